"""The preflight of a GPU node (`bert-preflight`): what this node will really do, measured
in minutes, before a pre-training run spends GPU-days on it.

It finds the GPUs TensorFlow sees (`runtime.devices`) and Horovod's build, then runs the
project's own pre-training command (`run_pretraining.py`, as a child process: what users
launch, start-up checks, hooks and all) on synthetic records: phase 1 once on one GPU and
once on all GPUs of the node (`horovodrun --gloo`, or in-graph towers where Horovod does not
import; on a machine without GPU: one process, then two CPU ranks), then phase 2 on all
GPUs (on a CPU: one process). Each run's steady-state rate and peak memory come from its
dllog summary (`training.hooks.StepLoggingHook`, warm-up left out); whether XLA compiled the
model's step, from the XLA record the run writes there (`training.xla_evidence`: its own
clusters, counted in the graph it executes). With `loss_steps`, the convergence check
follows (`pretraining.preflight_loss`). The report and the verdict are
`pretraining.preflight_report`'s, from these facts alone.

The loops: NVIDIA's shapes (phase 1: sequence length 128, 20 predictions; phase 2: 512, 80),
NVIDIA's per-GPU batch of the phase for the GPU and precision (`published_speed.phase_batch`,
by the GPU's memory where NVIDIA has no table for it), GPU_STEPS optimizer steps of
GPU_ACCUMULATION micro-batches: the first 2 steps (XLA's compilation, first runs) are
warm-up, so 6 steps of 8 micro-batches are measured, and accumulating 8 keeps the once-a-step
costs (the LAMB update, the allreduce) a small share as in NVIDIA's runs (which accumulate
128 to 1024). On an A100 that is ~10 s of training a phase-1 run, ~15 s a phase-2 run;
start-up (building BERT-large, XLA) is most of the few minutes. Phase 2 is where memory is
tightest (NVIDIA's batch 16 of 512 tokens on a 40 GB A100): an out-of-memory there shows here
in minutes, not 44 hours into the recipe. On a CPU (a fall-back anyway) CPU_STEPS steps
without accumulation, enough to show the path works.
"""
import dataclasses
import json
import os
import shutil
import tempfile
from typing import Optional

from absl import logging

from data_prep.instances import record_metadata
from modeling import BertConfig, ConfigError
from modeling.config import CONFIG_DIR
from pretraining import published_speed
from pretraining.preflight_loss import check_loss
from pretraining.preflight_records import PREDICTIONS, SEQ, write_records
from pretraining.preflight_report import Facts, HorovodBuild, Loop, Measured, run_label
from pretraining.preflight_runs import PRECISION_FLAGS, launches, run_training
from reporting.console import SHOW
from reporting.errors import UsageError
from runtime import devices
from training.flops import training_flops_per_sequence

PHASES = {1: published_speed.PHASE1_SEQ, 2: published_speed.PHASE2_SEQ}
GPU_STEPS, GPU_ACCUMULATION = 8, 8
CPU_STEPS, CPU_ACCUMULATION = 4, 1
WARMUP_STEPS = 2                        # StepLoggingHook's default warm-up
LEARNING_RATE = 7.5e-4                  # NVIDIA's phase-1 rate per GPU
INIT_LOSS_SCALE = 2.0 ** 15             # float16 steps from the first (2^32 skips ~17)
RECORDS_PER_BATCH = 4                   # records per file, in batches (the stream repeats)
ARCHITECTURE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


@dataclasses.dataclass(frozen=True)
class PreflightOptions:
    """The preflight's choices; None: the default for the node (module docstring)."""
    model: str = "large"
    bert_config_file: Optional[str] = None
    precision: str = "fp16"
    use_xla: bool = True
    train_batch_size: Optional[int] = None
    num_train_steps: Optional[int] = None
    num_accumulation_steps: Optional[int] = None
    work_dir: Optional[str] = None
    phase2: bool = True
    train_batch_size_phase2: Optional[int] = None
    loss_steps: int = 0                      # the convergence check's steps; 0: none


def horovod_build():
    """Horovod's HorovodBuild, or None when `horovod.tensorflow` does not import."""
    try:
        import horovod
        import horovod.tensorflow as hvd
        return HorovodBuild(getattr(horovod, "__version__", "?"), int(hvd.nccl_built()),
                            bool(hvd.gloo_built()), bool(hvd.mpi_built()))
    except Exception:  # noqa: BLE001 - not installed, or built against another TensorFlow
        return None


def model_facts(model, bert_config_file):
    """(config path, BertConfig, label, published model "large"/"base"/None, FLOP ratio of
    BERT-large to it). A config of BERT-large's or BERT-base's shape counts as that model."""
    path = os.path.abspath(bert_config_file or os.path.join(CONFIG_DIR,
                                                            f"bert_{model}_config.json"))
    try:
        config = BertConfig.from_json_file(path)
    except (ConfigError, OSError, ValueError) as err:
        raise UsageError(f"--bert_config_file={path}: {err}") from None
    large = BertConfig.from_json_file(os.path.join(CONFIG_DIR, "bert_large_config.json"))
    known = None
    for name in ("large", "base"):
        named = BertConfig.from_json_file(os.path.join(CONFIG_DIR, f"bert_{name}_config.json"))
        if all(getattr(config, field) == getattr(named, field) for field in ARCHITECTURE):
            known = name
    label = f"BERT-{known}" if known else f"the model of {path}"
    if bert_config_file and known:
        label += f" ({path})"
    ratio = (training_flops_per_sequence(large, SEQ, PREDICTIONS)
             / training_flops_per_sequence(config, SEQ, PREDICTIONS))
    return path, config, label, known, ratio


