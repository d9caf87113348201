"""The training summary's throughput is the steady-state rate a long run keeps: warm-up steps
and checkpoint writes are one-time costs, left out of `average_*_per_second` and reported
apart (a 10-step run used to report 0.93-0.97 seq/s where its steady state was 1.25)."""
import types

import pytest

from test_pretraining import make_flags, write_data


class _Clock:
    """time.time for `training.hooks`, advanced by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _step(hook, clock, step, seconds, write_seconds=0.0):
    """One optimizer step of `seconds`, of which `write_seconds` went to a checkpoint write
    (timed by the saving listeners, as the Estimator calls them)."""
    from training.hooks import CHECKPOINT_WRITES
    hook.before_run(None)
    clock.now += seconds - write_seconds
    if write_seconds:
        first, last = CHECKPOINT_WRITES.timers()
        first.before_save(None, step)
        clock.now += write_seconds
        last.after_save(None, step)
    hook.after_run(None, types.SimpleNamespace(results=dict(
        global_step=step, is_optimizer_step=True, total_loss=1.0)))


def test_warm_up_and_checkpoint_writes_are_reported_apart_not_averaged_in(monkeypatch):
    from training import hooks
    clock = _Clock()
    monkeypatch.setattr(hooks.time, "time", clock)
    hook = hooks.StepLoggingHook({}, 1, 8, is_chief=False, started_at=clock.now - 30.0)
    hook.begin()
    clock.now += 5.0  # session, restore, step-0 checkpoint: before the first step
    # steps 1-2 build executors (10 s and 6 s), steps 3-6 take 2 s of compute each, and
    # step 4 also wrote a checkpoint for 3 s
    for step, seconds, written in ((1, 10, 0), (2, 6, 0), (3, 2, 0), (4, 5, 3), (5, 2, 0),
                                   (6, 2, 0)):
        _step(hook, clock, step, seconds, written)
    summary = hook.summary()
    assert summary["average_sequences_per_second"] == pytest.approx(8 / 2.0)
    assert summary["steady_steps"] == "3-6"
    assert summary["warmup_seconds"] == pytest.approx(16.0)
    assert summary["checkpoint_seconds"] == pytest.approx(3.0)
    assert summary["checkpoints_written"] == 1
    assert summary["startup_seconds"] == pytest.approx(35.0)
    assert summary["average_sequences_per_second_with_overhead"] == pytest.approx(6 * 8 / 27.0)
    # the step's own record leaves the write out too
    assert hook.records[3]["sequences_per_second"] == pytest.approx(8 / 2.0)


def test_logs_of_ten_steps_leave_out_only_the_first_interval(monkeypatch):
    """Logged every 10 steps, the first interval (steps 1-10) is the warm-up; the next one
    starts after it and is measured whole."""
    from training import hooks
    clock = _Clock()
    monkeypatch.setattr(hooks.time, "time", clock)
    hook = hooks.StepLoggingHook({}, 10, 4, is_chief=False)
    hook.begin()
    for step in range(1, 31):
        _step(hook, clock, step, 9.0 if step == 1 else 1.0)
    summary = hook.summary()
    assert summary["steady_steps"] == "11-30"
    assert summary["average_sequences_per_second"] == pytest.approx(4.0)
    assert summary["warmup_seconds"] == pytest.approx(18.0)


def test_the_summary_s_final_step_and_loss_are_the_run_s_last_not_its_last_log_s(monkeypatch):
    """168 steps logged every 20 (fine-tuning's shape: the summary said final_step 160 and
    that interval's mean loss), 2 micro-batches a step: the summary names step 168 and the
    loss of that step (the mean of its micro-batches), whatever the logs did."""
    from training import hooks
    clock = _Clock()
    monkeypatch.setattr(hooks.time, "time", clock)
    hook = hooks.StepLoggingHook({}, 20, 4, is_chief=False)
    hook.begin()
    loss = {}
    for step in range(1, 169):
        for micro in (0, 1):
            loss[step, micro] = 10.0 / step + micro  # every micro-batch its own loss
            hook.before_run(None)
            clock.now += 0.5
            hook.after_run(None, types.SimpleNamespace(results=dict(
                global_step=step if micro else step - 1, is_optimizer_step=bool(micro),
                total_loss=loss[step, micro], masked_lm_loss=2 * loss[step, micro])))
    assert [record["step"] for record in hook.records][-1] == 160
    summary = hook.summary()
    assert summary["final_step"] == 168
    expected = (loss[168, 0] + loss[168, 1]) / 2
    assert summary["total_loss"] == pytest.approx(expected)
    assert summary["masked_lm_loss"] == pytest.approx(2 * expected)


@pytest.mark.slow
def test_a_real_run_times_its_checkpoint_writes(tmp_path):
    """run_pretraining with a checkpoint every 2 steps: the listeners around the Estimator's
    saves (training.resume) time the writes during training, and the summary says which
    steps its average covers."""
    from pretraining.runner import run
    (tmp_path / "data").mkdir()
    data = write_data(tmp_path / "data")
    train = run(make_flags(data, tmp_path / "run", num_train_steps=6,
                           save_checkpoints_steps=2))["train"]
    assert train["steady_steps"] == "3-6"
    assert train["checkpoints_written"] >= 1 and train["checkpoint_seconds"] > 0
    assert train["startup_seconds"] > 0 and train["warmup_seconds"] > 0
    assert train["average_sequences_per_second"] > 0


def test_start_up_counts_from_the_process_start_for_the_first_job_only(monkeypatch):
    """A command's one job pays the process's start-up (imports, TensorFlow); a later job of
    the same process (the demo's phases) counts from its own beginning."""
    from training import hooks
    monkeypatch.setattr(hooks, "_a_job_started", False)
    monkeypatch.setattr(hooks, "process_start_time", lambda: 1000.0)
    monkeypatch.setattr(hooks.time, "time", lambda: 5000.0)
    assert hooks.job_start_time() == 1000.0
    assert hooks.job_start_time() == 5000.0
