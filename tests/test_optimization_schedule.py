"""Learning-rate schedule and loss-scale state machines, on fed step values."""
import numpy as np
import pytest
import tensorflow as tf

from optimization import DynamicLossScale, FixedLossScale, learning_rate_schedule


def closed_form(step, init_lr, total, warmup, power, continuous=False):
    """NVIDIA's create_optimizer, transcribed: polynomial decay of an adjusted peak from
    step 0, linear warm-up; Adam adjusts the peak so the curve is continuous."""
    peak = init_lr
    if continuous:
        peak = init_lr * init_lr / (init_lr * (1.0 - warmup / total) ** power)
    if step < warmup:
        return init_lr * step / warmup
    return peak * (1.0 - min(step, total) / total) ** power


def evaluate_schedule(steps, **kwargs):
    with tf.Graph().as_default():
        global_step = tf.compat.v1.placeholder(tf.int64, [])
        lr = learning_rate_schedule(global_step=global_step, **kwargs)
        with tf.compat.v1.Session() as sess:
            return [sess.run(lr, {global_step: s}) for s in steps]


@pytest.mark.parametrize("power,continuous", [(1.0, True), (1.0, False), (0.5, False)])
def test_schedule_matches_closed_form(power, continuous):
    kwargs = dict(init_lr=6e-3, num_train_steps=1000, num_warmup_steps=100, power=power,
                  continuous=continuous)
    steps = [0, 1, 50, 99, 100, 101, 500, 999, 1000, 1500]
    values = evaluate_schedule(steps, **kwargs)
    expected = [closed_form(s, 6e-3, 1000, 100, power, continuous) for s in steps]
    np.testing.assert_allclose(values, expected, rtol=1e-6, atol=1e-12)


def test_schedule_landmarks():
    """Hand-computed values, so the test does not only compare the code with itself."""
    values = evaluate_schedule([0, 5, 10, 19, 100, 250], init_lr=1e-3, num_train_steps=100,
                               num_warmup_steps=10, power=0.5)
    np.testing.assert_allclose(values, [0.0, 5e-4, 1e-3 * 0.9 ** 0.5, 9e-4, 0.0, 0.0],
                               rtol=1e-6, atol=1e-12)
    # Adam (continuous): peak at the end of warm-up, then linear to 0 over the rest, as
    # HuggingFace's get_linear_schedule_with_warmup: lr * (100 - s) / (100 - 20).
    adam = evaluate_schedule([10, 20, 60, 100], init_lr=1e-3, num_train_steps=100,
                             num_warmup_steps=20, power=1.0, continuous=True)
    np.testing.assert_allclose(adam, [5e-4, 1e-3, 5e-4, 0.0], rtol=1e-6, atol=1e-12)
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
