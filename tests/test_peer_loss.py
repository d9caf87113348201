"""A rank lost mid-window (training/last_window.py): the chief saves the last completed
optimizer step before it stops, and that checkpoint is the one an uninterrupted run writes at
the same step, bit for bit; resumed on the same two ranks it ends on the uninterrupted run's
weights.

Two Horovod ranks over Gloo (horovodrun, as `scripts/run_pretraining_lamb_phase1.sh` starts
them), accumulation 4, no scheduled checkpoint before the end (every 1000 steps): rank 1 is
SIGKILLed (as an out-of-memory kill or a crashed GPU) right after rank 0 logged an optimizer
step, so inside the next window; without the chief's save the run would have to start over.
"""
import os
import re
import signal

import numpy as np
import pytest
import tensorflow as tf

from kill_support import trainer_pid
from test_preemption import (ACCUMULATION, PHASE1, PHASE1_STEPS, POSITIONAL,  # noqa: F401
                             Run, checkpoint_tensors, data, horovod, run_to_end, script_env)

pytestmark = [pytest.mark.horovod, pytest.mark.slow, pytest.mark.faults]

KILL_AFTER = 3   # optimizer steps rank 0 logged before rank 1 is killed


def kill_rank_1_after(step, args, env, cwd, results, timeout=600):
    """Runs `args`, SIGKILLs rank 1's trainer once rank 0 logged optimizer step `step`;
    returns (exit code, output)."""
    run = Run(args, env, cwd)
    try:
        run.wait_for(rf"\[0\]<std(err|out)>:.*step {step}/", timeout)
        pid = trainer_pid(1, results)
        assert pid, run.output[-3000:]
        os.kill(pid, signal.SIGKILL)
        code = run.finish(timeout)
    finally:
        run.kill_tree()
    return code, run.output


def test_a_rank_killed_mid_window_the_chief_saves_the_last_completed_step_exactly(
        horovod, data, tmp_path, repo_root):
    interrupted = tmp_path / "interrupted"
    code, output = kill_rank_1_after(KILL_AFTER, PHASE1, script_env(data, interrupted),
                                     repo_root, interrupted)
    assert code != 0, output[-3000:]
    said = re.search(r"the run failed \(a rank lost\?\): saved its last completed step, "
                     r"(\d+) \(micro_step (\d+)\), to (\S+) in [\d.]+ s", output)
    assert said, output[-3000:]
    step = int(said.group(1))
    assert KILL_AFTER <= step < PHASE1_STEPS, output[-3000:]
    assert int(said.group(2)) == step * ACCUMULATION
    folder = interrupted / "phase_1"
    assert tf.train.latest_checkpoint(str(folder)).endswith(f"model.ckpt-{step}")

    # The same step of a run never interrupted (a checkpoint every `step` steps): every
    # variable equal, bit for bit, the accumulation buffers empty as at any window's end.
    reference = tmp_path / "reference"
    every = list(PHASE1[:2]) + POSITIONAL[:11] + [str(step)] + POSITIONAL[12:]
    run_to_end(every, script_env(data, reference, paced=False), repo_root)
    expected = checkpoint_tensors(str(reference / "phase_1" / f"model.ckpt-{step}"))
    got = checkpoint_tensors(str(folder / f"model.ckpt-{step}"))
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        assert np.array_equal(got[name], value), name
    assert got["gradient_accumulation/local_step"] == 0
    assert not any(np.any(value) for name, value in got.items() if name.endswith("/accum"))

    # Resumed on the same two ranks (no input state at that step: the pipeline skips the
    # records read since the start, a warning says so), it ends on the reference's weights.
    resumed = run_to_end(PHASE1, script_env(data, interrupted, paced=False), repo_root)
    assert "skipping" in resumed, resumed[-3000:]
    final = f"model.ckpt-{PHASE1_STEPS}"
    expected = checkpoint_tensors(str(reference / "phase_1" / final))
    got = checkpoint_tensors(str(folder / final))
    for name, value in expected.items():
        assert np.array_equal(got[name], value), name
