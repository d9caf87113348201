"""Loading Google-format checkpoints into a graph: weights only, every decision logged.

`init_from_checkpoint` is what `--init_checkpoint` does (phase 1 -> phase 2, Google's released
BERT, a converted HuggingFace model): it maps each trainable variable of the graph to the
checkpoint variable of the same name, never touches optimizer slots, step counters, loss
scales or accumulation buffers (those belong to a run, not to a model), and refuses a shape
mismatch with a message naming the checkpoint and the variable instead of TensorFlow's
"Assign requires shapes of both tensors to match" a minute into the run.
"""
import os
import re

import tensorflow as tf
from absl import logging

tf1 = tf.compat.v1

# Name fragments of per-run state that a weights-only load must skip: optimizer slots of
# Google's AdamWeightDecay (adam_m/adam_v), of our LAMB and Keras/tf.train optimizers, step
# counters, loss scaling and gradient-accumulation buffers.
NON_MODEL_VARIABLE_PATTERN = re.compile(
    r"(^|/)(adam_m|adam_v|lamb_m|lamb_v|lamb_step|Adam|Adam_1|Momentum|LAMB|"
    r"global_step|micro_step|loss_scale|good_steps|skipped_steps|local_step|accum[^/]*|"
    r"gradient_accumulation[^/]*)($|/|_\d+$)")


class CheckpointError(ValueError):
    """A checkpoint is missing or does not fit the model."""


def is_model_variable(name):
    """True for model weights, False for optimizer slots and run state."""
    return not NON_MODEL_VARIABLE_PATTERN.search(name)


def resolve_checkpoint(path):
    """A checkpoint prefix from a prefix, or from a directory: its latest checkpoint (per its
    `checkpoint` index file), or the one checkpoint it holds when it has no index file, as
    Google's released model folders and `bert-convert-checkpoint hf2tf`'s output do
    (`bert_model.ckpt.*`)."""
    if path is None:
        return None
    if os.path.isdir(path):
        latest = tf1.train.latest_checkpoint(path)
        if latest is not None:
            return latest
        prefixes = sorted(name[:-len(".index")] for name in os.listdir(path)
                          if name.endswith(".index"))
        if len(prefixes) == 1:
            return os.path.join(path, prefixes[0])
        if prefixes:
            raise CheckpointError(f"{path}: {len(prefixes)} checkpoints and no 'checkpoint' "
                                  f"index file to say which: pass one prefix "
                                  f"({', '.join(prefixes[:3])}{', ...' if len(prefixes) > 3 else ''})")
        raise CheckpointError(f"{path}: directory holds no checkpoint (no 'checkpoint' index "
                              "file, no *.index)")
    if tf.io.gfile.exists(path + ".index") or tf.io.gfile.exists(path):
        return path
    raise CheckpointError(f"{path}: no such checkpoint (expected {path}.index)")


def checkpoint_variables(path):
    """{name: shape} of a checkpoint's variables."""
    prefix = resolve_checkpoint(path)
    try:
        return dict(tf1.train.list_variables(prefix))
    except (tf.errors.OpError, ValueError) as err:
        raise CheckpointError(f"{prefix}: unreadable checkpoint: {err.__class__.__name__}") from None


def _variable_name(variable):
    return variable.name[:-2] if variable.name.endswith(":0") else variable.name


def assignment_map_from_checkpoint(tvars, init_checkpoint):
    """Returns (assignment_map {ckpt_name: variable}, initialised names, fresh names).

    Raises CheckpointError when a variable exists in both but with different shapes.
    """
    prefix = resolve_checkpoint(init_checkpoint)
    in_checkpoint = checkpoint_variables(prefix)
    assignment_map, initialised, fresh = {}, [], []
    for variable in tvars:
        name = _variable_name(variable)
        if not is_model_variable(name) or name not in in_checkpoint:
            fresh.append(name)
            continue
        want = variable.shape.as_list()
        have = list(in_checkpoint[name])
        if want != have:
            raise CheckpointError(f"{prefix}: {name}: checkpoint shape {have} does not match "
                                  f"model shape {want}")
        assignment_map[name] = variable
        initialised.append(name)
    return assignment_map, initialised, fresh


def init_from_checkpoint(init_checkpoint, tvars=None, log=True):
    """Initialises the graph's model weights from `init_checkpoint` (weights only).

    Call while building the graph (inside `model_fn`), before the session starts. Returns the
    (initialised, fresh) name lists; each variable is logged as one or the other.
    """
    if tvars is None:
        tvars = tf1.trainable_variables()
    prefix = resolve_checkpoint(init_checkpoint)
    assignment_map, initialised, fresh = assignment_map_from_checkpoint(tvars, prefix)
    if assignment_map:
        tf1.train.init_from_checkpoint(prefix, {name: var for name, var in assignment_map.items()})
    if log:
        logging.info("Initialising %d of %d variables from %s", len(initialised), len(tvars), prefix)
        for name in initialised:
            logging.info("  INIT_FROM_CKPT %s", name)
        for name in fresh:
            logging.info("  fresh          %s", name)
    return initialised, fresh
