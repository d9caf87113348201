"""Disk space for checkpoints: refuse a save that cannot fit, say how much is needed, and
remove what a failed write leaves behind.

Why: a full disk during a checkpoint ends the run with a TensorFlow traceback and leaves
`model.ckpt-N_temp/` (TensorFlow's sharded save writes there, then renames), `.tempstate`
files, `graph.pbtxt.tmp<hex>` and similar half-writes behind for good, taking space that
the next attempt needs too. So:
- `CheckpointSpaceListener` checks the free space before each save against what one
  checkpoint takes (the latest one's files in the folder, else the variables' and the
  graph's bytes) and
  stops the run with `DiskFullError` before writing anything: one line naming the folder,
  the space needed and the space free;
- a write that fails anyway (another process filled the disk, a write outside checkpoints)
  is recognised by `disk_full_cause` (ENOSPC, EDQUOT, EFBIG, and TensorFlow's errors that
  wrap them) and reported the same way by `resilience.failures`;
- `remove_partial_writes` deletes the half-writes, after such a failure and at the start of
  the next run. That is safe because one run owns an output folder (`resilience.run_lock`):
  nobody else is writing there.
Object stores (`gs://`, `s3://`) have no free-space figure; there only failures are caught.
"""
import errno
import os
import re

import tensorflow as tf

tf1 = tf.compat.v1

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_FULL_TEXTS = tuple(os.strerror(code) for code in _FULL_ERRNOS)
# Half-writes: a sharded Saver's `<prefix>_temp[_<uuid>]/` folder, a tensor bundle's
# `<file>.tempstate<n>`, TensorFlow's atomic writes `<file>.tmp<32 hex>` (graph.pbtxt,
# `checkpoint`), and this project's `<file>.tmp-<pid>` (data_order.json, markers).
_PARTIAL = re.compile(r"(-\d+_temp(_[0-9a-f]{32})?|\.tempstate\d+|\.tmp[0-9a-f]{32}|\.tmp-\d+)$")
_CHECKPOINT_FILE = re.compile(r"^(.*)-(\d+)\.(index|meta|data-\d+-of-\d+)$")


class DiskFullError(RuntimeError):
    """Not enough disk space (a RuntimeError: entry points print it in one line)."""


def disk_full_cause(err):
    """`<path>: No space left on device` (or TensorFlow's line saying so) when `err` is a
    disk-full error (ENOSPC, EDQUOT, EFBIG), else None."""
    if isinstance(err, OSError):
        if err.errno in _FULL_ERRNOS:
            return f"{err.filename or '?'}: {os.strerror(err.errno)}"
        return None
    if isinstance(err, tf.errors.OpError):
        for line in (err.message or "").splitlines():
            if any(text in line for text in _FULL_TEXTS):
                return line.strip()
    return None


def free_bytes(path):
    """Bytes free for this user on the filesystem of `path` (or its nearest existing
    parent); None for object stores."""
    if "://" in str(path):
        return None
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def megabytes(count):
    return f"{count / 1e6:.1f} MB"


def latest_checkpoint_bytes(model_dir):
    """(bytes, name) of the latest checkpoint's files in `model_dir`, or None."""
    latest = tf1.train.latest_checkpoint(model_dir) if tf.io.gfile.isdir(model_dir) else None
    if latest is None:
        return None
    files = tf.io.gfile.glob(latest + ".*")
    return sum(tf.io.gfile.stat(path).length for path in files), os.path.basename(latest)


def shortage(folder, need, basis, cause=None, subject="a checkpoint", remedy=None):
    """One line: what failed (`cause`, or the space check), how much `subject` needs
    (`need` bytes, estimated from `basis`) and how much is free, and what to do (`remedy`,
    by default: rerun to resume from the latest checkpoint in `folder`)."""
    free = free_bytes(folder)
    what = f"disk full ({cause})" if cause else f"not enough disk space for {subject}"
    figures = f"needs about {megabytes(need)} ({basis})" if need else "needs more space"
    if free is not None:
        figures += f", {megabytes(free)} free"
    if remedy is None:
        latest = tf1.train.latest_checkpoint(folder) if tf.io.gfile.isdir(folder) else None
        remedy = ("free space and rerun the same command to "
                  + (f"resume from {os.path.basename(latest)}" if latest else "start"))
    return f"{folder}: {what}: {subject} {figures}; {remedy}"


class CheckpointSpaceListener(tf1.train.CheckpointSaverListener):
    """Stops the run (DiskFullError) before a checkpoint save that would not fit in
    `model_dir`; `extra_bytes()` adds what is saved with it (e.g. the input state)."""

    def __init__(self, model_dir, extra_bytes=lambda: 0):
        self._model_dir = model_dir
        self._extra_bytes = extra_bytes
        self._first_bytes = None

    def begin(self):
        # Before the first checkpoint: its data file holds the variables, its .meta the graph.
        self._first_bytes = (sum(v.shape.num_elements() * v.dtype.base_dtype.size
                                 for v in tf1.global_variables())
                             + tf1.get_default_graph().as_graph_def().ByteSize())

    def need(self):
        """(bytes, basis) one more checkpoint takes here."""
        latest = latest_checkpoint_bytes(self._model_dir)
        need, basis = latest if latest else (self._first_bytes or 0, "the variables and graph")
        extra = self._extra_bytes()
        return need + extra, basis + (" and the input state" if extra else "")

    def before_save(self, session, global_step_value):
        free = free_bytes(self._model_dir)
        need, basis = self.need()
        if free is not None and free < need:
            raise DiskFullError(shortage(self._model_dir, need, basis))


def remove_partial_writes(folders):
    """Deletes the half-writes (see the module docstring) directly in each of `folders`;
    returns their paths."""
    removed = []
    for folder in folders:
        if not tf.io.gfile.isdir(folder):
            continue
        for name in tf.io.gfile.listdir(folder):
            name = name.rstrip("/")
            if _PARTIAL.search(name):
                path = os.path.join(folder, name)
                if tf.io.gfile.isdir(path):
                    tf.io.gfile.rmtree(path)
                else:
                    tf.io.gfile.remove(path)
                removed.append(path)
    return removed


def remove_unrecorded_checkpoints(model_dir):
    """Deletes checkpoint files of steps after the latest checkpoint recorded in
    `model_dir/checkpoint`: a save that failed (or was killed) after writing some of its
    files. They are never restored (the next save of that step rewrites them). Nothing is
    deleted when no checkpoint is recorded. Returns their paths."""
    state = tf1.train.get_checkpoint_state(model_dir) if tf.io.gfile.isdir(model_dir) else None
    if not state or not state.model_checkpoint_path:
        return []
    match = _CHECKPOINT_FILE.match(os.path.basename(state.model_checkpoint_path) + ".index")
    if not match:
        return []
    prefix, latest = match.group(1), int(match.group(2))
    removed = []
    for name in tf.io.gfile.listdir(model_dir):
        found = _CHECKPOINT_FILE.match(name)
        if found and found.group(1) == prefix and int(found.group(2)) > latest:
            tf.io.gfile.remove(os.path.join(model_dir, name))
            removed.append(os.path.join(model_dir, name))
    return removed
