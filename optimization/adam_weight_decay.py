"""Google BERT's AdamWeightDecay (Adam without bias correction plus decoupled decay), and
the same with Adam's bias correction (AdamW as torch, Keras and TF Model Garden have it).

Google's is the optimizer the original BERT checkpoints were pre-trained and fine-tuned
with (NVIDIA's TensorFlow BERT keeps it), so fine-tuning recipes assume it. Per variable::

    m <- beta_1 m + (1 - beta_1) g
    v <- beta_2 v + (1 - beta_2) g^2
    u  = m / (sqrt(v) + epsilon) + weight_decay_rate * w     (decay unless excluded)
    w <- w - lr * u

``bias_correction=True`` (``--optimizer_type=adamw``) uses ``m / (1 - beta_1^t)`` and
``v / (1 - beta_2^t)`` instead, at the optimizer's own update counter ``t``
(``<name>/adam_step``, saved in checkpoints; it never advances on a skipped fp16 step).
Why both: without the correction an update is larger than AdamW's by
``sqrt(1 - beta_2^t) / (1 - beta_1^t)`` inverted, 2.1x at step 250 and still 1.3x at step
1,000, so a peak learning rate tuned for AdamW (HuggingFace's recipes) is in effect twice as
high through a short run's warm-up. Pre-training BERT-mini from scratch at 1e-3 with
warm-up to step 240 (bench/convergence.py) this blew the gradient norm up to 29 at the peak
and sent the held-out loss back to the unigram plateau for the rest of the run, while
torch's AdamW at the same rate kept learning. Google's recipes (fine-tuning at 2e-5..5e-5)
were tuned without the correction, so ``adam`` keeps Google's equations.

As in Google's and NVIDIA's ``create_optimizer``, all gradients are first clipped to global
norm 1.0 (``clip_norm``). The slots are named ``<var>/adam_m`` and ``<var>/adam_v`` like
Google's checkpoints, which lets the same checkpoint loader skip them.
"""
import tensorflow as tf

from optimization import state_names
from optimization.decoupled_weight_decay import DecoupledWeightDecayOptimizer


class AdamWeightDecayOptimizer(DecoupledWeightDecayOptimizer):
    """Adam with decoupled weight decay: no bias correction (Google BERT), or with it
    (``bias_correction=True``: torch's AdamW)."""

    SLOTS = ("m", "v")

    def __init__(self, learning_rate, weight_decay_rate=0.01, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-6, exclude_from_weight_decay=None, clip_norm=1.0,
                 name="AdamWeightDecay", fused=None, bias_correction=False):
        """``exclude_from_weight_decay``: regexes searched in variable names; None means
        ``("LayerNorm", "layer_norm", "bias")``, an empty list decays everything.
        ``clip_norm``: global-norm clipping before the update (None: off)."""
        super().__init__(learning_rate, weight_decay_rate, exclude_from_weight_decay, name,
                         clip_norm, fused)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.bias_correction = bool(bias_correction)

    def _create_slots(self, var_list):
        if self.bias_correction:
            first = min(var_list, key=lambda v: v.name)
            with tf.compat.v1.name_scope(self.get_name() + "/"):  # "AdamWeightDecay/adam_step"
                self._create_non_slot_variable(
                    initial_value=tf.constant(0, tf.int64), name=state_names.ADAM_STEP,
                    colocate_with=first)
        for var in var_list:
            self._zeros_slot(var, "m", state_names.ADAM_M)
            self._zeros_slot(var, "v", state_names.ADAM_V)

    def _prepare_step(self):
        """With bias correction: advances the update counter and returns (1 - beta_1^t,
        1 - beta_2^t), computed in float64 (float32 loses precision to cancellation in
        ``1 - 0.999^t`` early on); None without."""
        if not self.bias_correction:
            return None
        with tf.init_scope():
            graph = tf.compat.v1.get_default_graph()
        step = self._get_non_slot_variable(state_names.ADAM_STEP, graph)
        t = tf.cast(step.assign_add(1), tf.float64)
        return tuple(tf.cast(1.0 - tf.pow(tf.constant(beta, tf.float64), t), tf.float32)
                     for beta in (self.beta_1, self.beta_2))

    def _next_values(self, grad, var, slots, lr, step_state, decay, adapt):
        m, v = slots
        next_m = self.beta_1 * m + (1.0 - self.beta_1) * grad
        next_v = self.beta_2 * v + (1.0 - self.beta_2) * tf.square(grad)
        if step_state is None:
            update = next_m / (tf.sqrt(next_v) + self.epsilon)
        else:
            correction_1, correction_2 = step_state
            update = (next_m / correction_1) / (tf.sqrt(next_v / correction_2) + self.epsilon)
        if decay:
            update += self.weight_decay_rate * var
        return var - lr * update, [next_m, next_v]
