"""Work handed to forked processes, with its result back in order: the two cores of
``create_pretraining_data.py``.

Two stages of writing pre-training records run in several processes: tokenizing (each line on
its own, so the lines are cut into contiguous parts, one a process: ``map_in_processes``) and
building the batches of instances (batch k in process k % n, each helper sending back its
batches' bytes as it goes: ``ForkedStream``; packed batches, built here, are serialised by one
``ForkedWorker`` while the next is built). Results come back in order, so the output is the
same for any number of processes.

Why fork here when the pools of ``bertPrep.py`` spawn (``data_prep.processes.worker_lifetime``): a
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

from data_prep.processes.worker_lifetime import die_with_parent


def fork_is_safe() -> bool:
    """True when a fork cannot inherit a lock held by another thread (see the docstring)."""
    return (hasattr(os, "fork") and threading.active_count() == 1
            and "tensorflow" not in sys.modules)


def map_in_processes(function, parts):
    """``[function(part) for part in parts]``, the first part here and each other one in a
    forked helper at the same time. The caller checks ``fork_is_safe()`` first."""
    helpers = []
    try:
        for part in parts[1:]:
            helpers.append(ForkedWorker(function, part))
        results = [function(parts[0])] if parts else []
        results.extend(helper.first.result() for helper in helpers)
    finally:
        for helper in helpers:
            helper.close(kill=True)  # only those still there: the others are reaped
    return results


def _start_helper(parent, *caller_ends):
    """First steps of a forked helper: close the caller's ends of the pipes, drop the
    caller's signal handlers (SIGINT/SIGTERM end a helper at once), die with the caller."""
    for fd in caller_ends:
        os.close(fd)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    die_with_parent(parent)


# What a helper that failed gives instead of its value: the caller computes it itself.
FAILED = object()


class _ForkedHelper:
    """What every forked helper shares: its pid, our ends of its pipes (``self.pipes``), and
    how it fails (a warning; the caller does its work) and ends."""

    pid = None
    pipes = ()
    failed = None  # why the helper is no longer used

    def _fork(self, helper_body, helper_ends, caller_ends):
        """Forks the helper, which closes `caller_ends`, runs `helper_body()` and exits
        (status 0 when it returned, 1 when it raised); here, closes `helper_ends`."""
        # Rust's thread pool (tokenizers) must not be in use across a fork, and with one
        # process a core it has nothing to do anyway; set before the first helper exists.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the helper: never returns into the caller's code
            status = 1
            try:
                _start_helper(parent, *caller_ends)
                helper_body()
                status = 0
            finally:
                os._exit(status)
        for fd in helper_ends:
            os.close(fd)
        self.pid = pid

    def _take(self, function):
        """The helper's next value (from ``self.outbox``), or ``FAILED`` once it has failed
        (then warned about, and ended) while computing ``function``'s."""
        if self.failed is None:
            try:
                return pickle.load(self.outbox)
            except EOFError:  # its end of the pipe closes when it ends
                self._fail(f"exit status {self.close()}", function)
            except (OSError, pickle.UnpicklingError) as e:
                self._fail(f"{type(e).__name__}: {e}", function)
        return FAILED

    def _fail(self, problem, function):
        self.failed = problem
        name = getattr(getattr(function, "func", function), "__name__", "?")
        logging.warning("a helper process failed (%s); doing its work (%s) here", problem,
                        name)
        self.close(kill=True)

    def close(self, kill=False):
        """Ends the helper (killed with ``kill``: we stop early, or it failed) and reaps it.
        Returns its exit code (negative: the signal that ended it; None if reaped before)."""
        for pipe in self.pipes:
            try:
                pipe.close()
            except OSError:
                pass
        if self.pid is None:
            return None
        pid, self.pid = self.pid, None
        if kill:
            os.kill(pid, signal.SIGKILL)  # it cannot be gone: only waitpid reaps it
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


class ForkedWorker(_ForkedHelper):
    """One forked helper that runs calls in order: ``function(*args)`` given here (computed
    from the memory it shares with us: nothing is sent), then each call sent to it by
    ``submit``. For a stream of work (the serialisation of each batch) one helper serves
    all: a fork per call would cost more than it saves (after each fork, every page this
    process writes is first copied).

    ``first`` and ``submit(function, *args)`` are calls whose ``result()`` waits for the
    value (a submitted function is pickled by name, its arguments and every value by
    value). Submit the next call only after taking the previous result: both pipes can then
    never be full at once. A helper that fails costs time, not output: its call and every
    later one run here, with a warning.
    """

    def __init__(self, function=None, *args):
        inbox_read, inbox_write = os.pipe()
        outbox_read, outbox_write = os.pipe()

        def serve():
            with os.fdopen(inbox_read, "rb") as inbox, os.fdopen(outbox_write, "wb") as outbox:
                call = (function, args) if function is not None else _receive(inbox)
                while call is not None:
                    pickle.dump(call[0](*call[1]), outbox, protocol=pickle.HIGHEST_PROTOCOL)
                    outbox.flush()
                    call = _receive(inbox)

        self._fork(serve, (inbox_read, outbox_write), (inbox_write, outbox_read))
        self.inbox = os.fdopen(inbox_write, "wb")
        self.outbox = os.fdopen(outbox_read, "rb")
        self.pipes = (self.inbox, self.outbox)
        self.first = None if function is None else _WorkerCall(self, function, args, True)

    def submit(self, function, *args):
        if self.failed is None:
            try:
                pickle.dump((function, args), self.inbox, protocol=pickle.HIGHEST_PROTOCOL)
                self.inbox.flush()
            except OSError as e:  # the helper is gone (BrokenPipeError)
                self._fail(f"{type(e).__name__}: {e}", function)
        return _WorkerCall(self, function, args, sent=self.failed is None)


class ForkedStream(_ForkedHelper):
    """A forked helper that runs ``generator_function(*args)`` (computed from the memory it
    shares with us: nothing is sent) and sends back each value it yields, in order; ``next()``
    returns them one by one. The helper yields its next value while we use the last one, and
    waits (a full pipe) until we take it, so at most one value is ever on its way.

    A helper that fails (out of memory, killed) costs time, not output: ``next()`` then
    returns ``FAILED`` for this value and every later one, with a warning, and the caller
    computes them itself.
    """


    def __init__(self, generator_function, *args):
        outbox_read, outbox_write = os.pipe()

        def stream():
            with os.fdopen(outbox_write, "wb") as outbox:
                for value in generator_function(*args):
                    pickle.dump(value, outbox, protocol=pickle.HIGHEST_PROTOCOL)
                    outbox.flush()

        self._fork(stream, (outbox_write,), (outbox_read,))
        self.outbox = os.fdopen(outbox_read, "rb")
        self.pipes = (self.outbox,)
        self.function = generator_function

    def next(self):
        """The next value the helper yields, or ``FAILED``."""
        return self._take(self.function)


def _receive(inbox):
    """The next (function, args) sent to a helper; None when the caller closed the pipe."""
    try:
        return pickle.load(inbox)
    except EOFError:
        return None


class _WorkerCall:
    """A call of a ``ForkedWorker`` (its first, or one submitted)."""

    def __init__(self, worker, function, args, sent):
        self.worker, self.function, self.args, self.sent = worker, function, args, sent

    def result(self):
        value = self.worker._take(self.function) if self.sent else FAILED
        return self.function(*self.args) if value is FAILED else value
