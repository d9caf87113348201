"""Which checkpoint a run in an output folder resumes from: the one its `checkpoint` state
file names when that one is whole and finite, else the newest whole and finite one among
the files, said in one line; never step 0 over checkpoints that are there.

Why: TensorFlow resumes from what the `checkpoint` state file names and nothing else. With
that file missing (a crash, a partial copy, a sync tool that skips small files) or naming a
step that is not there, it trained from step 0 without a word, overwrote `model.ckpt-10`
with the new run's step 10 and let the rotation delete the oldest; an empty or garbled one,
or a newest checkpoint whose `.index` or `.data` is truncated, ended in a long traceback;
a checkpoint holding a NaN was resumed and failed again. So:
- `choose` reads the state file and the folder's `model.ckpt-<step>` checkpoints. The state
  file is followed when it parses and names a checkpoint that is whole (index readable, data
  files as long as the index says: `modeling.checkpoints.check_not_damaged`) and finite
  (every float variable but the gradient-accumulation buffers, read one at a time:
  `first_non_finite_variable`). Otherwise the newest checkpoint that is whole and finite is
  chosen. When checkpoints are there and none is usable, the run is refused in one line
  (UsageError) naming the newest and what is wrong with it, unless it starts over.
- `settle` (the chief, which holds the folder's run lock) acts on the choice: it rewrites the
  state file to name the chosen checkpoint (atomically, flushed to disk), moves the
  checkpoints newer than it (which the resumed run would overwrite) into a dated
  `set_aside-<time>/` folder, and says all that in one line. Starting over moves the earlier
  run's checkpoints and run state there too: a user's files are never deleted.

Horovod: every rank calls `choose` on the same files and gets the same answer whether it
reads them before or after the chief's `settle` (which only rewrites the state file to the
same choice and moves away checkpoints no rank chooses), so no rank waits for another.
"""
import dataclasses
import os
import re
import time
from typing import List, Optional, Tuple

import tensorflow as tf
from absl import logging
from google.protobuf import text_format

from modeling.checkpoints import (CheckpointError, check_not_damaged, first_non_finite_variable,
                                  trained_state_names)
from reporting.console import SHOW
from reporting.errors import UsageError
from resilience.atomic_files import read_text, write_text_atomically

tf1 = tf.compat.v1

STATE_FILE = "checkpoint"            # TensorFlow's checkpoint state file
CHECKPOINT_PREFIX = "model.ckpt"     # what the Estimator saves: model.ckpt-<global step>
SET_ASIDE_PREFIX = "set_aside-"
# What else a run's resume reads (moved aside with its checkpoints when starting over).
RUN_STATE_NAMES = ("data_order.json", "input_state")
_STEP_INDEX = re.compile(r"^" + re.escape(CHECKPOINT_PREFIX) + r"-(\d+)\.index$")


@dataclasses.dataclass
class ResumePoint:
    """The outcome of `choose`.

    `checkpoint`: the prefix to resume from, None to start at step 0. `step`: its step.
    `state_problem`: why the state file was not followed (None: it was, or there is none and
    no checkpoint). `passed_over`: [(prefix, problem)] of checkpoints newer than the chosen
    one that are not usable. `newer`: every checkpoint newer than the chosen one (to move
    aside). `start_over`: the run starts over on purpose; `earlier`: the checkpoints there."""
    checkpoint: Optional[str] = None
    step: int = 0
    state_problem: Optional[str] = None
    passed_over: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    newer: List[str] = dataclasses.field(default_factory=list)
    start_over: bool = False
    earlier: List[str] = dataclasses.field(default_factory=list)


def step_checkpoints(output_dir):
    """[(step, prefix)] of the `model.ckpt-<step>` checkpoints in `output_dir` with an index
    file, oldest first."""
    if not output_dir or not tf.io.gfile.isdir(output_dir):
        return []
    found = []
    for name in tf.io.gfile.listdir(output_dir):
        match = _STEP_INDEX.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(output_dir, name[:-len(".index")])))
    return sorted(found)


