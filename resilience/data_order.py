"""The job-level record of what fixes the training data order, checked when a run resumes.

A checkpoint's `micro_step` (micro-batches each rank consumed) is a data position only for
the settings that produced it: number of ranks (which files each rank reads), per-rank batch
size, seed, shuffle window, input files. Rank 0 writes those settings to
`<output_dir>/data_order.json` (atomically) when a run starts, with `start_micro_step`: the
micro-step at which this data order began (0, or the step of a deliberate reset).

On resume, settings that differ from the recorded ones are refused in one line (UsageError)
rather than mapped: with another batch size or other files the records each rank consumed
are not a position of the new streams, and guessing one would silently repeat or drop data.
One change is expected instead of refused: the number of ranks alone (a preempted job
requeued on another node count, which NVIDIA's scripts resume): the weights and step resume
and the data order restarts on the new ranks, said in one line.
Dynamic masking draws each micro-batch's masks from (seed, rank, micro-batch number), so
its settings (--max_predictions_per_seq, --masked_lm_prob, --do_whole_word_mask) are part
of the order too: with other values the same position would be trained on other masks.
Files written before they were recorded lack them (`LATER_SETTINGS`): such a missing
setting is taken as unknown and compatible (a warning, then this run's value is recorded),
not as a default, because there is no default to assume: --max_predictions_per_seq is 20 in
phase 1 and 80 in phase 2, and refusing would strand every older output folder.
`reset=True` (pre-training's --reset_data_position) restarts the data order on purpose at the
checkpoint's micro-step. Every rank computes the same outcome from the same inputs, so it
does not matter whether it reads the file before or after rank 0 rewrites it.
"""
import json
import os

import tensorflow as tf
from absl import logging

from reporting.errors import UsageError
from resilience.atomic_files import read_json_object, write_json_atomically  # noqa: F401

DATA_ORDER_FILE = "data_order.json"
START = "start_micro_step"
RANKS = "ranks"
# Settings recorded only by later versions; an older file without them is not refused.
LATER_SETTINGS = ("max_predictions_per_seq", "masked_lm_prob", "do_whole_word_mask")


def read_json(path):
    """The JSON object in `path`, or None when it does not exist or is damaged (say which with
    `resilience.atomic_files.read_json_object`)."""
    return read_json_object(path)[0]


def _describe(settings, keys):
    return ", ".join(f"{key}={settings.get(key)}" for key in keys)


def resolve(output_dir, order, micro_step, reset=None, is_chief=True, saved_order=None):
    """The data order this run continues: `order` (settings of this run) plus START.

    `micro_step` is the resumed checkpoint's (0: nothing consumed yet). `reset` is None when
    the caller offers no way to reset (then the refusal does not suggest one). Only the chief
    (`is_chief`) says a restart on the console; other ranks log it. `saved_order`: the
    order recorded with the input state of that micro_step (`training.input_state`), which
    stands in for a missing or damaged DATA_ORDER_FILE. Raises UsageError when the
    checkpoint's data position cannot carry over to these settings.
    """
    if micro_step <= 0:
        return dict(order, **{START: 0})
    if reset:
        logging.warning("%s: --reset_data_position: the data order restarts from its "
                        "beginning at micro_step %d", output_dir, micro_step)
        return dict(order, **{START: micro_step})
    path = os.path.join(output_dir, DATA_ORDER_FILE)
    recorded, problem = read_json_object(path)
    if recorded is None:
        say = logging.warning if is_chief else logging.info  # one line on the console
        what = f"{path} is damaged ({problem})" if problem else f"{output_dir} has no {DATA_ORDER_FILE}"
        if saved_order is None:
            # Without any record, the position is recomputed from the step: START 0 is the
            # order's start unless a reset or a change of ranks moved it, which would then
            # re-read or skip that many micro-batches (never crash, never lose a checkpoint).
            say("%s: treated as missing and no input state records the data order of "
                "micro_step %d: assuming this run's data settings from micro_step 0", what,
                micro_step)
            return dict(order, **{START: 0})
        say("%s: treated as missing, using the data order recorded with the input state of "
            "micro_step %d", what, micro_step)
        recorded = saved_order
    unknown = sorted(key for key in LATER_SETTINGS if key in order and key not in recorded)
    if unknown:
        logging.warning("%s predates the recording of %s: assuming they were %s",
                        os.path.join(output_dir, DATA_ORDER_FILE), ", ".join(unknown),
                        _describe(order, unknown))
    # a setting only one side has differs too (but for the unknown ones)
    keys = (set(order) | set(recorded)) - {START} - set(unknown)
    changed = sorted(key for key in keys if recorded.get(key) != order.get(key))
    if changed == [RANKS]:
        # A job resubmitted on another node count (preempted on 4 nodes, requeued on 2), as
        # NVIDIA's scripts resume it: the weights and step carry over, the data order
        # restarts for the new ranks (no record position maps between the two layouts).
        say = logging.warning if is_chief else logging.info  # one line on the console
        say("%s: its data position (micro_step %d) was reached on %s and this run has "
            "%s: the weights and step resume, the data order restarts from its beginning on "
            "%s (records of the current epoch may be seen again)", output_dir,
            micro_step, _ranks(recorded.get(RANKS)), order.get(RANKS), _ranks(order.get(RANKS)))
        return dict(order, **{START: micro_step})
    if changed:
        remedy = "rerun with the recorded values or use a new --output_dir"
        if reset is not None:
            remedy += ", or pass --reset_data_position to restart the data order on purpose"
        raise UsageError(
            f"{output_dir}: its checkpoint's data position (micro_step {micro_step}) was "
            f"reached with {_describe(recorded, changed)} but this run has "
            f"{_describe(order, changed)}; {remedy}")
    return dict(order, **{START: int(recorded.get(START, 0))})


def record(output_dir, resolved):
    """Rank 0: stores the resolved order (only when it changed: resumes do not rewrite)."""
    path = os.path.join(output_dir, DATA_ORDER_FILE)
    if read_json(path) != resolved:
        tf.io.gfile.makedirs(output_dir)
        write_json_atomically(path, resolved)


def _ranks(count) -> str:
    return f"{count} rank" if count == 1 else f"{count} ranks"
