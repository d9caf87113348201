"""The preflight's report and verdict, a pure function of what was found on the node
(`Facts`: devices, Horovod's build, the loops' measured runs, the loss check), so every
branch (GPU kinds, missing NCCL, XLA that did not compile, a slow GPU, phase 2 out of
memory, a recipe that does not converge) is tested from faked facts on a CPU machine.

What counts as a fall-back (exit status FELL_BACK, named on the final line): computing on
the CPU (unless `allow_cpu`); several GPUs without Horovod's NCCL (gradients then travel
through the host: Gloo, or in-graph towers without Horovod); XLA asked for but not compiled
in a run (judged from the run's own XLA clusters, `training.xla_evidence`); a rate below
RATE_FLOOR of NVIDIA's published figure. A rate below it against an estimate (an
interpolated GPU count, BERT-base from large's figure) is a warning only, and so is a peak
memory above MEMORY_WARNING of the GPU's. A run that did not finish (phase 2 out of memory
among them) and a loss check the recipe failed are failures (exit status FAILED). A GPU
NVIDIA publishes no figure for is said on the final line: its rates were not compared.
"""
import dataclasses
import json
from typing import Optional, Tuple

from pretraining import published_speed as published
from pretraining.loss_check import FAILED as LOSS_FAILED
from pretraining.loss_check import INCONCLUSIVE, LossCheck, judge
from runtime.devices import GIB, GpuInfo, describe

PASSED, FAILED, FELL_BACK = 0, 1, 2
RATE_FLOOR = 0.5          # measured / NVIDIA's below this: far too slow
MEMORY_WARNING = 0.95     # peak / the GPU's memory above this: no headroom


@dataclasses.dataclass(frozen=True)
class HorovodBuild:
    version: str
    nccl: int      # NCCL_VERSION_CODE Horovod was built with, 0 without NCCL
    gloo: bool
    mpi: bool

    def describe(self):
        return (f"{self.version}, NCCL {nccl_version(self.nccl) if self.nccl else 'no'}, "
                f"Gloo {'yes' if self.gloo else 'no'}, MPI {'yes' if self.mpi else 'no'}")


def nccl_version(code):
    """NCCL_VERSION_CODE -> "2.18.5" (NCCL's encoding changed at 2.9: X*10000+Y*100+Z after,
    X*1000+Y*100+Z before)."""
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


@dataclasses.dataclass(frozen=True)
class Measured:
    """One training run of the preflight: of `phase` (1 or 2), on `devices` GPUs (or CPU
    processes/ranks), launched `how`; its steady-state rate (all devices together), peak
    memory, whether XLA compiled the step (None: not known) and what it compiled (`xla`:
    `training.xla_evidence.describe`), or why it has no rate (`failure`)."""
    devices: int
    how: str
    sequences_per_second: Optional[float] = None
    peak_memory_bytes: Optional[int] = None
    peak_memory_of: Optional[str] = None
    xla_compiled: Optional[bool] = None
    steady_steps: Optional[str] = None
    failure: Optional[str] = None
    phase: int = 1
    xla: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Loop:
    """A phase's loop: sequence length, predictions, per-GPU batch (and why that batch),
    micro-batches a step, optimizer steps."""
    phase: int
    seq: int
    predictions: int
    batch: int
    batch_why: str
    accumulation: int
    steps: int

    def describe(self, unit):
        return (f"sequence length {self.seq}, {self.predictions} predictions: {self.steps} "
                f"steps of {self.accumulation} micro-batch{'es' * (self.accumulation != 1)} "
                f"of {self.batch} sequences a {unit} ({self.batch_why})")


@dataclasses.dataclass(frozen=True)
class Facts:
    """Everything the report says, found on the node. `model`: what was trained ("BERT-large",
    "BERT-base", a config file); `published_model`: "large", "base" or None (an architecture
    NVIDIA never measured); `flops_ratio`: BERT-large's training FLOPs a sequence over this
    model's (BERT-base's estimate)."""
    gpus: Tuple[GpuInfo, ...]
    gpu_expected: Optional[str]
    no_gpu_cause: Optional[str]
    horovod: Optional[HorovodBuild]
    model: str
    published_model: Optional[str]
    flops_ratio: Optional[float]
    precision: str
    use_xla: bool
    loops: Tuple[Loop, ...]
    runs: Tuple[Measured, ...]
    loss: Optional[LossCheck] = None

    @property
    def gpu_name(self):
        return self.gpus[0].name if self.gpus else None

    @property
    def gpu_memory(self):
        return self.gpus[0].memory_bytes if self.gpus else None

    def loop(self, phase):
        return next(loop for loop in self.loops if loop.phase == phase)


