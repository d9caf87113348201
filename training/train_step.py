"""The TRAIN half of a model_fn, shared by pre-training and fine-tuning.

`micro_step` counts micro-batches (saved in checkpoints): it seeds each micro-batch's
dropout masks (`stateless_dropout`) and tells a resumed run how many records to skip, which
together make a resumed run continue exactly where the interrupted one stopped.
"""
import tensorflow as tf
from absl import logging

from modeling.checkpoints import refuse_other_model
from modeling.core import stateless_dropout
from optimization import Tower, create_train_op
from resilience.accumulation_state import absent_accumulation_state, install_filling_saver
from resilience.divergence import DivergenceGuardHook
# The step's `is_optimizer_step` is published there: hooks that act only at window
# boundaries (preemption, the bad-record bound) follow it (resilience.window_boundaries).
from resilience.window_boundaries import OPTIMIZER_STEP_COLLECTION

tf1 = tf.compat.v1

MICRO_STEP_NAME = "micro_step"


def micro_step_variable():
    """Micro-batches trained so far (int64, non-trainable, in every checkpoint)."""
    return tf1.get_variable(MICRO_STEP_NAME, [], tf.int64, tf1.zeros_initializer(),
                            trainable=False)


def dropout_seed(seed, rank, micro_step):
    """[base, micro_step]: base mixes the run's seed and the rank (below 2**32)."""
    base = ((int(seed) & 0xFFFFF) << 12) | (int(rank) & 0xFFF)
    return tf.stack([tf.constant(base, tf.int64), micro_step])


def seeded_dropout(settings, micro_step, tower=0):
    """Context under which the model's dropout is stateless and keyed by the micro-step.
    Each tower (`runtime.towers`) of each rank draws its own masks, as ranks do: the
    replica's index (rank x towers + tower) goes where the rank does."""
    replica = settings.rank * max(1, len(settings.devices)) + tower
    return stateless_dropout(dropout_seed(settings.seed, replica, micro_step))


def finite_or_zero(value):
    """Estimator stops a run on a NaN loss (its NanTensorHook); a non-finite step is instead
    skipped and counted by the training op, so the loss the Estimator sees is sanitised."""
    return tf.where(tf.math.is_finite(value), value, tf.zeros_like(value))


def train_spec(settings, loss, micro_step, log_tensors, extra_hooks_fn=None, towers=()):
    """EstimatorSpec for TRAIN: the training op (optimizer, AMP, accumulation, allreduce),
    the micro-step increment, TensorBoard scalars, and hooks from `extra_hooks_fn(tensors)`
    which receive `log_tensors` plus the step's learning rate, loss scale and counters.

    `towers`: with in-graph towers (`runtime.towers`), one (device, loss, local weights
    read) per tower; the training op then differentiates each tower's loss on its device
    and `loss` (the towers' mean) is only reported."""
    if settings.log_variables:
        for variable in tf1.trainable_variables():
            logging.info("trainable %s %s", variable.op.name, variable.shape.as_list())
    train_op, extras = create_train_op(
        loss, settings.optimizer_type, settings.learning_rate, settings.num_train_steps,
        settings.num_warmup_steps, num_accumulation_steps=settings.num_accumulation_steps,
        loss_scale=settings.loss_scale, init_loss_scale=settings.init_loss_scale,
        allreduce_fn=settings.allreduce_fn,
        allreduce_post_accumulation=settings.allreduce_post_accumulation,
        weight_decay_rate=settings.weight_decay_rate,
        lamb_layer_adaptation=settings.lamb_layer_adaptation, fused=settings.fused_update,
        towers=[Tower(device, tower_loss, reads) for device, tower_loss, reads in towers]
        or None)
    # Every variable now exists (slots, buffers): before anything is saved, the folder's
    # checkpoint must be of this graph, or the run would overwrite another model with it;
    # but for accumulation state it lacks (written without accumulation, or with fewer
    # towers), which starts empty (`resilience.accumulation_state`).
    checkpoint = settings.resume_checkpoint
    if checkpoint is None and settings.model_dir:
        checkpoint = tf1.train.latest_checkpoint(settings.model_dir)
    absent = absent_accumulation_state(tf1.global_variables(), checkpoint)
    skipped = {id(variable) for variable in absent}
    refuse_other_model(settings.model_dir,
                       [var for var in tf1.global_variables() if id(var) not in skipped],
                       checkpoint=settings.resume_checkpoint)
    if absent:
        install_filling_saver(absent, settings.keep_checkpoint_max)
    with tf.control_dependencies([train_op]):
        train_op = tf.group(train_op, micro_step.assign_add(1, read_value=False))
    tensors = dict(log_tensors)
    tensors.update({key: extras[key] for key in ("learning_rate", "loss_scale",
                                                  "skipped_steps", "global_step",
                                                  "is_optimizer_step", "global_norm")})
    tf1.add_to_collection(OPTIMIZER_STEP_COLLECTION, tensors["is_optimizer_step"])
    for key in list(log_tensors) + ["learning_rate", "loss_scale"]:
        tf1.summary.scalar(key, tensors[key])
    hooks = extra_hooks_fn(tensors) if extra_hooks_fn else []
    hooks.append(DivergenceGuardHook(extras["consecutive_skips"], settings.max_consecutive_skips))
    return tf.estimator.EstimatorSpec(tf.estimator.ModeKeys.TRAIN, loss=finite_or_zero(loss),
                                      train_op=train_op, training_hooks=hooks)
