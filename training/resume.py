"""Training that resumes exactly where an interrupted run stopped (pre-training and
fine-tuning alike).

The Estimator restores the latest checkpoint in the output folder; the checkpoint's
`micro_step` says how many micro-batches this rank consumed, so the rebuilt, seeded input
pipeline skips exactly those records. SIGTERM/SIGINT save a checkpoint and end the run
cleanly (`PreemptionHook`).
"""
import os

import tensorflow as tf
from absl import logging

from training.hooks import PreemptionHook
from training.train_step import MICRO_STEP_NAME

tf1 = tf.compat.v1


def checkpoint_value(model_dir, name, default=0):
    """A scalar from the latest checkpoint in model_dir (default when there is none)."""
    latest = (tf1.train.latest_checkpoint(model_dir)
              if model_dir and tf.io.gfile.isdir(model_dir) else None)
    if latest is None:
        return default
    reader = tf.train.load_checkpoint(latest)
    return int(reader.get_tensor(name)) if reader.has_tensor(name) else default


def train_resuming(estimator, make_input_fn, output_dir, max_steps, batch_size, workers,
                   extra_hooks=()):
    """Trains to `max_steps` optimizer steps, continuing any checkpoint in `output_dir`.

    `make_input_fn(skip_records_fn)` builds the training input_fn; `skip_records_fn` is
    evaluated when the input_fn runs (after the checkpoint is known). Returns the
    PreemptionHook (`.received` is set if a signal stopped the run), or None when the
    checkpoint had already reached `max_steps` and nothing was trained.
    """
    done = checkpoint_value(output_dir, "global_step")
    if done >= max_steps:
        logging.info("%s already holds step %d >= %d: nothing to train", output_dir, done,
                     max_steps)
        return None
    input_fn = make_input_fn(
        lambda: checkpoint_value(output_dir, MICRO_STEP_NAME) * batch_size)
    preemption = PreemptionHook(os.path.join(output_dir, "model.ckpt"), workers)
    estimator.train(input_fn, max_steps=max_steps,
                    hooks=workers.hooks() + [preemption] + list(extra_hooks))
    return preemption
