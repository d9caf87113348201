"""Training that resumes exactly where an interrupted run stopped (pre-training and
fine-tuning alike).

The run resumes from the checkpoint `resume_point` chooses (`resilience.resume_point`: the
one the `checkpoint` state file names when whole and finite, else the newest such one, said
in one line; never step 0 over checkpoints unless starting over), which the Estimator then
restores (weights, optimizer and accumulation state, global step, loss scale,
`micro_step`). Each rank then continues its own
data stream from the checkpoint's `micro_step` (micro-batches it consumed):
- from its saved input-pipeline state for that micro-step (`training.input_state`): O(1);
- when there is none (killed between the model and input writes, a folder written by an
  older version): by rebuilding the seeded pipeline and skipping the records consumed since
  the data order began: exact, but each rank re-reads them, so a warning says so. The
  states this run saves restore later into a pipeline rebuilt with the same skip.
The data settings and the global batch must be those the checkpoint was trained with
(`resilience.data_order`, checked on every rank before training; another layout of ranks
and devices keeping the global batch restarts the data order). SIGTERM/SIGINT save a checkpoint and end the run
cleanly (`PreemptionHook`); the input state is saved at the same moment. A run that failed
or was killed may leave half-written files (a full disk): they are removed at the next
start, so the rerun resumes from the last complete checkpoint. No checkpoint holding a NaN
or an infinity is written (`resilience.divergence.FiniteWeightsGuard`).
"""
import os
import signal

import tensorflow as tf
from absl import logging

from reporting.console import SHOW
from resilience import data_order
from resilience.disk_space import (CheckpointSpaceListener, remove_partial_writes,
                                 remove_unrecorded_checkpoints)
from resilience.divergence import FiniteWeightsGuard
from resilience.failures import explained_failures
from resilience.resume_point import choose, settle
from training import input_state
from training.hooks import CHECKPOINT_WRITES, PreemptionHook
from training.last_window import LastWindowSaver
from training.pauses_for_tests import (CheckpointWritePause, MicroBatchDelayHook,
                                       checkpoint_pause_for_tests, micro_batch_delay_for_tests)
from training.input_state import InputStateHook, InputStateStore, stream_id
from training.records import PIPELINE_VERSION
from training.train_step import MICRO_STEP_NAME

tf1 = tf.compat.v1


def resume_point(output_dir, workers, start_over=False):
    """The checkpoint this run resumes from (`resilience.resume_point.ResumePoint`), the
    folder settled for it by the chief (state file rewritten, what the run would overwrite
    moved aside, one line). Call on every rank before anything reads the folder's
    checkpoints; raises UsageError when checkpoints are there and none is usable."""
    point = choose(output_dir, start_over)
    settle(output_dir, point, workers.is_chief)
    return point


def checkpoint_value(checkpoint, name, default=0):
    """A scalar from the checkpoint `checkpoint` (a prefix; a folder: its latest), default
    when there is none."""
    if checkpoint and tf.io.gfile.isdir(checkpoint):
        checkpoint = tf1.train.latest_checkpoint(checkpoint)
    if not checkpoint:
        return default
    reader = tf.train.load_checkpoint(checkpoint)
    return int(reader.get_tensor(name)) if reader.has_tensor(name) else default


def _input_position(training_input, output_dir, workers, save_checkpoints_steps,
                    reset_data_position, global_step, checkpoint, accumulation_steps,
                    record_flags):
    """(records to skip, InputStateHook) for this rank. Raises UsageError when the
    checkpoint's data position or global batch does not carry over to `training_input`'s
    settings, `accumulation_steps` and `record_flags`."""
    micro_step = checkpoint_value(checkpoint, MICRO_STEP_NAME)
    job = data_order.job_order(training_input.order(), accumulation_steps, workers.num_devices,
                               record_flags)
    order = data_order.resolve(output_dir, job, micro_step,
                               reset_data_position, workers.is_chief,
                               input_state.saved_order(output_dir, micro_step))
    if workers.is_chief:
        data_order.record(output_dir, order)
    store = InputStateStore(output_dir, workers.rank,
                            stream_id(order, training_input.files, PIPELINE_VERSION),
                            order=order)
    consumed = micro_step - order[data_order.START]
    saved_skip = store.pipeline_skip(micro_step) if consumed > 0 else None
    restore = saved_skip is not None
    if restore:  # the pipeline as it was saved: the state holds its skip as done
        skip = saved_skip
        logging.info("rank %d resumes its input from %s (micro_step %d): 0 records skipped",
                     workers.rank, store.path(micro_step), micro_step, extra=SHOW)
    else:
        skip = max(consumed, 0) * training_input.batch_size
        if skip:
            why = f" ({store.problem})" if store.problem else ""
            logging.warning("rank %d: no input state for micro_step %d in %s%s: rebuilding "
                            "the input pipeline and skipping %d records (exact, but slower)",
                            workers.rank, micro_step, store.directory, why, skip)
    hook = InputStateHook(store, save_checkpoints_steps, global_step,
                          micro_step if restore else None, workers.is_chief, skip)
    return skip, hook, store


