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
  check and its logs and passes it in (``global_norm=``), so a step computes it once. The
  clip is folded, with the training op's unscaling and accumulation mean, into one scalar
  multiplier applied inside the update: no pass writes a clipped copy of every gradient.
* Each variable's update can be one XLA-compiled function (``fused=True``):
  ``tf.function(jit_compile=True)`` called from the graph, which compiles on CPUs without
  any XLA flag, while the model's matmuls stay on oneDNN/cuBLAS. Op by op, an Adam/LAMB
  update is ~38 ops per variable, ~7,800 element-wise kernels per BERT-base update, each
  a pass over memory (and on a GPU a launch); fused it is two passes per variable (the
  norms, then the update), and same-shaped variables share one compiled function.
  Default (``default_fused``): fused, on GPUs and CPUs alike (1.06-1.07x on a 2-core
  EPYC's BERT-base step, bench/step_ab.py). XLA's compiler log lines, which ignore
  TF_CPP_MIN_LOG_LEVEL, go to the command's log file, not the quiet console
  (``reporting.native_log``). ``BERT_FUSED_OPTIMIZER=0`` keeps the op-by-op form.
"""
import os
import re

import tensorflow as tf

DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")


def default_fused():
    """Whether the optimizer update is XLA-fused by default: yes, on every device (see the
    module docstring), unless ``BERT_FUSED_OPTIMIZER=0``."""
    return os.environ.get("BERT_FUSED_OPTIMIZER", "").strip() != "0"


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

    Subclasses name their slots in ``SLOTS`` and implement ``_create_slots``,
    ``_next_values`` (the equations, on tensors) and optionally ``_prepare_step`` (run once
    per ``apply_gradients``, e.g. to advance a step counter). ``clip_norm`` (default 1.0,
    None to disable) clips all gradients to that global norm before the update.
    ``fused=True`` compiles each variable's update with XLA (see the module docstring);
    ``fused=False`` builds the same equations as separate TensorFlow ops; None (default):
    ``default_fused()``, fused unless ``BERT_FUSED_OPTIMIZER=0``.
    """

    SLOTS = ()  # slot names, in the order ``_next_values`` takes and returns them

    def __init__(self, learning_rate, weight_decay_rate, exclude_from_weight_decay, name,
                 clip_norm=1.0, fused=None):
        super().__init__(use_locking=False, name=name)
        self.fused = default_fused() if fused is None else bool(fused)
        self._compiled_update = None
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

    def apply_gradients(self, grads_and_vars, global_step=None, name=None, global_norm=None,
                        grad_multiplier=None):
        """Updates the variables; increments ``global_step`` afterwards when given.

        ``grad_multiplier``: a scalar every gradient is multiplied by before use (the
        training op's 1/loss-scale and 1/micro-batches), applied inside the fused update
        instead of as a separate pass over every gradient. ``global_norm``: the global norm
        of the gradients *after* that multiplier, if the caller has it (the training op
        does), so clipping does not compute it again."""
        pairs = [(to_dense(g), v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            raise ValueError("No gradients provided for any variable.")
        grads, var_list = [list(x) for x in zip(*pairs)]
        self.create_slots(var_list)
        with tf.compat.v1.name_scope(name, self.get_name()):
            multiplier = self._clip_multiplier(grads, global_norm, grad_multiplier)
            lr = tf.cast(tf.convert_to_tensor(self.learning_rate), tf.float32)
            step_state = self._prepare_step()
            updates = [self._apply_one(g, v, lr, multiplier, step_state)
                       for g, v in zip(grads, var_list)]
            update_op = tf.group(*updates)
            if global_step is None:
                return update_op
            with tf.control_dependencies([update_op]):
                return global_step.assign_add(1, read_value=False)

    def _clip_multiplier(self, grads, global_norm, grad_multiplier):
        """The scalar that turns the raw gradients into clipped ones:
        ``grad_multiplier * clip_norm / max(global_norm, clip_norm)`` (what
        ``tf.clip_by_global_norm`` multiplies by), float32."""
        multiplier = (tf.constant(1.0) if grad_multiplier is None
                      else tf.cast(grad_multiplier, tf.float32))
        if not self.clip_norm:
            return multiplier
        if global_norm is None:
            global_norm = tf.linalg.global_norm(grads) * multiplier
        clip_norm = tf.constant(float(self.clip_norm))
        return multiplier * clip_norm / tf.maximum(tf.cast(global_norm, tf.float32), clip_norm)

    def _apply_one(self, grad, var, lr, multiplier, step_state):
        """A tensor whose evaluation updates ``var`` and its slots from ``grad * multiplier``."""
        slots = [self.get_slot(var, name) for name in self.SLOTS]
        flags = (self.uses_weight_decay(var), self.uses_layer_adaptation(var))
        if not self.fused:
            return self._update_variable(grad, var, slots, lr, multiplier, step_state, *flags)
        if self._compiled_update is None:
            self._compiled_update = tf.function(self._update_variable, jit_compile=True,
                                                autograph=False)
        return self._compiled_update(grad, var, slots, lr, multiplier, step_state, *flags)

    def _update_variable(self, grad, var, slots, lr, multiplier, step_state, decay, adapt):
        """Reads ``var`` and its slots, computes their next values (``_next_values``) and
        assigns them. Compiled by XLA as one unit when ``fused``, so the dozen element-wise
        operations of an Adam/LAMB update become one or two passes over memory."""
        grad = grad * multiplier
        next_var, next_slots = self._next_values(
            grad, var.read_value(), [s.read_value() for s in slots], lr, step_state, decay,
            adapt)
        assigns = [s.assign(value, read_value=False) for s, value in zip(slots, next_slots)]
        assigns.append(var.assign(next_var, read_value=False))
        with tf.control_dependencies(assigns):  # a tensor: a compiled function returns one
            return tf.constant(True)

    def uses_layer_adaptation(self, var):
        """Whether ``var``'s update is scaled by a trust ratio (LAMB only)."""
        return False

    def _prepare_step(self):
        return ()

    def _next_values(self, grad, var, slots, lr, step_state, decay, adapt):
        """``(next_var, [next_slot, ...])`` from tensors: the optimizer's equations."""
        raise NotImplementedError
