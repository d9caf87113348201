"""Two hosts x 2 ranks through our launcher, over ssh (multi-host, as scripts/run.sub runs
it): `bash scripts/run_pretraining_lamb_phase1.sh` with HOROVOD_LAUNCH_FLAGS as run.sub
builds it for nodes 127.0.0.2 and 127.0.0.3 (tests/ssh_hosts.py: a private sshd on those
loopback addresses; horovodrun starts every rank through ssh) and SSH_PORT for its port.

Checked from the run's own log files: the ranks' layout (local ranks 0 and 1 on each host,
cross rank = host index), the thread choice made per host (2 ranks a node, not 4), each
rank reading its own file; only rank 0 writes checkpoints, summaries and the dllog (the
others only their own log file and input-pipeline state); the
final weights are those of a one-host 4-rank run on the same static records, bit for bit.
For that both runs set HOROVOD_FUSION_THRESHOLD=0: with tensor fusion, which gradients share
a fusion buffer depends on timing, an element's place in the buffer decides where Gloo's ring
starts summing it, and a sum of 4 floats in another order can differ in the last bit (seen
with fusion on: a one-host and a two-host run differed by ~1e-9 in 136 of 190 tensors;
with 2 ranks a + b = b + a, so the 2-rank tests are exact anyway). Without fusion each
gradient is reduced alone, in an order fixed by the ranks, whichever host they are on.
SIGTERM to the launcher, none of whose ranks runs on its machine, reaches them over ssh:
all four stop at one accumulation boundary, rank 0 saves, and the rerun resumes to
exactly the uninterrupted weights."""
import os
import re

import numpy as np
import pytest

from pretraining_records import with_both_phases, write_both_phases, write_script_data
from ssh_hosts import ssh_hosts  # noqa: F401 (fixture)
from test_preemption import (ACCUMULATION, PHASE1_STEPS, TRAIN_STEPS,  # noqa: F401 (horovod)
                             assert_stopped_together_at_a_boundary, checkpoint_tensors, horovod,
                             preempt, run_to_end, script_env)

pytestmark = [pytest.mark.horovod, pytest.mark.slow]

RANKS, PER_HOST = 4, 2
BATCH = 16
# NVIDIA's 15 positional arguments: batch 16/2, eval 4, lr 1e-3/5e-4, fp32, no XLA, 4 GPUs,
# warm-up 2/1, 10 steps, checkpoint every 1000, accumulation 4/4, model name (config: env).
POSITIONAL = [str(BATCH), "2", "4", "1e-3", "5e-4", "fp32", "false", str(RANKS), "2", "1",
              str(TRAIN_STEPS), "1000", str(ACCUMULATION), str(ACCUMULATION), "base"]
