"""Loading Google-format checkpoints into a graph: weights only, every decision logged.

`init_from_checkpoint` is what `--init_checkpoint` does (phase 1 -> phase 2, Google's released
BERT, a converted HuggingFace model): it maps each trainable variable of the graph to the
checkpoint variable of the same name, never touches optimizer slots, step counters, loss
scales or accumulation buffers (those belong to a run, not to a model), and refuses a shape
mismatch with a message naming the checkpoint and the variable instead of TensorFlow's
"Assign requires shapes of both tensors to match" a minute into the run, and weights holding
a NaN or an infinity with one naming the first such variable (a NaN start used to train on
with every step skipped, blame the learning rate or the loss scale, and save the NaN weights
as the run's first checkpoint).
"""
import os
import re

import numpy as np
import tensorflow as tf
from absl import logging

tf1 = tf.compat.v1

# Name fragments of per-run state that a weights-only load must skip: optimizer slots of
# Google's AdamWeightDecay (adam_m/adam_v), of our LAMB and Keras/tf.train optimizers, step
# counters, loss scaling and gradient-accumulation buffers.
NON_MODEL_VARIABLE_PATTERN = re.compile(
    r"(^|/)(adam_m|adam_v|adam_step|lamb_m|lamb_v|lamb_step|Adam|Adam_1|Momentum|LAMB|"
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
    """{name: shape} of a checkpoint's variables, after `check_not_damaged`."""
    prefix = resolve_checkpoint(path)
    return check_not_damaged(prefix)


def check_not_damaged(prefix):
    """Raises CheckpointError naming the file when the checkpoint `prefix` is damaged: an
    unreadable index, a data shard missing, or data shards shorter than the variables the
    index lists (a truncated copy). Returns {name: shape}.

    Restoring such a checkpoint fails deep inside TensorFlow (DataLossError, "Read fewer
    bytes than requested") in a traceback of a hundred lines, after the graph is built; this
    reads only the index and the files' sizes."""
    index = prefix + ".index"
    try:
        reader = tf1.train.load_checkpoint(prefix)
        shapes = reader.get_variable_to_shape_map()
        dtypes = reader.get_variable_to_dtype_map()
    except (tf.errors.OpError, ValueError) as err:
        raise CheckpointError(f"{index}: damaged or not a checkpoint index "
                              f"({err.__class__.__name__})") from None
    shards = sorted(tf.io.gfile.glob(prefix + ".data-*-of-*"))
    expected = int(shards[0].rsplit("-of-", 1)[1]) if shards else 1
    if len(shards) != expected:
        raise CheckpointError(f"{prefix}.data-*: damaged checkpoint: {len(shards)} of its "
                              f"{expected} data files are there")
    needed = sum(int(np.prod(shapes[name], dtype=np.int64)) * dtypes[name].size
                 for name in shapes if dtypes[name] != tf.string)
    present = sum(tf.io.gfile.stat(path).length for path in shards)
    if present < needed:
        raise CheckpointError(f"{shards[-1]}: damaged checkpoint (truncated?): its data files "
                              f"hold {present} bytes, its variables need {needed}")
    return {name: list(shape) for name, shape in shapes.items()}


def first_non_finite_variable(path, names=None):
    """The name of the first float variable of checkpoint `path` (prefix or folder) holding a
    NaN or an infinity, in name order, or None when every one is finite. `names`: only
    these (default: every float variable, optimizer state included: a run resumed from a
    NaN moment fails as surely as one from a NaN weight).

    Reads one variable at a time (BERT-large's largest is 125 MB), so its memory stays
    that of the largest variable; ~1 s per GB on one core. Data that cannot be read (a
    checksum mismatch: bytes changed on disk) is a `CheckpointError` naming `path`, in one
    line, not a DataLossError traceback."""
    prefix = resolve_checkpoint(path)
    try:
        reader = tf1.train.load_checkpoint(prefix)
        dtypes = reader.get_variable_to_dtype_map()
        for name in sorted(dtypes if names is None else names):
            if name in dtypes and dtypes[name].is_floating:
                value = reader.get_tensor(name)
                if not np.isfinite(value).all():
                    return name
    except tf.errors.OpError as err:
        cause = next((line.strip() for line in (err.message or "").splitlines()
                      if line.strip()), type(err).__name__)
        raise CheckpointError(f"{path}: damaged checkpoint: {cause}") from None
    return None


def is_accumulation_buffer(name):
    """True for a gradient-accumulation buffer (`<var>/accum`, `gradient_accumulation/...`):
    mid-window it may hold a skipped micro-batch's non-finite gradient, which the window's
    end discards, so it is no sign of a broken run."""
    return name.endswith("/accum") or name.startswith("gradient_accumulation/")


def trained_state_names(path):
    """The float variables of checkpoint `path` that must be finite to resume from it:
    weights and optimizer state, not the accumulation buffers."""
    reader = tf1.train.load_checkpoint(resolve_checkpoint(path))
    return [name for name, dtype in reader.get_variable_to_dtype_map().items()
            if dtype.is_floating and not is_accumulation_buffer(name)]


_FOUND_FINITE = set()  # (prefix, index size and time, names) already read: one read a process


def refuse_non_finite(prefix, names, doing):
    """Raises CheckpointError naming `prefix` and the first of `names` holding a NaN or an
    infinity (`doing`: what is refused, e.g. "refusing to initialise from it"). Each
    checkpoint is read once a process (the Estimator builds its graph once per call)."""
    try:
        stat = tf.io.gfile.stat(prefix + ".index")
        key = (prefix, stat.length, stat.mtime_nsec, tuple(sorted(names)))
    except tf.errors.OpError:
        key = None
    if key is not None and key in _FOUND_FINITE:
        return
    name = first_non_finite_variable(prefix, names)
    if name is not None:
        raise CheckpointError(f"{prefix}: variable {name} holds a NaN or an infinity: {doing}")
    if key is not None:
        _FOUND_FINITE.add(key)


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
    refuse_non_finite(prefix, initialised, "refusing to initialise from it (use an earlier "
                      "checkpoint of the run that wrote it)")
    if assignment_map:
        tf1.train.init_from_checkpoint(prefix, {name: var for name, var in assignment_map.items()})
    if log:
        logging.info("Initialising %d of %d variables from %s", len(initialised), len(tvars), prefix)
        for name in initialised:
            logging.info("  INIT_FROM_CKPT %s", name)
        for name in fresh:
            logging.info("  fresh          %s", name)
    return initialised, fresh


def refuse_other_model(model_dir, variables, what_runs="this run", checkpoint=None):
    """Raises CheckpointError when `model_dir`'s latest checkpoint is not one of this graph's;
    `checkpoint`: the one the run resumes from, when chosen already (`""`: none).

    A run in a folder that already holds checkpoints resumes from them; if the model changed
    in between (another `--bert_config_file`, optimizer, accumulation), TensorFlow either
    restores the variables the two graphs share and trains on, so that the next save
    replaces the old model with the new one (fewer layers: no error at all), or fails in a
    long traceback after writing the new graph. Called while the graph is built, before the
    session starts and before anything is saved: every variable of `variables` must be in
    the checkpoint with its shape, and every model weight of the checkpoint in the graph.
    Run state the new graph does not use (a loss scale, accumulation buffers) is ignored.
    """
    if checkpoint is not None:
        latest = checkpoint or None
    else:
        latest = tf1.train.latest_checkpoint(model_dir) if model_dir else None
    if latest is None:
        return
    saved = checkpoint_variables(latest)
    graph = {_variable_name(variable): variable.shape.as_list() for variable in variables}
    problems = []
    for name, shape in sorted(graph.items()):
        if name not in saved:
            problems.append(f"{name} is not in the checkpoint")
        elif list(saved[name]) != shape:
            problems.append(f"{name} has shape {list(saved[name])} in the checkpoint, "
                            f"{shape} in {what_runs}")
    problems += [f"{name} is in the checkpoint, not in {what_runs}"
                 for name in sorted(saved) if is_model_variable(name) and name not in graph]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointError(
            f"{model_dir}: holds {os.path.basename(latest)} of another model or training "
            f"setup: {problems[0]}{more}; refusing to resume from it or overwrite it (use the "
            f"config and flags it was trained with, or another output folder)")
