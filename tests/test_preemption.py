"""Preemption on a cluster: SIGTERM to our launcher (scripts/launch_common.sh `launch`) or
to the Slurm batch script (scripts/run.sub) makes both Horovod ranks stop at the same
accumulation boundary, rank 0 checkpoint, every rank exit 0 under the launcher (143 when run
alone) and the launcher 143; rerunning the same command resumes to weights identical to an
uninterrupted run."""
import os
import queue
import re
import signal
import stat
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from pretraining_records import write_script_data

ACCUMULATION = 4
TRAIN_STEPS = 10                       # phase 1 gets 90%: 9 optimizer steps
PHASE1_STEPS = TRAIN_STEPS * 9 // 10
# Large enough that a micro-batch outlasts the signal's way from the test to the ranks, so a
# signal sent right after an optimizer step lands inside the next accumulation window.
BATCH = 32

pytestmark = [pytest.mark.horovod, pytest.mark.slow, pytest.mark.faults]


@pytest.fixture(scope="module")
def horovod():
    pytest.importorskip("horovod.tensorflow", reason="Horovod not installed "
                        "(bash scripts/install.sh builds it)")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Phase-1 shaped records (sequence 128, 20 predictions) and a tiny BERT config."""
    return write_script_data(tmp_path_factory.mktemp("preemption"), 2, 96)


def script_env(data, results, paced=True, **extra):
    """The run scripts' environment. Paced (the default, for a run a signal or a kill must
    land in): BERT_TEST_MICRO_BATCH_SECONDS, each micro-batch waits 0.15 s more
    (training.pauses_for_tests), so a signal sent after step 2 lands before the last of the 9
    steps on any CPU (on a Zen 5 they took ~2 s, the signal's way). `paced=False` for a run
    nothing interrupts (a reference, a resumption to the end): the wait changes no weight, so
    such a run only loses time to it (~15 s a run of both phases on one rank)."""
    env = dict(os.environ, BERT_CONFIG=str(data / "bert_config.json"),
               RESULTS_DIR=str(results), PYTHON=sys.executable, DISPLAY_LOSS_STEPS="1",
               TRAIN_DATA_PHASE1=str(data / "training"), EVAL_DATA_PHASE1=str(data / "test"),
               TRAIN_DATA_PHASE2=str(data / "training"), EVAL_DATA_PHASE2=str(data / "test"),
               **extra)
    if paced:
        env["BERT_TEST_MICRO_BATCH_SECONDS"] = "0.15"
    else:  # nor from the caller's environment
        env.pop("BERT_TEST_MICRO_BATCH_SECONDS", None)
    return env


# NVIDIA's 15 positional arguments: batch 32/2, eval 4, lr 1e-3/5e-4, fp32, no XLA, 2 GPUs,
# warm-up 2/1, 10 steps, checkpoint every 1000, accumulation 4/4, model name (config: env).
POSITIONAL = [str(BATCH), "2", "4", "1e-3", "5e-4", "fp32", "false", "2", "2", "1",
              str(TRAIN_STEPS), "1000", str(ACCUMULATION), str(ACCUMULATION), "base"]
PHASE1 = ["bash", "scripts/run_pretraining_lamb_phase1.sh"] + POSITIONAL


class Run:
    """A process whose merged output is read by a thread (so waits can time out) and whose
    whole process tree is killed if the test fails half-way (horovodrun runs in a session of
    its own, out of reach of a process-group kill)."""

    def __init__(self, args, env, cwd):
        self.process = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.lines = []
        self._queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern, timeout):
        """Reads output until a line matches `pattern`; fails on timeout or exit."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                line = self._queue.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                pytest.fail("ended before /%s/:\n%s" % (pattern, self.output[-3000:]))
            self.lines.append(line)
            if re.search(pattern, line):
                return line
        pytest.fail(f"no /{pattern}/ within {timeout} s:\n{self.output[-3000:]}")

    def finish(self, timeout):
        self.process.wait(timeout=timeout)
        while True:
            line = self._queue.get(timeout=10)
            if line is None:
                return self.process.returncode
            self.lines.append(line)

    @property
    def output(self):
        return "".join(self.lines)

    def kill_tree(self):
        """Kills what is left: the descendants, and the session's orphans (under a launcher
        that died of the signal, horovodrun and its ranks would go on)."""
        import psutil  # comes with Horovod
        try:
            processes = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            processes = []
        for process in psutil.process_iter():
            try:
                if os.getsid(process.pid) == self.process.pid:
                    processes.append(process)
            except OSError:
                pass
        for process in processes + [self.process]:
            try:
                process.kill()
            except (psutil.NoSuchProcess, ProcessLookupError):
                pass


def run_to_end(args, env, cwd, timeout=600):
    run = Run(args, env, cwd)
    try:
        code = run.finish(timeout)
    finally:
        run.kill_tree()
    assert code == 0, run.output[-3000:]
    return run.output


def preempt(args, env, cwd, after_step=2, timeout=600):
    """Starts `args`, sends SIGTERM to it (the launching shell only) right after rank 0
    logged optimizer step `after_step`; returns (exit code, output)."""
    run = Run(args, env, cwd)
    try:
        run.wait_for(rf"\[0\]<std(err|out)>:.*step {after_step}/", timeout)
        run.process.send_signal(signal.SIGTERM)
        code = run.finish(timeout)
    finally:
        run.kill_tree()
    return code, run.output


def checkpoint_tensors(path):
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def assert_stopped_together_at_a_boundary(code, output, folder, ranks=2):
    """All `ranks` ranks agreed and exited 0, and the checkpoint closes an accumulation
    window."""
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert "preempted by SIGTERM" in output
    assert "exit with status code" not in output, output[-3000:]   # horovodrun: a rank failed
    agreed = dict(re.findall(r"rank (\d+): preemption agreed by all ranks.*\((\d+) micro-batches "
                             r"after", output))
    assert set(agreed) == {str(rank) for rank in range(ranks)}, output[-3000:]
    assert "preempted: saved" in output
    state = checkpoint_tensors(tf.train.latest_checkpoint(str(folder)))
    assert state["micro_step"] % ACCUMULATION == 0
    assert state["micro_step"] == state["global_step"] * ACCUMULATION
    assert state["gradient_accumulation/local_step"] == 0
    assert 0 < state["global_step"] < PHASE1_STEPS, "stopped too late to test resuming"
    return int(agreed["0"])


@pytest.mark.long
def test_sigterm_to_the_launcher_mid_window_stops_both_ranks_and_resumes_exactly(
        horovod, data, tmp_path, repo_root):
    reference = tmp_path / "reference"
    run_to_end(PHASE1, script_env(data, reference, paced=False), repo_root)

    # The signal must arrive inside a window, so that the ranks have to go on to its end
    # before stopping. Its arrival is a matter of timing (a loaded machine can deliver it in
    # a window's last micro-batch, ~1 time in 4), so an attempt that landed on a boundary is
    # repeated in a fresh folder; every attempt must still stop cleanly.
    for attempt in range(4):
        interrupted = tmp_path / f"interrupted-{attempt}"
        env = script_env(data, interrupted)
        code, output = preempt(PHASE1, env, repo_root)
        waited = assert_stopped_together_at_a_boundary(code, output, interrupted / "phase_1")
        if waited >= 1:
            break
    assert waited >= 1, "the signal landed on a window boundary 4 times: the test proved nothing"

    run_to_end(PHASE1, script_env(data, interrupted, paced=False), repo_root)
    final = f"model.ckpt-{PHASE1_STEPS}"
    expected = checkpoint_tensors(str(reference / "phase_1" / final))
    got = checkpoint_tensors(str(interrupted / "phase_1" / final))
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        assert np.array_equal(got[name], value), name
    assert got["micro_step"] == PHASE1_STEPS * ACCUMULATION


def test_sigterm_to_the_slurm_batch_script_reaches_the_ranks(horovod, data, tmp_path,
                                                              repo_root):
    """run.sub as Slurm runs it with --signal=B:TERM@...: only the batch shell is signalled."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    scontrol = stubs / "scontrol"
    scontrol.write_text("#!/bin/sh\n# scontrol show hostnames LIST: one host a line\n"
                        "echo \"$3\" | tr ',' '\\n'\n")
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IXUSR)
    results = tmp_path / "results"
    env = script_env(data, results, SLURM_JOB_NODELIST="localhost", GPUS_PER_NODE="2",
                     SLURM_SUBMIT_DIR=repo_root,
                     PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}")
    env.pop("NETWORK_INTERFACE", None)
    code, output = preempt(["bash", "scripts/run.sub"] + POSITIONAL, env, repo_root,
                           after_step=1)
    assert "nodes: localhost -> 2 ranks" in output
    assert_stopped_together_at_a_boundary(code, output, results / "phase_1")
    # the preempted phase 1 did not let phase 2 start from its unfinished weights
    assert "== phase 2" not in output and not (results / "phase_2").exists()
