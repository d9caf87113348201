"""A real Dask cluster on this machine for the tests: Dask's own scheduler and workers, started
as a user starts them (`python -m distributed.cli.dask_scheduler --scheduler-file F`,
`dask_worker --scheduler-file F`) on 127.0.0.1 and stopped by pid. Workers are added in
groups, with their own environment (e.g. a pause point) and without a nanny when a test kills
one for good; the scheduler's task stream tells which jobs ran on which worker."""
import json
import os
import pathlib
import subprocess
import sys
import time

import distributed
from distributed.diagnostics.plugin import SchedulerPlugin

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)


class HandshakeSpoiler(SchedulerPlugin):
    """The next `count` clients to connect meet another client's cancel in their handshake:
    the scheduler tells every client of each cancel, and this one is queued after the new
    client's reply ("stream-start") and before that reply's batch is flushed, so both arrive
    together, which distributed's Client does not expect (Client._ensure_connected). By chance,
    this needs jobs sharing a scheduler, one cancelling as another connects."""

    name = "handshake-spoiler"

    def __init__(self, count):
        self.count = count
        self.spoiled = 0

    def add_client(self, scheduler, client):
        if self.spoiled < self.count:
            self.spoiled += 1
            scheduler.loop.add_callback(scheduler.report, {
                "op": "cancelled-keys", "keys": [], "reason": "test", "msg": ""})


class DaskCluster:
    """A scheduler and workers as child processes on 127.0.0.1, stopped by pid."""

    def __init__(self, folder):
        self.folder = pathlib.Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.scheduler_file = str(self.folder / "scheduler.json")
        self.processes = []
        self.workers = 0
        self._start("scheduler", ["distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                  "--port", "0", "--no-dashboard"])
        deadline = time.monotonic() + 60
        while not os.path.exists(self.scheduler_file):
            assert time.monotonic() < deadline, "the Dask scheduler did not start"
            time.sleep(0.1)
        self.client = distributed.Client(scheduler_file=self.scheduler_file, timeout="60s")

    def _start(self, name, args, env=None):
        log = open(self.folder / f"{name}-{len(self.processes)}.log", "wb")
        process = subprocess.Popen(
            [sys.executable, "-m"] + args + ["--scheduler-file", self.scheduler_file],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, TESTS]), **(env or {})))
        log.close()
        self.processes.append(process)
        return process

    def add_workers(self, count, env=None, nanny=True):
        # --death-timeout: a worker whose scheduler is gone (a test or bench killed before
        # its clean-up) ends by itself instead of running on.
        process = self._start("worker", ["distributed.cli.dask_worker", "--nworkers",
                                         str(count), "--nthreads", "1", "--no-dashboard",
                                         "--death-timeout", "60"]
                              + ([] if nanny else ["--no-nanny"]), env)
        self.workers += count
        self.client.wait_for_workers(self.workers, timeout=60)
        return process

    def kill(self, process, lost_workers):
        process.kill()
        process.wait(timeout=30)
        self.workers -= lost_workers

    def kill_scheduler(self):
        """kill -9 of the scheduler; this harness's own client is closed first (it would
        try to reconnect, and log, until its timeout)."""
        self.client.close()
        self.client = None
        self.processes[0].kill()
        self.processes[0].wait(timeout=30)

    @property
    def address(self):
        with open(self.scheduler_file, encoding="utf-8") as f:
            return json.load(f)["address"]

    @property
    def worker_processes(self):
        return self.processes[1:]

    def spoil_handshakes(self, count):
        """Install a HandshakeSpoiler for the next `count` clients; returns a callable that
        says how many it has spoiled."""
        self.client.register_plugin(HandshakeSpoiler(count))
        return lambda: self.client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.plugins[HandshakeSpoiler.name].spoiled)

    def task_cursor(self):
        return self.client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.get_task_stream_index())

    def format_tasks_since(self, cursor):
        """The text_formatting jobs that ran since `cursor`: [(key, worker address)]."""
        records = self.client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.get_task_stream(start_index=cursor))
        return [(r["key"], r["worker"]) for r in records
                if str(r["key"]).startswith("format_part-")]

    def close(self):
        if self.client is not None:
            self.client.close()
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