def facts_from_json(text):
    """Facts from their JSON (`dataclasses.asdict`, as the preflight saves them)."""
    values = json.loads(text)
    values["gpus"] = tuple(GpuInfo(**dict(gpu, compute_capability=tuple(
        gpu["compute_capability"]) if gpu.get("compute_capability") else None))
        for gpu in values["gpus"])
    values["horovod"] = HorovodBuild(**values["horovod"]) if values["horovod"] else None
    values["loops"] = tuple(Loop(**loop) for loop in values["loops"])
    values["runs"] = tuple(Measured(**run) for run in values["runs"])
    if values.get("loss"):
        loss = values["loss"]
        values["loss"] = LossCheck(**dict(loss, recipe_losses=tuple(loss["recipe_losses"]),
                                          reference_losses=tuple(loss["reference_losses"])))
    return Facts(**values)


@dataclasses.dataclass(frozen=True)
class Report:
    text: str
    status: int
    fallbacks: Tuple[str, ...]
    warnings: Tuple[str, ...]


def device_count(devices, gpus):
    """"8 GPUs", or on a CPU "CPU, 1 worker" / "CPU, 2 workers" (processes, ranks or
    towers)."""
    if gpus:
        return f"{devices} GPU{'s' * (devices != 1)}"
    return f"CPU, {devices} worker{'s' * (devices != 1)}"


def run_label(run, gpus):
    """"phase 1, 8 GPUs"."""
    return f"phase {run.phase}, {device_count(run.devices, gpus)}"


def _memory(run, card):
    if run.peak_memory_bytes is None:
        return "?"
    if card and run.peak_memory_of and run.peak_memory_of.startswith("GPU"):
        return f"{run.peak_memory_bytes / GIB:.1f} of {card / GIB:.1f} GiB ({run.peak_memory_of})"
    return f"{run.peak_memory_bytes / GIB:.1f} GiB ({run.peak_memory_of or '?'})"


def _xla(run, use_xla):
    if not use_xla:
        return "off"
    return {True: "compiled", False: "NOT compiled", None: "?"}[run.xla_compiled]


def _figure(facts, run):
    """(published Figure for `run`'s phase and devices scaled to this model, or None; the
    table's note)."""
    table, note = published.table_for(facts.gpu_name, facts.gpu_memory, run.devices)
    if table is None or facts.published_model is None:
        return None, note
    figure = published.figure(table, facts.loop(run.phase).seq, run.devices,
                              published.PRECISION_CLASS[facts.precision])
    if figure is not None and facts.published_model == "base":
        figure = dataclasses.replace(figure, rate=figure.rate * facts.flops_ratio,
                                     how="BERT-large's figure x the FLOP ratio")
    return figure, note


def _devices_line(facts):
    if facts.gpus:
        return describe(list(facts.gpus))
    if facts.gpu_expected:
        return (f"CPU: a GPU was expected ({facts.gpu_expected}) but TensorFlow sees none: "
                f"{facts.no_gpu_cause}")
    return "CPU (TensorFlow sees no GPU, and none is expected: no /dev/nvidia* device)"


def _no_figure_reason(facts, table_note):
    """Why no rate was compared, or None when some were."""
    if facts.gpus and facts.published_model is None and table_note is None:
        return (f"NVIDIA publishes pre-training figures for BERT-large only: none for "
                f"{facts.model}")
    return table_note


