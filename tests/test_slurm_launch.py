"""Ranks started by srun (runtime/slurm_launch.py, scripts/launch_common.sh BERT_LAUNCHER=srun)
without a Slurm: a few seconds, no TensorFlow. tests/test_slurm.py trains under a real one.

* Each task gets the variables horovodrun gives the rank of that number (horovodrun itself,
  run on the same plan, is the reference), from one rendezvous server.
* A task Slurm put elsewhere than the plan (a cyclic distribution), or one not started through
  the server, is refused in one line.
* The network: NCCL_SOCKET_IFNAME, HOROVOD_GLOO_IFACE and NCCL_IB_HCA set by the user are kept
  (srun and horovodrun); otherwise the server probes every node in one srun step and takes
  InfiniBand found on all of them (probe output canned from fake sysfs trees), else the route;
  every rank gets the choice in one phrase (BERT_NETWORK_CHOICE), and Gloo's rendezvous
  timeout of 600 s (HOROVOD_GLOO_TIMEOUT_SECONDS, the user's kept; a bad one refused).
* `launch` with BERT_LAUNCHER=srun: the srun line (one task per GPU, node by node), SIGTERM
  to the launcher reaches the tasks through `scancel --signal=TERM JOB.STEP` and never
  through srun (the real srun SIGKILLs its tasks on SIGTERM), no ssh; and what it cannot
  launch is refused in one line before anything starts.
Stand-ins for srun, scontrol, scancel and the trainer: srun starts its tasks here with the
SLURM_* variables of a block (or cyclic) distribution."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from runtime.node_network import describe_node
from test_node_network import ib_node

pytestmark = [pytest.mark.horovod]

# Two "nodes", both this machine (no ssh for horovodrun either), two ranks each.
NODES = ["localhost", "127.0.0.1"]
PLAN = ",".join(f"{node}:2" for node in NODES)
COMPARED = re.compile(r"^(HOROVOD_\w+|NCCL_SOCKET_IFNAME|PYTHONUNBUFFERED)=(.*)$")

# srun: prints its arguments, starts --ntasks tasks here with the SLURM_* variables of their
# place (STUB_DISTRIBUTION=cyclic: task i on node i % nodes), records their pids and the step
# name; on SIGTERM it SIGKILLs them, as the real srun does ("forcing job termination").
SRUN = r"""#!/usr/bin/env bash
echo "srun $*"
echo "srun $*" >> "$STUB_DIR/srun.log"
ntasks=1 per_node=1 probe=""
[[ " $* " != *" runtime.node_network"* ]] || probe=1
while [ "${1#-}" != "$1" ]; do
  case "$1" in
    --ntasks=*) ntasks=${1#*=} ;;
    --ntasks-per-node=*) per_node=${1#*=} ;;
    --job-name=*) echo "${1#*=}" > "$STUB_DIR/step_name" ;;
  esac
  shift
done
trap 'echo "srun got TERM: forcing job termination"; kill -9 $(jobs -p); exit 137' TERM
nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
used=$(( ntasks / per_node ))
if [ -n "$probe" ] && [ -n "${STUB_PROBE:-}" ]; then   # the nodes' descriptions, canned
  for ((task = 0; task < ntasks; task++)); do echo "$task: $(cat "$STUB_PROBE/${nodes[task]}")"; done
  exit 0
fi
: > "$STUB_DIR/task_pids"
for ((task = 0; task < ntasks; task++)); do
  if [ "${STUB_DISTRIBUTION:-block}" = cyclic ]; then
    node=$(( task % used )); local=$(( task / used ))
  else
    node=$(( task / per_node )); local=$(( task % per_node ))
  fi
  SLURM_PROCID=$task SLURM_LOCALID=$local SLURM_STEP_NUM_TASKS=$ntasks \
    SLURMD_NODENAME=${nodes[node]} "$@" > "$STUB_DIR/task.$task.out" 2> "$STUB_DIR/task.$task.err" &
  echo $! >> "$STUB_DIR/task_pids"
