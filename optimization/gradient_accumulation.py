"""Gradient accumulation: N micro-batches per optimizer step.

BERT pre-training wants batches (64k sequences for LAMB) far larger than a device holds.
Each ``session.run`` processes one micro-batch and adds its gradients to a float32
buffer per variable; every N-th micro-batch the training op applies the buffers'
average and zeros them. Because BERT's loss is a mean over the batch, the average of
N micro-batch gradients equals the gradient of the whole N-times-larger batch.

State (non-trainable, saved by the Saver, so a run resumed mid-window continues it):
``<var>/accum`` for each variable and ``gradient_accumulation/local_step``, the
number of micro-batches already in the buffers.
"""
import tensorflow as tf

from optimization import state_names
from optimization.decoupled_weight_decay import variable_name


# Graph collection [micro-batches a window holds (int64 constant), micro-batches held now
# (int64, a read of the counter)], empty without accumulation. A hook that must act at the
# window's end (preemption) evaluates it once when the session starts and then follows the
# window itself, so it knows before a run whether that run closes the window.
WINDOW_COLLECTION = "bert_accumulation_window"


class GradientAccumulator:
    """Float32 gradient buffers for ``variables`` plus a micro-batch counter."""

    def __init__(self, variables, num_steps):
        if num_steps < 2:
            raise ValueError("accumulation needs num_steps >= 2")
        self.num_steps = int(num_steps)
        with tf.init_scope():
            with tf.compat.v1.name_scope(state_names.ACCUMULATION_SCOPE + "/"):
                self.local_step = tf.compat.v1.Variable(
                    0, dtype=tf.int64, name="local_step", trainable=False, use_resource=True)
            self.buffers = []
            for var in variables:
                with tf.compat.v1.name_scope(variable_name(var) + "/"):
                    self.buffers.append(tf.compat.v1.Variable(
                        tf.zeros(var.shape, tf.float32), name=state_names.GRAD_ACCUM,
                        trainable=False, use_resource=True))
        if not tf.executing_eagerly():
            tf.compat.v1.add_to_collection(WINDOW_COLLECTION,
                                           tf.constant(self.num_steps, tf.int64))
            tf.compat.v1.add_to_collection(WINDOW_COLLECTION, self.local_step.read_value())

    def add(self, grads):
        """Adds one micro-batch's gradients; returns a bool tensor, True when the
        buffers now hold at least ``num_steps`` micro-batches (an optimizer step is due).

        "At least": a run resumed with a smaller ``--num_accumulation_steps`` than the
        checkpoint's window may restore a count already past it; it then steps at once
        instead of never."""
        adds = [b.assign_add(g, read_value=False) for b, g in zip(self.buffers, grads)]
        with tf.control_dependencies(adds):
            count = self.local_step.assign_add(1)
        return count >= self.num_steps

    def sums(self):
        """The accumulated gradients (sums over the micro-batches held)."""
        return [b.read_value() for b in self.buffers]

    def mean_multiplier(self):
        """1 / micro-batches held: ``sums() * mean_multiplier()`` is the mean gradient.
        Kept a scalar so the optimizer folds it into its update instead of writing a
        divided copy of every buffer."""
        return 1.0 / tf.cast(tf.maximum(self.local_step.read_value(), 1), tf.float32)

    def reset(self):
        """Op zeroing the buffers and the micro-batch counter."""
        zeros = [b.assign(tf.zeros_like(b), read_value=False) for b in self.buffers]
        return tf.group(*zeros, self.local_step.assign(0, read_value=False))