def _notes(facts, figures, table_note):
    notes = []
    known = [(run, figure) for run, figure in zip(facts.runs, figures) if figure is not None]
    if not known:
        return [_no_figure_reason(facts, table_note)]
    table, precision_class = known[0][1].table, known[0][1].precision_class
    batches = {}
    for run, figure in known:
        batches.setdefault(facts.loop(run.phase).seq, figure.batch)
    at = ", ".join(f"{batch} at sequence length {seq}" for seq, batch in sorted(batches.items()))
    notes.append(f"NVIDIA's: BERT-large pre-training on a {table.system}, "
                 f"{table.precision_name(precision_class)}, batch a GPU {at}")
    notes.append(f"source: {table.source()}")
    if table_note:
        notes.append(table_note)
    if facts.published_model == "base":
        notes.append(f"~ BERT-base: NVIDIA publishes no BERT-base pre-training figure; "
                     f"BERT-large's x {facts.flops_ratio:.2f} (large's training FLOPs a "
                     "sequence / base's, training/flops.py), an estimate")
    for run, figure in known:
        if not figure.published and facts.published_model != "base":
            notes.append(f"~ {run_label(run, facts.gpus)}: {figure.how}, an estimate")
    if facts.precision == "bf16":
        notes.append("NVIDIA's mixed precision is fp16 AMP: bf16 is compared with it")
    if facts.precision == "tf32" and table.full_name == "FP32":
        notes.append("the V100 has no TF32: compared with NVIDIA's FP32")
    if facts.precision == "fp32" and table.full_name == "TF32":
        notes.append("NVIDIA's A100 figure without AMP is TF32 (its fp32 runs use TF32 "
                     "there, as this run does unless NVIDIA_TF32_OVERRIDE=0)")
    for seq, batch in sorted(batches.items()):
        loop = next(loop for loop in facts.loops if loop.seq == seq)
        if loop.batch != batch:
            notes.append(f"NVIDIA's figures at sequence length {seq} are at batch {batch} a "
                         f"GPU; this run used {loop.batch}")
    return notes


