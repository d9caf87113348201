"""A real one-node Slurm for tests: slurm-wlm's slurmctld and slurmd with their own munged,
all on the loopback address, with every file (configuration, key, socket, state, spool, logs)
in one temporary folder.

scripts/run.sub is a Slurm batch script; a stub `scontrol` proves only our side of it. Under a
real Slurm the script runs as a copy in slurmd's spool folder, in the submit directory, with
Slurm's own environment (SLURM_JOB_NODELIST, SLURM_NTASKS_PER_NODE, ...) and signals sent by
slurmstepd, which is what this cluster lets a test exercise. The daemons run in the
foreground as children of the test process, so stopping them is a kill by pid and nothing is
left behind; nothing of the machine's own Slurm or munge set-up is read or changed.

`SlurmCluster.start()` raises `SlurmUnavailable` (with the reason, for pytest.skip) when this
machine cannot run one: not root (slurmd starts jobs as their user), the packages missing
(`bash scripts/install.sh --test-services` installs them as root), or a daemon that does not
come up (the reason carries the tail of its log).
"""
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import tempfile
import time

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "sinfo", "scancel")
# Terminal job states (scontrol's JobState=); COMPLETING is not one: processes still end.
FINISHED_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                   "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


class SlurmUnavailable(Exception):
    """This machine cannot run the test cluster; the message says why (a skip reason)."""


def _program(name):
    """Path of a Slurm/munge program: daemons live in /usr/sbin, often not on a user's PATH."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")


def _free_loopback_ports(count):
    """`count` distinct TCP ports free on 127.0.0.1 right now (held open together so the
    kernel cannot hand out one twice)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _tail(path, lines=15):
    try:
        with open(path, errors="replace") as log:
            return "".join(log.readlines()[-lines:]).strip() or "(empty log)"
    except OSError:
        return f"(no log at {path})"


