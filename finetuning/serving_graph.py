"""The graph a SavedModel serves: two signatures over one set of weights.

* `serving_default` takes `input_ids`, `input_mask`, `segment_ids` of shape [batch, length]
  for any length up to the model's `max_seq_length`: a batch of short requests costs what they
  hold, not a padded full-length batch. Attention masks padding anyway, so a request's outputs
  do not depend on how far its batch is padded (tests/test_serving_lengths.py). `inference.py`
  pads each batch to its own longest request.
* `serving_fixed_length` takes them at exactly [batch, max_seq_length], and its outputs have
  static shapes: for servers that batch requests themselves and need one shape for every
  request, i.e. Triton's dynamic batcher (its config.pbtxt names this signature,
  `TF_SIGNATURE_DEF`), TF-TRT or XLA ahead-of-time compilation. TF Serving's batching does
  the same padding for variable shapes (`pad_variable_length_inputs`), so it can use either.

Both are the task's PREDICT `model_fn` on their own placeholders, built twice in one graph with
the variables reused (one copy of the weights on disk and in memory).
"""
import tensorflow as tf

tf1 = tf.compat.v1

SEQUENCE_INPUTS = ("input_ids", "input_mask", "segment_ids")
DEFAULT_SIGNATURE = "serving_default"
FIXED_LENGTH_SIGNATURE = "serving_fixed_length"


def serving_features(task, length, suffix=""):
    """Placeholders of the serving inputs: the sequence inputs [batch, `length`] (None: any)
    and the task's per-example extras (SQuAD's `unique_ids`) [batch]."""
    features = {name: tf1.placeholder(tf.int32, [None, length], name=name + suffix)
                for name in SEQUENCE_INPUTS}
    for name in task.extra_serving_inputs:
        features[name] = tf1.placeholder(tf.int32, [None], name=name + suffix)
    return features


def signature_lengths(max_seq_length):
    """[(signature name, sequence length or None for any)]: the default first."""
    return [(DEFAULT_SIGNATURE, None), (FIXED_LENGTH_SIGNATURE, max_seq_length)]


def build_serving_graph(model_fn, config, task, max_seq_length):
    """In the default graph: the global step, then for each signature its placeholders and the
    PREDICT `model_fn(features, labels, mode, config)` (an Estimator's `model_fn`) on them,
    variables shared. Returns {signature name: SignatureDef}."""
    tf1.train.get_or_create_global_step()
    signatures = {}
    for index, (name, length) in enumerate(signature_lengths(max_seq_length)):
        with tf1.variable_scope(tf1.get_variable_scope(), reuse=tf1.AUTO_REUSE):
            features = serving_features(task, length, suffix="" if index == 0 else f"_{name}")
            spec = model_fn(features, None, tf.estimator.ModeKeys.PREDICT, config)
        outputs = spec.export_outputs[DEFAULT_SIGNATURE].outputs
        signatures[name] = tf1.saved_model.predict_signature_def(features, outputs)
    return signatures
