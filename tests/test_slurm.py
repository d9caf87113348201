"""scripts/run.sub under a real one-node Slurm (tests/slurm_cluster.py: slurm-wlm's daemons on
the loopback), not a stub `scontrol`: `sbatch` runs a tiny two-phase recipe on two Horovod
ranks to the end, and `scancel --batch --signal=TERM` during phase 1 (what
`--signal=B:TERM@300` sends before the time limit) stops it with a checkpoint; the same
`sbatch` again resumes and ends on the weights of the uninterrupted job.

The job is submitted as a user would: from a folder of its own (where the `%x-%j.out` output
file lands) with the path of scripts/run.sub, its #SBATCH lines as they are but for what this
node lacks, overridden on the command line (--nodes=1, --gpus-per-node=0: no GPUs; the ranks
per node come from GPUS_PER_NODE=2, as on a node whose GPUs Slurm does not manage)."""
import os
import re
import shutil
import time

import numpy as np
import pytest
import tensorflow as tf

from pretraining_records import write_script_data
from slurm_cluster import SlurmCluster, SlurmUnavailable
from test_preemption import (ACCUMULATION, PHASE1_STEPS, TRAIN_STEPS,  # noqa: F401 (horovod)
                             assert_stopped_together_at_a_boundary, checkpoint_tensors, horovod,
                             script_env)

pytestmark = [pytest.mark.horovod, pytest.mark.slow, pytest.mark.faults]

# NVIDIA's 15 positional arguments: batch 32/8, eval 4, lr 1e-3/5e-4, fp32, no XLA, a recipe
# for 2 GPUs, warm-up 2/1, 10 steps, a checkpoint every 1000, accumulation 4/4, model name
# (the config comes from BERT_CONFIG). Phase 2 runs 1 x (32 x 4) / (8 x 4) = 4 steps.
POSITIONAL = ["32", "8", "4", "1e-3", "5e-4", "fp32", "false", "2", "2", "1", str(TRAIN_STEPS),
              "1000", str(ACCUMULATION), str(ACCUMULATION), "base"]
PHASE2_STEPS = TRAIN_STEPS // 10 * (32 * ACCUMULATION) // (8 * ACCUMULATION)
# What this node lacks; the rest of run.sub's #SBATCH lines (--ntasks-per-node=1,
# --exclusive, --time, --signal, --output=%x-%j.out) stay in force.
SBATCH_OVERRIDES = ["--nodes=1", "--gpus-per-node=0"]
JOB_TIMEOUT = 900


