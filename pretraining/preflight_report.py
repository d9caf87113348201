"""The preflight's report and verdict, a pure function of what was found on the node
(`Facts`: devices, Horovod's build, the measured runs), so every branch (GPU kinds, missing
NCCL, XLA that did not compile, a slow GPU) is tested from faked facts on a CPU machine.

What counts as a fall-back (exit status FELL_BACK, named on the final line): computing on
the CPU (unless `allow_cpu`); several GPUs without Horovod's NCCL (gradients then travel
through the host: Gloo, or in-graph towers without Horovod); XLA asked for but not compiled
in a run; a rate below RATE_FLOOR of NVIDIA's published figure. A rate below it against an
estimate (an interpolated GPU count, BERT-base from large's figure) is a warning only. A run
that did not finish is a failure (exit status FAILED).
"""
import dataclasses
import json
from typing import Optional, Tuple

from pretraining import published_speed as published
from runtime.devices import GIB, GpuInfo, describe

PASSED, FAILED, FELL_BACK = 0, 1, 2
RATE_FLOOR = 0.5          # measured / NVIDIA's below this: far too slow
XLA_EVIDENCE = "Compiled cluster using XLA"


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
    """One training run of the preflight: on `devices` GPUs (or CPU processes/ranks),
    launched `how`; its steady-state rate (all devices together), peak memory, whether XLA
    compiled (None: not asked), or why it has no rate (`failure`)."""
    devices: int
    how: str
    sequences_per_second: Optional[float] = None
    peak_memory_bytes: Optional[int] = None
    peak_memory_of: Optional[str] = None
    xla_compiled: Optional[bool] = None
    steady_steps: Optional[str] = None
    failure: Optional[str] = None


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
    seq: int
    predictions: int
    batch: int
    batch_why: str
    accumulation: int
    steps: int
    runs: Tuple[Measured, ...]

    @property
    def gpu_name(self):
        return self.gpus[0].name if self.gpus else None


def facts_from_json(text):
    """Facts from their JSON (`dataclasses.asdict`, as the preflight saves them)."""
    values = json.loads(text)
    values["gpus"] = tuple(GpuInfo(**dict(gpu, compute_capability=tuple(
        gpu["compute_capability"]) if gpu.get("compute_capability") else None))
        for gpu in values["gpus"])
    values["horovod"] = HorovodBuild(**values["horovod"]) if values["horovod"] else None
    values["runs"] = tuple(Measured(**run) for run in values["runs"])
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


def _memory(run):
    if run.peak_memory_bytes is None:
        return "?"
    return f"{run.peak_memory_bytes / GIB:.1f} GiB ({run.peak_memory_of or '?'})"


def _xla(run, use_xla):
    if not use_xla:
        return "off"
    return {True: "compiled", False: "NOT compiled", None: "?"}[run.xla_compiled]


