"""Resuming a checkpoint that holds no accumulation state into a run that accumulates.

A checkpoint written without gradient accumulation (`--num_accumulation_steps=1`), or with
fewer in-graph towers, lacks the float32 buffers and the micro-batch counter that a run with
accumulation (or with more towers) keeps (`optimization.gradient_accumulation`). Such a
resume is legitimate where the global batch is kept: a job requeued on half the nodes with
twice the accumulation (`resilience.data_order` accepts it), or a deliberate
`--reset_data_position`. TensorFlow's Saver restores every variable of the graph and fails on
the first missing one, so the run stopped with a list of checkpoint variables.

What is missing has one right value: a checkpoint without buffers held no pending window, so
the buffers are zero and the counter is 0, which is what their initialisers give. The
`FillingSaver` saves like the Estimator's default Saver (every variable, sharded) and, when
the checkpoint it restores lacks some accumulation state, restores the rest and initialises
that state. Only accumulation state may be missing: anything else (weights, optimizer moments,
the loss scale) stays a refusal of another model or training setup
(`modeling.checkpoints.refuse_other_model`).
"""
import tensorflow as tf
from absl import logging

from modeling.checkpoints import checkpoint_variables
from optimization import state_names

tf1 = tf.compat.v1


def _name(variable):
    return variable.name[:-2] if variable.name.endswith(":0") else variable.name


def is_accumulation_state(name):
    """True for a gradient-accumulation buffer (any tower's) or the micro-batch counter."""
    return (name.endswith("/" + state_names.GRAD_ACCUM)
            or name.startswith(state_names.ACCUMULATION_SCOPE + "/"))


def absent_accumulation_state(variables, checkpoint):
    """The accumulation state among `variables` that the checkpoint `checkpoint` (a prefix;
    None or "": no checkpoint) does not hold."""
    if not checkpoint:
        return []
    saved = checkpoint_variables(checkpoint)
    return [variable for variable in variables
            if is_accumulation_state(_name(variable)) and _name(variable) not in saved]


class FillingSaver(tf1.train.Saver):
    """The Estimator's default Saver, but a checkpoint lacking the accumulation state
    `absent` is restored without it, that state initialised (an empty window)."""

    def __init__(self, absent, keep_checkpoint_max):
        super().__init__(sharded=True, max_to_keep=keep_checkpoint_max, defer_build=True,
                         save_relative_paths=True)
        self._absent = list(absent)
        self._partial = self._fill = None

    def build(self):
        """Called by the Scaffold before the graph is finalised: also builds the restore of
        the variables the checkpoint holds and the initialiser of the others."""
        super().build()
        if self._partial is None:
            absent = {id(variable) for variable in self._absent}
            held = [variable for variable in tf1.global_variables() if id(variable) not in absent]
            self._partial = tf1.train.Saver(
                held + tf1.get_collection(tf1.GraphKeys.SAVEABLE_OBJECTS), sharded=True)
            self._fill = tf1.variables_initializer(self._absent)

    def restore(self, sess, save_path):
        saved = checkpoint_variables(save_path)
        missing = [_name(variable) for variable in self._absent if _name(variable) not in saved]
        if not missing:
            return super().restore(sess, save_path)
        logging.info("%s holds no accumulation state (%d variables, e.g. %s): restored without "
                     "it, the buffers start empty", save_path, len(missing), missing[0])
        self._partial.restore(sess, save_path)
        sess.run(self._fill)
        return None


def install_filling_saver(absent, keep_checkpoint_max):
    """Makes the Estimator save and restore with a `FillingSaver` (call in the model_fn, with
    every variable created); `keep_checkpoint_max`: the RunConfig's."""
    tf1.add_to_collection(tf1.GraphKeys.SAVERS, FillingSaver(absent, keep_checkpoint_max))
