"""NVLAMB: LAMB (You et al. 2019, Algorithm 2) with NVIDIA's gradient pre-normalisation.

LAMB lets BERT pre-train with batches of 64k sequences: it is Adam whose per-layer
step is rescaled by a *trust ratio* ``||w|| / ||u||`` so every layer moves by a
similar fraction of its norm, whatever the scale of its gradients. Per variable, at
optimizer step ``t`` (1-based)::

    m <- beta_1 m + (1 - beta_1) g          m_hat = m / (1 - beta_1^t)
    v <- beta_2 v + (1 - beta_2) g^2        v_hat = v / (1 - beta_2^t)
    u  = m_hat / (sqrt(v_hat) + epsilon) + weight_decay_rate * w
    r  = ||w|| / ||u||   if both norms > 0, else 1
    w <- w - lr * r * u

Pre-normalisation (``clip_norm=1.0``, NVLAMB): all gradients are first scaled down to
global norm 1 when their norm exceeds it (``clip_by_global_norm(grads, 1.0)``). With
huge batches and fp16 gradients the raw norm varies wildly between steps; the
normalisation keeps Adam's moments on a stable scale. Where it is applied matters:

* here (and in the NVLAMB paper and apex's FusedLAMB) it is applied once per optimizer
  step to the *whole* batch's gradient: after accumulation and after the allreduce. The
  update then depends only on the global batch, not on how it was split into ranks and
  micro-batches, so a recipe behaves the same on 8 GPUs or 64.
* NVIDIA's TensorFlow BERT instead clips each rank's micro-batch gradient of
  ``loss / num_accumulation_steps`` before accumulating. That norm is ~1/128 of the
  batch gradient's in phase 1, so the clip almost never acts there, and when it does the
  result depends on the number of ranks and micro-batches. We keep the first form.

Exclusions (regexes searched in variable names):

* ``exclude_from_weight_decay`` defaults to ``LayerNorm``, ``layer_norm`` and ``bias``.
* ``exclude_from_layer_adaptation`` (variables whose trust ratio is forced to 1)
  defaults to none: every variable, LayerNorm gains and biases included, is adapted,
  as in NVIDIA's TensorFlow BERT and apex's FusedLAMB (``use_nvlamb=True``).
  ``tfa.optimizers.LAMB`` and TF Model Garden's LAMB instead exclude whatever is
  excluded from weight decay (LayerNorm and biases: tiny vectors whose norms make the
  ratio noisy); pass ``exclude_from_layer_adaptation=DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY``
  (``run_pretraining.py --lamb_layer_adaptation=weights``) for that behaviour.

Bias correction uses the optimizer's own update counter ``<name>/lamb_step``
(``LAMB/lamb_step``), not ``global_step``: it advances only when an update is really
applied (never on a skipped fp16 step) and is saved in checkpoints with the moments
``<var>/lamb_m`` and ``<var>/lamb_v``.
"""
import tensorflow as tf

from optimization import state_names
from optimization.decoupled_weight_decay import DecoupledWeightDecayOptimizer, matches_any
from optimization.state_names import OPTIMIZER_SLOT_SUFFIXES  # noqa: F401  (re-export)


class LAMBOptimizer(DecoupledWeightDecayOptimizer):
    """LAMB with NVIDIA's global-norm pre-normalisation (NVLAMB)."""

    SLOTS = ("m", "v")

    def __init__(self, learning_rate, weight_decay_rate=0.01, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-6, exclude_from_weight_decay=None,
                 exclude_from_layer_adaptation=(), clip_norm=1.0, name="LAMB", fused=None):
        super().__init__(learning_rate, weight_decay_rate, exclude_from_weight_decay, name,
                         clip_norm, fused)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.exclude_from_layer_adaptation = tuple(exclude_from_layer_adaptation or ())

    def uses_layer_adaptation(self, var):
        """Whether ``var``'s update is scaled by the trust ratio."""
        return not matches_any(var, self.exclude_from_layer_adaptation)

    def _create_slots(self, var_list):
        first = min(var_list, key=lambda v: v.name)
        with tf.compat.v1.name_scope(self.get_name() + "/"):  # absolute: "LAMB/lamb_step"
            self._create_non_slot_variable(
                initial_value=tf.constant(0, tf.int64), name=state_names.LAMB_STEP,
                colocate_with=first)
        for var in var_list:
            self._zeros_slot(var, "m", state_names.LAMB_M)
            self._zeros_slot(var, "v", state_names.LAMB_V)

    def step_variable(self):
        """The saved count of applied LAMB updates (int64)."""
        with tf.init_scope():
            graph = tf.compat.v1.get_default_graph()
        return self._get_non_slot_variable(state_names.LAMB_STEP, graph)

    def _prepare_step(self):
        """Advances the step counter; returns the bias corrections (1 - beta^t).

        They are computed in float64: in float32, ``1 - 0.999^t`` loses ~1e-5 of its
        relative precision to cancellation in the first steps, which would show up
        directly in the update of the variables without trust ratio."""
        t = tf.cast(self.step_variable().assign_add(1), tf.float64)
        corrections = [1.0 - tf.pow(tf.constant(beta, tf.float64), t)
                       for beta in (self.beta_1, self.beta_2)]
        return tuple(tf.cast(c, tf.float32) for c in corrections)

    def _next_values(self, grad, var, slots, lr, step_state, decay, adapt):
        m, v = slots
        correction_1, correction_2 = step_state
        next_m = self.beta_1 * m + (1.0 - self.beta_1) * grad
        next_v = self.beta_2 * v + (1.0 - self.beta_2) * tf.square(grad)
        m_hat = next_m / correction_1
        v_hat = next_v / correction_2
        update = m_hat / (tf.sqrt(v_hat) + self.epsilon)
        if decay:
            update += self.weight_decay_rate * var
        ratio = 1.0
        if adapt:
            w_norm = tf.norm(var)
            u_norm = tf.norm(update)
            ratio = tf.where((w_norm > 0.0) & (u_norm > 0.0),
                             w_norm / tf.maximum(u_norm, 1e-30), 1.0)
        return var - lr * ratio * update, [next_m, next_v]
