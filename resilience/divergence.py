"""Stops a run that no longer trains: every optimizer step skipped for non-finite gradients.

Skipped steps do not advance ``global_step`` (optimization.train_op), so such a run would
otherwise consume data forever at the same step. A float16 run legitimately skips a few
steps in a row while the dynamic loss scale comes down from its initial 2**32 (one halving
per skip, ~20 steps); far more than that in a row means the scale is already at its floor
or the model has diverged (NaN weights, a bad learning rate), and no further data will fix
it. The run then ends with an error naming the cause instead of exiting 0 with the weights
it had. Weights that became non-finite anyway are never saved (`FiniteWeightsGuard`).
"""
import os

import numpy as np
import tensorflow as tf

from modeling.checkpoints import is_accumulation_buffer

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


class NonFiniteWeightsError(RuntimeError):
    """A checkpoint would have held a NaN or an infinity: refused, the run stops."""


class FiniteWeightsGuard(tf1.train.CheckpointSaverListener):
    """Refuses every checkpoint save (raises NonFiniteWeightsError, which ends the run in one
    line) while a weight or optimizer state holds a NaN or an infinity, so that the latest
    checkpoint in the folder is always one a rerun can resume from. (A NaN checkpoint used
    to become the latest: the advised rerun resumed from it and failed again.)

    Cost: one boolean per variable, computed in the graph (on each variable's device) and
    fetched only when a checkpoint is saved, never with the training steps. Gradient-
    accumulation buffers are left out (`is_accumulation_buffer`), as the resume check leaves
    them out. Pass it to `Estimator.train(saving_listeners=...)` before the listeners that
    write (input state); `check` serves a save made elsewhere (preemption)."""

    def __init__(self, model_dir):
        self._model_dir = model_dir
        self._finite = None

    def begin(self):
        self.build()

    def build(self):
        """Adds the check to the default graph (before it is finalized; idempotent)."""
        graph = tf1.get_default_graph()
        if self._finite is not None and self._finite.graph is graph:
            return
        variables = [variable for variable in tf1.global_variables()
                     if variable.dtype.base_dtype.is_floating
                     and not is_accumulation_buffer(variable.op.name)]
        self._names = [variable.op.name for variable in variables]
        flags = []
        for variable in variables:
            with tf1.device(variable.device):
                flags.append(tf.reduce_all(tf.math.is_finite(variable)))
        self._finite = tf.stack(flags) if flags else tf.constant([True])

    def before_save(self, session, global_step_value):
        self.check(session, global_step_value)

    def check(self, session, step):
        finite = session.run(self._finite)
        if finite.all():
            return
        name = self._names[int(np.argmin(finite))]
        latest = tf1.train.latest_checkpoint(self._model_dir) if self._model_dir else None
        kept = (f"{os.path.basename(latest)} stays the latest checkpoint: resume from it with "
                "a lower --learning_rate (or check the data)" if latest
                else "no checkpoint was written")
        raise NonFiniteWeightsError(
            f"{self._model_dir}: refusing to save a checkpoint at step {step}: {name} holds "
            f"a NaN or an infinity (the weights diverged); {kept}")
