"""Work handed to forked processes, with its result back in order: the two cores of
``create_pretraining_data.py``.

Two stages of writing pre-training records can run beside the rest: tokenizing (each line on
its own, so the lines are cut into contiguous parts, one a process) and serialising a batch of
instances (while this process builds the next one). Results come back in order, so the output
is the same for any number of processes.

Why fork here when the pools of ``bertPrep.py`` spawn (``data_prep.worker_lifetime``): a
spawned helper needs about 0.3 s to import and to build its tokenizer, as long as the work it
would take over on a 3 MB shard; a forked one shares the tokenizer and the data and starts at
once. A fork is only safe when this process has no other thread (a thread holding a lock at
the fork leaves it held for ever in the child), so callers fork only when ``fork_is_safe()``:
Python sees one thread and TensorFlow is not loaded. Otherwise they do the work themselves.

A helper asks the kernel to kill it when we die (``die_with_parent``), sends its result back
through a pipe (pickled), and is killed and reaped if we stop early. A helper that fails (out
of memory, killed) costs time, not output: its work is done here instead, with a warning.
"""
import os
import pickle
import signal
import sys
import threading

from absl import logging

from data_prep.worker_lifetime import die_with_parent


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which Slurm and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def fork_is_safe() -> bool:
    """True when a fork cannot inherit a lock held by another thread (see the docstring)."""
    return (hasattr(os, "fork") and threading.active_count() == 1
            and "tensorflow" not in sys.modules)


def prepare_to_fork():
    """Call before the first fork of a run. Rust's thread pool (tokenizers) must not be in
    use across a fork, and with one process a core it has nothing to do anyway."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def map_in_processes(function, parts):
    """``[function(part) for part in parts]``, the first part here and each other one in a
    forked helper at the same time. The caller checks ``fork_is_safe()`` first."""
    helpers = []
    try:
        for part in parts[1:]:
            helpers.append(ForkedCall(function, part))
        results = [function(parts[0])] if parts else []
        results.extend(helper.result() for helper in helpers)
    finally:
        for helper in helpers:
            helper.stop()
    return results


class ForkedCall:
    """``function(*args)`` computed in a forked helper; ``result()`` waits for its value."""

    def __init__(self, function, *args):
        self.function, self.args = function, args
        parent = os.getpid()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the helper: never returns into the caller's code
            status = 1
            try:
                os.close(read_end)
                for sig in (signal.SIGINT, signal.SIGTERM):  # not the caller's handlers
                    signal.signal(sig, signal.SIG_DFL)
                die_with_parent(parent)
                value = function(*args)
                with os.fdopen(write_end, "wb") as writer:
                    pickle.dump(value, writer, protocol=pickle.HIGHEST_PROTOCOL)
                status = 0
            finally:
                os._exit(status)
        os.close(write_end)
        self.pid = pid
        self.reader = os.fdopen(read_end, "rb")

    def result(self):
        """The helper's value; computed here instead if the helper failed."""
        try:
            value = pickle.load(self.reader)
            status = self.stop(wait=True)
            if not status:
                return value
            problem = f"exit status {status}"
        except EOFError:  # its end of the pipe closes when it ends
            problem = f"exit status {self.stop(wait=True)}"
        except (OSError, pickle.UnpicklingError) as e:
            problem = f"{type(e).__name__}: {e}"
        self.stop()  # kills a helper that is still there after sending garbage
        name = getattr(getattr(self.function, "func", self.function), "__name__", "?")
        logging.warning("a helper process failed (%s); doing its work (%s) here", problem,
                        name)
        return self.function(*self.args)

    def stop(self, wait=False):
        """Closes the pipe and reaps the helper: waits for it with ``wait``, else kills it
        first (we stop early on an error). Returns its exit code (negative: the signal that
        ended it; None if reaped before)."""
        self.reader.close()
        if self.pid is None:
            return None
        pid, self.pid = self.pid, None
        if not wait:
            os.kill(pid, signal.SIGKILL)  # it cannot be gone: only waitpid reaps it
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
