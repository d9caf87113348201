"""Loss scaling for float16 training, as graph-mode variables saved in checkpoints.

float16 gradients underflow to zero below ~6e-8. Multiplying the loss by a large
factor S before back-propagation shifts the gradients into float16's range; dividing
them by S afterwards (in float32) restores their value. Too large an S overflows
instead, which shows up as Inf/NaN gradients: that step is skipped and S halved.
``DynamicLossScale`` finds the largest safe S on its own: it halves on overflow and
doubles after ``growth_interval`` consecutive finite steps, so it keeps probing upward.

Both classes keep ``skipped_steps``, the number of optimizer steps thrown away because
of non-finite gradients, for logging (a run whose counter keeps rising is diverging).
``FixedLossScale`` (scale 1 for float32 and bfloat16, whose range needs no scaling)
still skips non-finite steps and counts them.

Variables (non-trainable, in GLOBAL_VARIABLES so the Saver keeps them, so a resumed
run continues with the scale it had found): ``loss_scale/loss_scale`` (float32),
``loss_scale/good_steps``, ``loss_scale/skipped_steps`` and ``loss_scale/consecutive_skips``
(int64). The defaults are NVIDIA's: initial scale 2**32, doubled after 1000 good steps.
"""
import tensorflow as tf

from optimization.state_names import LOSS_SCALE_SCOPE


def _state_variable(name, initial_value, dtype):
    """A non-trainable variable named ``loss_scale/<name>`` in the outermost graph."""
    with tf.init_scope(), tf.compat.v1.name_scope(LOSS_SCALE_SCOPE + "/"):
        return tf.compat.v1.Variable(initial_value, name=name, dtype=dtype, trainable=False,
                                     use_resource=True)


class FixedLossScale:
    """A constant loss scale; ``update`` only counts skipped steps (in total and in a
    row: the run-length lets a hook stop a run that no longer trains)."""

    def __init__(self, scale=1.0):
        self._scale = float(scale)
        self.skipped_steps = _state_variable("skipped_steps", 0, tf.int64)
        self.consecutive_skips = _state_variable("consecutive_skips", 0, tf.int64)

    @property
    def is_identity(self):
        """True when the scale is the constant 1 (gradients need no unscaling)."""
        return type(self) is FixedLossScale and self._scale == 1.0

    @property
    def scale(self):
        """The current loss scale as a float32 scalar tensor."""
        return tf.constant(self._scale, tf.float32)

    def update(self, grads_finite):
        """Returns the op recording one optimizer step whose gradients were ``grads_finite``."""
        skipped = tf.cast(tf.logical_not(grads_finite), tf.int64)
        in_a_row = tf.where(grads_finite, tf.constant(0, tf.int64),
                            self.consecutive_skips.read_value() + 1)
        return tf.group(self.skipped_steps.assign_add(skipped, read_value=False),
                        self.consecutive_skips.assign(in_a_row, read_value=False))


class DynamicLossScale(FixedLossScale):
    """Halves the scale on non-finite gradients, doubles it after ``growth_interval``
    consecutive finite steps; never goes below ``min_scale``."""

    def __init__(self, initial_scale=2.0 ** 32, growth_interval=1000, factor=2.0,
                 min_scale=1.0):
        super().__init__(initial_scale)
        self.growth_interval = int(growth_interval)
        self.factor = float(factor)
        self.min_scale = float(min_scale)
        self.loss_scale = _state_variable("loss_scale", float(initial_scale), tf.float32)
        self.good_steps = _state_variable("good_steps", 0, tf.int64)

    @property
    def scale(self):
        return self.loss_scale.read_value()

    def update(self, grads_finite):
        scale = self.loss_scale.read_value()
        counted = self.good_steps.read_value() + 1
        good_steps = tf.where(grads_finite, counted, tf.zeros_like(counted))
        grow = good_steps >= self.growth_interval
        grown = scale * self.factor
        grown = tf.where(tf.math.is_finite(grown), grown, scale)
        shrunk = tf.maximum(scale / self.factor, self.min_scale)
        new_scale = tf.where(grads_finite, tf.where(grow, grown, scale), shrunk)
        new_good_steps = tf.where(grow, tf.zeros_like(good_steps), good_steps)
        return tf.group(
            self.loss_scale.assign(new_scale, read_value=False),
            self.good_steps.assign(new_good_steps, read_value=False),
            super().update(grads_finite))
