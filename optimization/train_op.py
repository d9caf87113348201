"""The BERT training op: loss scaling, accumulation, allreduce, skip-on-overflow, update.

One ``session.run(train_op)`` processes one micro-batch:

1. gradients of ``loss * S`` (S = loss scale) w.r.t. the float32 master variables;
   ``IndexedSlices`` (embedding gradients) are made dense;
2. ``allreduce_fn`` on each gradient, unless ``allreduce_post_accumulation``;
3. with ``num_accumulation_steps`` N > 1, the gradients are added to float32 buffers;
   only every N-th micro-batch goes on (``tf.cond``, so no extra ``session.run``);
4. the optimizer step: the buffers' mean (or the gradients, N = 1), allreduced here
   when ``allreduce_post_accumulation``, divided by S; their global norm is computed
   once and serves three purposes: the finite check (a NaN/Inf anywhere makes it
   non-finite, and so does a norm beyond float32's range), the optimizer's clipping to
   norm 1.0, and the ``global_norm`` log. Finite gradients are applied, non-finite ones
   are dropped (weights untouched, ``skipped_steps`` + 1, a dynamic S halved); the
   buffers are zeroed either way.

Accumulation happens on the *scaled* gradients. The scale only changes at optimizer
steps, so every micro-batch of a window shares it, and a post-accumulation allreduce
with ``hvd.Compression.fp16`` then compresses values in the range the scale was
chosen for, instead of unscaled values that may underflow float16 (which is why
compression is only safe with float16 loss scaling: bfloat16 and float32 runs allreduce
uncompressed, see ``training.settings.gradient_compression``).

``global_step`` counts *applied* updates, as in NVIDIA's BERT: a skipped step does not
advance it, so the learning-rate schedule, ``--num_train_steps`` and step-based hooks
(checkpoints, logging) count real updates, and the micro-batches of a skipped window are
simply extra data. ``consecutive_skips`` (an output, not state) lets a hook stop a run
whose gradients stay non-finite instead of spinning forever at the same step
(``training.hooks.DivergenceGuardHook``). LAMB's bias correction counts its own applied
updates (``LAMB/lamb_step``), equal to ``global_step`` within one run.

With Horovod, pass e.g. ``allreduce_fn=lambda g: hvd.allreduce(g,
compression=hvd.Compression.fp16)``. Every gradient the optimizer sees has then been
allreduced (per micro-batch before accumulating, or once after), so it is identical on
all ranks and so is the finite check: all ranks skip or apply together and their
weights, loss scales and counters stay in sync without an extra collective. Inf and
NaN survive the allreduce sum, so an overflow on any one rank makes every rank skip.

With in-graph towers (``runtime.towers``, several devices in one process, ``towers=``) step 1
is taken per tower on its own device (``optimization.tower_gradients``: each tower's loss
scaled by S / towers, with respect to the local copies of the weights it reads), step 3
accumulates each tower's gradients in buffers on its own device, and the towers' sums meet on
the variables' device once per optimizer step; after an applied update the towers' copies
are refreshed from the masters. One finite check, one update for all towers, as before:
only what crosses devices changed (once per window instead of every micro-batch).
"""
import tensorflow as tf

from optimization.adam_weight_decay import AdamWeightDecayOptimizer
from optimization.decoupled_weight_decay import DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY
from optimization.gradient_accumulation import GradientAccumulator
from optimization.lamb import LAMBOptimizer
from optimization.learning_rate import learning_rate_schedule
from optimization.loss_scale import DynamicLossScale, FixedLossScale
from optimization.tower_gradients import (Tower, refresh_local_weights, sum_over_towers,
                                          tower_gradients)


# The Adam forms (make_optimizer): their schedule is linear and continuous, LAMB's is not.
ADAM_TYPES = ("adam", "adamw")
OPTIMIZER_TYPES = ("lamb",) + ADAM_TYPES