done
status=0
for pid in $(jobs -p); do wait "$pid" || status=$?; done
cat "$STUB_DIR"/task.*.out
exit $status
"""
SCONTROL = r"""#!/usr/bin/env bash
case "$1 $2" in
  "show hostnames") echo "$3" | tr , '\n' ;;
  "show step")   # the batch step, then srun's step once srun named it
    echo "StepId=$3.batch UserId=0 State=RUNNING Name=batch Network=(null)"
    [ -s "$STUB_DIR/step_name" ] && echo "StepId=$3.0 UserId=0 State=RUNNING Nodes=2" \
      "Tasks=4 Name=$(cat "$STUB_DIR/step_name") Network=(null)" ;;
esac
exit 0
"""
SCANCEL = r"""#!/usr/bin/env bash
echo "scancel $*" >> "$STUB_DIR/scancel.log"
kill -TERM $(cat "$STUB_DIR/task_pids")
"""
SSH = """#!/bin/sh
echo "ssh $*" >> "$STUB_DIR/ssh.log"
exit 255
"""
# $PYTHON: the Horovod build query (-c), the real Python for `-m runtime.slurm_launch`, and
# otherwise a trainer that prints its rank and exits 0 once it gets SIGTERM (or, with
# STUB_PRINT_ENV, prints its environment and exits).
PYTHON = """#!/usr/bin/env bash
if [ "$1" = -c ]; then echo "$STUB_BUILDS"; exit 0; fi
if [ "$1" = -m ]; then exec {real} "$@"; fi
if [ -n "${{STUB_PRINT_ENV:-}}" ]; then env; exit 0; fi
trap 'echo "rank $HOROVOD_RANK got TERM"; exit 0' TERM
echo "rank $HOROVOD_RANK of $HOROVOD_SIZE on $HOROVOD_HOSTNAME started: $*"
while :; do sleep 0.1; done
"""


@pytest.fixture(scope="module")
def horovod_runner():
    pytest.importorskip("horovod.runner", reason="Horovod not installed "
                        "(bash scripts/install.sh builds it)")


@pytest.fixture
def stubs(tmp_path, horovod_runner):
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("scancel", SCANCEL),
                       ("ssh", SSH), ("python", PYTHON.format(real=sys.executable))):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("SLURM_", "HOROVOD_", "BERT_", "NCCL_"))}
    env.update(PATH=f"{folder}:/usr/bin:/bin", STUB_DIR=str(tmp_path), STUB_BUILDS="gloo ",
               PYTHON=str(folder / "python"), PYTHONPATH="")
    return tmp_path, env


def variables(text):
    return dict(match.groups() for match in map(COMPARED.match, text.splitlines()) if match)


def run_server(repo_root, env, command, hosts=PLAN):
    return subprocess.run([sys.executable, "-m", "runtime.slurm_launch", "server",
                           "--hosts", hosts, "--"] + command, cwd=repo_root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_each_task_gets_the_variables_horovodrun_gives_that_rank(stubs, repo_root):
    folder, env = stubs
    env = dict(env, SLURM_JOB_NODELIST=",".join(NODES))
    four_tasks_printing_their_environment(repo_root, env)
    ours = [variables((folder / f"task.{rank}.out").read_text()) for rank in range(4)]

    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    reference = subprocess.run([horovodrun, "-np", "4", "--gloo", "-H", PLAN, "env"],
                               env=env, capture_output=True, text=True, timeout=120)
    assert reference.returncode == 0, reference.stdout[-2000:] + reference.stderr[-2000:]
    theirs = [variables("\n".join(line.partition(":")[2] for line in reference.stdout.splitlines()
                                  if line.startswith(f"[{rank}]<stdout>:")))
              for rank in range(4)]
    ports = {variables_of_rank.pop("HOROVOD_GLOO_RENDEZVOUS_PORT") for variables_of_rank in ours}
    for variables_of_rank in theirs:
        del variables_of_rank["HOROVOD_GLOO_RENDEZVOUS_PORT"]
    assert len(ports) == 1 and ports.pop().isdigit()   # one server for every task
    assert theirs[3]["HOROVOD_HOSTNAME"] == "127.0.0.1" and theirs[3]["HOROVOD_CROSS_RANK"] == "1"
    # Ours wait 600 s for the last rank at the rendezvous, horovodrun's Horovod's 30 s.
    assert {rank.pop("HOROVOD_GLOO_TIMEOUT_SECONDS") for rank in ours} == {"600"}
    assert ours == theirs
    assert not (folder / "ssh.log").exists()
    # The server read both nodes' interfaces (one srun step, a task a node) and found no
    # InfiniBand here: the route, said in one phrase to every rank.
    probe, step = (folder / "srun.log").read_text().splitlines()
    assert probe.split() == [
        "srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", f"--nodelist={','.join(NODES)}",
        "--kill-on-bad-exit=1", "--cpu-bind=none", "--job-name=bert-network-probe",
        sys.executable, "-m", "runtime.node_network"]
    assert step.startswith("srun --ntasks=4 ")
    assert {choice(folder, rank) for rank in range(4)} == {
        "lo (the route to the batch node; no InfiniBand/RoCE interface on localhost, 127.0.0.1)"}


def choice(folder, rank):
    """BERT_NETWORK_CHOICE in the environment task `rank` printed."""
    return dict(line.split("=", 1) for line in (folder / f"task.{rank}.out").read_text()
                .splitlines() if "=" in line).get("BERT_NETWORK_CHOICE")


def four_tasks_printing_their_environment(repo_root, env):
    """The server, then srun's 4 tasks (2 a node) each printing its environment."""
    task = [sys.executable, "-m", "runtime.slurm_launch", "task", "--", "env"]
    result = run_server(repo_root, env, ["srun", "--ntasks=4", "--ntasks-per-node=2"] + task)
    assert result.returncode == 0, result.stderr


