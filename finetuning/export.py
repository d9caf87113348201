"""SavedModel export for serving, and the Triton Inference Server model-repository layout.

The SavedModel's `serving_default` signature takes `input_ids`, `input_mask`, `segment_ids`
(int32, [batch, max_seq_length]) plus the task's extra inputs (`unique_ids` for SQuAD) and
returns the task's outputs (start/end logits, class probabilities or a regression score).
It loads with `tf.saved_model.load`, runs with `saved_model_cli run`, and serves from
TensorFlow Serving or Triton (`platform: "tensorflow_savedmodel"`).
"""
import json
import os
import shutil
import tempfile

import tensorflow as tf

tf1 = tf.compat.v1

SEQUENCE_INPUTS = ("input_ids", "input_mask", "segment_ids")


def serving_input_receiver_fn(task, max_seq_length):
    def receiver_fn():
        features = {name: tf1.placeholder(tf.int32, [None, max_seq_length], name=name)
                    for name in SEQUENCE_INPUTS}
        for name in task.extra_serving_inputs:
            features[name] = tf1.placeholder(tf.int32, [None], name=name)
        return tf.estimator.export.ServingInputReceiver(features, features)
    return receiver_fn


TASK_FILE = "bert_task.json"
VOCAB_FILE = "vocab.txt"


def export_saved_model(estimator, task, export_dir, max_seq_length, checkpoint_path=None,
                       vocab_file=None, do_lower_case=True):
    """Writes `export_dir/<timestamp>/` (the Estimator writes under a temporary name and
    renames it when complete). Returns its path.

    `assets.extra/` carries what a client needs to feed the model: the vocabulary and
    `bert_task.json` (task, labels, sequence length, casing, SQuAD window settings).
    """
    metadata = dict(task.metadata(), max_seq_length=max_seq_length,
                    do_lower_case=do_lower_case)
    with tempfile.TemporaryDirectory() as scratch:
        task_file = os.path.join(scratch, TASK_FILE)
        with open(task_file, "w", encoding="utf-8") as writer:
            json.dump(metadata, writer, indent=2)
        assets = {TASK_FILE: task_file}
        if vocab_file:
            assets[VOCAB_FILE] = vocab_file
        path = estimator.export_saved_model(export_dir,
                                            serving_input_receiver_fn(task, max_seq_length),
                                            assets_extra=assets, checkpoint_path=checkpoint_path)
    return path.decode() if isinstance(path, bytes) else path


def read_export_metadata(saved_model_dir):
    """(bert_task.json as a dict, vocab path or None) of a SavedModel written above."""
    extra = os.path.join(saved_model_dir, "assets.extra")
    task_file = os.path.join(extra, TASK_FILE)
    if not os.path.isfile(task_file):
        raise FileNotFoundError(f"{saved_model_dir}: no assets.extra/{TASK_FILE} "
                                "(not exported by this project?)")
    with open(task_file, encoding="utf-8") as reader:
        metadata = json.load(reader)
    vocab = os.path.join(extra, VOCAB_FILE)
    return metadata, vocab if os.path.isfile(vocab) else None


_TRITON_TYPES = {tf.int32: "TYPE_INT32", tf.float32: "TYPE_FP32", tf.int64: "TYPE_INT64"}


def triton_config(model_name, task, max_seq_length, max_batch_size=64):
    """config.pbtxt text: inputs/outputs without the batch dimension, dynamic batching."""
    def tensor(name, dtype, dims):
        dims_text = ", ".join(str(d) for d in dims) if dims else "1"
        return (f'  {{\n    name: "{name}"\n    data_type: {_TRITON_TYPES[dtype]}\n'
                f'    dims: [ {dims_text} ]\n  }}')
    inputs = [tensor(n, tf.int32, [max_seq_length]) for n in SEQUENCE_INPUTS]
    inputs += [tensor(n, tf.int32, []) for n in task.extra_serving_inputs]
    outputs = [tensor(name, dtype, dims)
               for name, (dtype, dims) in task.serving_output_spec(max_seq_length).items()]
    return (f'name: "{model_name}"\nplatform: "tensorflow_savedmodel"\n'
            f"max_batch_size: {max_batch_size}\n"
            "input [\n" + ",\n".join(inputs) + "\n]\n"
            "output [\n" + ",\n".join(outputs) + "\n]\n"
            "dynamic_batching {\n  preferred_batch_size: [ 8, 16, 32 ]\n"
            "  max_queue_delay_microseconds: 200\n}\n"
            "instance_group [\n  {\n    count: 1\n    kind: KIND_GPU\n  }\n]\n")


def write_triton_repository(saved_model_dir, repository, task, max_seq_length, version=1):
    """<repository>/bert_<task>/{config.pbtxt, <version>/model.savedmodel/}. Returns the
    model folder."""
    model_name = f"bert_{task.name}".replace("-", "_")
    model_dir = os.path.join(repository, model_name)
    tmp = f"{model_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(saved_model_dir, os.path.join(tmp, str(version), "model.savedmodel"))
    with open(os.path.join(tmp, "config.pbtxt"), "w", encoding="utf-8") as writer:
        writer.write(triton_config(model_name, task, max_seq_length))
    shutil.rmtree(model_dir, ignore_errors=True)
    os.replace(tmp, model_dir)
    return model_dir
