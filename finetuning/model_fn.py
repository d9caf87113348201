"""The fine-tuning `model_fn`, one for every task.

A task (see `finetuning/tasks.py`) supplies the head on top of `BertModel`, its loss, what
PREDICT returns and what the SavedModel serves; the encoder, mixed precision, checkpoint
loading and the training step (AdamWeightDecay or LAMB, loss scaling, accumulation, Horovod)
are the same for all, shared with pre-training through `training.train_step`. With several
`settings.devices` (--num_local_devices), TRAIN builds one tower per device on its slice of the
batch and trains on the mean of their losses, each tower's gradients taken on its device
(`runtime.towers`, `training.train_step.train_spec`); EVAL and PREDICT use one.
"""
from contextlib import nullcontext

import tensorflow as tf

from modeling import BertModel
from modeling.checkpoints import init_from_checkpoint, refuse_other_model
from runtime.towers import build_towers, tower_mean
from training.train_step import micro_step_variable, seeded_dropout, train_spec

tf1 = tf.compat.v1


def make_model_fn(task, settings, extra_hooks_fn=None):
    """Estimator model_fn for `task` with `TrainingSettings` `settings`."""

    def model_fn(features, labels, mode, params=None):
        del labels, params
        is_training = mode == tf.estimator.ModeKeys.TRAIN
        micro_step = micro_step_variable() if is_training else None

        def build(part, tower=0):
            """The encoder and the task's head on `part` of the features (a tower's slice)."""
            with seeded_dropout(settings, micro_step, tower) if is_training else nullcontext():
                # scope named: a defaulted one would be "bert_1" in a second tower
                model = BertModel(settings.bert_config, is_training, part["input_ids"],
                                  part["input_mask"], part["segment_ids"], scope="bert",
                                  compute_type=settings.compute_type,
                                  output_positions=task.output_positions(part),
                                  skip_padding=mode == tf.estimator.ModeKeys.PREDICT)
                return task.build_outputs(model, part, is_training)

        if is_training and len(settings.devices) > 1:
            built = build_towers(settings.devices, features,
                                 lambda part, tower: task.loss(build(part, tower), part))
            loss = tower_mean([tower.outputs for tower in built])
            if settings.init_checkpoint:
                init_from_checkpoint(settings.init_checkpoint)
            return train_spec(settings, loss, micro_step, {"loss": loss}, extra_hooks_fn,
                              [(tower.device, tower.outputs, tower.reads) for tower in built])
        outputs = build(features)
        if settings.init_checkpoint:
            init_from_checkpoint(settings.init_checkpoint)

        if not is_training:
            refuse_other_model(settings.model_dir, tf1.global_variables(), "this model")
        if mode == tf.estimator.ModeKeys.PREDICT:
            serving = task.serving_outputs(outputs, features)
            return tf.estimator.EstimatorSpec(
                mode, predictions=task.predictions(outputs, features),
                export_outputs={"serving_default":
                                tf.estimator.export.PredictOutput(serving)})
        loss = task.loss(outputs, features)
        if mode == tf.estimator.ModeKeys.EVAL:
            return tf.estimator.EstimatorSpec(mode, loss=loss,
                                              eval_metric_ops=task.eval_metric_ops(outputs, features))
        return train_spec(settings, loss, micro_step, {"loss": loss}, extra_hooks_fn)

    return model_fn
