"""Google BERT's AdamWeightDecay: Adam without bias correction plus decoupled decay.

This is the optimizer the original BERT checkpoints were pre-trained and fine-tuned
with, so fine-tuning recipes (learning rates, warm-up) assume it. Per variable::

    m <- beta_1 m + (1 - beta_1) g
    v <- beta_2 v + (1 - beta_2) g^2
    u  = m / (sqrt(v) + epsilon) + weight_decay_rate * w     (decay unless excluded)
    w <- w - lr * u

There is no bias correction (Google omitted it; with warm-up it hardly matters) and
so no step counter. As in Google's and NVIDIA's ``create_optimizer``, all gradients are
first clipped to global norm 1.0 (``clip_norm``). The slots are named ``<var>/adam_m`` and ``<var>/adam_v`` like
Google's checkpoints, which lets the same checkpoint loader skip them.
"""
import tensorflow as tf

from optimization import state_names
from optimization.decoupled_weight_decay import DecoupledWeightDecayOptimizer


class AdamWeightDecayOptimizer(DecoupledWeightDecayOptimizer):
    """Adam with decoupled weight decay and no bias correction (Google BERT)."""

    SLOTS = ("m", "v")

    def __init__(self, learning_rate, weight_decay_rate=0.01, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-6, exclude_from_weight_decay=None, clip_norm=1.0,
                 name="AdamWeightDecay", fused=None):
        """``exclude_from_weight_decay``: regexes searched in variable names; None means
        ``("LayerNorm", "layer_norm", "bias")``, an empty list decays everything.
        ``clip_norm``: global-norm clipping before the update (None: off)."""
        super().__init__(learning_rate, weight_decay_rate, exclude_from_weight_decay, name,
                         clip_norm, fused)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon

    def _create_slots(self, var_list):
        for var in var_list:
            self._zeros_slot(var, "m", state_names.ADAM_M)
            self._zeros_slot(var, "v", state_names.ADAM_V)

    def _next_values(self, grad, var, slots, lr, step_state, decay, adapt):
        m, v = slots
        next_m = self.beta_1 * m + (1.0 - self.beta_1) * grad
        next_v = self.beta_2 * v + (1.0 - self.beta_2) * tf.square(grad)
        update = next_m / (tf.sqrt(next_v) + self.epsilon)
        if decay:
            update += self.weight_decay_rate * var
        return var - lr * update, [next_m, next_v]
