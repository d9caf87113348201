"""SavedModel export for serving, and the Triton Inference Server model-repository layout.

The SavedModel's `serving_default` signature takes `input_ids`, `input_mask`, `segment_ids`
(int32, [batch, length], any length up to max_seq_length) plus the task's extra inputs
(`unique_ids` for SQuAD) and returns the task's outputs (start/end logits, class probabilities
or a regression score); `serving_fixed_length` is the same at exactly max_seq_length, for
Triton's dynamic batcher (`finetuning.serving_graph` says why both). It loads with
`tf.saved_model.load`, runs with `saved_model_cli run`, and serves from TensorFlow Serving or
Triton (`platform: "tensorflow_savedmodel"`).
"""
import dataclasses
import json
import os
import shutil
import tempfile
import time

import tensorflow as tf
from absl import logging

from modeling.checkpoints import (CheckpointError, checkpoint_variables,
                                  first_non_finite_variable, is_model_variable)
from resilience.disk_space import DiskFullError, disk_full_cause, free_bytes, shortage
from finetuning.serving_graph import (FIXED_LENGTH_SIGNATURE, SEQUENCE_INPUTS,
                                      build_serving_graph)
from resilience.failures import op_error_summary

tf1 = tf.compat.v1


TASK_FILE = "bert_task.json"
VOCAB_FILE = "vocab.txt"
# Where BertModel puts the encoder's variables (its default scope); everything trainable
# outside it belongs to the task's head (finetuning/heads.py).
ENCODER_SCOPE = "bert/"
# The Estimator writes an export to `<export_dir>/temp-<timestamp>/` and renames it when done.
TEMP_EXPORT_GLOB = "temp-*"


def export_saved_model(estimator, task, export_dir, max_seq_length, checkpoint_path=None,
                       vocab_file=None, do_lower_case=True, vocab_size=None):
    """Writes `export_dir/<timestamp>/` (the Estimator writes under a temporary name and
    renames it when complete). Returns its path.

    `assets.extra/` carries what a client needs to feed the model: the vocabulary and
    `bert_task.json` (task, labels, sequence length, casing, SQuAD window settings, and
    `vocab_size`, the model's embedding rows, when given: inference checks a vocabulary
    passed instead of the carried one against it, `training.vocab_fit`).
    The checkpoint is checked first (`check_exportable`), and so is the free space (the
    variables' and graph's bytes; DiskFullError, as for a disk that fills during the export). No
    `temp-*` folder is left in `export_dir`, neither by a failed export nor by an earlier
    interrupted one.
    """
    remove_temp_exports(export_dir)
    checkpoint_path = checkpoint_path or tf1.train.latest_checkpoint(estimator.model_dir)
    need = check_exportable(estimator, task, max_seq_length, checkpoint_path)
    free = free_bytes(export_dir)
    if free is not None and free < need:
        raise DiskFullError(_export_shortage(export_dir, need))
    try:
        return _write_saved_model(estimator, task, export_dir, max_seq_length, checkpoint_path,
                                  vocab_file, do_lower_case, need, vocab_size)
    except BaseException:
        remove_temp_exports(export_dir)
        raise


def _export_shortage(export_dir, need, cause=None):
    return shortage(export_dir, need, "its variables and graph", cause, subject="the SavedModel",
                    remedy="free space and rerun the same command")


def _write_saved_model(estimator, task, export_dir, max_seq_length, checkpoint_path,
                       vocab_file, do_lower_case, need, vocab_size=None):
    """The Estimator export with the task's assets; TensorFlow errors become one line
    (`RuntimeError`, which the driver reports) instead of a traceback; a full disk a
    DiskFullError saying how much the export (`need` bytes) takes."""
    metadata = dict(task.metadata(), max_seq_length=max_seq_length,
                    do_lower_case=do_lower_case)
    if vocab_size:
        metadata["vocab_size"] = vocab_size
    with tempfile.TemporaryDirectory() as scratch:
        task_file = os.path.join(scratch, TASK_FILE)
        with open(task_file, "w", encoding="utf-8") as writer:
            json.dump(metadata, writer, indent=2)
        assets = {TASK_FILE: task_file}
        if vocab_file:
            assets[VOCAB_FILE] = vocab_file
        try:
            path = _save(estimator, task, export_dir, max_seq_length, checkpoint_path, assets)
        except (tf.errors.OpError, OSError) as err:
            cause = disk_full_cause(err)
            if cause is not None:
                remove_temp_exports(export_dir)  # first: the free space then says what is
                raise DiskFullError(_export_shortage(export_dir, need, cause)) from None
            if isinstance(err, OSError):
                raise
            raise RuntimeError(f"{export_dir}: export of {checkpoint_path} failed: "
                               f"{op_error_summary(err)}") from None
    return path