def _table(facts, figures):
    rows = [("run", "launched as", "sequences/s", "NVIDIA's", "measured/NVIDIA",
             "peak memory", "XLA")]
    for run, figure in zip(facts.runs, figures):
        mark = "" if figure is None or figure.published else "~"
        rate = ("failed" if run.sequences_per_second is None
                else f"{run.sequences_per_second:.1f}")
        theirs = "-" if figure is None else f"{mark}{figure.rate:.1f}"
        ratio = ("-" if figure is None or run.sequences_per_second is None
                 else f"{mark}{run.sequences_per_second / figure.rate:.2f}")
        rows.append((run_label(run, facts.gpus), run.how, rate, theirs, ratio,
                     _memory(run, facts.gpu_memory), _xla(run, facts.use_xla)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = (2, 3, 4)  # numbers
    return ["  ".join(cell.rjust(width) if i in right else cell.ljust(width)
                      for i, (cell, width) in enumerate(zip(row, widths))).rstrip()
            for row in rows]


def _scaling(facts, figures):
    """The scaling line of phase 1 (all-device rate / (N x one-device rate)) beside NVIDIA's."""
    pairs = [(run, figure) for run, figure in zip(facts.runs, figures) if run.phase == 1]
    if len(pairs) < 2:
        return None
    (one, _), (many, figure) = pairs[0], pairs[-1]
    if one.sequences_per_second is None or many.sequences_per_second is None:
        return None
    efficiency = many.sequences_per_second / (many.devices * one.sequences_per_second)
    line = (f"scaling efficiency, {run_label(many, facts.gpus)}: {efficiency:.2f} (rate / "
            f"({many.devices} x the 1-{'GPU' if facts.gpus else 'worker'} rate))")
    if figure is not None:
        mark = "" if figure.published else "~"
        line += (f"; NVIDIA's: {mark}{figure.weak_scaling / many.devices:.2f} (weak scaling "
                 f"{mark}{figure.weak_scaling:.2f} on {many.devices} GPUs)")
    return line


def _run_verdicts(facts, figures, failures, fallbacks, warnings):
    for run, figure in zip(facts.runs, figures):
        label = run_label(run, facts.gpus)
        if run.failure:
            failures.append(f"the {label} run: {run.failure}")
            continue
        if facts.use_xla and run.xla_compiled is False:
            fallbacks.append(f"XLA asked for but not compiled in the {label} run "
                             f"({run.xla or 'no XLA cluster in its step'})")
        card = facts.gpu_memory
        if (card and run.peak_memory_bytes and (run.peak_memory_of or "").startswith("GPU")
                and run.peak_memory_bytes > MEMORY_WARNING * card):
            warnings.append(f"the {label} run peaked at {run.peak_memory_bytes / card:.0%} of "
                            f"the GPU's memory: no headroom for a longer run's fragmentation "
                            "(a smaller batch with more accumulation keeps the global batch)")
        if figure is not None and run.sequences_per_second is not None:
            ratio = run.sequences_per_second / figure.rate
            if ratio < RATE_FLOOR:
                what = (f"the {label} run at {ratio:.2f} of NVIDIA's "
                        f"{'figure' if figure.published else 'estimate'}")
                (fallbacks if figure.published else warnings).append(what)


def _verdicts(facts, figures, allow_cpu):
    """(failures, fall-backs, warnings): what the final line and the exit status say."""
    failures, fallbacks, warnings = [], [], []
    if not facts.gpus and not allow_cpu:
        fallbacks.append("no GPU, computed on the CPU (--allow_cpu accepts that)")
    multi = len(facts.gpus) > 1
    if multi and facts.horovod is None:
        fallbacks.append(f"Horovod not installed: the {len(facts.gpus)} GPUs ran as in-graph "
                         "towers, not NCCL ranks (bash scripts/install.sh builds Horovod)")
    elif multi and not facts.horovod.nccl:
        fallbacks.append("Horovod built without NCCL: gradients travel through the host "
                         "(rebuild: BERT_TF_FLAVOR=gpu bash scripts/install.sh)")
    _run_verdicts(facts, figures, failures, fallbacks, warnings)
    if facts.loss is not None:
        verdict = judge(facts.loss)
        if verdict.outcome == LOSS_FAILED:
            failures.append("the loss check: the recipe does not learn as float32 does "
                            "(the loss check line above)")
        elif verdict.outcome == INCONCLUSIVE:
            warnings.append("the loss check was inconclusive (the loss check line above)")
    return failures, fallbacks, warnings


def report(facts, allow_cpu=False):
    """The report's text, its exit status and what fell back, from `facts` alone."""
    unit = "GPU" if facts.gpus else "worker"
    found = [_figure(facts, run) if facts.gpus else (None, None) for run in facts.runs]
    figures = [figure for figure, _ in found]
    table_note = (found[0][1] if found and facts.gpus
                  else published.table_for(None, None)[1])
    lines = [f"BERT preflight: {facts.model}, {facts.precision}, XLA "
             f"{'on' if facts.use_xla else 'off'}",
             f"devices:  {_devices_line(facts)}",
             "Horovod:  " + (facts.horovod.describe() if facts.horovod
                             else "Horovod not installed (horovod.tensorflow does not import)")]
    lines += [f"phase {loop.phase}:  {loop.describe(unit)}" for loop in facts.loops]
    lines.append("")
    lines += _table(facts, figures)
    steady = next((run.steady_steps for run in facts.runs if run.steady_steps), None)
    lines.append(f"sequences/s: the steady state{f' (steps {steady})' if steady else ''}, "
                 "all devices together, warm-up left out (each run's dllog summary)")
    scaling = _scaling(facts, figures)
    if scaling:
        lines.append(scaling)
    if facts.gpus and len(facts.gpus) == 1:
        lines.append("one GPU: no all-GPU run, no scaling")
    lines.append("")
    lines += _notes(facts, figures, table_note)
    if facts.loss is not None:
        lines.append(judge(facts.loss).line)
    failures, fallbacks, warnings = _verdicts(facts, figures, allow_cpu)
    lines += [f"warning: {text}" for text in warnings]
    passed = ("PASS: on the CPU, accepted by --allow_cpu" if not facts.gpus
              else "PASS: nothing fell back")
    if facts.gpus and not any(figures):
        reason = _no_figure_reason(facts, table_note) or "no published figure"
        passed += f"; rates not compared: {reason.split(' (')[0]}"
    return verdict(lines, failures, fallbacks, warnings, passed)


def verdict(lines, failures, fallbacks, warnings, passed):
    """The Report of `lines` with its last line and status: FAILED when anything failed,
    else FELL BACK when anything fell back, else `passed` (the caller's PASS line)."""
    if failures:
        status, last = FAILED, "FAILED: " + "; ".join(failures + fallbacks)
    elif fallbacks:
        status, last = FELL_BACK, "FELL BACK: " + "; ".join(fallbacks)
    else:
        status, last = PASSED, passed
    return Report("\n".join(lines + [last]), status, tuple(fallbacks), tuple(warnings))