def make_optimizer(optimizer_type, learning_rate, weight_decay_rate=0.01,
                   lamb_layer_adaptation="all", fused=None):
    """``'lamb'`` -> LAMBOptimizer (NVLAMB), ``'adam'`` -> Google's AdamWeightDecay,
    ``'adamw'`` -> the same with Adam's bias correction (torch's AdamW).

    ``lamb_layer_adaptation``: ``'all'`` adapts every variable's step by its trust ratio
    (NVIDIA's TensorFlow BERT); ``'weights'`` leaves LayerNorm and bias out (ratio 1), as
    tfa's and TF Model Garden's LAMB do. ``fused``: the update XLA-compiled (None: the
    optimizer's default)."""
    if optimizer_type == "lamb":
        if lamb_layer_adaptation not in ("all", "weights"):
            raise ValueError("lamb_layer_adaptation must be 'all' or 'weights', got "
                             f"{lamb_layer_adaptation!r}")
        excluded = () if lamb_layer_adaptation == "all" else DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY
        return LAMBOptimizer(learning_rate, weight_decay_rate=weight_decay_rate,
                             exclude_from_layer_adaptation=excluded, fused=fused)
    if optimizer_type in ADAM_TYPES:
        return AdamWeightDecayOptimizer(learning_rate, weight_decay_rate=weight_decay_rate,
                                        bias_correction=optimizer_type == "adamw", fused=fused)
    raise ValueError(f"optimizer_type must be 'lamb', 'adam' or 'adamw', got {optimizer_type!r}")


def make_loss_scale(loss_scale, init_loss_scale=2.0 ** 32):
    """None -> scale 1; 'dynamic' -> DynamicLossScale(init_loss_scale); a number -> fixed
    scale; a FixedLossScale/DynamicLossScale instance is used as is."""
    if isinstance(loss_scale, FixedLossScale):
        return loss_scale
    if loss_scale is None:
        return FixedLossScale(1.0)
    if loss_scale == "dynamic":
        return DynamicLossScale(init_loss_scale)
    return FixedLossScale(float(loss_scale))


