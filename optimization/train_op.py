"""The BERT training op: loss scaling, accumulation, allreduce, skip-on-overflow, update.

One ``session.run(train_op)`` processes one micro-batch:

1. gradients of ``loss * S`` (S = loss scale) w.r.t. the float32 master variables;
   ``IndexedSlices`` (embedding gradients) are made dense;
2. ``allreduce_fn`` on each gradient, unless ``allreduce_post_accumulation``;
3. with ``num_accumulation_steps`` N > 1, the gradients are added to float32 buffers;
   only every N-th micro-batch goes on (``tf.cond``, so no extra ``session.run``);
4. the optimizer step: the buffers' mean (or the gradients, N = 1), allreduced here
   when ``allreduce_post_accumulation``, divided by S, checked for Inf/NaN; finite
   gradients are applied, non-finite ones are dropped (weights untouched,
   ``skipped_steps`` + 1, a dynamic S halved); the buffers are zeroed either way.

Accumulation happens on the *scaled* gradients. The scale only changes at optimizer
steps, so every micro-batch of a window shares it, and a post-accumulation allreduce
with ``hvd.Compression.fp16`` then compresses values in the range the scale was
chosen for, instead of unscaled values that may underflow float16.

``global_step`` counts optimizer steps: +1 every N micro-batches, *including* skipped
ones. That keeps the learning-rate schedule, ``max_steps`` and step-based hooks
(checkpoints, logging) tied to the data consumed, and guarantees that a run whose
gradients stay non-finite still ends (with ``skipped_steps`` telling why) instead of
spinning forever at the same step. Keras's LossScaleOptimizer does the same; NVIDIA's
TF1 BERT instead holds ``global_step`` on overflow. Adam's bias correction is not
disturbed by skips because LAMB counts its own applied updates (``LAMB/lamb_step``).

With Horovod, pass e.g. ``allreduce_fn=lambda g: hvd.allreduce(g,
compression=hvd.Compression.fp16)``. Every gradient the optimizer sees has then been
allreduced (per micro-batch before accumulating, or once after), so it is identical on
all ranks and so is the finite check: all ranks skip or apply together and their
weights, loss scales and counters stay in sync without an extra collective. Inf and
NaN survive the allreduce sum, so an overflow on any one rank makes every rank skip.
"""
import tensorflow as tf

from optimization.adam_weight_decay import AdamWeightDecayOptimizer
from optimization.decoupled_weight_decay import to_dense
from optimization.gradient_accumulation import GradientAccumulator
from optimization.lamb import LAMBOptimizer
from optimization.learning_rate import learning_rate_schedule
from optimization.loss_scale import DynamicLossScale, FixedLossScale


def make_optimizer(optimizer_type, learning_rate, weight_decay_rate=0.01):
    """``'lamb'`` -> LAMBOptimizer (NVLAMB), ``'adam'`` -> Google's AdamWeightDecay."""
    if optimizer_type == "lamb":
        return LAMBOptimizer(learning_rate, weight_decay_rate=weight_decay_rate)
    if optimizer_type == "adam":
        return AdamWeightDecayOptimizer(learning_rate, weight_decay_rate=weight_decay_rate)
    raise ValueError(f"optimizer_type must be 'lamb' or 'adam', got {optimizer_type!r}")


def make_loss_scale(loss_scale, init_loss_scale=2.0 ** 15):
    """None -> scale 1; 'dynamic' -> DynamicLossScale(init_loss_scale); a number -> fixed
    scale; a FixedLossScale/DynamicLossScale instance is used as is."""
    if isinstance(loss_scale, FixedLossScale):
        return loss_scale
    if loss_scale is None:
        return FixedLossScale(1.0)
    if loss_scale == "dynamic":
        return DynamicLossScale(init_loss_scale)
    return FixedLossScale(float(loss_scale))


def _all_finite(grads):
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])