def remove_leftovers(output_dir, rank_directories, is_chief=True):
    """Deletes what failed or killed writes left in `output_dir` (the chief's: checkpoint
    files of a save that never completed, half-written files) and in the input-state folders
    `rank_directories` (snapshots without their marker). Returns their paths."""
    removed = []
    if is_chief:
        removed += remove_partial_writes([output_dir]) + remove_unrecorded_checkpoints(output_dir)
    removed += remove_partial_writes(rank_directories)
    for directory in rank_directories:
        removed += input_state.remove_uncommitted(directory)
    return removed


def train_resuming(estimator, training_input, output_dir, max_steps, workers,
                   save_checkpoints_steps, extra_hooks=(), reset_data_position=None,
                   bad_records=None, resume=None, accumulation_steps=1, record_flags=None):
    """Trains to `max_steps` optimizer steps, continuing any checkpoint in `output_dir`.

    `training_input` (`training.records.TrainingInput`) is this rank's data stream;
    `accumulation_steps` (micro-batches an optimizer step) completes its global batch, which a
    resume must keep (`resilience.data_order`), as it must keep `record_flags` ({flag: value}
    the training records were made with, when the caller makes them: fine-tuning).
    `save_checkpoints_steps` must be the Estimator's (rank 0's) rule: input states are saved
    with every model checkpoint. `reset_data_position`: True restarts the data order on
    purpose when the data settings changed; None when the caller offers no such option.
    `bad_records`: a `resilience.record_guard.BadRecordLimitHook`, with a `training_input`
    that skips bad records: it counts them and stops the run over its bound. `resume`: the
    ResumePoint of `resume_point` when the caller chose it already (default: chosen here).
    Failures are one-line errors (`resilience.failures`): a full disk (DiskFullError; a save
    that would not fit is refused before writing, `resilience.disk_space`) or a bad record
    (BadRecordError naming its file). Half-written files of a failed or killed run are
    removed, here after a failure and at the next start.
    Returns the PreemptionHook (`.received` is set if a signal stopped the run), or None
    when the checkpoint had already reached `max_steps` and nothing was trained.
    """
    if resume is None:
        resume = resume_point(output_dir, workers)
    done = checkpoint_value(resume.checkpoint, "global_step")
    if done >= max_steps:
        logging.info("%s already holds step %d >= %d: nothing to train", output_dir, done,
                     max_steps, extra=SHOW)
        return None
    if workers.is_chief:  # one run owns the folder (run lock): what is half-written is dead
        for path in remove_leftovers(output_dir, input_state.rank_directories(output_dir)):
            logging.warning("removed what an earlier run left half-written: %s", path)
    skip, state_hook, store = _input_position(training_input, output_dir, workers,
                                              save_checkpoints_steps, reset_data_position, done,
                                              resume.checkpoint, accumulation_steps,
                                              record_flags)
    finite = FiniteWeightsGuard(output_dir)
    preemption = PreemptionHook(os.path.join(output_dir, "model.ckpt"), workers, finite)
    space = CheckpointSpaceListener(output_dir, store.latest_bytes)
    input_fn = state_hook.input_fn(lambda: training_input.dataset(skip))
    last_window = LastWindowSaver(os.path.join(output_dir, "model.ckpt"), workers, finite)
    hooks = workers.hooks() + [state_hook, preemption, last_window] + list(extra_hooks)
    delay = micro_batch_delay_for_tests()
    if delay:
        hooks.append(MicroBatchDelayHook(delay))
    if bad_records is not None:
        input_fn = bad_records.input_fn(input_fn)
        hooks.append(bad_records)
    # Only where the Estimator saves checkpoints (rank 0): the weights' finiteness, the space
    # check, then the input state, all before each model checkpoint.
    # The first and last listeners time each write (training.hooks.CHECKPOINT_WRITES): the
    # step log reports it apart instead of as slow steps.
    first, last = CHECKPOINT_WRITES.timers()
    pause = checkpoint_pause_for_tests()
    middle = [CheckpointWritePause(pause)] if pause else []
    listeners = ([first, finite, space, state_hook.listener] + middle + [last]
                 if state_hook.listener
                 else None)
    with explained_failures(output_dir, training_input.rank_files(), training_input.spec,
                            training_input.value_ranges, space,
                            lambda: remove_leftovers(output_dir, [store.directory],
                                                     workers.is_chief)):
        estimator.train(input_fn, max_steps=max_steps, hooks=hooks,
                        saving_listeners=listeners)
    return preemption


LAUNCHER_ENV = "BERT_LAUNCHER_PID"  # set by scripts/launch_common.sh for what it starts


def exit_status(preemption):
    """The command's exit status once training returned: 0 when it finished; after a signal
    stopped it (checkpoint saved), 128 + the signal, as a shell reports a process the signal
    ended (143 for SIGTERM, 130 for Ctrl-C), so `run_pretraining.py && next-step` does not
    go on with an unfinished model. A rank that stopped with others (it got no signal of
    its own) reports SIGTERM's. Under our launcher, 0: it reports the stop itself with that
    status (horovodrun would take a rank's 143 for a crash of its own)."""
    if preemption is None or preemption.received is None or os.environ.get(LAUNCHER_ENV):
        return 0
    return 128 + (preemption.received or signal.SIGTERM)
