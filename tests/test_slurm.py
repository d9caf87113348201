"""scripts/run.sub under a real one-node Slurm (tests/slurm_cluster.py: slurm-wlm's daemons on
the loopback), not a stub `scontrol`, with both ways of starting the two Horovod ranks:

* BERT_LAUNCHER=ssh (horovodrun, as before srun was the default): `sbatch` runs a tiny
  two-phase recipe to the end; its weights are the reference.
* the default, srun (two tasks, Horovod's Gloo rendezvous from runtime/slurm_launch.py, an
  `ssh` on the PATH that fails loudly and records any call): `scancel --batch --signal=TERM`
  during phase 1 (what `--signal=B:TERM@300` sends before the time limit) stops it with a
  checkpoint; the same `sbatch` again resumes phase 1 and runs phase 2, ending both phases on
  horovodrun's weights, bit for bit (phase 2 is a whole srun phase from the same start).
* `sbatch --distribution=cyclic` is refused in one line before any rank starts.
* A lost rank does not end the job: task 1 of a 2-task srun job SIGKILLed mid-phase 1 (as an
  out-of-memory kill or a crash), the job goes on with 1 task from the newest checkpoint,
  says in one line what failed, what it lost and how it goes on, ends both phases, and its
  weights equal, bit for bit, the same checkpoint resumed by a resubmission on 1 GPU.
* A slow start: in the horovodrun job and in the first srun job, rank 1 is held back 45 s
  before it starts the trainer (PYTHON is a wrapper that sleeps once), so the ranks reach
  Gloo's rendezvous ~45 s apart, as ranks importing TensorFlow from a cold shared file system
  can. Both train, with the launch's 600 s rendezvous timeout; with Horovod's default 30 s
  rank 0 stopped ("Gloo context initialization failed: Timed out ...").

The job is submitted as a user would: from a folder of its own (where the `%x-%j.out` output
file lands) with the path of scripts/run.sub, its #SBATCH lines as they are but for what this
node lacks, overridden on the command line (--nodes=1, --gpus-per-node=0: no GPUs; the ranks
per node come from GPUS_PER_NODE=2, as on a node whose GPUs Slurm does not manage)."""
import glob
import os
import re
import shutil
import signal
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from kill_support import trainer_pid
from pretraining_records import with_both_phases, write_both_phases
from slurm_cluster import slurm  # noqa: F401 (the module's real Slurm: a fixture)
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
HOLD_BACK = 45   # s: longer than Horovod's default rendezvous timeout (30 s)


