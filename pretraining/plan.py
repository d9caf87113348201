"""The effective recipe of a pre-training run, as one JSON-able record.

What a cluster run will really do depends on flags *and* on the number of ranks: under
Horovod, `--learning_rate` is per rank (NVIDIA's convention: the optimizer applies
`learning_rate * ranks`) and the global batch is `train_batch_size * num_accumulation_steps
* ranks`. `--num_local_devices` (towers in one process, runtime/towers.py) counts the same
way: replicas = ranks x local_devices replace ranks in both. Nobody should discover that after a GPU-day, so every run logs this record at
start-up (console and dllog), and `run_pretraining.py --dry_run --dry_run_ranks=N` (what
`DRY_RUN=1 bash scripts/run_pretraining_lamb.sh ...` calls per phase) prints it without
reading data or starting TensorFlow.

This module must not import TensorFlow: the dry run is meant to be instant.
"""
import json

from training.settings import peak_learning_rate

PLAN_FIELDS = ("phase", "ranks", "local_devices", "max_seq_length", "max_predictions_per_seq",
               "per_rank_batch_size", "accumulation_steps", "global_batch_size",
               "learning_rate_per_rank", "peak_learning_rate", "train_steps", "warmup_steps",
               "optimizer", "precision", "save_checkpoints_steps", "init_checkpoint")


def pretraining_plan(options, ranks, speed=None):
    """The run's plan (see PLAN_FIELDS) from run_pretraining.py's options. `speed`: the
    run's `runtime.speed_defaults.Speed` (on a machine without a GPU, NVIDIA's default --amp
    is off); a dry run plans the flags as given (--amp, --manual_fp16), for the GPUs it is
    for."""
    ranks = int(ranks)
    devices = int(getattr(options, "num_local_devices", 1) or 1)
    if speed is None:
        manual = bool(getattr(options, "manual_fp16", False))
        amp, amp_dtype = options.amp or manual, "float16" if manual else options.amp_dtype
    else:
        amp, amp_dtype = speed.amp, speed.amp_dtype
    precision = "fp32"
    if amp:
        precision = {"float16": "fp16", "bfloat16": "bf16"}[amp_dtype]
    plan = {
        "phase": options.phase,
        "ranks": ranks,
        "local_devices": devices,
        "max_seq_length": options.max_seq_length,
        "max_predictions_per_seq": options.max_predictions_per_seq,
        "per_rank_batch_size": options.train_batch_size,
        "accumulation_steps": options.num_accumulation_steps,
        "global_batch_size": (options.train_batch_size * options.num_accumulation_steps * ranks
                              * devices),
        "learning_rate_per_rank": float(options.learning_rate),
        "peak_learning_rate": peak_learning_rate(options.learning_rate, ranks * devices),
        "train_steps": options.num_train_steps,
        "warmup_steps": options.num_warmup_steps,
        "optimizer": options.optimizer_type,
        "precision": precision,
        "save_checkpoints_steps": options.save_checkpoints_steps,
        "init_checkpoint": options.init_checkpoint,
    }
    assert tuple(plan) == PLAN_FIELDS
    return plan


def plan_line(plan):
    """The plan as the one JSON line that dry runs print and runs log."""
    return json.dumps(dict(plan, event="plan"), sort_keys=False)