def _save(estimator, task, export_dir, max_seq_length, checkpoint_path, assets):
    """`export_dir/<unix time>/`: the serving graph (`finetuning.serving_graph`) with the
    checkpoint's weights and the `assets` files in `assets.extra/`, written as
    `temp-<time>/` and renamed when whole, as the Estimator's own export does."""
    stamp = int(time.time())
    while tf.io.gfile.exists(os.path.join(export_dir, str(stamp))):
        stamp += 1
    temporary = os.path.join(export_dir, f"temp-{stamp}")
    with tf.Graph().as_default():
        signatures = build_serving_graph(estimator.model_fn, estimator.config, task,
                                         max_seq_length)
        with tf1.Session() as session:
            tf1.train.Saver().restore(session, checkpoint_path)
            builder = tf1.saved_model.Builder(temporary)
            builder.add_meta_graph_and_variables(session, [tf1.saved_model.SERVING],
                                                 signature_def_map=signatures,
                                                 strip_default_attrs=True)
            builder.save()
    extra = os.path.join(temporary, "assets.extra")
    tf.io.gfile.makedirs(extra)
    for name, source in assets.items():
        tf.io.gfile.copy(source, os.path.join(extra, name), overwrite=True)
    final = os.path.join(export_dir, str(stamp))
    tf.io.gfile.rename(temporary, final)
    return final


def remove_temp_exports(export_dir):
    """Deletes the Estimator's `temp-*` folders in `export_dir`; returns their paths.

    They are half-written exports (the Estimator renames a finished one), never servable,
    and a serving system watching `export_dir` must not see them.
    """
    if not tf.io.gfile.isdir(export_dir):
        return []
    stale = tf.io.gfile.glob(os.path.join(export_dir, TEMP_EXPORT_GLOB))
    for path in stale:
        tf.io.gfile.rmtree(path)
        logging.info("removed unfinished export %s", path)
    return stale


def serving_graph(estimator, task, max_seq_length):
    """({variable name: (trainable, bytes)}, bytes of the graph) of the graph the Estimator
    restores for export: what the check below asks for, and about what the export writes.

    Built as the export builds it (`finetuning.serving_graph`) in a scratch graph, so the
    check below asks exactly what the export's restore will.
    """
    with tf.Graph().as_default() as graph:
        build_serving_graph(estimator.model_fn, estimator.config, task, max_seq_length)
        trainable = {v.op.name for v in tf1.trainable_variables()}
        variables = {v.op.name: (v.op.name in trainable,
                                 v.shape.num_elements() * v.dtype.base_dtype.size)
                     for v in tf1.global_variables()}
        return variables, graph.as_graph_def().ByteSize()


def check_exportable(estimator, task, max_seq_length, checkpoint_path):
    """Raises `CheckpointError` (one line) when `checkpoint_path` cannot be exported;
    returns about the bytes the export writes (its variables and graph).

    Without this, exporting a pre-trained (not fine-tuned) checkpoint fails inside the
    Estimator's restore with a NotFoundError traceback about `cls/squad/output_bias`, and a
    checkpoint holding a NaN exports without a word into a model that answers NaN.
    """
    if checkpoint_path is None:
        raise CheckpointError(f"{estimator.model_dir}: no checkpoint to export: pass "
                              "--init_checkpoint (a fine-tuned checkpoint) or --do_train")
    needed, graph_bytes = serving_graph(estimator, task, max_seq_length)
    check_checkpoint_serves(
        checkpoint_path, task, {name: trainable for name, (trainable, _) in needed.items()},
        "fine-tune it first (--do_train with the training data), then export",
        "not exported: export an earlier checkpoint (--init_checkpoint=PREFIX) or fine-tune "
        "again")
    return sum(size for _, size in needed.values()) + graph_bytes


