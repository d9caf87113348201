"""The job-level record of what fixes the training data order and the global batch, checked
when a run resumes.

A checkpoint's `micro_step` (micro-batches each rank consumed) is a data position only for
the settings that produced it: number of ranks (which files each rank reads), per-rank batch
size, seed, shuffle window, input files. Rank 0 writes those settings to
`<output_dir>/data_order.json` (atomically) when a run starts, with `start_micro_step`: the
micro-step at which this data order began (0, or the step of a deliberate reset). With them it
records the other factors of the global batch (`--train_batch_size x --num_accumulation_steps
x ranks x --num_local_devices`): a resume with another accumulation reads the same records per
rank, but trains the rest of the run on a batch twice or half as large under a learning-rate
schedule made for the first, which nobody would notice until the loss curve disagrees.

On resume, settings that differ from the recorded ones are refused in one line (UsageError)
rather than mapped: with another batch size or other files the records each rank consumed
are not a position of the new streams, and guessing one would silently repeat or drop data;
another global batch is another recipe. One change is expected instead of refused: the
layout alone, ranks or local devices, with the global batch kept (a preempted job requeued on
another node count with the accumulation rescaled, as NVIDIA's multi-node settings and
scripts/run.sub do): the weights and step resume and the data order restarts on the new
ranks, said in one line.
Dynamic masking draws each micro-batch's masks from (seed, rank, micro-batch number), so
its settings (--max_predictions_per_seq, --masked_lm_prob, --do_whole_word_mask) are part
of the order too: with other values the same position would be trained on other masks.
Files written before they were recorded lack them (`LATER_SETTINGS`): such a missing
setting is taken as unknown and compatible (a warning, then this run's value is recorded),
not as a default, because there is no default to assume: --max_predictions_per_seq is 20 in
phase 1 and 80 in phase 2, accumulation 128 or 512, and refusing would strand every older
output folder. (Such a file's `train_batch_size` is what one rank read: local devices x the
flag; its local devices are taken as this run's.)
`reset=True` (pre-training's --reset_data_position) restarts the data order on purpose at the
checkpoint's micro-step, whatever changed (a global batch that changes is said). Every rank
computes the same outcome from the same inputs, so it does not matter whether it reads the
file before or after rank 0 rewrites it.
"""
import os

import tensorflow as tf
from absl import logging

from reporting.errors import UsageError
from resilience.atomic_files import read_json_object, write_json_atomically  # noqa: F401

DATA_ORDER_FILE = "data_order.json"
START = "start_micro_step"
RANKS = "ranks"
BATCH = "train_batch_size"
ACCUMULATION = "num_accumulation_steps"
DEVICES = "num_local_devices"
# The factors of the global batch, and those a requeue may change while keeping it.
GLOBAL_BATCH_FACTORS = (BATCH, ACCUMULATION, RANKS, DEVICES)
LAYOUT = (RANKS, DEVICES)
# Settings recorded only by later versions; an older file without them is not refused.
# (Fine-tuning's record flags: its training records are made at every start, and before they
# were recorded a change was refused as other input files, by their digest.)
LATER_SETTINGS = ("max_predictions_per_seq", "masked_lm_prob", "do_whole_word_mask",
                  ACCUMULATION, DEVICES, "max_seq_length", "doc_stride", "max_query_length",
                  "do_lower_case")
DIGEST = "input_files_sha256"


def job_order(stream_order, accumulation_steps=1, local_devices=1, record_flags=None):
    """This run's order: `stream_order` (`training.records.TrainingInput.order()`, whose
    `train_batch_size` is what one rank reads a micro-batch: local devices x the flag) with
    `train_batch_size` the flag's value and the global batch's other factors beside it;
    `record_flags` ({flag name: value}): the flags the caller made its training records with
    (fine-tuning's), so that a change is refused by name rather than by the files' digest."""
    order = dict(stream_order, **(record_flags or {}))
    order[BATCH] = int(order[BATCH]) // int(local_devices)
    order[ACCUMULATION] = int(accumulation_steps)
    order[DEVICES] = int(local_devices)
    return order


def global_batch(order):
    """Sequences an optimizer step of `order` trains on, or None when a factor is unknown."""
    if any(not isinstance(order.get(key), int) for key in GLOBAL_BATCH_FACTORS):
        return None
    return order[BATCH] * order[ACCUMULATION] * order[RANKS] * order[DEVICES]


def read_json(path):
    """The JSON object in `path`, or None when it does not exist or is damaged (say which with
    `resilience.atomic_files.read_json_object`)."""
    return read_json_object(path)[0]


def _describe(settings, keys):
    """`key=value, ...`; a digest shortened to 12 characters (enough to tell two apart)."""
    return ", ".join(f"{key}={str(settings.get(key))[:12] if key == DIGEST else settings.get(key)}"
                     for key in keys)