def test_the_users_network_settings_are_kept_and_nothing_is_probed(stubs, repo_root):
    """NCCL_SOCKET_IFNAME=ib0 (an interface this machine lacks: nothing dials on it here) and
    NCCL_IB_HCA set by the user stay as they are in every task, as does a longer Gloo
    timeout; Gloo takes the route; no probe step runs. (Before, each task came out with
    NCCL_SOCKET_IFNAME=lo.)"""
    folder, env = stubs
    env = dict(env, SLURM_JOB_NODELIST=",".join(NODES), NCCL_SOCKET_IFNAME="ib0",
               NCCL_IB_HCA="mlx5_0,mlx5_1", HOROVOD_GLOO_TIMEOUT_SECONDS="1200")
    four_tasks_printing_their_environment(repo_root, env)
    for rank in range(4):
        got = variables((folder / f"task.{rank}.out").read_text())
        assert (got["NCCL_SOCKET_IFNAME"], got["HOROVOD_GLOO_IFACE"],
                got["HOROVOD_GLOO_TIMEOUT_SECONDS"]) == ("ib0", "lo", "1200")
        assert "NCCL_IB_HCA=mlx5_0,mlx5_1" in (folder / f"task.{rank}.out").read_text()
        assert choice(folder, rank) == ("NCCL_SOCKET_IFNAME=ib0, NCCL_IB_HCA=mlx5_0,mlx5_1 (set "
                                        "by you or the site); Gloo: lo (the route to the batch "
                                        "node)")
    assert [line.split()[1] for line in (folder / "srun.log").read_text().splitlines()] == \
        ["--ntasks=4"]   # the ranks' step alone


def test_infiniband_on_every_node_is_taken_for_gloo_and_nccl(stubs, repo_root, tmp_path):
    """The probe step (its output canned from fake sysfs trees, tests/test_node_network.py)
    finds ib0 with an address on both nodes: every task talks on it, and says so. This host
    has no ib0, so the rendezvous address stays the route's (127.0.0.1)."""
    folder, env = stubs
    canned = tmp_path / "probe"
    canned.mkdir()
    for number, node in enumerate(NODES):
        description = describe_node(ib_node(tmp_path / f"sys{number}"),
                                    {"eno1": f"10.1.0.{number}", "ib0": f"10.2.0.{number}"},
                                    node=node)
        (canned / node).write_text(json.dumps(description))
    env = dict(env, SLURM_JOB_NODELIST=",".join(NODES), STUB_PROBE=str(canned))
    four_tasks_printing_their_environment(repo_root, env)
    for rank in range(4):
        got = variables((folder / f"task.{rank}.out").read_text())
        assert (got["NCCL_SOCKET_IFNAME"], got["HOROVOD_GLOO_IFACE"],
                got["HOROVOD_GLOO_RENDEZVOUS_ADDR"]) == ("ib0", "ib0", "127.0.0.1")
        assert choice(folder, rank) == "ib0 (InfiniBand, on every node)"