PHASE1 = ["bash", "scripts/run_pretraining_lamb_phase1.sh"] + POSITIONAL
LAYOUT = re.compile(r"rank (\d+) of (\d+) on host (\S+): local rank (\d+) of (\d+), "
                    r"cross rank (\d+) of (\d+)")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Phase-1 shaped static records, one file per rank, and a tiny BERT config."""
    return write_script_data(tmp_path_factory.mktemp("multihost"), RANKS, 24)


def exact_env(data, results, **extra):
    """script_env with tensor fusion off (see the module's docstring) and no host list."""
    env = script_env(data, results, **extra)
    env.setdefault("HOROVOD_FUSION_THRESHOLD", "0")
    return env


def two_host_env(ssh_hosts, data, results, paced=True):
    """As run.sub exports it on nodes 127.0.0.2,127.0.0.3 with GPUS_PER_NODE=2 and
    NETWORK_INTERFACE=lo, plus SSH_PORT; the test's `ssh` first on the PATH. `paced`: see
    test_preemption.script_env."""
    hosts = ",".join(f"{host}:{PER_HOST}" for host in ssh_hosts.hosts)
    env = exact_env(data, results, HOROVOD_LAUNCH_FLAGS=f"--gloo -H {hosts} --network-interface lo",
                    SSH_PORT=str(ssh_hosts.port), paced=paced)
    env["PATH"] = ssh_hosts.env(env)["PATH"]
    return env


def rank_logs(folder):
    """rank -> its log file's text (rank 0: run_pretraining.log, rank N: .rankN.log)."""
    logs = {}
    for name in os.listdir(folder):
        match = re.fullmatch(r"run_pretraining(?:\.rank(\d+))?\.log", name)
        if match:
            with open(os.path.join(folder, name), encoding="utf-8") as log:
                logs[int(match.group(1) or 0)] = log.read()
    return logs


def listing(results):
    """Every file under `results`, relative, with the summary files' time stamps left out."""
    return {re.sub(r"tfevents\.\d+", "tfevents.*", os.path.relpath(os.path.join(top, name),
                                                                   results))
            for top, _, names in os.walk(results) for name in names}


def final_weights(results):
    return checkpoint_tensors(str(results / "phase_1" / f"model.ckpt-{PHASE1_STEPS}"))


def assert_same_weights(got, expected):
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert np.array_equal(got[name], value), name


@pytest.fixture(scope="module")
def one_host(horovod, data, tmp_path_factory, repo_root):
    """The reference: the same 4 ranks on this host alone (the launcher's default -H)."""
    results = tmp_path_factory.mktemp("one-host")
    env = exact_env(data, results, paced=False)
    env.pop("HOROVOD_LAUNCH_FLAGS", None)
    env.pop("SSH_PORT", None)
    run_to_end(PHASE1, env, repo_root)
    return results


def test_two_hosts_by_ssh_lay_out_ranks_per_host_and_train_as_one_host(
        horovod, ssh_hosts, data, one_host, tmp_path, repo_root):  # noqa: F811
    from pretraining.input_pipeline import list_input_files
    results = tmp_path / "two-hosts"
    output = run_to_end(PHASE1, two_host_env(ssh_hosts, data, results, paced=False), repo_root)
    folder = results / "phase_1"
    logs = rank_logs(folder)
    assert sorted(logs) == list(range(RANKS)), sorted(os.listdir(folder))

    hosts = ssh_hosts.hosts
    files = list_input_files(str(data / "training"))
    one_host_logs = rank_logs(one_host / "phase_1")
    for rank, text in logs.items():
        layout = LAYOUT.search(text)
        assert layout, f"rank {rank}: no layout line in its log"
        got = layout.groups()
        expected = (str(rank), str(RANKS), hosts[rank // PER_HOST], str(rank % PER_HOST),
                    str(PER_HOST), str(rank // PER_HOST), str(len(hosts)))
        assert got == expected, f"rank {rank}: {layout.group(0)}"
        # Threads are chosen per host: 2 ranks share each "node" (4 on the one-host run).
        assert f", {PER_HOST} ranks on this node)" in text, f"rank {rank}: " + \
            " | ".join(re.findall(r"threads: .*", text))
        assert f", {RANKS} ranks on this node)" in one_host_logs[rank]
        # Each rank reads its own file (the records are split by whole files).
        mine = files[rank::RANKS]
        assert f"rank {rank} reads {len(mine)} training file(s): {', '.join(mine)}" in text
    # Ranks on both hosts took part in every allreduce: horovodrun reports no failure.
    assert "exit with status code" not in output

    # Only rank 0 writes checkpoints, summaries, the eval results and the dllog; the other
    # ranks write just their own log file (reporting/console.py) and their own input-pipeline
    # state (training/input_state.py: input_state/rank-<r>, read back on resume). The
    # two-host folder holds what the one-host one does.
    paths = listing(results)
    others = {path for path in paths if re.search(r"rank-?[1-9]", path)}
    assert others == {path for path in paths if re.fullmatch(
        r"phase_1/(run_pretraining\.rank[1-9]\.log|input_state/rank-[1-9]/.*)", path)}, others
    assert {path.split("/")[2] for path in others if "/input_state/" in path} == {
        f"rank-{rank}" for rank in range(1, RANKS)}
    assert paths == listing(one_host), paths ^ listing(one_host)

    assert_same_weights(final_weights(results), final_weights(one_host))


@pytest.mark.faults
def test_sigterm_to_the_launcher_reaches_ranks_on_other_hosts_and_resumes_exactly(
        horovod, ssh_hosts, data, one_host, tmp_path, repo_root):  # noqa: F811
    results = tmp_path / "interrupted"
    env = two_host_env(ssh_hosts, data, results)
    code, output = preempt(PHASE1, env, repo_root, after_step=2)
    assert_stopped_together_at_a_boundary(code, output, results / "phase_1", ranks=RANKS)

    run_to_end(PHASE1, two_host_env(ssh_hosts, data, results, paced=False), repo_root)
    got = final_weights(results)
    assert got["micro_step"] == PHASE1_STEPS * ACCUMULATION
    # The uninterrupted weights: those of the one-host run, which the first test showed the
    # uninterrupted two-host run ends on.
    assert_same_weights(got, final_weights(one_host))


# ---- A host lost outside Slurm: the run goes on with the other (scripts/elastic.sh) -------

ELASTIC_EVERY = 2   # a checkpoint every 2 optimizer steps
KILL_AFTER = 5      # rank 0's steps before host 127.0.0.3's rank is killed


def elastic_args(batch_phase1, lr_phase1, lr_phase2, ranks, accumulation):
    """NVIDIA's 15 positional arguments of both phases (phase 2: batch 8, 4 steps)."""
    return ["bash", "scripts/run_pretraining_lamb.sh", str(batch_phase1), "8", "4", lr_phase1,
            lr_phase2, "fp32", "false", str(ranks), "2", "1", str(TRAIN_STEPS),
            str(ELASTIC_EVERY), str(accumulation), str(accumulation), "base"]


@pytest.fixture(scope="module")
def both_phases(tmp_path_factory):
    """Records of both phases' shapes, two files each (one per rank), a tiny BERT config."""
    return write_both_phases(tmp_path_factory.mktemp("elastic-data"))


def both_phases_env(data, results, **extra):
    return with_both_phases(exact_env(data, results, **extra), data)


def one_rank_a_host_env(ssh_hosts, data, results, **extra):
    """The run scripts' environment for both hosts, one rank each, over the test's sshd."""
    first, second = ssh_hosts.hosts
    env = both_phases_env(data, results, HOROVOD_LAUNCH_FLAGS=f"--gloo -H {first}:1,{second}:1 "
                          "--network-interface lo", SSH_PORT=str(ssh_hosts.port), **extra)
    env["PATH"] = ssh_hosts.env(env)["PATH"]
    return env


def assert_ends_as_a_rerun_on_one_gpu(data, results, reference, repo_root):
    """The folder `reference` (as a failure left it) rerun by hand on 1 GPU, the recipe
    rescaled as NVIDIA's arithmetic does (accumulation x2, per-GPU rate x2), ends both phases
    on the weights `results` ended on, bit for bit."""
    env = both_phases_env(data, reference, paced=False)
    env.pop("HOROVOD_LAUNCH_FLAGS", None)
    run_to_end(elastic_args(32, "2e-3", "1e-3", 1, 2 * ACCUMULATION), env, repo_root,
               timeout=900)
    phase2_steps = TRAIN_STEPS // 10 * (32 * ACCUMULATION) // (8 * ACCUMULATION)
    for phase, steps in ((1, PHASE1_STEPS), (2, phase2_steps)):
        final = f"phase_{phase}/model.ckpt-{steps}"
        assert_same_weights(checkpoint_tensors(str(results / final)),
                            checkpoint_tensors(str(reference / final)))


@pytest.mark.faults
def test_a_hosts_rank_killed_the_run_goes_on_with_the_other_host_as_a_rerun_would(
        horovod, ssh_hosts, both_phases, tmp_path, repo_root):  # noqa: F811
    import shutil
    from kill_support import trainer_pid
    from test_preemption import Run
    first, second = ssh_hosts.hosts
    results = tmp_path / "results"
    env = one_rank_a_host_env(ssh_hosts, both_phases, results)
    run = Run(elastic_args(32, "1e-3", "5e-4", 2, ACCUMULATION), env, repo_root)
    try:
        run.wait_for(rf"\[0\]<std(err|out)>:.*step {KILL_AFTER}/", 600)
        pid = trainer_pid(1, results)
        assert pid, run.output[-3000:]
        os.kill(pid, 9)
        said = run.wait_for(r"^run_pretraining_lamb\.sh: attempt 1 failed", 300)
        # What a user would have rerun by hand: the folder as the failure left it.
        reference = tmp_path / "reference"
        shutil.copytree(results, reference)
        code = run.finish(900)
    finally:
        run.kill_tree()
    output = run.output
    assert code == 0, output[-4000:]
    # Rank 0's line is in its log file (horovodrun stops relaying a rank it is ending).
    log = (results / "phase_1" / "run_pretraining.log").read_text()
    saved = re.search(r"saved its last completed step, (\d+) ", log)
    assert saved, log[-4000:]
    last = int(saved.group(1))
    assert KILL_AFTER <= last < PHASE1_STEPS and last % ELASTIC_EVERY, output[-4000:]
    seconds = re.search(r"[(](\d+) s of work", said)
    assert seconds and said.strip() == (
        f"run_pretraining_lamb.sh: attempt 1 failed: rank 1: ssh ended with 255 (the rank "
        f"killed, or its host lost) on {second}; "
        f"phase_1 goes on from its checkpoint of step {last}: only the window in progress is "
        f"done again ({seconds.group(1)} s of work since it was written); going on with 1 "
        f"rank(s) on {first} (1 a node; per rank accumulation 8/8, the same global batch), "
        "attempt 2 of at most 4"), output[-4000:]
    assert output.count("attempt 1 failed") == 1 and "attempt 2 failed" not in output

    assert_ends_as_a_rerun_on_one_gpu(both_phases, results, reference, repo_root)


@pytest.mark.faults
def test_rank_0_killed_mid_checkpoint_and_a_relaunch_killed_too_the_run_ends_as_a_rerun_would(
        horovod, ssh_hosts, both_phases, tmp_path, repo_root):  # noqa: F811
    """Two failures at the stages a save cannot cover. Attempt 1: rank 0 (the chief, which
    saves) SIGKILLed while the checkpoint of step 4 is half written (its input states
    written, the model's not: BERT_TEST_CHECKPOINT_PAUSE_SECONDS), so nothing saves the last
    step and the relaunch goes on from step 2 on the other host. Attempt 2, the relaunch,
    SIGKILLed after its step 5 (its own checkpoint of step 4 whole): attempt 3 goes on from
    that, on the same host (the only one left, and it answers). Both phases end on
    the weights of the folder as attempt 1 left it, rerun by hand on 1 GPU."""
    import shutil
    from kill_support import trainer_pid
    from test_preemption import Run
    first, second = ssh_hosts.hosts
    results = tmp_path / "results"
    env = one_rank_a_host_env(ssh_hosts, both_phases, results,
                              BERT_TEST_CHECKPOINT_PAUSE_SECONDS="3")
    run = Run(elastic_args(32, "1e-3", "5e-4", 2, ACCUMULATION), env, repo_root)
    try:
        run.wait_for(r"\[0\]<std(err|out)>:.*test pause: the checkpoint of step 4 is half", 600)
        os.kill(trainer_pid(0, results), 9)
        first_failure = run.wait_for(r"^run_pretraining_lamb\.sh: attempt 1 failed", 300)
        reference = tmp_path / "reference"
        shutil.copytree(results, reference)
        run.wait_for(r"\[0\]<std(err|out)>:.*step 5/", 300)   # attempt 2: one rank, by ssh
        os.kill(trainer_pid(0, results), 9)
        second_failure = run.wait_for(r"^run_pretraining_lamb\.sh: attempt 2 failed", 300)
        code = run.finish(900)
    finally:
        run.kill_tree()
    output = run.output
    assert code == 0, output[-4000:]
    # (step 4's line comes after its checkpoint: the last logged step is 3)
    assert f"rank 0: ssh ended with 255 (the rank killed, or its host lost) on {first}; " \
           "phase_1 goes on from its checkpoint of step 2: step 3 is done again" \
           in first_failure, output[-4000:]
    assert f"going on with 1 rank(s) on {second} (1 a node; per rank accumulation 8/8" \
           in first_failure
    assert "saved its last completed step" not in output   # rank 0 was the rank lost
    assert f"on {second}; phase_1 goes on from its checkpoint of step 4: step 5 is done " \
           f"again" in second_failure, output[-4000:]
    # the only node left: it answers, so it is kept (nodes left out stay out)
    assert f"going on with 1 rank(s) on {second} " in second_failure

    assert_ends_as_a_rerun_on_one_gpu(both_phases, results, reference, repo_root)
