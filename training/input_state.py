"""Per-rank snapshots of the training input pipeline, so a resumed run continues its data
stream in O(1) instead of re-reading every record already trained on.

Choice: tf.data iterator checkpointing (`tf.data.experimental.make_saveable_from_iterator`,
what `CheckpointInputPipelineHook` does) rather than file-offset bookkeeping. The iterator
state holds everything that fixes the rest of the stream: the file-shuffle and
record-shuffle RNG states, the interleave's open files and their byte offsets, the shuffle
buffer's records and the batches already prefetched. Restoring it is exact by construction
and costs one read of the snapshot (about `shuffle_buffer` records), whatever the training
progress. File offsets alone cannot reproduce the shuffle buffer's contents, so they would
need a different (weaker or index-based) shuffle; iterator states keep today's data order.
`CheckpointInputPipelineHook` itself is not usable: it writes into the Estimator's
model_dir, which Horovod ranks other than 0 do not have, and saves on its own schedule.

Layout: `<output_dir>/input_state/rank-<r>/micro_step-<m>.{index,data-*,json}`. The key `m`
is the `micro_step` of the model checkpoint saved at the same moment (micro-batches this rank
consumed; unlike global_step it counts every micro-batch). Each rank saves its own states,
at every model checkpoint and at the end of training (normal end or preemption): rank 0 just
before each of the Estimator's model checkpoints (from its saver's listener), the other
ranks, which have no model saver, by applying the Estimator's rule themselves (every
`save_checkpoints_steps` global steps) at the end of the same step. The `.json` marker is
written last, via a temporary name and a rename, and names the data order the state belongs
to: a state is used only when its marker exists and matches, so a kill -9 in the middle of a
save leaves no usable half.

The marker also records how many records the saving run's pipeline skipped when it was built
(a run that resumed without a state skips what was consumed: `training.resume`). A saved
iterator restores only into a pipeline of the same structure, so a later resume builds the
pipeline with that same skip and restores the state over it: the state already holds the skip
as done, so nothing is re-read. (A pipeline built without the skip cannot take such a state:
that is how a second kill after a skipping resume once stopped the next resume.)
"""
import hashlib
import json
import os
import re

import tensorflow as tf
from absl import logging

from resilience.atomic_files import flush_to_disk, read_json_object, write_json_atomically
from training.train_step import MICRO_STEP_NAME

tf1 = tf.compat.v1

STATE_DIR = "input_state"
KEEP = 3
_NAME = re.compile(r"^micro_step-(\d+)\.(json|index|data-\d+-of-\d+)$")