def test_a_task_slurm_put_off_the_plan_is_refused_in_one_line(stubs, repo_root):
    """A cyclic distribution puts task 1 on the second node: its rank is the first node's."""
    folder, env = stubs
    env = dict(env, SLURM_JOB_NODELIST=",".join(NODES), STUB_DISTRIBUTION="cyclic",
               SLURM_DISTRIBUTION="cyclic")
    task = [sys.executable, "-m", "runtime.slurm_launch", "task", "--", "env"]
    result = run_server(repo_root, env, ["srun", "--ntasks=4", "--ntasks-per-node=2"] + task)
    assert result.returncode == 2
    for rank, node, local in ((1, "127.0.0.1", 0), (2, "localhost", 1)):
        assert (folder / f"task.{rank}.err").read_text().splitlines() == [
            f"slurm_launch: srun put task {rank} on node {node} as local task {local}; the plan "
            f"({PLAN}, ranks node by node) has rank {rank} on {NODES[rank // 2]} as local rank "
            f"{rank % 2}: use srun's block distribution (SLURM_DISTRIBUTION=cyclic)"]
        assert (folder / f"task.{rank}.out").read_text() == ""
    assert "HOROVOD_RANK=0" in (folder / "task.0.out").read_text()   # on its planned place


@pytest.mark.parametrize("args, extra, message", [
    (["task", "--", "env"], {},
     "slurm_launch: BERT_SLURM_HOSTS, HOROVOD_GLOO_RENDEZVOUS_ADDR, HOROVOD_GLOO_RENDEZVOUS_PORT "
     "not set: start the tasks through `python -m runtime.slurm_launch server ... -- srun ...` "
     "(srun's default --export=ALL passes them on)"),
    (["task", "--", "env"], {"BERT_SLURM_HOSTS": PLAN, "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
                             "HOROVOD_GLOO_RENDEZVOUS_PORT": "1234", "SLURM_PROCID": "0",
                             "SLURM_LOCALID": "0", "SLURM_STEP_NUM_TASKS": "2",
                             "SLURMD_NODENAME": "localhost"},
     f"slurm_launch: srun started 2 tasks, the plan ({PLAN}) has 4 ranks: give srun --ntasks=4"),
    (["server", "--hosts", "node1=8", "--", "true"], {},
     "slurm_launch: --hosts 'node1=8': expected NODE:RANKS[,NODE:RANKS...], e.g. node1:8,node2:8"),
    (["server", "--hosts", PLAN, "--network-interface", "nosuch0", "--", "true"], {},
     "slurm_launch: network interface 'nosuch0' (NETWORK_INTERFACE) has no IPv4 address on"),
    (["server", "--hosts", PLAN, "--", "true"], {"HOROVOD_GLOO_TIMEOUT_SECONDS": "10m"},
     "slurm_launch: HOROVOD_GLOO_TIMEOUT_SECONDS=10m: must be a whole number of seconds, at "
     "least 1 (unset: 600)"),
], ids=["task_without_server", "task_count", "bad_hosts", "bad_interface", "bad_gloo_timeout"])
def test_what_cannot_start_is_refused_in_one_line(stubs, repo_root, args, extra, message):
    _, env = stubs
    result = subprocess.run([sys.executable, "-m", "runtime.slurm_launch"] + args,
                            cwd=repo_root, env=dict(env, **extra), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(message), \
        result.stderr
    assert result.stdout == ""


def test_the_server_role_imports_no_tensorflow(stubs, repo_root):
    """It runs in the batch shell beside the ranks of its node: only horovod.runner."""
    _, env = stubs
    result = subprocess.run(
        [sys.executable, "-c", "import sys, runtime.slurm_launch; print(sorted({name.split('.')[0] "
         "for name in sys.modules if name.split('.')[0] in ('tensorflow', 'keras', 'torch', "
         "'horovod')}))"], cwd=repo_root, env=env, capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["['horovod']"], result.stderr


def launch(repo_root, env, num_gpus):
    script = f"set -euo pipefail; num_gpus={num_gpus}; source scripts/launch_common.sh; " \
             "launch trainer.py --flag"
    return subprocess.Popen(["bash", "-c", script], cwd=repo_root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def kill_tasks(folder):
    """SIGKILL to the stand-in tasks still there (srun, then the server, end with them: they
    run in a session of their own, out of reach of the launcher's process group)."""
    pids = folder / "task_pids"
    for pid in pids.read_text().split() if pids.exists() else []:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_sigterm_to_the_launcher_reaches_the_srun_tasks_through_scancel(stubs, repo_root):
    folder, env = stubs
    # 1 rank a node on the first 2 of the job's 3 nodes
    env = dict(env, BERT_LAUNCHER="srun", SLURM_JOB_ID="77", GPUS_PER_NODE="1",
               SLURM_JOB_NODELIST=",".join(NODES + ["node3"]))
    process = launch(repo_root, env, 2)
    try:
        first = [process.stdout.readline() for _ in range(1)]
        deadline = time.time() + 60
        while not ((folder / "task_pids").exists()
                   and len((folder / "task_pids").read_text().split()) == 2
                   and all(b"started" in (folder / f"task.{rank}.out").read_bytes()
                           for rank in range(2))):
            assert time.time() < deadline and process.poll() is None, first
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            kill_tasks(folder)
    step_name = (folder / "step_name").read_text().strip()
    assert first[0].split() == [
        "srun", "--ntasks=2", "--nodes=2", "--ntasks-per-node=1",
        f"--nodelist={','.join(NODES)}", "--distribution=block",
        "--kill-on-bad-exit=0", "--wait=180", "--cpu-bind=none", "--label",
        f"--job-name={step_name}",
        env["PYTHON"], "-m", "runtime.slurm_launch", "task", "--", env["PYTHON"], "trainer.py",
        "--flag", "--horovod"]
    assert (folder / "scancel.log").read_text() == "scancel --signal=TERM 77.0\n"  # once
    for rank in range(2):
        assert f"rank {rank} of 2 on {NODES[rank]} started: trainer.py --flag --horovod" in out
        assert f"rank {rank} got TERM" in out
    assert "srun got TERM" not in out
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "preempted by SIGTERM" in err
    assert not (folder / "ssh.log").exists()


def launch_and_wait(repo_root, env, num_gpus, folder):
    """`launch` with num_gpus ranks, waited for (a minute at most, then killed with whatever
    tasks it started): (process, stdout, stderr)."""
    process = launch(repo_root, env, num_gpus)
    try:
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            kill_tasks(folder)
    return process, out, err


@pytest.mark.parametrize("extra, num_gpus, message", [
    ({"SLURM_JOB_ID": "", "SLURM_JOB_NODELIST": ""}, 2,
     "BERT_LAUNCHER=srun needs a Slurm allocation (SLURM_JOB_ID, SLURM_JOB_NODELIST unset): run "
     "it inside sbatch or salloc, or unset BERT_LAUNCHER"),
    ({"HOROVOD_LAUNCH_FLAGS": "--gloo -H node1:2"}, 2,
     "BERT_LAUNCHER=srun and HOROVOD_LAUNCH_FLAGS given together: srun starts the ranks itself; "
     "unset HOROVOD_LAUNCH_FLAGS, or BERT_LAUNCHER=ssh for horovodrun"),
    ({"SLURM_DISTRIBUTION": "cyclic"}, 4,
     "SLURM_DISTRIBUTION=cyclic: Horovod's ranks go node by node, which only srun's block "
     "distribution gives; submit without --distribution (or --distribution=block)"),
    ({"GPUS_PER_NODE": "3"}, 4,
     "num_gpus=4 does not fill whole nodes of GPUS_PER_NODE=3 ranks on the 2 node(s) of job 77: "
     "set GPUS_PER_NODE (ranks a node) to a divisor of num_gpus"),
    ({}, 5,
     "num_gpus=5 does not fill whole nodes of GPUS_PER_NODE=unset ranks on the 2 node(s) of job "
     "77: set GPUS_PER_NODE (ranks a node) to a divisor of num_gpus"),
    ({"STUB_BUILDS": " mpi"}, 4,
     "num_gpus=4 started by srun (BERT_LAUNCHER=srun) needs Horovod for TensorFlow with Gloo in "
     "{python}: bash scripts/install.sh builds it"),
    ({"BERT_LAUNCHER": "pdsh"}, 4,
     "BERT_LAUNCHER=pdsh: use srun (ranks started by srun in a Slurm allocation) or ssh "
     "(horovodrun)"),
], ids=["no_allocation", "with_host_flags", "cyclic", "uneven_nodes", "too_many_ranks",
        "no_gloo", "unknown_launcher"])
def test_launch_refuses_what_srun_cannot_start_in_one_line(stubs, repo_root, extra, num_gpus,
                                                           message):
    folder, env = stubs
    env = dict(env, BERT_LAUNCHER="srun", SLURM_JOB_ID="77",
               SLURM_JOB_NODELIST="localhost,127.0.0.1")
    env.update(extra)
    process, out, err = launch_and_wait(repo_root, env, num_gpus, folder)
    assert process.returncode == 1
    assert err.splitlines() == [message.format(python=env["PYTHON"])]
    assert out == "" and not (folder / "task_pids").exists()


def test_horovodrun_keeps_the_users_network_settings_and_waits_600_s(stubs, repo_root):
    """horovodrun prefixes every rank's command with NCCL_SOCKET_IFNAME=<its nics> and
    HOROVOD_GLOO_IFACE=<its nic>: `launch` runs the trainer through `env NAME=value` so the
    user's NCCL_SOCKET_IFNAME (ib0, which this machine lacks: only the environment is looked
    at) wins, and passes --gloo-timeout-seconds 600 (Horovod's default: 30 s). The real
    horovodrun, two ranks on this host."""
    folder, env = stubs
    (folder / "bin" / "horovodrun").symlink_to(
        os.path.join(os.path.dirname(sys.executable), "horovodrun"))
    env = dict(env, NCCL_SOCKET_IFNAME="ib0", STUB_PRINT_ENV="1")
    process = launch(repo_root, env, 2)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    for rank in range(2):
        got = dict(line.partition(":")[2].split("=", 1) for line in out.splitlines()
                   if line.startswith(f"[{rank}]<stdout>:") and "=" in line)
        assert got["HOROVOD_RANK"] == str(rank)
        assert (got["NCCL_SOCKET_IFNAME"], got["HOROVOD_GLOO_TIMEOUT_SECONDS"]) == ("ib0", "600")
        assert got["BERT_NETWORK_CHOICE"] == (
            "NCCL_SOCKET_IFNAME=ib0 (set by you or the site); Gloo: horovodrun's choice (an "
            "interface routed between the hosts)")


@pytest.mark.parametrize("launcher", ["ssh", "srun"])
def test_a_gloo_timeout_that_is_not_a_number_is_refused_in_one_line(stubs, repo_root, launcher):
    folder, env = stubs
    env = dict(env, BERT_LAUNCHER=launcher, SLURM_JOB_ID="77", SLURM_JOB_NODELIST="localhost",
               HOROVOD_GLOO_TIMEOUT_SECONDS="ten",
               STUB_PRINT_ENV="1")   # were ranks started anyway, they end at once
    (folder / "bin" / "horovodrun").symlink_to(
        os.path.join(os.path.dirname(sys.executable), "horovodrun"))
    process, out, err = launch_and_wait(repo_root, env, 2, folder)
    prefix = {"ssh": "", "srun": "slurm_launch: "}[launcher]   # horovodrun's or the server's
    assert process.returncode != 0
    assert err.splitlines() == [f"{prefix}HOROVOD_GLOO_TIMEOUT_SECONDS=ten: must be a whole "
                                "number of seconds, at least 1 (unset: 600)"]
    assert not (folder / "task_pids").exists() and "srun" not in out
