"""One run per output folder: rank 0 holds `<output_dir>/.run.lock` for the life of the run.

Two runs writing one `--output_dir` overwrite each other's checkpoints and interleave one
events file while both report success. So the chief (rank 0; the other Horovod ranks never
write the folder's shared files and take no lock) locks the folder before it writes anything,
and a second run refuses in one line naming the holder (host, pid, start time, command):
`RunLockedError`, a `UsageError`, which the entry points print as `error: ...` and exit 1.

Why `fcntl.flock` on a lock file rather than an O_EXCL file plus a pid-liveness check: the
kernel drops a flock when its holder dies in any way (kill -9, OOM killer, node reboot), so
a dead run never blocks and no pid has to be guessed at: an O_EXCL file outlives a killed
holder, and a pid check is only possible on the holder's host and is fooled by pid reuse.
The holder's description is written into the lock file only to name it in the refusal; a
record left by a dead holder (same host, pid not running, or any host) is simply replaced
by the next run, which logs that it did. The lock file is removed when the run ends
(normally, by preemption's SIGTERM, or by an exception): `run_lock` releases it in a
`finally`.

Shared filesystems: on NFS, Linux emulates flock with POSIX byte-range locks, visible to
every client when NFS locking works (NFSv4, or lockd for v3); a `nolock` mount makes the
lock local to one host. Lustre honours flock across clients only when mounted with
`-o flock` (`localflock`: one host only); without either, flock fails with ENOSYS, and the
run proceeds unlocked with a warning (as before this lock existed) rather than refuse to
train. Object stores (`gs://`, `s3://`) have no locks: also a warning, no lock. The lock fd
is not inherited across exec; a child forked without exec shares it until it exits.
"""
import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time

from absl import logging

from reporting.errors import UsageError

LOCK_NAME = ".run.lock"
_UNSUPPORTED = {errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL}


class RunLockedError(UsageError):
    """Another live run holds the output folder."""


def _holder_record():
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "command": " ".join(sys.argv)}


def _read_record(fd):
    """The holder's record, or None when it is empty or unreadable (e.g. not written yet)."""
    try:
        record = json.loads(os.pread(fd, 1 << 16, 0).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def describe(record):
    """One line naming a holder: `pid P on HOST, started T: COMMAND`."""
    if not record:
        return "a process that has not written its record yet"
    command = " ".join(str(record.get("command", "?")).split())  # one line
    return (f"pid {record.get('pid', '?')} on {record.get('host', '?')}, started "
            f"{record.get('started', '?')}: {command}")


def _is_same_file(fd, path):
    """False when the holder we raced with removed (and maybe re-created) `path`."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


class RunLock:
    """The chief's hold on an output folder; `release` is idempotent."""

    def __init__(self, path, fd, created_dir):
        self.path, self._fd, self._created_dir = path, fd, created_dir

    def release(self):
        if self._fd is None:
            return
        try:
            if _is_same_file(self._fd, self.path):
                os.remove(self.path)  # while still locked: a waiting opener then retries
        finally:
            os.close(self._fd)
            self._fd = None
        if self._created_dir:  # a run that wrote nothing leaves no empty folder behind
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(self.path))


def acquire(output_dir):
    """Locks `output_dir` (created if missing) for this process and records the holder.

    Returns a `RunLock`, or None where the filesystem has no locks (a warning says so).
    Raises `RunLockedError` naming the holder when another live run has it."""
    if "://" in str(output_dir):
        logging.warning("%s: object stores have no locks; nothing stops a second run from "
                        "writing this folder", output_dir)
        return None
    created_dir = not os.path.isdir(output_dir)
    if os.path.exists(output_dir) and created_dir:
        raise UsageError(f"{output_dir}: is a file, not a folder: pass a folder as the output "
                         "folder")
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{output_dir}: cannot create the output folder "
                         f"({err.strerror or err})") from None
    path = os.path.join(output_dir, LOCK_NAME)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise UsageError(f"{output_dir}: cannot write to the output folder "
                             f"({err.strerror or err})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            record = _read_record(fd)
            for _ in range(20):  # the holder may have locked but not yet written its record
                if record:
                    break
                time.sleep(0.05)
                record = _read_record(fd)
            os.close(fd)
            raise RunLockedError(f"{output_dir} is in use by another run ({describe(record)}); "
                                 "wait for it to end or choose another --output_dir") from None
        except OSError as err:
            os.close(fd)
            if err.errno not in _UNSUPPORTED:
                raise
            logging.warning("%s: the filesystem does not support flock (%s; Lustre: mount "
                            "with -o flock); nothing stops a second run from writing this "
                            "folder", output_dir, os.strerror(err.errno))
            return None
        if _is_same_file(fd, path):
            break
        os.close(fd)  # locked a file its releasing holder had just removed: try again
    stale = _read_record(fd)
    if stale:
        logging.info("%s: replacing the lock record of a run that is gone (%s)", path,
                     describe(stale))
    data = json.dumps(_holder_record()).encode("utf-8")
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)
    return RunLock(path, fd, created_dir)


@contextlib.contextmanager
def run_lock(output_dir, is_chief=True):
    """Holds `output_dir`'s run lock for the `with` block on the chief; no-op on other ranks.
    Released however the block ends (return, preemption, exception)."""
    lock = acquire(output_dir) if is_chief else None
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()
