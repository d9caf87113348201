"""Gradients of in-graph towers, kept on each tower's device until the optimizer step.

In-graph towers (``runtime.towers``, ``--num_local_devices``) train one model on several
devices of one process. The trained ("master") variables live on the first device; every
other tower reads a local copy of each weight on its own device. What used to cross devices
on every micro-batch, every tower reading every weight from the first device and sending
each gradient back to it (``tf.gradients`` of the towers' mean loss), now crosses only
where the optimizer needs it:

* each tower differentiates its own loss (times the loss scale and ``1 / towers``, so the
  sum over towers is the towers' mean) with respect to the variables it reads, on its own
  device; with accumulation, those gradients go into float32 buffers on the same device
  (``GradientAccumulator`` with ``devices``);
* once per optimizer step the towers' gradients are summed onto each variable's device
  (``sum_over_towers``; with accumulation, ``GradientAccumulator.sums`` sums the buffers):
  (towers - 1) x the gradient bytes;
* after an applied update each tower's copies are overwritten from the masters
  (``refresh_local_weights``): (towers - 1) x the weight bytes.

A micro-batch inside an accumulation window therefore moves only the towers' input slices
and a few scalars (the loss scale, the dropout seed's step) between devices.

``Tower`` is the plain description of one tower the training op takes; this package does
not import ``runtime`` (a floor above it), so the towers' builder hands these values over.
"""
import contextlib
import dataclasses
from typing import Mapping

import tensorflow as tf

from optimization.decoupled_weight_decay import to_dense, variable_name


@dataclasses.dataclass(frozen=True)
class Tower:
    """One in-graph tower.

    ``device``: where its forward and backward passes run. ``loss``: the scalar mean loss of
    its slice of the batch. ``reads``: for each trained variable this tower does not read
    directly, by the variable's checkpoint name, the local copy it reads instead (empty for
    the tower on the variables' own device)."""
    device: str
    loss: object
    reads: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def variable_read(self, variable):
        """The variable this tower reads in place of the trained ``variable``."""
        return self.reads.get(variable_name(variable), variable)


def on_device(device):
    """``tf.device(device)``, or placement left as it is for no device (one device)."""
    return tf.device(device) if device else contextlib.nullcontext()


def tower_gradients(towers, variables, scale):
    """``(variables, per_tower)``: the trained variables that get a gradient, and per tower
    the float32 dense gradients of ``loss * scale / len(towers)`` with respect to what the
    tower reads for them, computed on the tower's device (colocated with the forward ops).

    Raises ValueError when the loss depends on no variable, or when towers disagree on which
    variables their losses depend on (they build the same model, so that is a bug)."""
    share = 1.0 / len(towers)
    per_tower = []
    for tower in towers:
        reads = [tower.variable_read(v) for v in variables]
        with on_device(tower.device):
            scaled = tf.cast(tower.loss, tf.float32) * scale
            if len(towers) > 1:
                scaled *= share
            grads = tf.compat.v1.gradients(scaled, reads, colocate_gradients_with_ops=True)
            per_tower.append([None if g is None else tf.cast(to_dense(g), tf.float32)
                              for g in grads])
    used = [g is not None for g in per_tower[0]]
    for index, grads in enumerate(per_tower[1:], 1):
        if [g is not None for g in grads] != used:
            raise ValueError(f"tower {index}'s loss depends on other variables than tower 0's")
    if not any(used):
        raise ValueError("the loss depends on none of the trainable variables")
    variables = [v for v, keep in zip(variables, used) if keep]
    per_tower = [[g for g, keep in zip(grads, used) if keep] for grads in per_tower]
    return variables, per_tower


def sum_over_towers(per_tower, variables):
    """Each variable's gradient summed over the towers, on the variable's device (the one
    transfer of a gradient across devices). One tower: its gradients as they are."""
    if len(per_tower) == 1:
        return list(per_tower[0])
    sums = []
    for index, variable in enumerate(variables):
        with on_device(variable.device):
            sums.append(tf.add_n([grads[index] for grads in per_tower]))
    return sums


def refresh_local_weights(towers, variables):
    """Op overwriting every tower's local copies of ``variables`` with the masters' values
    (run after an update: the one transfer of a weight across devices). A no-op without
    copies."""
    assigns = []
    for tower in towers or ():
        copies = [(tower.reads[variable_name(v)], v) for v in variables
                  if variable_name(v) in tower.reads]
        if not copies:
            continue
        values = []
        for _, master in copies:
            with on_device(master.device):
                values.append(master.read_value())
        with on_device(tower.device):
            assigns.append(tf.group(*[copy.assign(value, read_value=False)
                                      for (copy, _), value in zip(copies, values)]))
    return tf.group(*assigns)
