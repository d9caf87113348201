"""What a failed training or evaluation tells its user: one line, not a TensorFlow traceback.

Two failures come from the world rather than from a bug, so they are explained:
- the disk filled up (`resilience.disk_space`): DiskFullError naming the folder, what failed,
  the space one checkpoint needs and the space free, after removing the half-written files;
- a bad input record (unreadable framing, unparsable, a value out of range): TensorFlow's
  error names neither file nor record, so the files are scanned again for the first bad
  record (`resilience.record_scan`) and BadRecordError names it.
Under Horovod, the other ranks of a rank that failed so see only "Horovod has been shut
down" in their next collective: they say in one line that another rank failed
(PeerFailedError), and the failed rank's line says why.
Any other error is left as it is (a bug deserves its traceback).
"""
import contextlib

import tensorflow as tf
from absl import logging

from resilience.disk_space import DiskFullError, disk_full_cause, shortage
from resilience.record_scan import BadRecordError, locate_bad_record

_PEER_FAILED = "Horovod has been shut down"


class PeerFailedError(RuntimeError):
    """Another Horovod rank failed (a RuntimeError: entry points print it in one line)."""


# Lines of a TensorFlow graph-execution error that frame the cause rather than state it.
_OP_ERROR_FRAMING = ("Graph execution error", "Detected at node", "File ", "Node:", "[[")


def op_error_summary(err):
    """The line of a TensorFlow error that says what went wrong (e.g. "Read less bytes than
    requested"), without the Python stack TensorFlow 2.x puts before it."""
    for line in (err.message or "").splitlines():
        line = line.strip()
        if line and not line.startswith(_OP_ERROR_FRAMING):
            return line
    return type(err).__name__


def is_input_failure(err):
    """Whether a TensorFlow error was raised by the input pipeline's iterator (the failing
    op, or, for an error inside a dataset function, the iterator named in the message)."""
    op = getattr(err, "op", None)
    if op is not None and op.type.startswith("IteratorGetNext"):
        return True
    return "IteratorGetNext" in (err.message or "")


@contextlib.contextmanager
def explained_failures(output_dir, files, spec, value_ranges=None, space=None,
                       remove_leftovers=None):
    """Runs the `with` block, turning a disk-full error into DiskFullError and an input
    pipeline error into BadRecordError (the first bad record of `files`, read with `spec`
    and `value_ranges`). `space`: a `CheckpointSpaceListener` to say what a checkpoint needs;
    `remove_leftovers()`: deletes this process's half-written files (before the error)."""
    try:
        yield
    except (tf.errors.OpError, OSError) as err:
        cause = disk_full_cause(err)
        if cause is not None:
            if remove_leftovers is not None:
                for path in remove_leftovers():
                    logging.warning("removed a half-written file: %s", path)
            need, basis = space.need() if space is not None else (None, None)
            raise DiskFullError(shortage(output_dir, need, basis, cause)) from None
        if isinstance(err, tf.errors.OpError) and is_input_failure(err):
            logging.warning("reading the input failed (%s); scanning %d file(s) for the bad "
                            "record", op_error_summary(err), len(files))
            where = locate_bad_record(files, spec, value_ranges)
            if where is None:
                shown = files[0] + (f" and {len(files) - 1} other files" if len(files) > 1 else "")
                where = f"{shown}: reading the records failed: {op_error_summary(err)}"
            raise BadRecordError(where) from None
        if isinstance(err, tf.errors.OpError) and _PEER_FAILED in (err.message or ""):
            raise PeerFailedError(f"{output_dir}: this rank stopped because another rank "
                                  "failed (that rank's error line says why)") from None
        raise
