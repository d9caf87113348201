"""Wall time, CPU time and sampled memory of a command and of every process it starts.

The peers in bench/data_prep_peers.py are process trees, not one process: NVIDIA's bertPrep.py
starts its record writers through a shell and returns without waiting for all of them (it
waits only for every n_processes-th one and for the last), and LDDL runs under mpirun. To
charge each run with all of its work, this process makes itself the *child subreaper*
(Linux prctl PR_SET_CHILD_SUBREAPER): a grandchild whose parent exits is re-parented here
instead of to init, so it is still sampled, waited for (the stage ends when the last one
does) and its CPU time lands in this process's RUSAGE_CHILDREN.

Memory is sampled (psutil, every 0.2 s): each process's peak RSS under a role label, the
peak of the tree's summed RSS, and how many processes of a role ran at once. A process
shorter than the interval can be missed; a peak between samples is under-read.
"""
import ctypes
import os
import resource
import subprocess
import threading
import time

import psutil

PR_SET_CHILD_SUBREAPER = 36
SAMPLE_SECONDS = 0.2


def become_subreaper():
    """True when orphaned descendants will be re-parented to this process (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class StageFailed(RuntimeError):
    pass


class _Sampler(threading.Thread):
    def __init__(self, label):
        super().__init__(daemon=True)
        self.label = label          # psutil.Process -> role name
        self.roles = {}             # pid -> role (labelled once, at first sight)
        self.peak_by_role = {}      # role -> peak RSS bytes of one process
        self.peak_tree = 0          # peak of the summed RSS of all descendants
        self.max_concurrent = {}    # role -> most processes of that role alive at once
        self._halt = threading.Event()

    def run(self):
        me = psutil.Process()
        while not self._halt.is_set():
            self.sample(me)
            self._halt.wait(SAMPLE_SECONDS)

    def sample(self, me):
        total, alive = 0, {}
        for proc in me.children(recursive=True):
            try:
                if proc.pid not in self.roles:
                    self.roles[proc.pid] = self.label(proc)
                rss = proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            role = self.roles[proc.pid]
            total += rss
            alive[role] = alive.get(role, 0) + 1
            self.peak_by_role[role] = max(self.peak_by_role.get(role, 0), rss)
        self.peak_tree = max(self.peak_tree, total)
        for role, count in alive.items():
            self.max_concurrent[role] = max(self.max_concurrent.get(role, 0), count)

    def stop(self):
        self._halt.set()
        self.join()


def _reap_orphans():
    """Waits for every remaining child (re-parented orphans included)."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def run_stage(name, cmd, env, cwd, log_path, label=lambda proc: proc.name()):
    """Runs `cmd` (output appended to log_path) until it and all its descendants end.

    Returns {"wall", "cpu", "peak_rss_mb": {role: MB}, "peak_tree_rss_mb",
    "max_concurrent": {role: n}}; raises StageFailed naming the log when cmd fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler = _Sampler(label)
    t0 = time.perf_counter()
    with open(log_path, "ab") as log:
        log.write(f"\n$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        sampler.start()
        status = proc.wait()
        _reap_orphans()
    wall = time.perf_counter() - t0
    sampler.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if status != 0:
        raise StageFailed(f"{name} failed with status {status}; see {log_path}")
    mb = 1024.0 * 1024.0
    return {
        "wall": wall,
        "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "peak_rss_mb": {role: peak / mb for role, peak in sampler.peak_by_role.items()},
        "peak_tree_rss_mb": sampler.peak_tree / mb,
        "max_concurrent": dict(sampler.max_concurrent),
    }
