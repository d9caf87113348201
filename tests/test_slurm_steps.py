"""What a real Slurm gives the launch before any rank trains (tests/slurm_cluster.py: slurm-wlm
on the loopback, here with 4 fake GPUs as Slurm's `gpu` resource: device files slurmd hands
out and sets CUDA_VISIBLE_DEVICES for, which nothing can compute on). No TensorFlow runs, so
these take seconds:

* `sbatch --gres=gpu:4 run.sub` (its own `#SBATCH --gpus-per-node=8` still in force): Slurm
  gives the batch step 4 GPUs (SLURM_GPUS_ON_NODE=4) and still exports SLURM_GPUS_PER_NODE=8;
  run.sub's plan says 4 GPUs a node, 4 ranks (it said 8 before).
* In a `--gres=gpu:4` job, `srun --gpus-per-task=1` leaves each of 4 tasks one GPU of its own
  (CUDA_VISIBLE_DEVICES=0, 1, 2, 3) and a plain srun all four: runtime/gpu_binding.py gives
  each local rank a distinct physical GPU either way (the refusal before: "Horovod local rank
  1 but this node has 1 GPU(s) visible"; tests/test_devices.py carries TensorFlow's side).
* runtime/slurm_launch.py under the real srun: the server's probe step (one task a node,
  runtime/node_network.py) runs, finds no InfiniBand here and says so in every rank's
  BERT_NETWORK_CHOICE; NCCL_SOCKET_IFNAME=ib0 set by the user reaches every task as it is
  (no probe then); Gloo's rendezvous timeout is 600 s.
"""
import json
import os
import re
import sys

import pytest

from slurm_cluster import slurm_with_gpus  # noqa: F401 (the module's real Slurm: a fixture)

TIMEOUT = 120


@pytest.fixture(scope="module")
def horovod_runner():
    pytest.importorskip("horovod.runner", reason="Horovod not installed "
                        "(bash scripts/install.sh builds it)")


def run_job(slurm, folder, script, options, env=None):
    """sbatch `script` (text) with `options` from `folder`; its output once it completed."""
    path = folder / "job.sh"
    path.write_text("#!/bin/bash\nset -euo pipefail\n" + script)
    job_id = slurm.sbatch(list(options) + [str(path)], env=env, cwd=folder)
    record = slurm.wait_until_finished(job_id, TIMEOUT)
    with open(record["StdOut"], errors="replace") as out:
        output = out.read()
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), output[-3000:]
    return output


def test_run_sub_plans_the_gpus_slurm_gave_the_node(slurm_with_gpus, repo_root, tmp_path):
    """`sbatch --gres=gpu:4 run.sub` on a 4-GPU node: 4 ranks a node, said with its source."""
    env = dict(os.environ, DRY_RUN="1", PYTHON=sys.executable,
               RESULTS_DIR=str(tmp_path / "results"))
    for name in ("GPUS_PER_NODE", "BERT_LAUNCHER", "HOROVOD_LAUNCH_FLAGS", "CUDA_VISIBLE_DEVICES"):
        env.pop(name, None)
    job_id = slurm_with_gpus.sbatch(["--nodes=1", "--gres=gpu:4",
                                     os.path.join(repo_root, "scripts", "run.sub")],
                                    env=env, cwd=tmp_path)
    record = slurm_with_gpus.wait_until_finished(job_id, TIMEOUT)
    with open(record["StdOut"], errors="replace") as out:
        output = out.read()
    assert record["JobState"] == "COMPLETED", output[-3000:]
    assert f"nodes: {slurm_with_gpus.node} -> 4 ranks, started by srun" in output, output
    assert "GPUs per node: 4 (from SLURM_GPUS_ON_NODE)" in output, output
    plans = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert [plan["ranks"] for plan in plans] == [4, 4], output[-3000:]


# Each task: its place, what Slurm set, and the GPU runtime/gpu_binding.py makes its own (the
# visible count TensorFlow would list is CUDA_VISIBLE_DEVICES's: no GPU can compute here).
CHECK = r"""
import json, os
from runtime.gpu_binding import rank_gpu
visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
index = rank_gpu(int(os.environ["SLURM_LOCALID"]), 4, len(visible))
print(json.dumps({"local": int(os.environ["SLURM_LOCALID"]), "visible": visible,
                  "on_node": os.environ.get("SLURM_GPUS_ON_NODE"), "own": visible[index]}))
"""


