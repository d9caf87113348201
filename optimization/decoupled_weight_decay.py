"""Shared skeleton of the two BERT optimizers (AdamWeightDecay and LAMB).

Both are Adam variants with *decoupled* weight decay (the decay term is added to the
Adam update, not to the gradient, so it does not pass through the moment estimates)
and both exempt LayerNorm parameters and biases from it. They differ only in how one
variable is updated, so this base class owns everything else:

* ``apply_gradients`` is overridden instead of the v1 ``_apply_dense`` hooks because
  LAMB's pre-normalisation needs *all* gradients at once, and because we want the
  graph it builds to be usable inside ``tf.cond`` (the training op only applies on
  accumulation boundaries and finite gradients).
* Slots are created under ``tf.init_scope`` so they are ordinary variables of the
  outer graph (saved by ``tf.compat.v1.train.Saver``) even when the update itself is
  built inside a ``tf.cond`` branch; ``create_slots`` lets callers create them
  up front.
* Sparse gradients (``tf.IndexedSlices`` of the embedding lookup) are made dense:
  LAMB's trust ratio and Adam's moment decay touch every row anyway.
* Both clip all gradients to global norm ``clip_norm`` (1.0) before the update, as
  Google's and NVIDIA's BERT do for either optimizer (for LAMB this is NVIDIA's
  "pre-normalisation"). The training op already computes the global norm for its finite
  check and its logs and passes it in (``global_norm=``), so a step computes it once.
"""
import re

import tensorflow as tf

DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")


def variable_name(var):
    """The checkpoint name of a variable (its tensor name without ``:0``)."""
    return re.sub(r":\d+$", "", var.name)


def matches_any(var, patterns):
    """Whether any regex in ``patterns`` is found in the variable's name (re.search)."""
    name = variable_name(var)
    return any(re.search(p, name) for p in patterns)


def to_dense(grad):
    """Converts an ``IndexedSlices`` gradient to a dense tensor; passes others through."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.convert_to_tensor(grad)
    return grad


class DecoupledWeightDecayOptimizer(tf.compat.v1.train.Optimizer):
    """Base of Adam-style optimizers with decoupled weight decay and name-based exclusion.

    Subclasses implement ``_create_slots``, ``_apply_one`` and optionally
    ``_prepare_step`` (run once per ``apply_gradients``, e.g. to advance a step counter).
    ``clip_norm`` (default 1.0, None to disable) clips all gradients to that global norm
    before the update.
    """

    def __init__(self, learning_rate, weight_decay_rate, exclude_from_weight_decay, name,
                 clip_norm=1.0):
        super().__init__(use_locking=False, name=name)
        self.learning_rate = learning_rate
        self.weight_decay_rate = weight_decay_rate
        self.clip_norm = clip_norm
        if exclude_from_weight_decay is None:
            exclude_from_weight_decay = DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY
        self.exclude_from_weight_decay = tuple(exclude_from_weight_decay)

    def uses_weight_decay(self, var):
        """Whether ``var`` gets the ``weight_decay_rate * w`` term."""
        return bool(self.weight_decay_rate) and not matches_any(var, self.exclude_from_weight_decay)

    def create_slots(self, var_list):
        """Creates the optimizer's variables for ``var_list`` in the outermost graph."""
        with tf.init_scope():
            self._create_slots(list(var_list))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None, global_norm=None):
        """Updates the variables; increments ``global_step`` afterwards when given.

        ``global_norm``: the global norm of the gradients if the caller has it (the
        training op does), so clipping does not compute it again."""
        pairs = [(to_dense(g), v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            raise ValueError("No gradients provided for any variable.")
        grads, var_list = [list(x) for x in zip(*pairs)]
        self.create_slots(var_list)
        with tf.compat.v1.name_scope(name, self.get_name()):
            grads = self._clip(grads, global_norm)
            lr = tf.cast(tf.convert_to_tensor(self.learning_rate), tf.float32)
            step_state = self._prepare_step()
            updates = [self._apply_one(g, v, lr, step_state) for g, v in zip(grads, var_list)]
            update_op = tf.group(*updates)
            if global_step is None:
                return update_op
            with tf.control_dependencies([update_op]):
                return global_step.assign_add(1, read_value=False)

    def _clip(self, grads, global_norm=None):
        """Scales all gradients by ``clip_norm / max(global_norm, clip_norm)``."""
        if not self.clip_norm:
            return grads
        clipped, _ = tf.clip_by_global_norm(grads, clip_norm=self.clip_norm,
                                            use_norm=global_norm)
        return clipped

    def _prepare_step(self):
        return None

    def _apply_one(self, grad, var, lr, step_state):
        raise NotImplementedError
