"""Learning-rate schedule and loss-scale state machines, on fed step values."""
import numpy as np
import pytest
import tensorflow as tf

from optimization import DynamicLossScale, FixedLossScale, learning_rate_schedule


def closed_form(step, init_lr, total, warmup, power, start):
    s = max(step - start, 0)
    if s < warmup:
        return init_lr * s / warmup
    return init_lr * (1.0 - min(s, total) / total) ** power


def evaluate_schedule(steps, **kwargs):
    with tf.Graph().as_default():
        global_step = tf.compat.v1.placeholder(tf.int64, [])
        lr = learning_rate_schedule(global_step=global_step, **kwargs)
        with tf.compat.v1.Session() as sess:
            return [sess.run(lr, {global_step: s}) for s in steps]


@pytest.mark.parametrize("power", [1.0, 0.5])
@pytest.mark.parametrize("start", [0, 7038])
def test_schedule_matches_closed_form(power, start):
    kwargs = dict(init_lr=6e-3, num_train_steps=1000, num_warmup_steps=100, power=power,
                  start_step=start)
    offsets = [0, 1, 50, 99, 100, 101, 500, 999, 1000, 1500]
    steps = [start + o for o in offsets]
    values = evaluate_schedule(steps, **kwargs)
    expected = [closed_form(s, 6e-3, 1000, 100, power, start) for s in steps]
    np.testing.assert_allclose(values, expected, rtol=1e-6, atol=1e-12)


def test_schedule_landmarks():
    """Hand-computed values, so the test does not only compare the code with itself."""
    values = evaluate_schedule([0, 5, 10, 19, 100, 250], init_lr=1e-3, num_train_steps=100,
                               num_warmup_steps=10, power=0.5, start_step=0)
    np.testing.assert_allclose(values, [0.0, 5e-4, 1e-3 * 0.9 ** 0.5, 9e-4, 0.0, 0.0],
                               rtol=1e-6, atol=1e-12)
    # Phase 2: global_step continues from phase 1, the schedule restarts at start_step.
    phase2 = evaluate_schedule([500, 1000, 1010, 1050, 1100], init_lr=4e-3,
                               num_train_steps=100, num_warmup_steps=20, start_step=1000)
    np.testing.assert_allclose(phase2, [0.0, 0.0, 2e-3, 4e-3 * 0.5, 0.0], rtol=1e-6,
                               atol=1e-12)
    no_warmup = evaluate_schedule([0, 50], init_lr=1e-3, num_train_steps=100,
                                  num_warmup_steps=0)
    np.testing.assert_allclose(no_warmup, [1e-3, 5e-4], rtol=1e-6)


def run_loss_scale(make, finite_sequence):
    """Feeds a sequence of 'gradients finite?' flags; returns (scale, good, skipped) after each."""
    with tf.Graph().as_default():
        scaler = make()
        finite = tf.compat.v1.placeholder(tf.bool, [])
        update = scaler.update(finite)
        with tf.control_dependencies([update]):
            state = (scaler.scale, scaler.skipped_steps.read_value())
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return [tuple(sess.run(state, {finite: f})) for f in finite_sequence]


def test_dynamic_loss_scale_halves_grows_and_floors():
    seq = [False, True, True, True, True, False, False, False, False, True]
    history = run_loss_scale(lambda: DynamicLossScale(8.0, growth_interval=3), seq)
    scales = [h[0] for h in history]
    skipped = [h[1] for h in history]
    # halve; 3 good -> double; a failure resets the count; floor at 1.
    assert scales == [4.0, 4.0, 4.0, 8.0, 8.0, 4.0, 2.0, 1.0, 1.0, 1.0]
    assert skipped == [1, 1, 1, 1, 1, 2, 3, 4, 5, 5]


def test_fixed_loss_scale_only_counts_skips():
    history = run_loss_scale(lambda: FixedLossScale(1.0), [True, False, True, False])
    assert [h[0] for h in history] == [1.0] * 4
    assert [h[1] for h in history] == [0, 1, 1, 2]