def check_checkpoint_serves(checkpoint_path, task, needed, untuned_remedy, non_finite_remedy):
    """Raises `CheckpointError` (one line naming the checkpoint) unless `checkpoint_path`
    holds every variable of `needed` ({name: trainable}, the task's serving graph) and each
    of them is finite; export and inference from a checkpoint both ask this.

    A missing trainable variable outside the encoder is the task's head: the checkpoint is
    not fine-tuned for `task` (`untuned_remedy` says what to do). A NaN or infinity
    (`modeling.checkpoints.first_non_finite_variable`: one variable read at a time, ~1 s per
    GB) is named with `non_finite_remedy`: served, it answers NaN to every query.
    """
    present = checkpoint_variables(checkpoint_path)
    missing = sorted(name for name in needed if name not in present)
    head = [name for name in missing if needed[name] and not name.startswith(ENCODER_SCOPE)]
    if head:
        other = sorted(name for name in present if is_model_variable(name)
                       and not name.startswith(ENCODER_SCOPE) and name not in needed)
        guess = (f"one fine-tuned for another task? it has {other[0]}" if other
                 else "a pre-trained checkpoint?")
        raise CheckpointError(
            f"{checkpoint_path}: has no {task.name} head ({', '.join(head)}): it is not a "
            f"fine-tuned {task.model_kind} checkpoint ({guess}); {untuned_remedy}")
    if missing:
        shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise CheckpointError(f"{checkpoint_path}: lacks {len(missing)} variable(s) the "
                              f"{task.name} model needs: {shown}")
    non_finite = first_non_finite_variable(checkpoint_path, names=needed)
    if non_finite is not None:
        raise CheckpointError(f"{checkpoint_path}: variable {non_finite} holds a NaN or an infinity "
                              f"(a diverged run's weights?); {non_finite_remedy}")


def read_export_metadata(saved_model_dir):
    """(bert_task.json as a dict, vocab path or None) of a SavedModel written above."""
    extra = os.path.join(saved_model_dir, "assets.extra")
    task_file = os.path.join(extra, TASK_FILE)
    if not os.path.isfile(task_file):
        raise FileNotFoundError(_not_a_saved_model(saved_model_dir))
    with open(task_file, encoding="utf-8") as reader:
        metadata = json.load(reader)
    vocab = os.path.join(extra, VOCAB_FILE)
    return metadata, vocab if os.path.isfile(vocab) else None


def _not_a_saved_model(path):
    """Why `path` is not a SavedModel of this project, in one line: a missing folder, the
    export folder holding the timestamped SavedModels (pass one), or some other folder."""
    if not os.path.isdir(path):
        return f"{path}: the SavedModel folder does not exist"
    versions = sorted(name for name in os.listdir(path)
                      if os.path.isfile(os.path.join(path, name, "assets.extra", TASK_FILE)))
    if versions:
        return (f"{path}: is an export folder holding SavedModels {', '.join(versions)}: pass "
                f"one of them, e.g. the newest {os.path.join(path, versions[-1])}")
    return f"{path}: no assets.extra/{TASK_FILE} (not a SavedModel exported by this project?)"


_TRITON_TYPES = {tf.int32: "TYPE_INT32", tf.float32: "TYPE_FP32", tf.int64: "TYPE_INT64"}


@dataclasses.dataclass(frozen=True)
class TritonModel:
    """A Triton model to write, with NVIDIA's names and defaults (their --triton_* flags):
    `<repository>/<name>/config.pbtxt` and `<repository>/<name>/<version>/model.savedmodel`.
    `batching_delay_ms` > 0 turns on dynamic batching (preferred batches max/2 and max);
    `amp` asks Triton for automatic mixed precision on GPUs, as NVIDIA's export does."""
    repository: str
    name: str = "bert"
    version: int = 1
    max_batch_size: int = 8
    batching_delay_ms: float = 0.0
    engine_count: int = 1
    amp: bool = False
    overwrite: bool = False

    @property
    def folder(self):
        return os.path.join(self.repository, self.name)

    @property
    def version_folder(self):
        return os.path.join(self.folder, str(self.version), "model.savedmodel")

    def check_writable(self):
        """Refuses (ExportError, one line) to replace an existing model unless `overwrite`:
        call it at start-up, before training."""
        config = os.path.join(self.folder, "config.pbtxt")
        existing = [p for p in (self.version_folder, config) if os.path.exists(p)]
        if existing and not self.overwrite:
            raise ExportError(f"{existing[0]}: a Triton model is already there; pass "
                              "--triton_model_overwrite to replace it, or another "
                              "--triton_model_name/--triton_model_version")


