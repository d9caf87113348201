"""BERT's learning-rate schedule: linear warm-up, then polynomial decay to zero.

With ``s = global_step`` (optimizer updates applied in this run's folder)::

    lr(s) = init_lr * s / num_warmup_steps                           if s < num_warmup_steps
    lr(s) = peak * (1 - min(s, num_train_steps) / num_train_steps) ** power    otherwise

``power`` is 0.5 for LAMB and 1 (linear) for Adam, and ``peak`` is NVIDIA's choice per
optimizer (their ``create_optimizer``):

* LAMB: ``peak = init_lr``. The decay is measured from step 0, not from the end of
  warm-up, so the curve drops at the crossover (to ``init_lr * (1 - w/T) ** 0.5``).
* Adam (``continuous=True``): ``peak = init_lr / (1 - w/T) ** power``, so the decay starts
  exactly at ``init_lr`` where warm-up ends; for power 1 this is ``init_lr * (T - s) /
  (T - w)``, HuggingFace's linear schedule with warm-up. Google's original code had the
  drop for Adam too; NVIDIA's fine-tuning scripts (and ours) do not.

Each pre-training phase runs in its own output folder from the previous phase's weights
(a fresh ``global_step``), so the schedule needs no phase offset.
"""
import tensorflow as tf


def learning_rate_schedule(init_lr, num_train_steps, num_warmup_steps, global_step,
                           power=1.0, continuous=False):
    """Returns the float32 learning rate for ``global_step`` (a scalar integer tensor)."""
    if num_train_steps <= 0:
        raise ValueError(f"num_train_steps must be positive, got {num_train_steps}")
    peak = float(init_lr)
    if continuous and 0 < num_warmup_steps < num_train_steps:
        peak = init_lr / (1.0 - num_warmup_steps / num_train_steps) ** power
    with tf.name_scope("learning_rate"):
        # Integer arithmetic first: 1 - 999/1000 in float32 would lose 4 digits.
        step = tf.maximum(tf.cast(global_step, tf.int64), 0)
        remaining = tf.maximum(int(num_train_steps) - step, 0)
        remaining = tf.cast(remaining, tf.float32) / float(num_train_steps)
        learning_rate = peak * tf.pow(remaining, power)
        if num_warmup_steps > 0:
            warmup_rate = init_lr * tf.cast(step, tf.float32) / float(num_warmup_steps)
            learning_rate = tf.where(step < int(num_warmup_steps), warmup_rate, learning_rate)
        return tf.identity(learning_rate, name="value")
