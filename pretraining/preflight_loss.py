"""The preflight's convergence check, run (`bert-preflight --loss_steps=N`): the recipe's
precision and XLA against float32 from the same weights on the same batches
(`pretraining.loss_check` says why and judges it).

Two runs of the project's own pre-training command on one device, on records a model can
learn (`preflight_records.write_records(learnable=True)`: a Markov chain's tokens), phase-1 shape at
the node's phase-1 batch, one micro-batch a step, one optimizer step a log line:
1. the reference: float32 (`--noamp`), no XLA anywhere (`--nouse_xla`), and on GPUs TF32 off
   (NVIDIA_TF32_OVERRIDE=0: Ampere's cuBLAS would otherwise round float32 matmuls to TF32);
   its step-0 checkpoint holds the initial weights;
2. the recipe: the preflight's precision and XLA, initialised from that checkpoint.
Same seed, files and batch: the input order and the dropout masks (keyed by the step) are the
same, so the curves differ only by their arithmetic.
"""
import os
import shutil

from absl import logging

from pretraining.loss_check import LossCheck
from pretraining.preflight_records import write_records
from pretraining.preflight_runs import PRECISION_FLAGS, failure_line, step_losses, tidy, train
from reporting.console import SHOW

LEARNING_RATE = 5e-3      # LAMB on one device: the loss falls within a few hundred steps
WARMUP_SHARE = 0.1
MAX_RECORDS = 8192        # the stream repeats: the chain is learned, not the records
LOSS_KEY = "masked_lm_loss"


def _args(loop_args, records, steps, precision_flags, xla_flag):
    """The phase-1 loop's flags, changed for the check: its records, its steps, one
    micro-batch a step, the rate, checkpoints only at the start and the end, the given
    precision and XLA."""
    kept = [arg for arg in loop_args
            if not arg.startswith(("--input_files_dir", "--num_warmup_steps", "--num_train_steps",
                                   "--num_accumulation_steps", "--learning_rate",
                                   "--save_checkpoints_steps", "--use_xla", "--nouse_xla",
                                   "--amp", "--noamp", "--amp_dtype"))]
    return kept + [f"--input_files_dir={records}", f"--num_train_steps={steps}",
                   f"--num_warmup_steps={max(1, int(steps * WARMUP_SHARE))}",
                   "--num_accumulation_steps=1", f"--learning_rate={LEARNING_RATE}",
                   f"--save_checkpoints_steps={steps}", xla_flag] + precision_flags


def _losses(dllog, steps):
    """The run's masked-LM loss at steps 1..steps (None where none was logged)."""
    by_step = dict(step_losses(dllog, LOSS_KEY))
    return tuple(by_step.get(step) for step in range(1, steps + 1))


def _skipped(dllog):
    """Optimizer steps the loss scale skipped in the run (its last step record's count)."""
    counts = step_losses(dllog, "skipped_steps")
    return int(counts[-1][1]) if counts else 0


def check_loss(steps, batch, precision, use_xla, loop_args, vocab_size, on_gpus, launch,
               work):
    """Runs the check's two runs (module docstring): `steps` steps of `batch` sequences,
    the recipe in `precision` with or without XLA, from the phase-1 loop's flags
    `loop_args`, with `launch` (the preflight's one-device launch) in folders of `work`.
    Returns the LossCheck."""
    records = os.path.join(work, "records_loss")
    shutil.rmtree(records, ignore_errors=True)
    write_records(records, 1, min(steps * batch, MAX_RECORDS), vocab_size, learnable=True)
    recipe = f"{precision}, {'XLA' if use_xla else 'no XLA'}"
    reference = "fp32 (TF32 off), no XLA" if on_gpus else "fp32, no XLA"
    where = "1 GPU" if on_gpus else "the CPU"
    check = dict(steps=steps, batch=batch, devices=where, recipe=recipe, reference=reference)
    reference_dir, recipe_dir = (os.path.join(work, name) for name in ("loss_fp32", "loss_recipe"))
    logging.info("preflight: loss check, %d steps in fp32 on %s...", steps, where, extra=SHOW)
    status, output, reference_log = train(
        launch, _args(loop_args, records, steps, ["--noamp"], "--nouse_xla"), reference_dir,
        env_changes={"NVIDIA_TF32_OVERRIDE": "0"})
    if status != 0:
        return LossCheck(**check, failure="the fp32 run: " + (
            failure_line(output, status) if status is not None else "no end"))
    initial = os.path.join(reference_dir, "model.ckpt-0")
    logging.info("preflight: loss check, %d steps in %s on %s...", steps, recipe, where,
                 extra=SHOW)
    status, output, recipe_log = train(
        launch, _args(loop_args, records, steps, PRECISION_FLAGS[precision],
                      "--use_xla" if use_xla else "--nouse_xla")
        + [f"--init_checkpoint={initial}"], recipe_dir)
    for folder in (reference_dir, recipe_dir):
        tidy(folder)
    if status != 0:
        return LossCheck(**check, reference_losses=_losses(reference_log, steps),
                         failure=f"the {recipe} run: " + (
                             failure_line(output, status) if status is not None else "no end"))
    return LossCheck(**check, recipe_losses=_losses(recipe_log, steps),
                     reference_losses=_losses(reference_log, steps),
                     recipe_skipped=_skipped(recipe_log))
