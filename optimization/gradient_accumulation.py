"""Gradient accumulation: N micro-batches per optimizer step.

BERT pre-training wants batches (64k sequences for LAMB) far larger than a device holds.
Each ``session.run`` processes one micro-batch and adds its gradients to a float32
buffer per variable; every N-th micro-batch the training op applies the buffers'
average and zeros them. Because BERT's loss is a mean over the batch, the average of
N micro-batch gradients equals the gradient of the whole N-times-larger batch.

State (non-trainable, saved by the Saver, so a run resumed mid-window continues it):
``<var>/accum`` for each variable and ``gradient_accumulation/local_step``, the
number of micro-batches already in the buffers.

With in-graph towers (``devices``: one per tower, ``optimization.tower_gradients``) each
tower adds its own gradients into buffers on its own device, so nothing crosses devices
between optimizer steps: tower 0's are the variables' ``<var>/accum`` above, tower k's
``gradient_accumulation/tower_<k>/<var>/accum`` (``state_names.TOWER_ACCUMULATION_SCOPE``).
All of them are saved, so a checkpoint written mid-window (at the end of the data, say)
resumes that window exactly. ``sums()`` adds the towers' buffers on each variable's device,
once per window. The micro-batch counter is one for all towers.
"""
import tensorflow as tf

from optimization import state_names
from optimization.decoupled_weight_decay import variable_name
from optimization.tower_gradients import on_device


# Graph collection [micro-batches a window holds (int64 constant), micro-batches held now
# (int64, a read of the counter)], empty without accumulation. A hook that must act at the
# window's end (preemption) evaluates it once when the session starts and then follows the
# window itself, so it knows before a run whether that run closes the window.
WINDOW_COLLECTION = "bert_accumulation_window"


class GradientAccumulator:
    """Float32 gradient buffers for ``variables`` (one set per tower) plus a micro-batch
    counter.

    ``devices``: with in-graph towers, the device of each tower (tower 0's buffers go on
    each variable's own device, tower k's on ``devices[k]``); None for one device."""

    def __init__(self, variables, num_steps, devices=None):
        if num_steps < 2:
            raise ValueError("accumulation needs num_steps >= 2")
        self.num_steps = int(num_steps)
        variables = list(variables)
        with tf.init_scope():
            with tf.compat.v1.name_scope(state_names.ACCUMULATION_SCOPE + "/"):
                self.local_step = tf.compat.v1.Variable(
                    0, dtype=tf.int64, name="local_step", trainable=False, use_resource=True)
            self.tower_buffers = [
                [self._buffer(var, tower, device) for var in variables]
                for tower, device in enumerate(devices or [None])]
        self.buffers = self.tower_buffers[0]
        if not tf.executing_eagerly():
            tf.compat.v1.add_to_collection(WINDOW_COLLECTION,
                                           tf.constant(self.num_steps, tf.int64))
            tf.compat.v1.add_to_collection(WINDOW_COLLECTION, self.local_step.read_value())

    @staticmethod
    def _buffer(var, tower, device):
        """Tower ``tower``'s zeroed float32 buffer for ``var``: ``<var>/accum`` for tower 0
        (on the variable's device), else under ``gradient_accumulation/tower_<k>/`` on
        ``device``."""
        name = variable_name(var)
        if tower:
            name = state_names.TOWER_ACCUMULATION_SCOPE.format(tower) + "/" + name
            device = device or var.device
        else:
            device = var.device
        with on_device(device), tf.compat.v1.name_scope(name + "/"):
            return tf.compat.v1.Variable(tf.zeros(var.shape, tf.float32),
                                         name=state_names.GRAD_ACCUM, trainable=False,
                                         use_resource=True)

    def add(self, *tower_grads):
        """Adds one micro-batch's gradients, one list per tower (one list without towers),
        each tower's into its own buffers; returns a bool tensor, True when the buffers now
        hold at least ``num_steps`` micro-batches (an optimizer step is due).

        "At least": a run resumed with a smaller ``--num_accumulation_steps`` than the
        checkpoint's window may restore a count already past it; it then steps at once
        instead of never."""
        if len(tower_grads) != len(self.tower_buffers):
            raise ValueError(f"{len(tower_grads)} lists of gradients for "
                             f"{len(self.tower_buffers)} towers")
        added = []
        for buffers, grads in zip(self.tower_buffers, tower_grads):
            adds = [b.assign_add(g, read_value=False) for b, g in zip(buffers, grads)]
            # one group per tower, on its device: one control edge to the counter, not one
            # per variable
            with on_device(buffers[0].device if len(self.tower_buffers) > 1 else None):
                added.append(tf.group(*adds))
        with tf.control_dependencies(added):
            count = self.local_step.assign_add(1)
        return count >= self.num_steps

    def sums(self):
        """The accumulated gradients (sums over the micro-batches held), each summed over
        the towers on its variable's device."""
        reads = []
        for buffers in self.tower_buffers:
            tower_reads = []
            for b in buffers:
                with on_device(b.device):
                    tower_reads.append(b.read_value())
            reads.append(tower_reads)
        if len(reads) == 1:
            return reads[0]
        sums = []
        for index, buffer in enumerate(self.buffers):
            with on_device(buffer.device):
                sums.append(tf.add_n([tower[index] for tower in reads]))
        return sums

    def mean_multiplier(self):
        """1 / micro-batches held: ``sums() * mean_multiplier()`` is the mean gradient.
        Kept a scalar so the optimizer folds it into its update instead of writing a
        divided copy of every buffer."""
        return 1.0 / tf.cast(tf.maximum(self.local_step.read_value(), 1), tf.float32)

    def reset(self):
        """Op zeroing the buffers (each on its device) and the micro-batch counter."""
        zeros = []
        for buffers in self.tower_buffers:
            tower = []
            for b in buffers:
                with on_device(b.device):
                    tower.append(b.assign(tf.zeros(b.shape, b.dtype), read_value=False))
            with on_device(buffers[0].device if len(self.tower_buffers) > 1 else None):
                zeros.append(tf.group(*tower))
        return tf.group(*zeros, self.local_step.assign(0, read_value=False))
