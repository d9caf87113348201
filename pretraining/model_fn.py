"""The pre-training `model_fn`: BERT + masked-LM and next-sentence heads, for TRAIN and EVAL.

TRAIN builds the whole step with `training.train_step` (NVLAMB or AdamWeightDecay, loss
scaling, gradient accumulation, Horovod allreduce), over in-graph towers with
--num_local_devices (`runtime.towers`); EVAL reports Google's four metrics.
Everything the step needs comes in one `TrainingSettings`, so the model_fn has no global
flags and tests can build it directly.
"""
from contextlib import nullcontext

import tensorflow as tf

from modeling import BertModel, PackedRows, masked_lm_output, next_sentence_output
from modeling.checkpoints import init_from_checkpoint, refuse_other_model
from runtime.towers import build_towers, tower_mean
from training.hooks import INSTANCES, REAL_TOKENS
from training.train_step import micro_step_variable, seeded_dropout, train_spec

tf1 = tf.compat.v1

def packed_rows(features):
    """`PackedRows` when the records are packed (several instances a row), else None."""
    if "instance_ids" not in features:
        return None
    return PackedRows(features["instance_ids"], features["position_ids"],
                      features["next_sentence_positions"])


LOSS_KEYS = ("total_loss", "masked_lm_loss", "next_sentence_loss")


def pretraining_losses(settings, features, is_training, micro_step=None, tower=0):
    """Builds BERT and both heads. Returns a dict of tensors (losses and head outputs).
    `tower`: the index of this tower's dropout masks (`seeded_dropout`).

    Packed rows (`packed_rows`) give the same losses as their instances unpacked: the
    masked-LM loss is a mean over masked tokens either way, and the next-sentence loss a
    mean over instances (`next_sentence_weights`), not rows.
    """
    config = settings.bert_config
    packing = packed_rows(features)
    dropout = seeded_dropout(settings, micro_step, tower) if micro_step is not None else None
    with dropout or nullcontext():
        # scope "bert" named, not defaulted: a default name would be uniquified ("bert_1") in
        # a second tower instead of reusing the first tower's variables.
        model = BertModel(config, is_training, features["input_ids"], features["input_mask"],
                          features["segment_ids"], scope="bert",
                          compute_type=settings.compute_type,
                          packing=packing, output_positions=features["masked_lm_positions"])
        mlm_loss, mlm_example_loss, mlm_log_probs = masked_lm_output(
            config, model.get_sequence_output(), model.get_embedding_table(),
            None, features["masked_lm_ids"],
            features["masked_lm_weights"], settings.compute_type)
        nsp_loss, nsp_example_loss, nsp_log_probs = next_sentence_output(
            config, model.get_pooled_output(), features["next_sentence_labels"],
            features.get("next_sentence_weights"))
    return {"total_loss": mlm_loss + nsp_loss, "masked_lm_loss": mlm_loss,
            "next_sentence_loss": nsp_loss, "mlm_example_loss": mlm_example_loss,
            "mlm_log_probs": mlm_log_probs, "nsp_example_loss": nsp_example_loss,
            "nsp_log_probs": nsp_log_probs}


def training_losses(settings, features, micro_step):
    """`(losses, towers)` of one training micro-batch. `losses`: the three `LOSS_KEYS`
    (float32 scalars) of the model on the default device, or, with several
    `settings.devices`, the means of the towers' losses, each tower on its slice of the
    batch (`runtime.towers.build_towers`). `towers`: () on one device, else per tower
    (device, total loss, local weights read) for the training op (`train_spec`)."""
    if len(settings.devices) < 2:
        outputs = pretraining_losses(settings, features, True, micro_step)
        return {key: outputs[key] for key in LOSS_KEYS}, ()
    built = build_towers(settings.devices, features,
                         lambda part, index: pretraining_losses(settings, part, True,
                                                                micro_step, index))
    losses = {key: tower_mean([tower.outputs[key] for tower in built]) for key in LOSS_KEYS}
    return losses, [(tower.device, tower.outputs["total_loss"], tower.reads)
                    for tower in built]


def eval_metrics(outputs, features):
    """Google's pre-training metrics (weighted by masked_lm_weights)."""
    mlm_predictions = tf.argmax(outputs["mlm_log_probs"], axis=-1, output_type=tf.int32)
    mlm_ids = tf.reshape(features["masked_lm_ids"], [-1])
    mlm_weights = tf.reshape(features["masked_lm_weights"], [-1])
    nsp_predictions = tf.argmax(outputs["nsp_log_probs"], axis=-1, output_type=tf.int32)
    nsp_labels = tf.reshape(features["next_sentence_labels"], [-1])
    nsp_weights = features.get("next_sentence_weights")   # packed rows: real instances only
    if nsp_weights is not None:
        nsp_weights = tf.reshape(nsp_weights, [-1])
    return {
        "masked_lm_accuracy": tf1.metrics.accuracy(mlm_ids, mlm_predictions, weights=mlm_weights),
        "masked_lm_loss": tf1.metrics.mean(outputs["mlm_example_loss"], weights=mlm_weights),
        "next_sentence_accuracy": tf1.metrics.accuracy(nsp_labels, nsp_predictions,
                                                       weights=nsp_weights),
        "next_sentence_loss": tf1.metrics.mean(outputs["nsp_example_loss"], weights=nsp_weights),
    }


def batch_counts(features):
    """What a micro-batch holds, for throughput (`training.hooks.StepLoggingHook`): its real
    (non-padding) tokens and, for packed rows, its instances (each real one has
    next-sentence weight 1); unpacked rows are one instance each, which the hook knows."""
    counts = {REAL_TOKENS: tf.reduce_sum(features["input_mask"])}
    if packed_rows(features) is not None:
        counts[INSTANCES] = tf.reduce_sum(features["next_sentence_weights"])
    return counts


def make_model_fn(settings, extra_hooks_fn=None):
    """Returns an Estimator model_fn. `extra_hooks_fn(tensors)` may add training hooks that
    need the step's tensors (logging); they also get `batch_counts`."""

    def model_fn(features, labels, mode, params=None):
        del labels, params
        is_training = mode == tf.estimator.ModeKeys.TRAIN
        micro_step = micro_step_variable() if is_training else None
        towers = ()
        if is_training:
            outputs, towers = training_losses(settings, features, micro_step)
        else:
            outputs = pretraining_losses(settings, features, is_training)
        if settings.init_checkpoint:
            init_from_checkpoint(settings.init_checkpoint)

        if mode == tf.estimator.ModeKeys.EVAL:
            refuse_other_model(settings.model_dir, tf1.global_variables(), "this evaluation")
            return tf.estimator.EstimatorSpec(
                mode, loss=outputs["total_loss"],
                eval_metric_ops=eval_metrics(outputs, features))
        if mode != tf.estimator.ModeKeys.TRAIN:
            raise ValueError(f"pre-training supports TRAIN and EVAL, not {mode}")

        log_tensors = {key: outputs[key] for key in LOSS_KEYS}
        hooks_fn = extra_hooks_fn and (
            lambda tensors: extra_hooks_fn(dict(tensors, **batch_counts(features))))
        return train_spec(settings, outputs["total_loss"], micro_step, log_tensors, hooks_fn,
                          towers)

    return model_fn