def checkpoint_problem(prefix):
    """None when the checkpoint `prefix` is whole and its trained state finite, else what is
    wrong with it, as the end of a sentence ("is damaged (...)", "holds a NaN ...")."""
    try:
        check_not_damaged(prefix)
        name = first_non_finite_variable(prefix, trained_state_names(prefix))
    except CheckpointError as err:
        return f"is damaged ({err})"
    except (tf.errors.OpError, ValueError) as err:  # e.g. a data file shorter than its index
        message = str(getattr(err, "message", err)).strip().splitlines()
        return f"cannot be read ({message[0] if message else err.__class__.__name__})"
    if name is not None:
        return f"holds a NaN or an infinity in {name}"
    return None


def read_state(output_dir):
    """(prefix the state file names, None) or (None, what is wrong with the file: "is
    missing", "is empty", ...)."""
    text = read_text(os.path.join(output_dir, STATE_FILE))
    if text is None:
        return None, "is missing"
    if not text.strip():
        return None, "is empty"
    state = type(tf1.train.generate_checkpoint_state_proto(output_dir, "x"))()
    try:
        text_format.Parse(text, state)
    except (text_format.ParseError, ValueError):
        return None, "is not a checkpoint state file"
    if not state.model_checkpoint_path:
        return None, "names no checkpoint"
    path = state.model_checkpoint_path
    return (path if os.path.isabs(path) or "://" in path else os.path.join(output_dir, path)), None


def _step_of(prefix):
    match = _STEP_INDEX.match(os.path.basename(prefix) + ".index")
    return int(match.group(1)) if match else None


def choose(output_dir, start_over=False):
    """The ResumePoint of a run in `output_dir` (see the module docstring). Raises
    UsageError when the folder holds checkpoints and none is usable (and not `start_over`).
    Reads only: every rank may call it."""
    found = step_checkpoints(output_dir)
    if start_over:
        return ResumePoint(start_over=True, earlier=[prefix for _, prefix in found])
    if not found and not tf.io.gfile.exists(os.path.join(output_dir or "", STATE_FILE)):
        return ResumePoint()
    named, problem = read_state(output_dir)
    problems = {}  # prefix -> what is wrong with it
    if named is not None:
        problems[named] = (checkpoint_problem(named) if tf.io.gfile.exists(named + ".index")
                           else "is not there")
        if problems[named] is None:
            step = _step_of(named)
            return ResumePoint(named, _reader_step(named, step), newer=[
                prefix for later, prefix in found if step is not None and later > step])
        problem = f"names {os.path.basename(named)}, which {problems[named]}"
    passed = []
    for step, prefix in reversed(found):
        if prefix not in problems:
            problems[prefix] = checkpoint_problem(prefix)
            if problems[prefix] is None:
                return ResumePoint(prefix, step, problem, passed,
                                   [later for number, later in found if number > step])
            passed.append((prefix, problems[prefix]))
    if not found:
        return ResumePoint(state_problem=problem)
    newest = found[-1][1]
    raise UsageError(
        f"{output_dir}: holds checkpoints ({_names([prefix for _, prefix in found])}) but "
        f"none to resume from: {os.path.basename(newest)} {problems[newest]}; refusing to "
        "start at step 0 over them: pass --start_over to move them aside into a "
        "set_aside-<time> folder and start again, or use another --output_dir")


def _reader_step(prefix, step):
    if step is not None:
        return step
    reader = tf1.train.load_checkpoint(prefix)
    return int(reader.get_tensor("global_step")) if reader.has_tensor("global_step") else 0