def _figure(facts, gpus):
    """(published Figure scaled to this model, or None; the table's note)."""
    table, note = published.table_for(facts.gpu_name, facts.gpus[0].memory_bytes
                                      if facts.gpus else None, gpus)
    if table is None or facts.published_model is None:
        return None, note
    figure = published.figure(table, facts.seq, gpus,
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


def _notes(facts, figures, table_note):
    notes = []
    known = [figure for figure in figures if figure is not None]
    if not known:
        reason = table_note
        if facts.gpus and facts.published_model is None and table_note is None:
            reason = (f"NVIDIA publishes pre-training figures for BERT-large only: none for "
                      f"{facts.model}")
        return [reason]
    first = known[0]
    table = first.table
    name = table.precision_name(first.precision_class)
    notes.append(f"NVIDIA's: BERT-large pre-training on a {table.system}, {name}, sequence "
                 f"length {facts.seq}, batch {first.batch} a GPU")
    notes.append(f"source: {table.source()}")
    if table_note:
        notes.append(table_note)
    if facts.published_model == "base":
        notes.append(f"~ BERT-base: NVIDIA publishes no BERT-base pre-training figure; "
                     f"BERT-large's x {facts.flops_ratio:.2f} (large's training FLOPs a "
                     "sequence / base's, training/flops.py), an estimate")
    for figure in known:
        if not figure.published and facts.published_model != "base":
            notes.append(f"~ {figure.gpus} GPUs: {figure.how}, an estimate")
    if facts.precision == "bf16":
        notes.append("NVIDIA's mixed precision is fp16 AMP: bf16 is compared with it")
    if facts.precision == "tf32" and table.full_name == "FP32":
        notes.append("the V100 has no TF32: compared with NVIDIA's FP32")
    if facts.precision == "fp32" and table.full_name == "TF32":
        notes.append("NVIDIA's A100 figure without AMP is TF32 (its fp32 runs use TF32 "
                     "there, as this run does unless NVIDIA_TF32_OVERRIDE=0)")
    if facts.batch != first.batch:
        notes.append(f"NVIDIA's figures are at batch {first.batch} a GPU; this run used "
                     f"{facts.batch}")
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
        rows.append((device_count(run.devices, facts.gpus), run.how, rate, theirs, ratio,
                     _memory(run), _xla(run, facts.use_xla)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = (2, 3, 4)  # numbers
    return ["  ".join(cell.rjust(width) if i in right else cell.ljust(width)
                      for i, (cell, width) in enumerate(zip(row, widths))).rstrip()
            for row in rows]


def _scaling(facts, figures):
    """The scaling line (all-device rate / (N x one-device rate)) beside NVIDIA's."""
    if len(facts.runs) < 2:
        return None
    one, many = facts.runs[0], facts.runs[-1]
    if one.sequences_per_second is None or many.sequences_per_second is None:
        return None
    efficiency = many.sequences_per_second / (many.devices * one.sequences_per_second)
    line = (f"scaling efficiency, {device_count(many.devices, facts.gpus)}: {efficiency:.2f} "
            f"(rate / ({many.devices} x the 1-{'GPU' if facts.gpus else 'worker'} rate))")
    figure = figures[-1]
    if figure is not None:
        mark = "" if figure.published else "~"
        line += (f"; NVIDIA's: {mark}{figure.weak_scaling / many.devices:.2f} (weak scaling "
                 f"{mark}{figure.weak_scaling:.2f} on {many.devices} GPUs)")
    return line


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
    for run, figure in zip(facts.runs, figures):
        label = device_count(run.devices, facts.gpus)
        if run.failure:
            failures.append(f"the {label} run: {run.failure}")
            continue
        if facts.use_xla and run.xla_compiled is False:
            fallbacks.append(f"XLA asked for but not compiled in the {label} run (no "
                             f"\"{XLA_EVIDENCE}\" in its log)")
        if figure is not None and run.sequences_per_second is not None:
            ratio = run.sequences_per_second / figure.rate
            if ratio < RATE_FLOOR:
                what = (f"the {label} run at {ratio:.2f} of NVIDIA's "
                        f"{'figure' if figure.published else 'estimate'}")
                (fallbacks if figure.published else warnings).append(what)
    return failures, fallbacks, warnings


def report(facts, allow_cpu=False):
    """The report's text, its exit status and what fell back, from `facts` alone."""
    figures = [_figure(facts, run.devices)[0] if facts.gpus else None for run in facts.runs]
    table_note = _figure(facts, facts.runs[0].devices if facts.runs else 1)[1]
    lines = [f"BERT preflight: {facts.model}, phase 1 (sequence length {facts.seq}, "
             f"{facts.predictions} predictions), {facts.precision}, XLA "
             f"{'on' if facts.use_xla else 'off'}",
             f"devices:  {_devices_line(facts)}",
             "Horovod:  " + (facts.horovod.describe() if facts.horovod
                             else "Horovod not installed (horovod.tensorflow does not import)"),
             f"loop:     {facts.steps} steps of {facts.accumulation} micro-batch"
             f"{'es' * (facts.accumulation != 1)} of {facts.batch} sequences a "
             f"{'GPU' if facts.gpus else 'worker'} ({facts.batch_why})", ""]
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
    failures, fallbacks, warnings = _verdicts(facts, figures, allow_cpu)
    lines += [f"warning: {text}" for text in warnings]
    if failures:
        status, last = FAILED, "FAILED: " + "; ".join(failures + fallbacks)
    elif fallbacks:
        status, last = FELL_BACK, "FELL BACK: " + "; ".join(fallbacks)
    else:
        status = PASSED
        last = ("PASS: on the CPU, accepted by --allow_cpu" if not facts.gpus
                else "PASS: nothing fell back")
    lines.append(last)
    return Report("\n".join(lines), status, tuple(fallbacks), tuple(warnings))
