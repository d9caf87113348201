"""Stops a run that no longer trains: every optimizer step skipped for non-finite gradients.

Skipped steps do not advance ``global_step`` (optimization.train_op), so such a run would
otherwise consume data forever at the same step. A float16 run legitimately skips a few
steps in a row while the dynamic loss scale comes down from its initial 2**32 (one halving
per skip, ~20 steps); far more than that in a row means the scale is already at its floor
or the model has diverged (NaN weights, a bad learning rate), and no further data will fix
it. The run then ends with an error naming the cause instead of exiting 0 with the weights
it had.
"""
import tensorflow as tf

tf1 = tf.compat.v1


class DivergenceError(RuntimeError):
    """Too many optimizer steps in a row were skipped for non-finite gradients."""


class DivergenceGuardHook(tf1.train.SessionRunHook):
    """Raises DivergenceError when ``consecutive_skips`` (fetched with every micro-batch,
    in the same run as the training op) reaches ``limit``; 0 disables the guard."""

    def __init__(self, consecutive_skips, limit):
        self._consecutive_skips = consecutive_skips
        self._limit = int(limit)

    def before_run(self, run_context):
        if self._limit <= 0:
            return None
        return tf1.train.SessionRunArgs(self._consecutive_skips)

    def after_run(self, run_context, run_values):
        if self._limit > 0 and int(run_values.results) >= self._limit:
            raise DivergenceError(
                f"{int(run_values.results)} optimizer steps in a row were skipped for "
                "non-finite gradients: the run is not training (diverged, or the loss "
                "scale is unusable); lower --learning_rate or check the data, then resume "
                "from an earlier checkpoint")