def _names(prefixes, most=4):
    names = [os.path.basename(prefix) for prefix in prefixes]
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def write_state(output_dir, prefix, older=()):
    """Rewrites `output_dir`'s state file to name `prefix` (and `older`, oldest first, as
    the checkpoints the rotation keeps counting), atomically and flushed to disk."""
    here = os.path.normpath(output_dir)
    relative = [os.path.basename(path) if os.path.normpath(os.path.dirname(path)) == here
                else path for path in list(older) + [prefix]]
    state = tf1.train.generate_checkpoint_state_proto(output_dir, relative[-1], relative)
    write_text_atomically(os.path.join(output_dir, STATE_FILE),
                          text_format.MessageToString(state))


def _set_aside_folder(output_dir):
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = os.path.join(output_dir, SET_ASIDE_PREFIX + stamp)
    number = 1
    while tf.io.gfile.exists(folder):
        number += 1
        folder = os.path.join(output_dir, f"{SET_ASIDE_PREFIX}{stamp}-{number}")
    tf.io.gfile.makedirs(folder)
    return folder


def move_aside(output_dir, prefixes, names=()):
    """Moves every file of the checkpoints `prefixes` and the entries `names` of
    `output_dir` (those that exist) into a new `set_aside-<time>` folder; returns it, or None
    when there was nothing to move."""
    if not tf.io.gfile.isdir(output_dir):
        return None
    bases = [os.path.basename(prefix) for prefix in prefixes]
    entries = [name.rstrip("/") for name in tf.io.gfile.listdir(output_dir)]
    moving = [name for name in entries if name in names or any(
        name.startswith(base + ".") or name.startswith(base + "_temp") for base in bases)]
    if not moving:
        return None
    folder = _set_aside_folder(output_dir)
    for name in sorted(moving):
        tf.io.gfile.rename(os.path.join(output_dir, name), os.path.join(folder, name))
    return folder


def settle(output_dir, point, is_chief=True):
    """Acts on `point` (`choose`'s): the chief moves aside what the run would overwrite,
    rewrites the state file when it was not followed, and says so in one line; other ranks
    only log the choice."""
    if not is_chief:
        if point.checkpoint:
            logging.info("resuming from %s", point.checkpoint)
        return
    if point.start_over:
        folder = move_aside(output_dir, point.earlier, (STATE_FILE,) + RUN_STATE_NAMES)
        if folder:
            what = _names(point.earlier) if point.earlier else "no checkpoint"
            logging.warning("%s: --start_over: moved the earlier run's checkpoints (%s) and "
                            "run state to %s; training starts at step 0", output_dir, what,
                            folder, extra=SHOW)
        return
    if point.checkpoint is None:
        if point.state_problem:  # a state file but no checkpoint: TensorFlow would choke on it
            folder = move_aside(output_dir, [], (STATE_FILE,))
            logging.warning("%s: its '%s' file %s and the folder holds no checkpoint: moved "
                            "that file to %s; training starts at step 0", output_dir,
                            STATE_FILE, point.state_problem, folder, extra=SHOW)
        return
    parts = []
    if point.state_problem:
        parts.append(f"its '{STATE_FILE}' file {point.state_problem}")
    parts += [f"{os.path.basename(prefix)} {why}" for prefix, why in point.passed_over]
    if point.newer:
        folder = move_aside(output_dir, point.newer)
        if folder:
            if not point.state_problem and not point.passed_over:
                parts.append(f"its '{STATE_FILE}' file names it and not the newer "
                             f"{_names(point.newer)}")
            parts.append(f"moved {_names(point.newer)} (which the run would overwrite) to "
                         f"{os.path.relpath(folder, output_dir)}/")
    if point.state_problem:
        older = [prefix for step, prefix in step_checkpoints(output_dir) if step < point.step]
        write_state(output_dir, point.checkpoint, older)
        parts.append(f"'{STATE_FILE}' rewritten to name it")
    if parts:
        logging.warning("%s: resuming from %s: %s", output_dir,
                        os.path.basename(point.checkpoint), "; ".join(parts), extra=SHOW)