class SlurmCluster:
    """One node (this host, `hostname -s`, at 127.0.0.1) with 2 CPUs in one partition; with
    `gpus` N, also N GPUs as Slurm's generic resource `gpu` (`Gres=gpu:N`), whose device files
    are character devices made in the cluster's folder (gres.conf `File=`, `AutoDetect=off`): slurmd
    hands them out and sets the jobs' GPU variables (SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS,
    SLURM_STEP_GPUS, CUDA_VISIBLE_DEVICES) as on a GPU node; nothing can compute on them."""

    def __init__(self, cpus=2, gpus=0):
        self.cpus = cpus
        self.gpus = gpus
        self.folder = None
        self.processes = {}   # daemon name -> Popen
        self.jobs = []        # ids of the jobs submitted, cancelled at stop()
        self.logs = {}
        self.node = socket.gethostname().split(".")[0]

    # ---- start and stop ------------------------------------------------------------------
    def start(self, timeout=60):
        """Writes the files, starts munged, slurmctld and slurmd, and waits (at most
        `timeout` s) until the node is idle. Raises SlurmUnavailable; stops what it
        started before raising."""
        if os.geteuid() != 0:
            raise SlurmUnavailable("not root: slurmd must run as root to start jobs as their "
                                   "user, and the test starts the daemons itself")
        missing = [name for name in DAEMONS + CLIENTS if not _program(name)]
        if missing:
            raise SlurmUnavailable(f"{', '.join(missing)} not installed: apt-get install "
                                   "slurm-wlm munge (bash scripts/install.sh --test-services)")
        try:
            self._write_files()
            self._start_munged()
            self._start("slurmctld", [_program("slurmctld"), "-D", "-i", "-f", self.conf])
            self._start("slurmd", [_program("slurmd"), "-D", "-f", self.conf])
            self._wait_until_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        """Kills the jobs submitted through `sbatch` that are still there (slurmstepd and a
        job's processes outlive slurmd), then SIGTERM to every daemon started (by pid),
        SIGKILL to any still there 10 s later, in reverse start order; then the folder goes."""
        if self.jobs and "slurmctld" in self.processes:
            self.run(["scancel", "--full", "--signal=KILL"] + self.jobs, check=False)
            self.run(["scancel"] + self.jobs, check=False)
            deadline = time.time() + 30
            while time.time() < deadline and any(
                    self._state(job) not in FINISHED_STATES for job in self.jobs):
                time.sleep(0.5)
        for name in reversed(list(self.processes)):
            process = self.processes.pop(name)
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def _write_files(self):
        self.folder = tempfile.mkdtemp(prefix="slurm-test-")
        os.chmod(self.folder, 0o755)   # munged (user munge) must reach its own subfolder

        def path(*parts):
            return os.path.join(self.folder, *parts)
        for sub in ("state", "spool", "log", "run"):
            os.mkdir(path(sub))
        self.munge_socket = path("munge", "munge.socket")
        self.conf = path("slurm.conf")
        controller_port, node_port = _free_loopback_ports(2)
        settings = {
            "ClusterName": "berttest",
            "SlurmctldHost": f"{self.node}(127.0.0.1)",
            "SlurmctldPort": controller_port, "SlurmdPort": node_port,
            "SlurmUser": "root", "SlurmdUser": "root",
            "AuthType": "auth/munge", "CredType": "cred/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "StateSaveLocation": path("state"), "SlurmdSpoolDir": path("spool"),
            "SlurmctldLogFile": path("log", "slurmctld.log"),
            "SlurmdLogFile": path("log", "slurmd.log"),
            "SlurmctldPidFile": path("run", "slurmctld.pid"),
            "SlurmdPidFile": path("run", "slurmd.pid"),
            # No cgroups (containers and CI machines often cannot delegate them): processes
            # are tracked through /proc, tasks are not bound, nothing is measured.
            "SelectType": "select/cons_tres", "SelectTypeParameters": "CR_CPU",
            "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none", "JobCompType": "jobcomp/none",
            "MpiDefault": "none", "SwitchType": "switch/none",
            "ReturnToService": 2, "SlurmdDebug": "info", "SlurmctldDebug": "info",
            "MinJobAge": 600,   # finished jobs stay visible to `scontrol show job`
        }
        gres = ""
        if self.gpus:
            settings["GresTypes"] = "gpu"
            os.mkdir(path("dev"))
            for index in range(self.gpus):   # character devices, as slurmd requires
                try:                              # (NVIDIA's major 195: no driver here)
                    os.mknod(path("dev", f"nvidia{index}"), stat.S_IFCHR | 0o600,
                             os.makedev(195, index))
                except OSError as error:
                    raise SlurmUnavailable(f"cannot make the fake GPU device files in "
                                           f"{self.folder} ({error.strerror})") from None
            with open(path("gres.conf"), "w") as conf:
                conf.write(f"AutoDetect=off\nNodeName={self.node} Name=gpu "
                           f"File={path('dev', 'nvidia')}[0-{self.gpus - 1}]\n")
            gres = f" Gres=gpu:{self.gpus}"
        lines = [f"{key}={value}" for key, value in settings.items()]
        lines.append(f"NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname={self.node} "
                     f"CPUs={self.cpus} RealMemory=1000{gres} State=UNKNOWN")
        lines.append(f"PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE "
                     "State=UP")
        with open(self.conf, "w") as conf:
            conf.write("\n".join(lines) + "\n")

    def _start_munged(self):
        """munged with its own key, socket, log, pid and seed files (as user munge where
        that user exists, the packaged way; as root otherwise)."""
        folder = os.path.dirname(self.munge_socket)
        os.mkdir(folder, 0o700)
        key = os.path.join(folder, "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(os.urandom(1024))
        try:
            user = pwd.getpwnam("munge")
        except KeyError:
            user = None
        if user is not None:
            for item in (folder, key):
                os.chown(item, user.pw_uid, user.pw_gid)
        command = [_program("munged"), "--foreground", f"--socket={self.munge_socket}",
                   f"--key-file={key}", f"--log-file={os.path.join(folder, 'munged.log')}",
                   f"--pid-file={os.path.join(folder, 'munged.pid')}",
                   f"--seed-file={os.path.join(folder, 'munged.seed')}",
                   "--force"]   # a temporary folder under /tmp (world-writable) is accepted
        if user is not None and user.pw_uid != os.geteuid() and shutil.which("setpriv"):
            command = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                       "--clear-groups"] + command
        self._start("munged", command, log=os.path.join(folder, "munged.log"))
        self._wait(lambda: os.path.exists(self.munge_socket), 20, "munged",
                   "its socket did not appear")

    def _start(self, name, command, log=None):
        log = log or os.path.join(self.folder, "log", f"{name}.log")
        self.logs[name] = log
        console = open(os.path.join(self.folder, "log", f"{name}.console"), "w")
        self.processes[name] = subprocess.Popen(command, stdout=console,
                                                stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL,
                                                start_new_session=True)
        console.close()

    def _daemon_report(self, name):
        console = os.path.join(self.folder, "log", f"{name}.console")
        return f"{name} log:\n{_tail(self.logs[name])}\n{name} console:\n{_tail(console)}"

    def _wait(self, ready, timeout, name, what):
        deadline = time.time() + timeout
        while not ready():
            process = self.processes.get(name)
            if process is not None and process.poll() is not None:
                raise SlurmUnavailable(f"{name} exited ({process.returncode}) at start-up: "
                                       + self._daemon_report(name))
            if time.time() > deadline:
                raise SlurmUnavailable(f"{name}: {what} within {timeout} s: "
                                       + self._daemon_report(name))
            time.sleep(0.2)

    def _wait_until_idle(self, timeout):
        def idle():
            for name in ("slurmctld", "slurmd"):
                if self.processes[name].poll() is not None:
                    raise SlurmUnavailable(f"{name} exited ({self.processes[name].returncode})"
                                           " at start-up: " + self._daemon_report(name))
            result = self.run(["sinfo", "--noheader", "--nodes", self.node, "-o", "%T"],
                              check=False)
            state = result.stdout.strip()
            if state.startswith(("drain", "inval")):   # refused by slurmctld
                raise SlurmUnavailable(f"node {self.node} is {state}: "
                                       + self._daemon_report("slurmctld"))
            return result.returncode == 0 and state == "idle"
        try:
            self._wait(idle, timeout, "slurmd", "the node did not become idle")
        except SlurmUnavailable as error:
            raise SlurmUnavailable(f"{error}\n{self._daemon_report('slurmctld')}") from None

    # ---- client commands -----------------------------------------------------------------
    def env(self, base=None):
        """`base` (default os.environ) with SLURM_CONF pointing the clients at this cluster."""
        env = dict(os.environ if base is None else base, SLURM_CONF=self.conf)
        for name in list(env):   # an enclosing job's variables would mislead the clients
            if name.startswith(("SLURM_JOB", "SLURM_STEP", "SBATCH_", "SLURM_NTASKS")):
                del env[name]
        return env

    def run(self, args, check=True, env=None, cwd=None, timeout=60):
        """A client command (sbatch, scontrol, ...) against this cluster; its completed
        process. check=True fails with the command's stderr in one line."""
        result = subprocess.run([_program(args[0])] + list(args[1:]), capture_output=True,
                                text=True, env=self.env(env), cwd=cwd, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): "
                               f"{result.stderr.strip() or result.stdout.strip()}")
        return result

    def sbatch(self, args, env=None, cwd=None):
        """Submits (`sbatch --parsable ARGS`); the job id."""
        out = self.run(["sbatch", "--parsable"] + list(args), env=env, cwd=cwd).stdout
        job_id = out.strip().split(";")[0]
        self.jobs.append(job_id)
        return job_id

    def job(self, job_id):
        """`scontrol show job` as a dict (JobState, ExitCode, StdOut, Command, ...)."""
        text = self.run(["scontrol", "show", "job", "--oneliner", str(job_id)]).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def _state(self, job_id):
        """The job's JobState, None when scontrol cannot tell (e.g. slurmctld gone)."""
        try:
            return self.job(job_id).get("JobState")
        except (RuntimeError, subprocess.TimeoutExpired):
            return None

    def wait_for_state(self, job_id, states, timeout):
        """Polls the job until its JobState is one of `states`; its record. Raises
        TimeoutError naming the last state."""
        deadline = time.time() + timeout
        while True:
            record = self.job(job_id)
            if record.get("JobState") in states:
                return record
            if time.time() > deadline:
                raise TimeoutError(f"job {job_id} still {record.get('JobState')} after "
                                   f"{timeout} s (waiting for {'/'.join(sorted(states))})")
            time.sleep(0.5)

    def wait_until_finished(self, job_id, timeout):
        """The record of the job once it ended and its processes are gone (not COMPLETING)."""
        record = self.wait_for_state(job_id, FINISHED_STATES, timeout)
        # The node goes back to idle once the job's processes are reaped: the next job (a
        # resubmission) can then start at once.
        self._wait(lambda: "COMPLETING" not in self.job(job_id).get("JobState", "")
                   and self.run(["sinfo", "--noheader", "-o", "%T"]).stdout.strip() == "idle",
                   60, "slurmd", "the node did not return to idle after the job")
        return record


def _started(cluster):
    try:
        cluster.start()
    except SlurmUnavailable as reason:
        pytest.skip(f"no real Slurm on this machine: {reason}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def slurm():
    """A real single-node Slurm for this module, or a skip saying why there is none."""
    yield from _started(SlurmCluster())


@pytest.fixture(scope="module")
def slurm_with_gpus():
    """The same with 4 fake GPUs Slurm manages (Gres=gpu:4); nothing can compute on them."""
    yield from _started(SlurmCluster(gpus=4))