@pytest.fixture(scope="module")
def slurm():
    """A real single-node Slurm for this module, or a skip saying why there is none."""
    cluster = SlurmCluster()
    try:
        cluster.start()
    except SlurmUnavailable as reason:
        pytest.skip(f"no real Slurm on this machine: {reason}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Records of both phases' shapes (sequence 128 with 20 predictions, 512 with 80), two
    files each (one per rank), and a tiny BERT config."""
    root = tmp_path_factory.mktemp("slurm-data")
    for phase, seq, predictions in ((1, 128, 20), (2, 512, 80)):
        write_script_data(root / f"phase{phase}", 2, 64, seq, predictions, seed_base=100 * phase)
    shutil.copy(root / "phase1" / "bert_config.json", root / "bert_config.json")
    return root


def job_env(data, results):
    """test_preemption's environment of the scripts, with this module's records per phase."""
    env = script_env(data, results, GPUS_PER_NODE="2")
    for phase in (1, 2):
        env[f"TRAIN_DATA_PHASE{phase}"] = str(data / f"phase{phase}" / "training")
        env[f"EVAL_DATA_PHASE{phase}"] = str(data / f"phase{phase}" / "test")
    env.pop("NETWORK_INTERFACE", None)
    return env


def submit(slurm, repo_root, folder, env):
    """`sbatch --nodes=1 --gpus-per-node=0 /path/to/scripts/run.sub ARGS` from `folder`;
    (job id, path of its output file)."""
    job_id = slurm.sbatch(SBATCH_OVERRIDES + [os.path.join(repo_root, "scripts", "run.sub")]
                          + POSITIONAL, env=env, cwd=folder)
    return job_id, slurm.job(job_id)["StdOut"]


def job_output(path):
    try:
        with open(path, errors="replace") as log:
            return log.read()
    except FileNotFoundError:
        return ""


def wait_for_output(slurm, job_id, path, pattern, timeout=JOB_TIMEOUT):
    """Polls the job's output file until a line matches `pattern`; fails (with the output)
    when the job ends first or the time is up."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if re.search(pattern, job_output(path), re.MULTILINE):
            return
        if slurm.job(job_id).get("JobState") not in ("PENDING", "CONFIGURING", "RUNNING"):
            break
        time.sleep(0.2)
    record = slurm.job(job_id)
    pytest.fail(f"job {job_id} ({record.get('JobState')}) printed no /{pattern}/:\n"
                + job_output(path)[-4000:])


def finish(slurm, job_id, path, timeout=JOB_TIMEOUT):
    """Waits for the job to end; (scontrol's JobState, the batch script's exit code, output)."""
    try:
        record = slurm.wait_until_finished(job_id, timeout)
    except TimeoutError as error:
        pytest.fail(f"{error}:\n{job_output(path)[-4000:]}")
    code, _, _ = record["ExitCode"].partition(":")
    return record["JobState"], int(code), job_output(path)


@pytest.fixture(scope="module")
def uninterrupted(slurm, horovod, data, repo_root, tmp_path_factory):
    """One job run through both phases without a signal: (results folder, its output)."""
    folder = tmp_path_factory.mktemp("slurm-uninterrupted")
    results = folder / "results"
    job_id, path = submit(slurm, repo_root, folder, job_env(data, results))
    state, code, output = finish(slurm, job_id, path)
    assert (state, code) == ("COMPLETED", 0), f"job {job_id} {state} ({code}):\n{output[-4000:]}"
    return results, output


def test_sbatch_runs_the_two_phase_recipe_to_the_end(uninterrupted):
    results, output = uninterrupted
    assert "nodes: " in output and "-> 2 ranks" in output, output[-4000:]
    plans = re.findall(r"^phase (\d): global batch (\d+) .*?(\d+) steps", output, re.MULTILINE)
    assert plans == [("1", str(32 * ACCUMULATION * 2), str(PHASE1_STEPS)),
                     ("2", str(8 * ACCUMULATION * 2), str(PHASE2_STEPS))], output[-4000:]
    assert "== phase 1" in output and "== phase 2" in output
    assert "exit with status code" not in output, output[-4000:]   # horovodrun: a rank failed
    for phase, steps in ((1, PHASE1_STEPS), (2, PHASE2_STEPS)):
        state = checkpoint_tensors(tf.train.latest_checkpoint(str(results / f"phase_{phase}")))
        assert state["global_step"] == steps


def test_scancel_batch_term_checkpoints_and_the_same_sbatch_resumes_exactly(
        slurm, data, repo_root, tmp_path, uninterrupted):
    """The notice Slurm gives before the time limit reaches the ranks through run.sub; the
    resubmitted job resumes phase 1, then runs phase 2, to the uninterrupted job's weights."""
    reference, _ = uninterrupted
    results = tmp_path / "results"
    env = job_env(data, results)
    job_id, path = submit(slurm, repo_root, tmp_path, env)
    wait_for_output(slurm, job_id, path, r"\[0\]<std(err|out)>:.*step 1/")
    slurm.run(["scancel", "--batch", "--signal=TERM", job_id])
    state, code, output = finish(slurm, job_id, path)
    # both ranks agreed, rank 0 saved at a window's end, the batch script exited 143
    assert_stopped_together_at_a_boundary(code, output, results / "phase_1")
    assert state == "FAILED"   # a non-zero exit: a job chain (afterok) does not go on
    assert "== phase 2" not in output and not (results / "phase_2").exists()

    job_id, path = submit(slurm, repo_root, tmp_path, env)
    state, code, output = finish(slurm, job_id, path)
    assert (state, code) == ("COMPLETED", 0), f"job {job_id} {state} ({code}):\n{output[-4000:]}"
    assert "== phase 2" in output
    for phase, steps in ((1, PHASE1_STEPS), (2, PHASE2_STEPS)):
        final = f"phase_{phase}/model.ckpt-{steps}"
        expected = checkpoint_tensors(str(reference / final))
        got = checkpoint_tensors(str(results / final))
        assert expected.keys() == got.keys()
        for name, value in expected.items():
            assert np.array_equal(got[name], value), f"{final}: {name}"
