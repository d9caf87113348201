"""BERT's learning-rate schedule: linear warm-up, then polynomial decay to zero.

With ``s = max(global_step - start_step, 0)``::

    lr(s) = init_lr * s / num_warmup_steps                               if s < num_warmup_steps
    lr(s) = init_lr * (1 - min(s, num_train_steps) / num_train_steps) ** power   otherwise

The decay is measured from step 0, not from the end of warm-up (as in Google's and
NVIDIA's BERT), so the curve drops slightly at the crossover; ``power`` is 1 (linear)
for Adam and 0.5 for LAMB.

``start_step`` is the phase-2 offset: the phase-2 run continues ``global_step`` from the
phase-1 checkpoint but must do its own warm-up and decay over its own
``num_train_steps`` (phase-2 steps only), so the schedule runs on the distance from
the step where the phase began.
"""
import tensorflow as tf


def learning_rate_schedule(init_lr, num_train_steps, num_warmup_steps, global_step,
                           power=1.0, start_step=0):
    """Returns the float32 learning rate for ``global_step`` (a scalar integer tensor)."""
    if num_train_steps <= 0:
        raise ValueError(f"num_train_steps must be positive, got {num_train_steps}")
    with tf.name_scope("learning_rate"):
        # Integer arithmetic first: 1 - 999/1000 in float32 would lose 4 digits.
        step = tf.maximum(tf.cast(global_step, tf.int64) - int(start_step), 0)
        remaining = tf.maximum(int(num_train_steps) - step, 0)
        remaining = tf.cast(remaining, tf.float32) / float(num_train_steps)
        learning_rate = init_lr * tf.pow(remaining, power)
        if num_warmup_steps > 0:
            warmup_rate = init_lr * tf.cast(step, tf.float32) / float(num_warmup_steps)
            learning_rate = tf.where(step < int(num_warmup_steps), warmup_rate, learning_rate)
        return tf.identity(learning_rate, name="value")