def phase_loops(options, gpus):
    """The phases' Loops for this node."""
    name = gpus[0].name if gpus else None
    memory = gpus[0].memory_bytes if gpus else None
    steps = options.num_train_steps or (GPU_STEPS if gpus else CPU_STEPS)
    accumulation = options.num_accumulation_steps or (GPU_ACCUMULATION if gpus
                                                      else CPU_ACCUMULATION)
    if steps <= WARMUP_STEPS:
        raise UsageError(f"--num_train_steps={steps}: the first {WARMUP_STEPS} steps are "
                         f"warm-up, left out of the rate; give at least {WARMUP_STEPS + 1}")
    given = {1: (options.train_batch_size, "--train_batch_size"),
             2: (options.train_batch_size_phase2, "--train_batch_size_phase2")}
    loops = []
    for phase in (1, 2) if options.phase2 else (1,):
        seq = PHASES[phase]
        batch, why = published_speed.phase_batch(name, memory, options.precision, seq)
        if given[phase][0]:
            batch, why = given[phase]
        loops.append(Loop(phase, seq, published_speed.PHASE_PREDICTIONS[seq], batch, why,
                          accumulation, steps))
    return tuple(loops)


def loop_args(loop, path, records, options):
    """run_pretraining.py's flags for a loop on `records`."""
    return [f"--bert_config_file={path}", f"--input_files_dir={records}", "--do_train",
            "--optimizer_type=lamb", f"--max_seq_length={loop.seq}",
            f"--max_predictions_per_seq={loop.predictions}", f"--train_batch_size={loop.batch}",
            f"--learning_rate={LEARNING_RATE}", f"--num_warmup_steps={loop.steps}",
            f"--num_train_steps={loop.steps}", f"--num_accumulation_steps={loop.accumulation}",
            "--allreduce_post_accumulation", f"--save_checkpoints_steps={loop.steps}",
            "--display_loss_steps=1", f"--init_loss_scale={INIT_LOSS_SCALE:g}",
            "--use_xla" if options.use_xla else "--nouse_xla"] + PRECISION_FLAGS[options.precision]


def _phase_records(work, loop, files, vocab_size):
    folder = os.path.join(work, f"records_phase{loop.phase}")
    for stale in (folder, folder + record_metadata.FOLDER_SUFFIX):
        shutil.rmtree(stale, ignore_errors=True)  # an earlier preflight's
    try:
        write_records(folder, files, loop.batch * RECORDS_PER_BATCH, vocab_size,
                      seq=loop.seq, predictions=loop.predictions)
    except OSError as err:
        raise UsageError(f"--work_dir={work}: cannot write the records: {err}") from None
    return folder


def run(options, gpus=None):
    """Finds the node's facts, runs the loops (and the loss check), returns Facts. `gpus`:
    the visible GpuInfo list (default: `runtime.devices.visible_gpus()`)."""
    path, config, label, known, ratio = model_facts(options.model, options.bert_config_file)
    gpus = devices.visible_gpus() if gpus is None else gpus
    loops = phase_loops(options, gpus)
    for loop in loops:
        if loop.seq > config.max_position_embeddings:
            raise UsageError(f"phase {loop.phase} needs sequence length {loop.seq}, but "
                             f"{path} has max_position_embeddings "
                             f"{config.max_position_embeddings}: pass --nophase2")
    expected = devices.gpu_expected()
    cause = devices.no_gpu_cause() if expected and not gpus else None
    horovod = horovod_build()
    plan = launches(gpus, horovod)
    work = os.path.abspath(options.work_dir or tempfile.mkdtemp(prefix="bert_preflight_"))
    runs = []
    for loop in loops:
        # phase 1 on one device and on all; phase 2 as the recipe runs it: on all GPUs (on
        # a CPU, a fall-back anyway, one process keeps it short)
        chosen = plan if loop.phase == 1 else [plan[-1] if gpus else plan[0]]
        records = _phase_records(work, loop, max(launch[0] for launch in chosen),
                                 config.vocab_size)
        args = loop_args(loop, path, records, options) + ([] if gpus else ["--allow_cpu"])
        for launch in chosen:
            logging.info("preflight: %s (%s), a few minutes...",
                         run_label(Measured(launch[0], launch[1], phase=loop.phase), gpus),
                         launch[1], extra=SHOW)
            runs.append(run_training(launch, args, os.path.join(
                work, f"run_phase{loop.phase}_{launch[0]}"), options.use_xla,
                phase=loop.phase, batch=loop.batch if gpus else None))
    loss = None
    if options.loss_steps:
        first = loops[0]
        base = loop_args(first, path, "", options) + ([] if gpus else ["--allow_cpu"])
        loss = check_loss(options.loss_steps, first.batch, options.precision, options.use_xla,
                          base, config.vocab_size, bool(gpus), plan[0], work)
    facts = Facts(tuple(gpus), expected, cause, horovod, label, known, ratio, options.precision,
                  options.use_xla, loops, tuple(runs), loss)
    with open(os.path.join(work, "preflight.json"), "w", encoding="utf-8") as writer:
        json.dump(dataclasses.asdict(facts), writer, indent=1)
    failed = any(run.failure for run in runs) or (loss is not None and loss.failure)
    if options.work_dir is None and not failed:
        shutil.rmtree(work, ignore_errors=True)
    elif options.work_dir is None:
        logging.warning("preflight: a run failed; its logs are kept in %s", work)
    return facts
