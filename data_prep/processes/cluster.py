"""Where data preparation's jobs run: this machine's worker processes, or a Dask cluster.

``bertPrep.py`` cuts every stage into jobs whose output depends only on their input (a byte
range to index, a shard to write, a shard to turn into records, each seeded by its own name),
so where a job runs cannot change a byte of the output. This module runs such jobs:

* ``--n_processes N`` alone: N worker processes on this machine (spawned, dying with us:
  ``worker_lifetime``), as before;
* ``--dask_scheduler ADDRESS|FILE``: the workers of a running Dask cluster (an address such as
  ``tcp://node1:8786``, or the scheduler file ``dask scheduler --scheduler-file F`` wrote; the
  Slurm script ``scripts/prep.sub`` starts one inside the allocation);
* ``--hosts a:8,b:8``: a Dask scheduler in this process and, over ``ssh`` (the user's own ssh,
  keys and config, and ``SSH_PORT`` when set, as ``horovodrun -H`` uses them via
  scripts/run.sub), ``dask worker`` with 8 single-threaded
  worker processes on each host; shut down at the end.

Why Dask (docs/data_preparation.md, "Why Dask"): it is LDDL's engine, it re-runs the jobs of a
worker or host that is lost (our jobs are idempotent, so a re-run is safe), it starts under
Slurm, ssh or anything that can run a command, and it speaks its own protocol: nothing here
schedules or talks on the wire. Every host must see the working dir at the same path (NFS,
Lustre...) and run the same Python; both are checked before the first job.

Jobs are module-level functions called with one tuple of arguments; results come back as the
jobs finish (any order). A job's exception comes back with its job; a job whose workers died
``distributed.scheduler.allowed-failures`` + 1 times (3 by default) comes back as a
``DataPrepError`` naming the job.

A scheduler file that is not one (not JSON, no ``"address"`` string) is one ``DataPrepError``
naming the file and what is wrong, before anything connects. A scheduler that stops answering
mid-run (killed, its node lost) ends the step with one ``DataPrepError`` naming its address
and how many of the step's jobs had finished, not one error per job blaming a worker; the
stages keep the parts their finished jobs wrote (``staging``: shards and formatted parts; the
record files are written whole), so a rerun of the same command resumes. Dask's own log lines
about the lost connection (tracebacks of its reconnection attempts) are silenced then: they
would bury that line.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shlex
import socket
import subprocess
import sys
import time
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

from data_prep.errors import DataPrepError
from data_prep.processes.worker_lifetime import die_with_parent, pool_context

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# How long to wait for a scheduler to answer, and for the workers to come up.
CONNECT_TIMEOUT_S = float(os.environ.get("BERT_PREP_CONNECT_TIMEOUT", "30"))
WORKERS_TIMEOUT_S = float(os.environ.get("BERT_PREP_WORKERS_TIMEOUT", "120"))
# The reason distributed's Client gives the futures it cancels when its scheduler connection
# closes (distributed/client.py, Client._reconnect).
SCHEDULER_LOST = "scheduler-connection-lost"
# distributed's handshake expects the scheduler's first batch to hold its one reply, but the
# scheduler sends every client's cancel to all clients: one batched (2 ms) with the reply fails
# the handshake with a bare AssertionError (distributed/client.py, Client._ensure_connected).
# Jobs sharing a scheduler cancel while another connects; the next try meets a quiet moment.
HANDSHAKE_ATTEMPTS = 5
_SCHEDULER_FILE_HELP = ("give the file `dask scheduler --scheduler-file FILE` writes, or the "
                        "scheduler's address such as tcp://host:8786")


@dataclasses.dataclass(frozen=True)
class ClusterOptions:
    """Where jobs run (see the module docstring)."""
    n_processes: int = 1
    dask_scheduler: str = ""          # address or scheduler file of a running Dask cluster
    hosts: Tuple[str, ...] = ()       # "host" or "host:workers" to start Dask workers on

    @property
    def distributed(self) -> bool:
        return bool(self.dask_scheduler or self.hosts)

    def validate(self) -> None:
        if self.dask_scheduler and self.hosts:
            raise DataPrepError("--hosts", "give --hosts or --dask_scheduler, not both")
        for host, slots in (parse_host(h) for h in self.hosts):
            if slots < 1:
                raise DataPrepError("--hosts", f"{host}: workers per host must be at least 1")


def parse_host(spec: str) -> Tuple[str, int]:
    """``"node1:8"`` -> ("node1", 8); ``"node1"`` -> ("node1", 0: --n_processes)."""
    host, _, slots = spec.strip().rpartition(":") if ":" in spec else (spec.strip(), "", "")
    if not host:
        raise DataPrepError("--hosts", f"empty host name in {spec!r}")
    try:
        return host, int(slots) if slots else 0
    except ValueError:
        raise DataPrepError("--hosts", f"{spec!r}: expected host or host:workers") from None


# --------------------------------------------------------------------------- this machine

def _call(function, job):
    return function(*job)


class LocalRunner:
    """Jobs in ``n_processes`` spawned worker processes of this machine (or in this process)."""

    def __init__(self, n_processes: int, initializer=None):
        self.n_processes = max(1, n_processes)
        self.initializer = initializer
        self.workers = self.n_processes

    def run(self, function: Callable, jobs: Sequence[tuple], names: Sequence[str]
            ) -> Iterator[Tuple[str, object, Optional[BaseException]]]:
        """(name, result, None) or (name, None, exception) per job, as jobs finish."""
        if self.n_processes <= 1 or len(jobs) <= 1:
            if self.initializer:
                self.initializer()
            for name, job in zip(names, jobs):
                try:
                    result = function(*job)
                except DataPrepError as e:
                    yield name, None, e
                    continue
                yield name, result, None
            return
        from concurrent.futures import ProcessPoolExecutor, as_completed
        with ProcessPoolExecutor(max_workers=min(self.n_processes, len(jobs)),
                                 mp_context=pool_context(), initializer=die_with_parent,
                                 initargs=(os.getpid(), self.initializer)) as pool:
            futures = {pool.submit(_call, function, job): name for name, job in zip(names, jobs)}
            for future in as_completed(futures):
                error = future.exception()
                if error is not None and not isinstance(error, DataPrepError):
                    raise error
                yield futures[future], (None if error else future.result()), error


# --------------------------------------------------------------------------- Dask

_JSON_KINDS = {dict: "an object", list: "a list", str: "a string", int: "a number",
               float: "a number", bool: "true/false", type(None): "null"}


def read_scheduler_file(path: str, attempts: int = 10, wait_s: float = 0.1) -> str:
    """The address in the scheduler file `path` (``{"address": "tcp://host:port", ...}``, as
    ``dask scheduler --scheduler-file`` writes it); a ``DataPrepError`` naming the file and what
    is wrong otherwise. An empty or cut-off file is read again for up to attempts x wait_s
    (a scheduler may be writing it, as distributed's Client allows for)."""
    for attempt in range(attempts):
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise DataPrepError("--dask_scheduler", f"{path}: cannot read the scheduler file: "
                                                    f"{e.strerror or e}") from None
        try:
            value = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            problem = ("empty" if not raw.strip() else "not text" if isinstance(
                e, UnicodeDecodeError) else f"not JSON ({str(e).splitlines()[0]})")
            if attempt + 1 < attempts:
                time.sleep(wait_s)
                continue
            break
        if not isinstance(value, dict):
            problem = f"holds {_JSON_KINDS.get(type(value), 'JSON')}, not an object with an \"address\""
        elif "address" not in value:
            problem = "has no \"address\""
        elif not isinstance(value["address"], str) or not value["address"].strip():
            shown = json.dumps(value["address"])
            problem = (f"its \"address\" is {shown[:60]}, not a string such as "
                       f"tcp://host:8786")
        else:
            return value["address"].strip()
        break
    raise DataPrepError("--dask_scheduler", f"{path} is not a Dask scheduler file ({problem}): "
                                            f"{_SCHEDULER_FILE_HELP}")


def _silence_dask_logs() -> None:
    """No more of distributed's log lines in this process: once its scheduler is gone, the
    Client logs a traceback for each reconnection attempt and again when it closes."""
    names = ["distributed"] + [name for name in logging.root.manager.loggerDict
                               if name.startswith("distributed.")]
    for name in names:
        logging.getLogger(name).disabled = True


def _close_half_open_client() -> None:
    """Close the Client whose handshake just failed: distributed makes a Client the default
    before it connects and closes it after an OSError, not after this AssertionError; left
    open, its event loop broke the next Client (`assert loop is not None` after 10 s)."""
    from distributed import default_client
    with contextlib.suppress(Exception):
        default_client().close()


def _worker_sees(path: str) -> Tuple[str, bool]:
    return socket.gethostname(), os.path.exists(path)


def _setup_plugin(initializer):
    """A Dask worker plugin calling `initializer` on every worker, also on workers that join
    after the run started (a late node of a Slurm job, a replacement for a lost worker)."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class Setup(WorkerPlugin):
        def setup(self, worker):
            initializer()

    return Setup()


class DaskRunner:
    """Jobs on the workers of a Dask cluster: one we connect to, or one we start over ssh."""

    def __init__(self, options: ClusterOptions, shared_dir: str, initializer=None):
        self.options = options
        self.shared_dir = shared_dir
        self.initializer = initializer
        self.client = None
        self.cluster = None
        self.ssh_workers: List[Tuple[str, subprocess.Popen]] = []
        self.workers = 0
        self.address = ""             # the scheduler's, once known

    @property
    def _flag(self) -> str:
        return "--hosts" if self.options.hosts else "--dask_scheduler"

    # -- start and stop
    def __enter__(self):
        try:
            import distributed  # noqa: F401
        except ImportError:
            raise DataPrepError("--hosts" if self.options.hosts else "--dask_scheduler",
                                "Dask is not installed (pip install 'dask[distributed]', "
                                "which scripts/install.sh does)") from None
        try:
            if self.options.hosts:
                self._start_over_ssh()
            else:
                self._connect(self.options.dask_scheduler)
            self._check_shared_dir()
            if self.initializer is not None:
                self.client.register_plugin(_setup_plugin(self.initializer),
                                            name=f"bertprep-setup-{self.initializer.__name__}")
        except DataPrepError:
            self.__exit__(None, None, None)
            raise
        except Exception as e:
            lost = self._scheduler_lost(e)
            self.__exit__(None, None, None)
            if lost:
                raise self._lost_error("", 0, 0) from None
            raise
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        if self.client is not None:
            with contextlib.suppress(Exception):
                if self.options.hosts:
                    self.client.shutdown()  # ours: the scheduler and every worker end
                else:
                    self.client.close()     # the user's cluster: left running
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.close()
        for _, process in self.ssh_workers:
            with contextlib.suppress(Exception):
                process.terminate()
                process.wait(timeout=10)
        return False

    def _connect(self, target: str) -> None:
        from distributed import Client
        if os.path.isfile(target):
            self.address = read_scheduler_file(target)
            where = f"address {self.address} (from the scheduler file {target})"
        elif "://" not in target and ":" not in target:
            raise DataPrepError("--dask_scheduler", f"{target}: no such scheduler file (and "
                                                    f"not an address such as tcp://host:8786)")
        else:
            self.address, where = target, f"address {target}"
        for attempt in range(1, HANDSHAKE_ATTEMPTS + 1):
            try:
                self.client = Client(self.address, timeout=f"{CONNECT_TIMEOUT_S}s")
                break
            except AssertionError:  # another client's cancel met our handshake (above)
                _close_half_open_client()
                if attempt == HANDSHAKE_ATTEMPTS:
                    raise DataPrepError("--dask_scheduler", f"the Dask scheduler at the {where} "
                                                            f"answered {attempt} handshakes out "
                                                            f"of turn (other clients cancelling "
                                                            f"jobs): try again") from None
            except (OSError, TimeoutError, ValueError) as e:
                first = str(e).splitlines()[0] if str(e) else ""
                raise DataPrepError("--dask_scheduler", f"no Dask scheduler answers at the "
                                                        f"{where} ({type(e).__name__}: {first})"
                                    ) from None
        self.workers = self._wait_for_workers(1, target)

    def _wait_for_workers(self, expected: int, where: str) -> int:
        deadline = time.monotonic() + WORKERS_TIMEOUT_S
        while True:
            count = len(self.client.scheduler_info(n_workers=-1).get("workers", {}))
            if count >= expected:
                return count
            dead = [f"{host}: {self._ssh_error(process)}" for host, process in self.ssh_workers
                    if process.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = "; ".join(dead) or (f"{count} of {expected} workers after "
                                          f"{WORKERS_TIMEOUT_S:.0f} s")
                raise DataPrepError(self._flag, f"the Dask workers of {where} did not start ({why})")
            time.sleep(0.5)

    @staticmethod
    def _ssh_error(process: subprocess.Popen) -> str:
        text = process.stderr.read().decode("utf-8", "replace") if process.stderr else ""
        lines = [line for line in text.strip().splitlines() if line.strip()]
        return lines[-1] if lines else f"ssh exited with status {process.returncode}"

    def _start_over_ssh(self) -> None:
        from distributed import Client, LocalCluster
        hosts = [parse_host(h) for h in self.options.hosts]
        # The scheduler listens on every interface; workers reach it at the address this
        # machine uses to reach the first host (the loopback for 127.0.0.x "hosts").
        # No dashboard; its HTTP server (always started) on a free port, not on 8787, which
        # another Dask on this machine may hold (a "Port 8787 is already in use" warning).
        self.cluster = LocalCluster(n_workers=0, host="0.0.0.0", scheduler_port=0,
                                    dashboard_address=None, processes=True,
                                    scheduler_kwargs={"dashboard_address": ":0"})
        port = self.cluster.scheduler.port
        address = f"tcp://{_route_to(hosts[0][0])}:{port}"
        self.address = address
        self.client = Client(self.cluster)
        # SSH_PORT: the hosts' sshd port, as scripts/run.sub passes it to horovodrun -p.
        port_of_sshd = os.environ.get("SSH_PORT", "").strip()
        ssh_port = ["-p", port_of_sshd] if port_of_sshd else []
        expected = 0
        for host, slots in hosts:
            workers = slots or max(1, self.options.n_processes)
            expected += workers
            command = (f"cd {shlex.quote(REPO_ROOT)} && TOKENIZERS_PARALLELISM=false exec "
                       f"{shlex.quote(sys.executable)} -m distributed.cli.dask_worker "
                       f"{address} --nworkers {workers} --nthreads 1 --no-dashboard "
                       f"--death-timeout 60 --name {shlex.quote(host)}")
            process = subprocess.Popen(["ssh", "-o", "BatchMode=yes", *ssh_port, host, command],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE)
            self.ssh_workers.append((host, process))
        self.workers = self._wait_for_workers(expected, ",".join(self.options.hosts))

    def _check_shared_dir(self) -> None:
        probe = os.path.join(self.shared_dir, f".bertprep-shared-{socket.gethostname()}-"
                                              f"{os.getpid()}")
        with open(probe, "w", encoding="ascii"):
            pass
        try:
            seen = self.client.run(_worker_sees, probe)
        finally:
            with contextlib.suppress(OSError):
                os.remove(probe)
        blind = sorted({host for host, sees in seen.values() if not sees})
        if blind:
            raise DataPrepError(self.shared_dir, f"not seen by the Dask workers on "
                                                 f"{', '.join(blind)} (every host needs the "
                                                 f"working dir at the same path: NFS, Lustre...)")

    # -- a scheduler that stops answering
    def _scheduler_lost(self, error: BaseException) -> bool:
        """Whether `error` (from a job's future or a call to the scheduler) means the
        scheduler is gone rather than the job failing: the Client cancelled the futures for a
        lost connection, or it is no longer connected."""
        if getattr(error, "reason", None) == SCHEDULER_LOST:
            return True
        return self.client is not None and self.client.status != "running"

    def _lost_error(self, step: str, done: int, total: int) -> DataPrepError:
        _silence_dask_logs()
        where = self.address or self.options.dask_scheduler
        finished = (f"{done} of {total} jobs of this step ({step}) had finished"
                    if total else "before any job ran")
        return DataPrepError(self._flag, f"the Dask scheduler at {where} stopped answering "
                                         f"({finished}): rerun the same command once a "
                                         f"scheduler runs (or with --n_processes instead of "
                                         f"{self._flag}); the parts already written are kept "
                                         f"and only the rest is done")

    # -- jobs
    def run(self, function: Callable, jobs: Sequence[tuple], names: Sequence[str]
            ) -> Iterator[Tuple[str, object, Optional[BaseException]]]:
        from distributed import as_completed
        from distributed.scheduler import KilledWorker
        futures = {}
        for name, job in zip(names, jobs):
            # pure=False and a unique key: a rerun of a job is run, never served from a cache.
            future = self.client.submit(function, *job, pure=False,
                                        key=f"{function.__name__}-{name}-{os.urandom(4).hex()}")
            futures[future] = name
        done = 0
        try:
            for future in as_completed(futures):
                name = futures[future]
                try:
                    result = future.result()
                except KilledWorker:
                    yield name, None, DataPrepError(name, "its Dask workers died every time it "
                                                          "ran (out of memory? see the workers' "
                                                          "logs)")
                    continue
                except DataPrepError as e:
                    yield name, None, e
                    continue
                except Exception as e:  # noqa: BLE001 - a worker's environment, not our input
                    if self._scheduler_lost(e):
                        raise self._lost_error(function.__name__, done, len(futures)) from None
                    first = str(e).splitlines()[0] if str(e) else ""
                    yield name, None, DataPrepError(name, f"failed on a Dask worker: "
                                                          f"{type(e).__name__}: {first}")
                    continue
                done += 1
                yield name, result, None
        except DataPrepError:
            raise
        except Exception as e:  # as_completed itself, when the connection goes
            if self._scheduler_lost(e):
                raise self._lost_error(function.__name__, done, len(futures)) from None
            raise
        finally:
            # Only what did not finish, in one call: the scheduler tells every client of each
            # cancel, and one arriving in another client's handshake fails it (above).
            pending = [future for future in futures if not future.done()]
            if pending:
                with contextlib.suppress(Exception):
                    self.client.cancel(pending)


def _route_to(host: str) -> str:
    """The address of this machine on the route to `host` (no packet is sent)."""
    try:
        target = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()


@contextlib.contextmanager
def job_runner(options: ClusterOptions, shared_dir: str, initializer=None):
    """A runner with ``run(function, jobs, names)`` and ``workers`` (how many run at once)."""
    options.validate()
    if not options.distributed:
        yield LocalRunner(options.n_processes, initializer)
        return
    with DaskRunner(options, shared_dir, initializer) as runner:
        yield runner


def describe(options: ClusterOptions, runner) -> str:
    """Where the jobs run, for the log: 'this machine, 4 processes' or 'Dask: 8 workers'."""
    if not options.distributed:
        return f"this machine, {runner.workers} process{'es' if runner.workers > 1 else ''}"
    where = ",".join(options.hosts) if options.hosts else options.dask_scheduler
    return f"Dask cluster {where}, {runner.workers} workers"