def stream_id(order, files, pipeline_version):
    """Names the exact stream a snapshot belongs to: the resolved data order (with its start),
    the files' full paths, which the saved interleave state reopens by name, and the version
    of the pipeline's structure (a snapshot restores only into the same structure)."""
    text = json.dumps({"order": order, "files": list(files), "pipeline": pipeline_version},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


class InputStateStore:
    """One rank's snapshots in `<output_dir>/input_state/rank-<rank>`, keyed by micro_step
    and labelled with `order_id` (states of another data order are never used). Keeps the
    `keep` most recent: the latest model checkpoint may be older than the latest snapshot
    when a run was killed between the two writes."""

    def __init__(self, output_dir, rank, order_id, keep=KEEP, order=None):
        """`order_id`: the `stream_id` of this run's data (same on every rank); `order`: the
        resolved data order itself, recorded in each marker (`saved_order` reads it back
        when `data_order.json` is lost or damaged)."""
        self.directory = os.path.join(output_dir, STATE_DIR, f"rank-{rank}")
        self.order_id = order_id
        self.order = order
        self.keep = keep
        self.problem = None  # why the last `pipeline_skip` found no usable snapshot

    def path(self, micro_step):
        """Checkpoint prefix of the snapshot at `micro_step`."""
        return os.path.join(self.directory, f"micro_step-{micro_step}")

    def pipeline_skip(self, micro_step):
        """The records skipped when the pipeline of the committed snapshot at `micro_step` was
        built (rebuild it so to restore the snapshot), or None when there is no committed
        snapshot of this data order there. A damaged marker or snapshot (a crash before its
        data reached the disk) counts as none; `problem` then says what was wrong."""
        self.problem = None
        path = self.path(micro_step) + ".json"
        marker, problem = read_json_object(path)
        if problem is None and marker is not None and not (
                isinstance(marker.get("skip_records", 0), int)
                and isinstance(marker.get("files", {}), dict)):
            problem = "not an input-state marker"
        if problem:
            self.problem = f"{path} is damaged ({problem})"
            return None
        if not marker or marker.get("order_id") != self.order_id \
                or marker.get("micro_step") != micro_step:
            return None
        for name, size in marker.get("files", {}).items():  # absent from older markers
            path = os.path.join(self.directory, name)
            found = tf.io.gfile.stat(path).length if tf.io.gfile.exists(path) else None
            if found != size:
                self.problem = (f"{path} is damaged: {found} bytes, {size} when saved"
                                if found is not None else f"{path} is missing")
                return None
        return int(marker.get("skip_records", 0))

    def latest_bytes(self):
        """Size of the most recent committed snapshot (what the next one will take, about)."""
        if not tf.io.gfile.isdir(self.directory):
            return 0
        names = tf.io.gfile.listdir(self.directory)
        committed = [int(m.group(1)) for m in map(_NAME.match, names) if m and m.group(2) == "json"]
        if not committed:
            return 0
        prefix = f"micro_step-{max(committed)}."
        return sum(tf.io.gfile.stat(os.path.join(self.directory, name)).length
                   for name in names if name.startswith(prefix))

    def save(self, session, saver, micro_step, skip_records=0):
        """Saves the iterator through `saver` under `micro_step`, then commits the marker;
        `skip_records`: what the pipeline skipped when it was built."""
        tf.io.gfile.makedirs(self.directory)
        prefix = self.path(micro_step)
        if tf.io.gfile.exists(prefix + ".json"):  # a previous data order's: uncommit first
            tf.io.gfile.remove(prefix + ".json")
        saver.save(session, prefix, write_meta_graph=False, write_state=False)
        # the snapshot on the disk before the marker that makes it count, its sizes in the
        # marker (its iterator state is a variant: the index says nothing of its length)
        written = sorted(tf.io.gfile.glob(prefix + ".*"))
        flush_to_disk(written)
        marker = {"micro_step": micro_step, "order_id": self.order_id,
                  "skip_records": skip_records,
                  "files": {os.path.basename(path): tf.io.gfile.stat(path).length
                            for path in written}}
        if self.order is not None:
            marker["order"] = self.order
        write_json_atomically(prefix + ".json", marker)
        self._prune()
        return prefix

    def _prune(self):
        names = tf.io.gfile.listdir(self.directory)
        committed = sorted(int(m.group(1)) for m in map(_NAME.match, names)
                           if m and m.group(2) == "json")
        kept = set(committed[-self.keep:])
        doomed = [name for name in names
                  if not (_NAME.match(name) and int(_NAME.match(name).group(1)) in kept)]
        for name in sorted(doomed, key=lambda n: not n.endswith(".json")):  # markers first
            tf.io.gfile.remove(os.path.join(self.directory, name))


def saved_order(output_dir, micro_step):
    """The data order recorded with rank 0's input state at `micro_step` (every rank reads
    rank 0's, so all find the same), or None."""
    marker, _ = read_json_object(os.path.join(output_dir, STATE_DIR, "rank-0",
                                              f"micro_step-{micro_step}.json"))
    if not marker or marker.get("micro_step") != micro_step \
            or not isinstance(marker.get("order"), dict):
        return None
    return marker["order"]


def rank_directories(output_dir):
    """Every rank's snapshot folder under `output_dir`."""
    root = os.path.join(output_dir, STATE_DIR)
    if not tf.io.gfile.isdir(root):
        return []
    return [os.path.join(root, name.rstrip("/")) for name in sorted(tf.io.gfile.listdir(root))
            if name.startswith("rank-")]


def remove_uncommitted(directory):
    """Deletes one rank's snapshot files that have no committed marker (a save that failed
    or was killed half-way: never used, only taking space). Returns their paths."""
    if not tf.io.gfile.isdir(directory):
        return []
    names = tf.io.gfile.listdir(directory)
    committed = {m.group(1) for m in map(_NAME.match, names) if m and m.group(2) == "json"}
    doomed = [os.path.join(directory, name) for name in names
              if _NAME.match(name) and _NAME.match(name).group(1) not in committed]
    for path in doomed:
        tf.io.gfile.remove(path)
    return doomed


class _SaveBeforeModelCheckpoint(tf1.train.CheckpointSaverListener):
    """Rank 0: the Estimator's saver runs before any user hook, so the input state is saved
    from its listener, just before each model checkpoint: a model checkpoint is never on disk
    without the input state of its micro_step."""

    def __init__(self, save):
        self._save = save

    def before_save(self, session, global_step_value):
        self._save(session)


class InputStateHook(tf1.train.SessionRunHook):
    """Owns one rank's training iterator: creates it (`input_fn`), initialises it, restores
    the snapshot at `restore_micro_step` (if given), and saves snapshots into `store` with
    every model checkpoint and at the end of training (normal end or preemption).

    Rank 0 saves from `listener` (pass it to `Estimator.train(saving_listeners=...)`), just
    before the Estimator's model checkpoint. The other ranks have no Estimator saver; they
    apply its rule themselves: every `save_checkpoints_steps` global steps, counted from the
    resumed step (global steps are the same on every rank).
    """

    def __init__(self, store, save_checkpoints_steps, global_step, restore_micro_step=None,
                 is_chief=True, skip_records=0):
        """`global_step` and `restore_micro_step` are the resumed checkpoint's, read from the
        shared output folder: every rank starts from the same values as rank 0's Estimator,
        whatever order the hooks (and Horovod's broadcast) run in. `skip_records`: what the
        pipeline of `input_fn` skips when built (recorded with every snapshot)."""
        self._store = store
        self._skip_records = skip_records
        self._restore_micro_step = restore_micro_step
        every = save_checkpoints_steps if save_checkpoints_steps and not is_chief else None
        self._timer = tf1.train.SecondOrStepTimer(every_steps=every) if every else None
        self.listener = (_SaveBeforeModelCheckpoint(self._save)
                         if save_checkpoints_steps and is_chief else None)
        self._start_step = global_step
        self._iterator = None
        self._trained = False

    def input_fn(self, make_dataset):
        """An Estimator input_fn reading `make_dataset()` through an iterator this hook owns
        (the Estimator's own iterator would be out of reach of the saver)."""
        def input_fn():
            self._iterator = tf1.data.make_initializable_iterator(make_dataset())
            return self._iterator.get_next()
        return input_fn

    def begin(self):
        if self._iterator is None:
            raise RuntimeError("InputStateHook used without its input_fn")
        saveable = tf.data.experimental.make_saveable_from_iterator(
            self._iterator, external_state_policy="fail")
        self._saver = tf1.train.Saver([saveable], sharded=False, save_relative_paths=True)
        self._global_step = tf1.train.get_global_step()
        self._micro_step = next(v for v in tf1.global_variables()
                                if v.op.name == MICRO_STEP_NAME)

    def after_create_session(self, session, coord):
        session.run(self._iterator.initializer)
        self._last_saved = None
        if self._restore_micro_step is not None:
            path = self._store.path(self._restore_micro_step)
            try:
                self._saver.restore(session, path)
            except (tf.errors.OpError, ValueError) as err:
                message = str(getattr(err, "message", err)).splitlines()[0]
                raise RuntimeError(
                    f"cannot restore the input state {path} ({message}); delete "
                    f"{os.path.dirname(self._store.directory)} to resume by skipping the "
                    "records already trained on instead") from None
            self._last_saved = self._restore_micro_step
            logging.info("input state restored: %s", path)
        if self._timer:
            self._timer.update_last_triggered_step(self._start_step)

    def before_run(self, run_context):
        self._trained = True
        return tf1.train.SessionRunArgs(self._global_step) if self._timer else None

    def after_run(self, run_context, run_values):
        # The rule of the Estimator's CheckpointSaverHook: a cheap test on the global step
        # fetched with the training op, confirmed by reading it again after the step.
        if not self._timer or not self._timer.should_trigger_for_step(run_values.results + 1):
            return
        step = int(run_context.session.run(self._global_step))
        if self._timer.should_trigger_for_step(step):
            self._timer.update_last_triggered_step(step)
            self._save(run_context.session)

    def end(self, session):
        self._save(session)

    def _save(self, session):
        # Not before the first step: the Estimator's checkpoint at start-up (listener) comes
        # before this hook has set up the iterator, and marks no new position anyway.
        if not self._trained:
            return
        micro_step = int(session.run(self._micro_step))
        if micro_step == self._last_saved:
            return
        path = self._store.save(session, self._saver, micro_step, self._skip_records)
        self._last_saved = micro_step
        logging.info("input state saved: %s", path)