def test_each_task_gets_a_gpu_of_its_own_however_srun_binds_them(slurm_with_gpus, repo_root,
                                                                   tmp_path):
    (tmp_path / "check.py").write_text(CHECK)
    check = f"{sys.executable} {tmp_path / 'check.py'}"
    output = run_job(slurm_with_gpus, tmp_path,
                     f"cd {repo_root}\n"
                     f"echo '== per task'; srun --ntasks=4 --overcommit --gpus-per-task=1 "
                     f"--label {check}\n"
                     f"echo '== all'; srun --ntasks=4 --overcommit --label {check}\n",
                     ["--nodes=1", "--exclusive", "--overcommit", "--gres=gpu:4"],
                     env=dict(os.environ, PYTHONPATH=repo_root))
    per_task, _, plain = output.partition("== all")
    for text, visible in ((per_task, lambda local: [str(local)]),
                          (plain, lambda local: ["0", "1", "2", "3"])):
        tasks = sorted((json.loads(line.partition(": ")[2]) for line in text.splitlines()
                        if re.match(r"\d+: \{", line)), key=lambda task: task["local"])
        assert [task["visible"] for task in tasks] == [visible(local) for local in range(4)], \
            output
        assert [task["own"] for task in tasks] == ["0", "1", "2", "3"], output
        assert {task["on_node"] for task in tasks} == {"4"}


def task_variables(text):
    """{task: {NAME: value}} from `srun --label env` output."""
    tasks = {}
    for line in text.splitlines():
        match = re.match(r"(\d+): ([A-Z_][A-Z0-9_]*)=(.*)$", line)
        if match:
            tasks.setdefault(int(match.group(1)), {})[match.group(2)] = match.group(3)
    return tasks


@pytest.mark.horovod
def test_the_network_probe_runs_under_srun_and_the_users_interface_is_kept(
        slurm_with_gpus, horovod_runner, repo_root, tmp_path):
    """The server and its tasks under the real srun, the task printing its environment (an
    `srun` first on the PATH records every call): first as is, then with the user's
    NCCL_SOCKET_IFNAME=ib0, an interface this node lacks (nothing dials on it here)."""
    node = slurm_with_gpus.node
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "srun").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "srun.log"}\n'
                                f'exec /usr/bin/srun "$@"\n')
    (stubs / "srun").chmod(0o755)
    launch = (f"{sys.executable} -m runtime.slurm_launch server --hosts {node}:2 -- "
              f"srun --ntasks=2 --ntasks-per-node=2 --label "
              f"{sys.executable} -m runtime.slurm_launch task -- env")
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("NCCL_", "HOROVOD_", "BERT_"))}
    env.update(PYTHONPATH=repo_root, PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}")
    output = run_job(slurm_with_gpus, tmp_path,
                     f"cd {repo_root}\necho '== as is'; {launch}\n"
                     f"echo '== ib0'; NCCL_SOCKET_IFNAME=ib0 {launch}\n",
                     ["--nodes=1", "--ntasks=2"], env=env)
    as_is, _, user = output.partition("== ib0")
    calls = (tmp_path / "srun.log").read_text().splitlines()
    assert len(calls) == 3 and calls[0].endswith("-m runtime.node_network"), calls
    assert [call.split()[0] for call in calls[1:]] == ["--ntasks=2"] * 2, calls

    tasks = task_variables(as_is)
    assert sorted(tasks) == [0, 1], output
    for variables in tasks.values():
        assert variables["BERT_NETWORK_CHOICE"] == \
            f"lo (the route to the batch node; no InfiniBand/RoCE interface on {node})"
        assert (variables["NCCL_SOCKET_IFNAME"], variables["HOROVOD_GLOO_TIMEOUT_SECONDS"]) == \
            ("lo", "600")
    tasks = task_variables(user)
    assert sorted(tasks) == [0, 1], output
    for variables in tasks.values():
        assert (variables["NCCL_SOCKET_IFNAME"], variables["HOROVOD_GLOO_IFACE"]) == ("ib0", "lo")
        assert variables["BERT_NETWORK_CHOICE"] == (
            "NCCL_SOCKET_IFNAME=ib0 (set by you or the site); Gloo: lo (the route to the batch "
            "node)")
