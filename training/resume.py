"""Training that resumes exactly where an interrupted run stopped (pre-training and
fine-tuning alike).

The Estimator restores the latest checkpoint in the output folder (weights, optimizer and
accumulation state, global step, loss scale, `micro_step`). Each rank then continues its own
data stream from the checkpoint's `micro_step` (micro-batches it consumed):
- from its saved input-pipeline state for that micro-step (`training.input_state`): O(1);
- when there is none (killed between the model and input writes, a folder written by an
  older version): by rebuilding the seeded pipeline and skipping the records consumed since
  the data order began: exact, but each rank re-reads them, so a warning says so.
The data settings must be those the checkpoint was trained with (`training.data_order`,
checked on every rank before training). SIGTERM/SIGINT save a checkpoint and end the run
cleanly (`PreemptionHook`); the input state is saved at the same moment.
"""
import os

import tensorflow as tf
from absl import logging

from cli.console import SHOW
from training import data_order
from training.hooks import PreemptionHook
from training.input_state import InputStateHook, InputStateStore, stream_id
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


def _input_position(training_input, output_dir, workers, save_checkpoints_steps,
                    reset_data_position, global_step):
    """(records to skip, InputStateHook) for this rank. Raises UsageError when the
    checkpoint's data position does not carry over to `training_input`'s settings."""
    micro_step = checkpoint_value(output_dir, MICRO_STEP_NAME)
    order = data_order.resolve(output_dir, training_input.order(), micro_step,
                               reset_data_position)
    if workers.is_chief:
        data_order.record(output_dir, order)
    store = InputStateStore(output_dir, workers.rank, stream_id(order, training_input.files))
    consumed = micro_step - order[data_order.START]
    restore = consumed > 0 and store.has(micro_step)
    skip = 0 if restore or consumed <= 0 else consumed * training_input.batch_size
    if restore:
        logging.info("rank %d resumes its input from %s (micro_step %d): 0 records skipped",
                     workers.rank, store.path(micro_step), micro_step, extra=SHOW)
    elif skip:
        logging.warning("rank %d: no input state for micro_step %d in %s: rebuilding the "
                        "input pipeline and skipping %d records (exact, but slower)",
                        workers.rank, micro_step, store.directory, skip)
    hook = InputStateHook(store, save_checkpoints_steps, global_step,
                          micro_step if restore else None, workers.is_chief)
    return skip, hook


def train_resuming(estimator, training_input, output_dir, max_steps, workers,
                   save_checkpoints_steps, extra_hooks=(), reset_data_position=None):
    """Trains to `max_steps` optimizer steps, continuing any checkpoint in `output_dir`.

    `training_input` (`training.records.TrainingInput`) is this rank's data stream.
    `save_checkpoints_steps` must be the Estimator's (rank 0's) rule: input states are saved
    with every model checkpoint. `reset_data_position`: True restarts the data order on
    purpose when the data settings changed; None when the caller offers no such option.
    Returns the PreemptionHook (`.received` is set if a signal stopped the run), or None
    when the checkpoint had already reached `max_steps` and nothing was trained.
    """
    done = checkpoint_value(output_dir, "global_step")
    if done >= max_steps:
        logging.info("%s already holds step %d >= %d: nothing to train", output_dir, done,
                     max_steps, extra=SHOW)
        return None
    skip, input_state = _input_position(training_input, output_dir, workers,
                                        save_checkpoints_steps, reset_data_position, done)
    preemption = PreemptionHook(os.path.join(output_dir, "model.ckpt"), workers)
    # input_state before preemption: at the end, the input state is saved before the model.
    estimator.train(input_state.input_fn(lambda: training_input.dataset(skip)),
                    max_steps=max_steps,
                    hooks=workers.hooks() + [input_state, preemption] + list(extra_hooks),
                    saving_listeners=[input_state.listener] if input_state.listener else None)
    return preemption