class ExportError(ValueError):
    """An export that would overwrite what a user made; one line."""


def _triton_tensor(name, dtype, dims):
    """A config.pbtxt input/output. Triton's TensorFlow backend compares [-1] + dims (the
    batch dimension first) with the signature's shape, or [-1] + reshape when a reshape is
    given: a per-example scalar (SQuAD's unique_ids, STS-B's score) is dims [1] reshaped to
    [] (Triton allows no empty dims), as NVIDIA's export writes it."""
    shape = f"dims: [ {', '.join(str(d) for d in dims)} ]" if dims else \
        "dims: [ 1 ]\n    reshape: { shape: [ ] }"
    return f'  {{\n    name: "{name}"\n    data_type: {_TRITON_TYPES[dtype]}\n    {shape}\n  }}'


def triton_config(model, task, max_seq_length):
    """config.pbtxt text for `model` (a TritonModel) of `task`'s SavedModel: its serving
    inputs and outputs (an output that only echoes an input, SQuAD's unique_ids, is left out,
    as NVIDIA's config does), NVIDIA's batching and instance settings."""
    inputs = [_triton_tensor(n, tf.int32, []) for n in task.extra_serving_inputs]
    inputs += [_triton_tensor(n, tf.int32, [max_seq_length]) for n in SEQUENCE_INPUTS]
    outputs = [_triton_tensor(name, dtype, dims)
               for name, (dtype, dims) in task.serving_output_spec(max_seq_length).items()
               if name not in task.extra_serving_inputs]
    text = (f'name: "{model.name}"\nplatform: "tensorflow_savedmodel"\n'
            f"max_batch_size: {model.max_batch_size}\n")
    if model.amp:
        text += ("optimization {\n  execution_accelerators {\n    gpu_execution_accelerator"
                 ' : [ { name : "auto_mixed_precision" } ]\n  }\n}\n')
    text += "input [\n" + ",\n".join(inputs) + "\n]\noutput [\n" + ",\n".join(outputs) + "\n]\n"
    # the signature of one shape: Triton's dynamic batcher joins requests of one shape only
    text += ('parameters: {\n  key: "TF_SIGNATURE_DEF"\n  value: { string_value: '
             f'"{FIXED_LENGTH_SIGNATURE}" }}\n}}\n')
    if model.batching_delay_ms > 0:
        preferred = sorted({max(1, model.max_batch_size // 2), model.max_batch_size})
        text += (f"dynamic_batching {{\n  preferred_batch_size: [ "
                 f"{', '.join(map(str, preferred))} ]\n  max_queue_delay_microseconds: "
                 f"{int(model.batching_delay_ms * 1000)}\n}}\n")
    return text + f"instance_group [\n  {{\n    count: {model.engine_count}\n  }}\n]\n"


def write_triton_repository(saved_model_dir, model, task, max_seq_length):
    """Lays the SavedModel out as Triton `model` (a TritonModel): its version folder and
    config.pbtxt, each written under a temporary name and renamed. Returns the model folder."""
    model.check_writable()
    version_parent = os.path.dirname(model.version_folder)
    os.makedirs(version_parent, exist_ok=True)
    tmp = f"{model.version_folder}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(saved_model_dir, tmp)
    shutil.rmtree(model.version_folder, ignore_errors=True)  # overwrite asked (checked above)
    os.replace(tmp, model.version_folder)
    config = os.path.join(model.folder, "config.pbtxt")
    with open(f"{config}.tmp-{os.getpid()}", "w", encoding="utf-8") as writer:
        writer.write(triton_config(model, task, max_seq_length))
    os.replace(f"{config}.tmp-{os.getpid()}", config)
    return model.folder
