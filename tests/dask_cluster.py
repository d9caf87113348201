"""A real Dask cluster on this machine for the tests: Dask's own scheduler and workers, started
as the user starts them (`dask scheduler --scheduler-file F`, `dask worker --scheduler-file F`),
stopped by pid. Workers can be added one by one (with their own environment, e.g. a pause
point) and killed."""
import json
import os
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class LocalDask:
    def __init__(self, folder):
        self.folder = str(folder)
        os.makedirs(self.folder, exist_ok=True)
        self.scheduler_file = os.path.join(self.folder, "scheduler.json")
        self.processes = []

    def _start(self, args, log, env=None):
        full_env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2",
                        TOKENIZERS_PARALLELISM="false")
        full_env.update(env or {})
        process = subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, env=full_env,
                                   stdout=subprocess.DEVNULL,
                                   stderr=open(os.path.join(self.folder, log), "ab"))
        self.processes.append(process)
        return process

    def start(self, timeout=60):
        self._start(["distributed.cli.dask_scheduler", "--scheduler-file", self.scheduler_file,
                     "--host", "127.0.0.1", "--port", "0", "--no-dashboard"], "scheduler.log")
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.scheduler_file):
            if time.monotonic() > deadline:
                raise RuntimeError("the Dask scheduler did not start: "
                                   + open(os.path.join(self.folder, "scheduler.log")).read())
            time.sleep(0.2)
        return self

    @property
    def address(self):
        with open(self.scheduler_file, encoding="utf-8") as f:
            return json.load(f)["address"]

    def add_worker(self, env=None, nanny=True, name=None):
        """One single-threaded worker process; returns its Popen (with --no-nanny, the worker
        itself, so killing it loses the worker for good)."""
        args = ["distributed.cli.dask_worker", "--scheduler-file", self.scheduler_file,
                "--nthreads", "1", "--no-dashboard"]
        if not nanny:
            args.append("--no-nanny")
        if name:
            args += ["--name", name]
        return self._start(args, f"worker-{len(self.processes)}.log", env)

    def workers(self):
        from distributed import Client
        with Client(scheduler_file=self.scheduler_file, timeout="30s") as client:
            return len(client.scheduler_info(n_workers=-1)["workers"])

    def wait_for_workers(self, count, timeout=90):
        deadline = time.monotonic() + timeout
        while self.workers() < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {count} Dask workers after {timeout} s")
            time.sleep(0.3)

    def stop(self):
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