def held_back_python(folder):
    """A PYTHON that holds rank 1 back HOLD_BACK s the first time it starts the trainer (a
    marker folder makes it once), then runs the real Python; beside it the venv's horovodrun,
    which the launcher looks for beside PYTHON."""
    bin_dir = folder / "rank1-late"
    bin_dir.mkdir()
    (bin_dir / "horovodrun").symlink_to(os.path.join(os.path.dirname(sys.executable),
                                                     "horovodrun"))
    path = bin_dir / "python"
    path.write_text(f"""#!/bin/sh
case " $* " in *run_pretraining.py*)
  if [ "${{HOROVOD_RANK:-}}" = 1 ] && mkdir "{folder / 'held-back'}" 2>/dev/null; then
    echo "rank 1 held back {HOLD_BACK} s before it starts" >&2; sleep {HOLD_BACK}
  fi ;;
esac
exec {sys.executable} "$@"
""")
    path.chmod(0o755)
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Records of both phases' shapes (sequence 128 with 20 predictions, 512 with 80), two
    files each (one per rank), and a tiny BERT config."""
    return write_both_phases(tmp_path_factory.mktemp("slurm-data"))


def job_env(data, results, paced=True, **extra):
    """test_preemption's environment of the scripts, with this module's records per phase
    (`paced`: see test_preemption.script_env)."""
    env = with_both_phases(script_env(data, results, paced, GPUS_PER_NODE="2", **extra), data)
    for name in ("NETWORK_INTERFACE", "BERT_LAUNCHER", "HOROVOD_LAUNCH_FLAGS"):
        env.pop(name, None)
    env.update(extra)
    return env


def srun_env(data, results, folder, paced=True):
    """job_env for the default launcher (srun), with an `ssh` first on the PATH that fails
    and leaves `folder`/ssh-called behind."""
    stubs = folder / "no-ssh"
    stubs.mkdir(exist_ok=True)
    (stubs / "ssh").write_text(f'#!/bin/sh\necho "ssh $*" >> {folder / "ssh-called"}\n'
                               'echo "ssh is not allowed here" >&2\nexit 255\n')
    (stubs / "ssh").chmod(0o755)
    return job_env(data, results, paced, PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}")


def submit(slurm, repo_root, folder, env, sbatch_options=()):
    """`sbatch --nodes=1 --gpus-per-node=0 /path/to/scripts/run.sub ARGS` from `folder`;
    (job id, path of its output file)."""
    job_id = slurm.sbatch(SBATCH_OVERRIDES + list(sbatch_options)
                          + [os.path.join(repo_root, "scripts", "run.sub")] + POSITIONAL,
                          env=env, cwd=folder)
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
    """One job run through both phases without a signal, its ranks started by horovodrun
    (BERT_LAUNCHER=ssh): (results folder, its output)."""
    folder = tmp_path_factory.mktemp("slurm-uninterrupted")
    results = folder / "results"
    env = job_env(data, results, paced=False, BERT_LAUNCHER="ssh")
    env["PYTHON"] = held_back_python(folder)   # rank 1 starts 45 s late
    job_id, path = submit(slurm, repo_root, folder, env)
    state, code, output = finish(slurm, job_id, path)
    assert (state, code) == ("COMPLETED", 0), f"job {job_id} {state} ({code}):\n{output[-4000:]}"
    assert f"rank 1 held back {HOLD_BACK} s" in output, output[-4000:]
    return results, output


def test_sbatch_with_horovodrun_runs_the_two_phase_recipe_to_the_end(uninterrupted):
    results, output = uninterrupted
    assert "nodes: " in output and "-> 2 ranks, started by horovodrun --gloo -H " in output, \
        output[-4000:]
    plans = re.findall(r"^phase (\d): global batch (\d+) .*?(\d+) steps", output, re.MULTILINE)
    assert plans == [("1", str(32 * ACCUMULATION * 2), str(PHASE1_STEPS)),
                     ("2", str(8 * ACCUMULATION * 2), str(PHASE2_STEPS))], output[-4000:]
    assert "== phase 1" in output and "== phase 2" in output
    assert "exit with status code" not in output, output[-4000:]   # horovodrun: a rank failed
    for phase, steps in ((1, PHASE1_STEPS), (2, PHASE2_STEPS)):
        state = checkpoint_tensors(tf.train.latest_checkpoint(str(results / f"phase_{phase}")))
        assert state["global_step"] == steps


def rank_places(folder):
    """{rank: (host, local rank)} from the layout line each rank logs in its log file."""
    places = {}
    for log in glob.glob(os.path.join(folder, "run_pretraining*.log")):
        with open(log, errors="replace") as text:
            for rank, host, local in re.findall(r"rank (\d+) of \d+ on host (\S+): local rank "
                                                r"(\d+) of", text.read()):
                places[int(rank)] = (host, int(local))
    return places


def test_srun_ranks_stop_on_scancel_batch_term_and_the_same_sbatch_resumes_to_horovodruns_weights(
        slurm, data, repo_root, tmp_path, uninterrupted):
    """The notice Slurm gives before the time limit reaches the srun tasks through run.sub
    (children of slurmstepd, not of the batch shell); the resubmitted job resumes phase 1,
    then runs phase 2, to the weights of the uninterrupted horovodrun job. No ssh at all."""
    reference, _ = uninterrupted
    results = tmp_path / "results"
    env = srun_env(data, results, tmp_path)
    env["PYTHON"] = held_back_python(tmp_path)   # rank 1 starts 45 s late, in this job only
    job_id, path = submit(slurm, repo_root, tmp_path, env)
    wait_for_output(slurm, job_id, path, r"^0: .*step 1/")   # srun --label: "RANK: line"
    assert f"rank 1 held back {HOLD_BACK} s" in job_output(path)
    slurm.run(["scancel", "--batch", "--signal=TERM", job_id])
    state, code, output = finish(slurm, job_id, path)
    assert "-> 2 ranks, started by srun, one task per GPU" in output, output[-4000:]
    # both ranks agreed, rank 0 saved at a window's end, the batch script exited 143
    assert_stopped_together_at_a_boundary(code, output, results / "phase_1")
    assert "srun: error" not in output, output[-4000:]   # no task failed or was killed
    assert state == "FAILED"   # a non-zero exit: a job chain (afterok) does not go on
    assert "== phase 2" not in output and not (results / "phase_2").exists()

    job_id, path = submit(slurm, repo_root, tmp_path, env)
    state, code, output = finish(slurm, job_id, path)
    assert (state, code) == ("COMPLETED", 0), f"job {job_id} {state} ({code}):\n{output[-4000:]}"
    assert "== phase 2" in output and "srun: error" not in output
    assert not (tmp_path / "ssh-called").exists(), (tmp_path / "ssh-called").read_text()
    for phase in (1, 2):   # srun's block distribution: both tasks on the node, in rank order
        assert rank_places(results / f"phase_{phase}") == {0: (slurm.node, 0), 1: (slurm.node, 1)}
    assert_same_final_weights(reference, results)


def assert_same_final_weights(reference, results):
    """Every variable of both phases' last checkpoints under `results` equals `reference`'s."""
    for phase, steps in ((1, PHASE1_STEPS), (2, PHASE2_STEPS)):
        final = f"phase_{phase}/model.ckpt-{steps}"
        expected = checkpoint_tensors(str(reference / final))
        got = checkpoint_tensors(str(results / final))
        assert expected.keys() == got.keys()
        for name, value in expected.items():
            assert np.array_equal(got[name], value), f"{final}: {name}"


def test_a_cyclic_distribution_is_refused_in_one_line(slurm, horovod, data, repo_root, tmp_path):
    """srun would number the tasks round the nodes, while Horovod's plan goes node by node:
    refused before any rank starts (sbatch --distribution passes on as SLURM_DISTRIBUTION)."""
    results = tmp_path / "results"
    job_id, path = submit(slurm, repo_root, tmp_path, srun_env(data, results, tmp_path),
                          ["--distribution=cyclic"])
    state, code, output = finish(slurm, job_id, path)
    assert (state, code) == ("FAILED", 1), output[-4000:]
    refusals = [line for line in output.splitlines() if "SLURM_DISTRIBUTION" in line]
    assert refusals == ["SLURM_DISTRIBUTION=cyclic: Horovod's ranks go node by node, which only "
                        "srun's block distribution gives; submit without --distribution (or "
                        "--distribution=block)"], output[-4000:]
    assert "step 1/" not in output and not glob.glob(str(results / "phase_1" / "model.ckpt-*"))


# ---- A lost rank does not end the job (scripts/run.sub, scripts/elastic.sh) -------------
# In this module, on its cluster: two test clusters at once on one machine (both node "vm")
# cancelled each other's jobs when one stopped.

EVERY = 2   # a checkpoint every 2 optimizer steps (the 12th positional argument)
ELASTIC = POSITIONAL[:11] + [str(EVERY)] + POSITIONAL[12:]
KILL_AFTER = 5   # rank 0's optimizer steps before task 1 is killed


def latest_step(folder):
    path = tf.train.latest_checkpoint(str(folder))
    return int(path.rsplit("-", 1)[1]) if path else None


def test_a_killed_task_the_job_goes_on_with_one_and_ends_on_a_resubmissions_weights(
        slurm, horovod, data, repo_root, tmp_path):
    results = tmp_path / "results"
    env = srun_env(data, results, tmp_path)
    job_id = slurm.sbatch(["--nodes=1", "--gpus-per-node=0",
                           os.path.join(repo_root, "scripts", "run.sub")] + ELASTIC,
                          env=env, cwd=tmp_path)
    path = slurm.job(job_id)["StdOut"]
    # After step 5: inside step 6's window, past the scheduled checkpoint of step 4.
    wait_for_output(slurm, job_id, path, rf"^0: .*step {KILL_AFTER}/")
    pid = trainer_pid(1, results)
    assert pid, job_output(path)[-4000:]
    os.kill(pid, signal.SIGKILL)
    wait_for_output(slurm, job_id, path, r"^run\.sub: attempt 1 failed")
    # What a user would have resumed from by hand: the folder as the failure left it.
    reference = tmp_path / "reference"
    shutil.copytree(results, reference)
    output = job_output(path)
    # Rank 0 went on to the window's end, where the allreduce failed, and saved the last
    # completed step (training/last_window.py): only the window in progress is lost.
    saved = re.search(r"^0: .*the run failed \(a rank lost\?\): saved its last completed "
                      r"step, (\d+) ", output, re.MULTILINE)
    assert saved, output[-4000:]
    last = int(saved.group(1))
    assert KILL_AFTER <= last < PHASE1_STEPS and last % EVERY, output[-4000:]
    said = re.search(r"^run\.sub: attempt 1 failed: task 1: Killed on (?P<failed>\S+); "
                     rf"phase_1 goes on from its checkpoint of step {last}: only the window in "
                     r"progress is done again \(\d+ s of work since it was written\); going on "
                     r"with 1 rank\(s\) on (?P<kept>\S+) \(1 a node; per rank accumulation 8/8, "
                     r"the same global batch\), attempt 2 of at most 4$", output, re.MULTILINE)
    assert said, output[-4000:]
    assert said.group("failed") == said.group("kept") == slurm.node
    assert latest_step(reference / "phase_1") == last

    state, code, output = finish(slurm, job_id, path)
    assert (state, code) == ("COMPLETED", 0), f"job {job_id} {state} ({code}):\n{output[-4000:]}"
    assert output.count("run.sub: attempt") == 1, output[-4000:]
    assert "== phase 2" in output

    # The same checkpoint resumed by a resubmission on 1 GPU: the same weights, bit for bit.
    ref_env = srun_env(data, reference, tmp_path, paced=False)
    ref_env["GPUS_PER_NODE"] = "1"
    ref_job = slurm.sbatch(["--nodes=1", "--gpus-per-node=0",
                            os.path.join(repo_root, "scripts", "run.sub")] + ELASTIC,
                           env=ref_env, cwd=tmp_path)
    ref_path = slurm.job(ref_job)["StdOut"]
    ref_state, ref_code, ref_output = finish(slurm, ref_job, ref_path)
    assert (ref_state, ref_code) == ("COMPLETED", 0), ref_output[-4000:]
    assert_same_final_weights(reference, results)