def resolve(output_dir, order, micro_step, reset=None, is_chief=True, saved_order=None):
    """The data order this run continues: `order` (settings of this run, `job_order`) plus
    START.

    `micro_step` is the resumed checkpoint's (0: nothing consumed yet). `reset` is None when
    the caller offers no way to reset (then the refusal does not suggest one). Only the chief
    (`is_chief`) says a restart on the console; other ranks log it. `saved_order`: the
    order recorded with the input state of that micro_step (`training.input_state`), which
    stands in for a missing or damaged DATA_ORDER_FILE. Raises UsageError when the
    checkpoint's data position or global batch cannot carry over to these settings.
    """
    if micro_step <= 0:
        return dict(order, **{START: 0})
    say = logging.warning if is_chief else logging.info  # one line on the console
    path = os.path.join(output_dir, DATA_ORDER_FILE)
    recorded, problem = read_json_object(path)
    if reset:
        before = global_batch(_as_now(recorded or saved_order or {}, order, ()))
        after = global_batch(order)
        change = (f", and the global batch changes from {before} to {after} sequences"
                  if before and after and before != after else "")
        say("%s: --reset_data_position: the data order restarts from its beginning at "
            "micro_step %d%s", output_dir, micro_step, change)
        return dict(order, **{START: micro_step})
    if recorded is None:
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
        logging.warning("%s predates the recording of %s: assuming they were %s", path,
                        ", ".join(unknown), _describe(order, unknown))
    recorded = _as_now(recorded, order, unknown)
    # a setting only one side has differs too
    keys = (set(order) | set(recorded)) - {START}
    changed = sorted(key for key in keys if recorded.get(key) != order.get(key))
    if changed and set(changed) <= set(LAYOUT + (ACCUMULATION,)):
        before, after = global_batch(recorded), global_batch(order)
        known = None not in (before, after) and not set(unknown) & {ACCUMULATION, DEVICES}
        if known and before != after:
            raise _global_batch_changed(output_dir, micro_step, recorded, order, reset)
        if set(changed) & set(LAYOUT):
            # A job resubmitted on another node count (preempted on 4 nodes, requeued on 2),
            # as NVIDIA's scripts resume it: the weights and step carry over, the data order
            # restarts for the new ranks (no record position maps between the two layouts).
            kept = (f" (global batch {after} kept: --{ACCUMULATION}={order[ACCUMULATION]})"
                    if known else "")
            say("%s: its data position (micro_step %d) was reached on %s and this run has "
                "%s%s: the weights and step resume, the data order restarts from its "
                "beginning on %s (records of the current epoch may be seen again)", output_dir,
                micro_step, _layout(recorded, order), _layout(order, recorded, short=True),
                kept, _layout(order, recorded))
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


def _as_now(recorded, order, unknown):
    """`recorded` with its `unknown` settings taken as this run's; a file without DEVICES
    recorded `train_batch_size` as local devices x the flag, with as many devices as now."""
    recorded = dict(recorded, **{key: order[key] for key in unknown if key in order})
    devices = order.get(DEVICES, 1)
    if DEVICES in unknown and isinstance(recorded.get(BATCH), int) \
            and recorded[BATCH] % devices == 0:
        recorded[BATCH] //= devices
    return recorded


def _global_batch_changed(output_dir, micro_step, recorded, order, reset):
    """The refusal of a resume whose global batch differs from the checkpoint's."""
    changes = []
    for key in GLOBAL_BATCH_FACTORS:
        if recorded[key] != order[key]:
            now = _ranks(order[key]) if key == RANKS else f"--{key}={order[key]}"
            changes.append(f"{now} where it had {recorded[key]}")
    before = global_batch(recorded)
    per_step = order[BATCH] * order[RANKS] * order[DEVICES]
    remedy = (f"pass --{ACCUMULATION}={before // per_step} to keep it" if before % per_step == 0
              else "rerun with the recorded values")
    if reset is not None:
        remedy += ", pass --reset_data_position to change it on purpose"
    return UsageError(
        f"{output_dir}: its checkpoint (micro_step {micro_step}) was trained with a global "
        f"batch of {before} sequences ({_factors(recorded, order)}) and this run's would be "
        f"{global_batch(order)} ({', '.join(changes)}); {remedy}, or start over "
        "(--start_over, or a new --output_dir)")


def _factors(settings, other):
    text = (f"--{BATCH}={settings[BATCH]} x --{ACCUMULATION}={settings[ACCUMULATION]} x "
            f"{_ranks(settings[RANKS])}")
    if settings[DEVICES] > 1 or other[DEVICES] > 1:
        text += f" x --{DEVICES}={settings[DEVICES]}"
    return text


def _layout(settings, other, short=False):
    """'2 ranks', or '2 ranks x 2 local devices' when either side had several; `short`:
    without the word 'ranks' ('2')."""
    count = settings.get(RANKS)
    text = str(count) if short else _ranks(count)
    if max(settings.get(DEVICES) or 1, other.get(DEVICES) or 1) > 1:
        text = f"{_ranks(count)} x {settings.get(DEVICES)} local device(s)"
    return text


def record(output_dir, resolved):
    """Rank 0: stores the resolved order (only when it changed: resumes do not rewrite)."""
    path = os.path.join(output_dir, DATA_ORDER_FILE)
    if read_json(path) != resolved:
        tf.io.gfile.makedirs(output_dir)
        write_json_atomically(path, resolved)


def _ranks(count) -> str:
    return f"{count} rank" if count == 1 else f"{count} ranks"
