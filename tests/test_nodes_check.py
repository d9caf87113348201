"""The multi-node check launched for real, without a GPU: CPU ranks allreduce over Horovod's
Gloo (a real bandwidth figure, on loopback), started as the recipe starts its ranks.

* Over ssh to two loopback "hosts" (tests/ssh_hosts.py; horovodrun -H 127.0.0.2:1,127.0.0.3:1,
  as run.sub builds it with BERT_LAUNCHER=ssh): `bert-preflight --nodes` sees 2 nodes, and its
  report's figures are the measuring program's JSON (recomputed here).
* Under the real one-node Slurm (tests/slurm_cluster.py): `PREFLIGHT=1 sbatch scripts/run.sub`
  runs the check on the job's two srun tasks before the recipe; on CPUs without --allow_cpu
  the check falls back (exit 2), and run.sub stops in one line before the recipe starts.
The report's branches (NCCL over InfiniBand, a socket fall-back, ...) are tested from faked
facts in tests/test_preflight_nodes.py."""
import json
import os
import re
import subprocess
import sys

import pytest

from modeling import named_config
from slurm_cluster import slurm  # noqa: F401 (the module's real Slurm: a fixture)
from ssh_hosts import ssh_hosts  # noqa: F401 (fixture)
from test_preemption import horovod  # noqa: F401 (fixture)
from test_slurm import SBATCH_OVERRIDES, job_output

pytestmark = [pytest.mark.horovod, pytest.mark.slow]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("nodes-config") / "bert_config.json"
    named_config("tiny").replace(vocab_size=512, num_hidden_layers=1).to_json_file(str(path))
    return path


def _report(stdout):
    lines = stdout.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("BERT preflight, nodes"))
    return lines[start:]


def test_two_ssh_hosts_allreduce_across_nodes_and_the_report_is_the_measurement(
        horovod, ssh_hosts, tiny_config, tmp_path):  # noqa: F811
    hosts = ",".join(f"{host}:1" for host in ssh_hosts.hosts)
    env = ssh_hosts.env(dict(os.environ, HOROVOD_LAUNCH_FLAGS=f"--gloo -H {hosts} "
                             "--network-interface lo", SSH_PORT=str(ssh_hosts.port)))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    result = subprocess.run(
        ["bash", os.path.join(REPO, "scripts", "preflight.sh"), "--nodes", "--allow_cpu",
         f"--bert_config_file={tiny_config}", f"--work_dir={tmp_path}"],
        capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    measured = json.loads((tmp_path / "nodes" / "allreduce.json").read_text())
    assert measured["nodes"] == 2 and measured["ranks"] == 2
    assert sorted(set(measured["hosts"])) == sorted(ssh_hosts.hosts)
    config = named_config("tiny").replace(vocab_size=512, num_hidden_layers=1)
    assert measured["bytes"] == config.parameter_count() * 2  # fp16 gradients' bytes
    times = measured["times_s"]
    busbw = measured["bytes"] / (sum(times) / len(times)) / 1e9 * 2 * (2 - 1) / 2
    report = _report(result.stdout)
    assert report[0] == "BERT preflight, nodes: the allreduce of the model of " \
                        f"{tiny_config}, fp16"
    assert report[1] == "network: lo (--network-interface)"
    assert report[3] == "transport: Horovod's gloo over TCP (no NCCL: CPU ranks)"
    assert report[5] == ("links:  this node's interface lo: speed unknown (no rate known to "
                         "compare with)")  # the interface rank 0 was given
    assert f"bus bandwidth {busbw:.2f} GB/s" in report[4]
    assert report[-1] == f"PASS: across nodes over gloo at {busbw:.2f} GB/s"
    saved = json.loads((tmp_path / "nodes.json").read_text())
    assert saved["result"]["busbw_GBps"] == pytest.approx(busbw)


def test_run_sub_checks_the_nodes_first_and_does_not_start_a_recipe_that_failed_it(
        slurm, horovod, tiny_config, tmp_path):  # noqa: F811
    folder = tmp_path / "submit"
    folder.mkdir()
    results = tmp_path / "results"
    env = dict(os.environ, GPUS_PER_NODE="2", PREFLIGHT="1", RESULTS_DIR=str(results),
               BERT_CONFIG=str(tiny_config), PYTHON=sys.executable,
               PREFLIGHT_FLAGS=f"--bert_config_file={tiny_config}")
    for name in ("NETWORK_INTERFACE", "BERT_LAUNCHER", "HOROVOD_LAUNCH_FLAGS",
                 "CUDA_VISIBLE_DEVICES"):
        env.pop(name, None)
    job_id = slurm.sbatch(SBATCH_OVERRIDES + [os.path.join(REPO, "scripts", "run.sub")],
                          env=env, cwd=folder)
    record = slurm.wait_until_finished(job_id, timeout=600)
    output = job_output(record["StdOut"])
    assert record["JobState"] == "FAILED", output[-4000:]
    # the check ran on the job's two srun tasks, and measured
    measured = json.loads((results / "preflight_nodes" / "nodes" / "allreduce.json")
                          .read_text())
    assert measured["ranks"] == 2 and measured["busbw_GBps"] > 0
    assert re.search(r"^ranks:  2 on \S+ \(2 rank\(s\), on CPUs", output, re.MULTILINE), output
    assert "FELL BACK: no GPU: CPU ranks allreduced over Gloo (--allow_cpu accepts that)" in output
    assert output.rstrip().splitlines()[-1] == (
        f"run.sub: the multi-node check did not pass (exit 2, its report above and in "
        f"{results / 'preflight_nodes'}): the recipe is not started")
    assert not (results / "phase_1").exists()