def create_train_op(loss, optimizer_type, init_lr, num_train_steps, num_warmup_steps,
                    start_step=0, num_accumulation_steps=1, loss_scale=None,
                    init_loss_scale=2.0 ** 15, allreduce_fn=None,
                    allreduce_post_accumulation=False, tvars=None, global_step=None,
                    weight_decay_rate=0.01):
    """Builds the op running one micro-batch of training (see the module docstring).

    Args:
      loss: scalar loss of the micro-batch (a mean over its examples), any float dtype.
      optimizer_type: 'lamb' or 'adam'.
      init_lr, num_train_steps, num_warmup_steps, start_step: the learning-rate
        schedule (``learning_rate_schedule``; power 0.5 for LAMB, 1 for Adam).
      num_accumulation_steps: micro-batches per optimizer step.
      loss_scale: None, 'dynamic', a number or a loss-scale object (``make_loss_scale``).
      init_loss_scale: initial scale of 'dynamic'.
      allreduce_fn: callable(grad) -> grad averaged over workers, or None.
      allreduce_post_accumulation: allreduce the accumulated mean once per optimizer
        step instead of every micro-batch's gradients.
      tvars: variables to train (default: all trainable variables).
      global_step: the step variable (default: get_or_create_global_step()).
      weight_decay_rate: decoupled weight decay of the optimizer.

    Returns:
      ``(train_op, extras)``. ``extras`` holds scalar tensors for logging:
      ``learning_rate`` and ``loss_scale`` (used for this micro-batch),
      ``is_optimizer_step`` (this micro-batch closed an accumulation window),
      ``is_finite`` and ``global_norm`` (of the unscaled averaged gradients; True/0
      between optimizer steps), and the post-step ``skipped_steps`` and ``global_step``.
      They are outputs of the step: fetch them in the same ``session.run`` as
      ``train_op`` (fetching one alone runs a training step).
    """
    if global_step is None:
        global_step = tf.compat.v1.train.get_or_create_global_step()
    power = 0.5 if optimizer_type == "lamb" else 1.0
    learning_rate = learning_rate_schedule(init_lr, num_train_steps, num_warmup_steps,
                                           global_step, power=power, start_step=start_step)
    optimizer = make_optimizer(optimizer_type, learning_rate, weight_decay_rate)
    scaler = make_loss_scale(loss_scale, init_loss_scale)
    if tvars is None:
        tvars = tf.compat.v1.trainable_variables()

    scale = scaler.scale
    grads = tf.compat.v1.gradients(tf.cast(loss, tf.float32) * scale, list(tvars))
    pairs = [(g, v) for g, v in zip(grads, tvars) if g is not None]
    if not pairs:
        raise ValueError("the loss depends on none of the trainable variables")
    variables = [v for _, v in pairs]
    grads = [tf.cast(to_dense(g), tf.float32) for g, _ in pairs]
    optimizer.create_slots(variables)  # outside any tf.cond: plain outer-graph variables
    if allreduce_fn is not None and not allreduce_post_accumulation:
        grads = [allreduce_fn(g) for g in grads]

    def optimizer_step(scaled_grads):
        """Unscale, check, apply or skip, count. Returns (is_finite, global_norm)."""
        if allreduce_fn is not None and allreduce_post_accumulation:
            scaled_grads = [allreduce_fn(g) for g in scaled_grads]
        unscaled = [g / scale for g in scaled_grads]
        is_finite = _all_finite(unscaled)
        global_norm = tf.linalg.global_norm(unscaled)

        def apply():
            with tf.control_dependencies([optimizer.apply_gradients(zip(unscaled, variables))]):
                return tf.constant(True)

        applied = tf.cond(is_finite, apply, lambda: tf.constant(False))
        with tf.control_dependencies([applied]):
            bookkeeping = tf.group(scaler.update(is_finite),
                                   global_step.assign_add(1, read_value=False))
        with tf.control_dependencies([bookkeeping]):
            return tf.identity(is_finite), tf.identity(global_norm)

    if num_accumulation_steps == 1:
        is_optimizer_step = tf.constant(True)
        is_finite, global_norm = optimizer_step(grads)
    else:
        accumulator = GradientAccumulator(variables, num_accumulation_steps)
        is_optimizer_step = accumulator.add(grads)

        def at_boundary():
            outputs = optimizer_step(accumulator.average())
            with tf.control_dependencies(outputs):
                reset = accumulator.reset()
            with tf.control_dependencies([reset]):
                return tuple(tf.identity(x) for x in outputs)

        is_finite, global_norm = tf.cond(
            is_optimizer_step, at_boundary, lambda: (tf.constant(True), tf.constant(0.0)))

    train_op = tf.group(is_finite, global_norm, name="train_op")
    with tf.control_dependencies([train_op]):
        extras = {
            "learning_rate": learning_rate,
            "loss_scale": scale,
            "is_optimizer_step": is_optimizer_step,
            "is_finite": is_finite,
            "global_norm": global_norm,
            "skipped_steps": scaler.skipped_steps.read_value(),
            "global_step": global_step.read_value(),
        }
    return train_op, extras
