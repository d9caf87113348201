"""Optimization for BERT pre-training and fine-tuning (graph mode, tf.compat.v1).

``create_train_op`` builds the whole training step (loss scaling, gradient
accumulation, Horovod allreduce, skip on overflow, LAMB or AdamWeightDecay update,
learning-rate schedule), on one device or over in-graph towers (``Tower``); the pieces
are importable on their own. ``state_names`` lists
the checkpoint names of the optimizer state so loaders can skip it.
"""
from optimization.adam_weight_decay import AdamWeightDecayOptimizer
from optimization.gradient_accumulation import GradientAccumulator
from optimization.lamb import LAMBOptimizer
from optimization.learning_rate import learning_rate_schedule
from optimization.loss_scale import DynamicLossScale, FixedLossScale
from optimization.state_names import (OPTIMIZER_SLOT_SUFFIXES, TRAINING_STATE_SCOPES,
                                      TRAINING_STATE_SUFFIXES, is_training_state)
from optimization.tower_gradients import Tower
from optimization.train_op import create_train_op, make_loss_scale, make_optimizer

__all__ = [
    "AdamWeightDecayOptimizer",
    "DynamicLossScale",
    "FixedLossScale",
    "GradientAccumulator",
    "LAMBOptimizer",
    "OPTIMIZER_SLOT_SUFFIXES",
    "TRAINING_STATE_SCOPES",
    "TRAINING_STATE_SUFFIXES",
    "Tower",
    "create_train_op",
    "is_training_state",
    "learning_rate_schedule",
    "make_loss_scale",
    "make_optimizer",
]