def create_train_op(loss, optimizer_type, init_lr, num_train_steps, num_warmup_steps,
                    num_accumulation_steps=1, loss_scale=None, init_loss_scale=2.0 ** 32,
                    allreduce_fn=None, allreduce_post_accumulation=False, tvars=None,
                    global_step=None, weight_decay_rate=0.01, lamb_layer_adaptation="all",
                    towers=None, fused=None):
    """Builds the op running one micro-batch of training (see the module docstring).

    Args:
      loss: scalar loss of the micro-batch (a mean over its examples), any float dtype;
        with ``towers``, not differentiated (the towers' own losses are).
      optimizer_type: 'lamb', 'adam' or 'adamw'.
      init_lr, num_train_steps, num_warmup_steps: the learning-rate schedule
        (``learning_rate_schedule``: power 0.5 for LAMB, 1 and continuous for Adam).
      num_accumulation_steps: micro-batches per optimizer step.
      loss_scale: None, 'dynamic', a number or a loss-scale object (``make_loss_scale``).
      init_loss_scale: initial scale of 'dynamic'.
      allreduce_fn: callable(grad) -> grad averaged over workers, or None.
      allreduce_post_accumulation: allreduce the accumulated mean once per optimizer
        step instead of every micro-batch's gradients.
      tvars: variables to train (default: all trainable variables).
      global_step: the step variable (default: get_or_create_global_step()).
      weight_decay_rate: decoupled weight decay of the optimizer.
      lamb_layer_adaptation: 'all' or 'weights' (``make_optimizer``).
      fused: the optimizer's update XLA-compiled, or None for its default
        (``optimization.decoupled_weight_decay.default_fused``).
      towers: in-graph towers (``optimization.tower_gradients.Tower``: device, loss, local
        copies read), or None: train on ``loss`` alone.

    Returns:
      ``(train_op, extras)``. ``extras`` holds scalar tensors for logging:
      ``learning_rate`` and ``loss_scale`` (used for this micro-batch),
      ``is_optimizer_step`` (this micro-batch closed an accumulation window),
      ``is_finite`` and ``global_norm`` (of the unscaled averaged gradients; True/0
      between optimizer steps), and the post-step ``skipped_steps``,
      ``consecutive_skips`` and ``global_step``.
      They are outputs of the step: fetch them in the same ``session.run`` as
      ``train_op`` (fetching one alone runs a training step).
    """
    if global_step is None:
        global_step = tf.compat.v1.train.get_or_create_global_step()
    power = 0.5 if optimizer_type == "lamb" else 1.0
    learning_rate = learning_rate_schedule(init_lr, num_train_steps, num_warmup_steps,
                                           global_step, power=power,
                                           continuous=optimizer_type in ADAM_TYPES)
    optimizer = make_optimizer(optimizer_type, learning_rate, weight_decay_rate,
                               lamb_layer_adaptation, fused)
    scaler = make_loss_scale(loss_scale, init_loss_scale)
    if tvars is None:
        tvars = tf.compat.v1.trainable_variables()

    scale = scaler.scale
    # Colocated gradients: each tower's backward pass runs on its own device (with one
    # device this changes nothing).
    towers = list(towers or [Tower(None, loss)])
    variables, tower_grads = tower_gradients(towers, list(tvars), scale)
    optimizer.create_slots(variables)  # outside any tf.cond: plain outer-graph variables
    if allreduce_fn is not None and not allreduce_post_accumulation:
        # Horovod averages one gradient per rank and micro-batch: the towers' sum.
        tower_grads = [[allreduce_fn(g) for g in sum_over_towers(tower_grads, variables)]]

    def optimizer_step(scaled_grads, multiplier=None):
        """Unscale, check, apply or skip, count. Returns (is_finite, global_norm).

        The gradients are used as ``scaled_grads * multiplier / S`` (multiplier: the
        accumulation mean's 1/micro-batches). That product is never materialised: its norm
        is the raw norm times the scalar, and the optimizer applies the scalar inside its
        fused update, which saves two passes over every gradient."""
        if allreduce_fn is not None and allreduce_post_accumulation:
            # The window's mean on the wire, as NVIDIA's (its loss / N): a float16 allreduce
            # of the sum of N = 512 micro-batches on 8 ranks would overflow ~12 powers of two
            # sooner and halve the loss scale for nothing. One multiply per gradient per
            # window buys it.
            if multiplier is not None:
                scaled_grads = [g * multiplier for g in scaled_grads]
                multiplier = None
            scaled_grads = [allreduce_fn(g) for g in scaled_grads]
        if not scaler.is_identity:
            multiplier = 1.0 / scale if multiplier is None else multiplier / scale
        global_norm = tf.linalg.global_norm(scaled_grads)
        if multiplier is not None:
            global_norm *= multiplier
        is_finite = tf.math.is_finite(global_norm)

        def apply():
            update = optimizer.apply_gradients(zip(scaled_grads, variables),
                                               global_norm=global_norm,
                                               grad_multiplier=multiplier)
            with tf.control_dependencies([update]):
                refreshed = refresh_local_weights(towers, variables)
            with tf.control_dependencies([refreshed]):
                return tf.constant(True)

        applied = tf.cond(is_finite, apply, lambda: tf.constant(False))
        with tf.control_dependencies([applied]):
            bookkeeping = tf.group(
                scaler.update(is_finite),
                global_step.assign_add(tf.cast(is_finite, global_step.dtype), read_value=False))
        with tf.control_dependencies([bookkeeping]):
            return tf.identity(is_finite), tf.identity(global_norm)

    if num_accumulation_steps == 1:
        is_optimizer_step = tf.constant(True)
        is_finite, global_norm = optimizer_step(sum_over_towers(tower_grads, variables))
    else:
        accumulator = GradientAccumulator(
            variables, num_accumulation_steps,
            devices=[tower.device for tower in towers] if len(tower_grads) > 1 else None)
        is_optimizer_step = accumulator.add(*tower_grads)

        def at_boundary():
            outputs = optimizer_step(accumulator.sums(), accumulator.mean_multiplier())
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
            "consecutive_skips": scaler.consecutive_skips.read_value(),
            "global_step": global_step.read_value(),
        }
    return train_op, extras
