"""The pre-training `model_fn`: BERT + masked-LM and next-sentence heads, for TRAIN and EVAL.

TRAIN builds the whole step with `optimization.create_train_op` (NVLAMB or AdamWeightDecay,
loss scaling, gradient accumulation, Horovod allreduce); EVAL reports Google's four metrics.
Everything the step needs comes in one `PretrainingSettings`, so the model_fn has no global
flags and tests can build it directly.
"""
import dataclasses
from typing import Optional

import tensorflow as tf

from modeling import BertModel, masked_lm_output, next_sentence_output
from modeling.checkpoints import init_from_checkpoint
from modeling.core import stateless_dropout
from optimization import create_train_op

tf1 = tf.compat.v1

MICRO_STEP_NAME = "micro_step"


@dataclasses.dataclass
class PretrainingSettings:
    """What the model_fn needs besides the features (see run_pretraining.py's flags)."""
    bert_config: object
    learning_rate: float = 5e-5
    num_train_steps: int = 100
    num_warmup_steps: int = 10
    start_step: int = 0
    optimizer_type: str = "lamb"
    init_checkpoint: Optional[str] = None
    compute_type: str = "float32"          # float32 | float16 | bfloat16
    loss_scale: Optional[object] = None    # None | "dynamic" | number | loss-scale object
    init_loss_scale: float = 2.0 ** 15
    num_accumulation_steps: int = 1
    allreduce_post_accumulation: bool = False
    allreduce_fn: Optional[object] = None
    seed: int = 12345
    rank: int = 0
    weight_decay_rate: float = 0.01


def micro_step_variable():
    """Micro-batches trained so far (int64, saved in checkpoints).

    It seeds each micro-batch's dropout masks and tells a resumed run how many records to
    skip, which together make a resumed run continue exactly where the interrupted one was.
    """
    return tf1.get_variable(MICRO_STEP_NAME, [], tf.int64, tf1.zeros_initializer(),
                            trainable=False)


def dropout_seed(seed, rank, micro_step):
    """[base, micro_step]: base mixes the run's seed and the rank (below 2**32)."""
    base = ((int(seed) & 0xFFFFF) << 12) | (int(rank) & 0xFFF)
    return tf.stack([tf.constant(base, tf.int64), micro_step])


def pretraining_losses(settings, features, is_training, micro_step=None):
    """Builds BERT and both heads. Returns a dict of tensors (losses and head outputs)."""
    config = settings.bert_config
    seed_context = (stateless_dropout(dropout_seed(settings.seed, settings.rank, micro_step))
                    if is_training and micro_step is not None else None)
    if seed_context is not None:
        seed_context.__enter__()
    try:
        model = BertModel(config, is_training, features["input_ids"], features["input_mask"],
                          features["segment_ids"], compute_type=settings.compute_type)
        mlm_loss, mlm_example_loss, mlm_log_probs = masked_lm_output(
            config, model.get_sequence_output(), model.get_embedding_table(),
            features["masked_lm_positions"], features["masked_lm_ids"],
            features["masked_lm_weights"], settings.compute_type)
        nsp_loss, nsp_example_loss, nsp_log_probs = next_sentence_output(
            config, model.get_pooled_output(), features["next_sentence_labels"])
    finally:
        if seed_context is not None:
            seed_context.__exit__(None, None, None)
    return {"total_loss": mlm_loss + nsp_loss, "masked_lm_loss": mlm_loss,
            "next_sentence_loss": nsp_loss, "mlm_example_loss": mlm_example_loss,
            "mlm_log_probs": mlm_log_probs, "nsp_example_loss": nsp_example_loss,
            "nsp_log_probs": nsp_log_probs}


def eval_metrics(outputs, features):
    """Google's pre-training metrics (weighted by masked_lm_weights)."""
    mlm_predictions = tf.argmax(outputs["mlm_log_probs"], axis=-1, output_type=tf.int32)
    mlm_ids = tf.reshape(features["masked_lm_ids"], [-1])
    mlm_weights = tf.reshape(features["masked_lm_weights"], [-1])
    nsp_predictions = tf.argmax(outputs["nsp_log_probs"], axis=-1, output_type=tf.int32)
    nsp_labels = tf.reshape(features["next_sentence_labels"], [-1])
    return {
        "masked_lm_accuracy": tf1.metrics.accuracy(mlm_ids, mlm_predictions, weights=mlm_weights),
        "masked_lm_loss": tf1.metrics.mean(outputs["mlm_example_loss"], weights=mlm_weights),
        "next_sentence_accuracy": tf1.metrics.accuracy(nsp_labels, nsp_predictions),
        "next_sentence_loss": tf1.metrics.mean(outputs["nsp_example_loss"]),
    }


def _finite_or_zero(value):
    """Estimator stops the run on a NaN loss (NanTensorHook); a non-finite step is instead
    skipped and counted by the training op, so the loss it sees is sanitised."""
    return tf.where(tf.math.is_finite(value), value, tf.zeros_like(value))


def make_model_fn(settings, extra_hooks_fn=None):
    """Returns an Estimator model_fn. `extra_hooks_fn(tensors)` may add training hooks that
    need the step's tensors (logging)."""

    def model_fn(features, labels, mode, params=None):
        del labels, params
        is_training = mode == tf.estimator.ModeKeys.TRAIN
        micro_step = micro_step_variable() if is_training else None
        outputs = pretraining_losses(settings, features, is_training, micro_step)
        if settings.init_checkpoint:
            init_from_checkpoint(settings.init_checkpoint)

        if mode == tf.estimator.ModeKeys.EVAL:
            return tf.estimator.EstimatorSpec(
                mode, loss=outputs["total_loss"],
                eval_metric_ops=eval_metrics(outputs, features))
        if mode != tf.estimator.ModeKeys.TRAIN:
            raise ValueError(f"pre-training supports TRAIN and EVAL, not {mode}")

        train_op, extras = create_train_op(
            outputs["total_loss"], settings.optimizer_type, settings.learning_rate,
            settings.num_train_steps, settings.num_warmup_steps,
            start_step=settings.start_step,
            num_accumulation_steps=settings.num_accumulation_steps,
            loss_scale=settings.loss_scale, init_loss_scale=settings.init_loss_scale,
            allreduce_fn=settings.allreduce_fn,
            allreduce_post_accumulation=settings.allreduce_post_accumulation,
            weight_decay_rate=settings.weight_decay_rate)
        with tf.control_dependencies([train_op]):
            train_op = tf.group(train_op, micro_step.assign_add(1, read_value=False))
        for key in ("total_loss", "masked_lm_loss", "next_sentence_loss"):
            tf1.summary.scalar(key, outputs[key])
        for key in ("learning_rate", "loss_scale"):
            tf1.summary.scalar(key, extras[key])
        tensors = {key: outputs[key] for key in ("total_loss", "masked_lm_loss",
                                                   "next_sentence_loss")}
        tensors.update({key: extras[key] for key in ("learning_rate", "loss_scale",
                                                      "skipped_steps", "global_step",
                                                      "is_optimizer_step")})
        hooks = extra_hooks_fn(tensors) if extra_hooks_fn else []
        return tf.estimator.EstimatorSpec(mode, loss=_finite_or_zero(outputs["total_loss"]),
                                          train_op=train_op, training_hooks=hooks)

    return model_fn
