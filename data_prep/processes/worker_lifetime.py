"""Pool workers that die with the process that started them.

Killing ``bertPrep.py`` (kill -9, OOM killer, a scheduler's time limit) used to leave its
pool workers running: re-parented to init, they went on writing shards nobody would rename,
then hung on a result queue with no reader. A worker cannot notice that by itself, so each
pool passes ``die_with_parent`` as its initializer with the parent's pid as argument::

    Pool(n, initializer=die_with_parent, initargs=(os.getpid(),))

On Linux the initializer asks the kernel for SIGKILL when the parent dies
(``prctl(PR_SET_PDEATHSIG)``). SIGKILL rather than SIGTERM: workers inherit the parent's
signal handlers under fork, and a handler could swallow SIGTERM; a killed worker's
``*.tmp-<pid>`` output is removed by the next run (``data_prep.processes.temporaries``). The parent
can die before the worker's prctl call, in which case no signal ever comes: the worker then sees
that its parent is no longer the original one and exits at once. Elsewhere (macOS, Windows)
there is no such request and the initializer does nothing but the same check.

Workers are started with the "spawn" method (`pool_context`): a fresh interpreter, not a
fork of the parent. A fork copies only the forking thread, so a parent that has other threads
(tqdm's monitor, or TensorFlow's when a test or a notebook calls the actions in-process) can
hand a worker a lock held forever; the worker then hangs in its first malloc or log call and
the pool waits for it. Spawned workers are still the parent's children (the death signal and
the check below hold) and cost about half a second each to start.

Caveat: the kernel signals when the *thread* that forked the worker ends. Both pools used here
start their workers from the main thread (``multiprocessing.Pool`` re-spawns a crashed worker
from its handler thread, which lives as long as the pool).
"""
import ctypes
import ctypes.util
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _request_death_signal(sig):
    """prctl(PR_SET_PDEATHSIG, sig); raises OSError if the kernel refuses."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def pool_context():
    """The multiprocessing context every pool of data preparation uses ("spawn", see the
    module docstring)."""
    import multiprocessing
    return multiprocessing.get_context("spawn")


def die_with_parent(parent_pid, initializer=None, *initargs):
    """Pool initializer: this process ends when ``parent_pid`` does; then ``initializer``."""
    if sys.platform.startswith("linux"):
        _request_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the request: nobody to serve
        os._exit(1)
    if initializer is not None:
        initializer(*initargs)
