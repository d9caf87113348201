"""Test helper: runs our BertModel from a checkpoint on numpy inputs in a fresh graph."""
import numpy as np
import tensorflow as tf

from modeling import BertModel
from modeling.checkpoints import init_from_checkpoint

tf1 = tf.compat.v1


def run_encoder(config, checkpoint, input_ids, input_mask, segment_ids, compute_type="float32",
                jit=False):
    """Returns dict(layers=[...], sequence=..., pooled=..., embedding=...) as float32 numpy."""
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int32, input_ids.shape)
        mask = tf1.placeholder(tf.int32, input_ids.shape)
        segments = tf1.placeholder(tf.int32, input_ids.shape)
        model = BertModel(config, False, ids, mask, segments, compute_type=compute_type)
        if checkpoint is not None:
            init_from_checkpoint(checkpoint, log=False)
        fetches = dict(layers=model.get_all_encoder_layers(), sequence=model.get_sequence_output(),
                       pooled=model.get_pooled_output(),
                       embedding=tf.cast(model.get_embedding_output(), tf.float32))
        session_config = tf1.ConfigProto()
        if jit:
            session_config.graph_options.optimizer_options.global_jit_level = \
                tf1.OptimizerOptions.ON_1
        with tf1.Session(config=session_config) as session:
            session.run(tf1.global_variables_initializer())
            metadata = tf1.RunMetadata()
            result = session.run(
                fetches, {ids: input_ids, mask: input_mask, segments: segment_ids},
                options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
                run_metadata=metadata)
    # Nodes named cluster_N/xla_run exist only when XLA compiled part of the graph.
    result["xla_clusters_run"] = sum(node.node_name.endswith("xla_run")
                                     for device in metadata.step_stats.dev_stats
                                     for node in device.node_stats)
    return result


def random_inputs(batch, seq, vocab_size, seed=0):
    """Token ids with a ragged padding pattern: row i has seq - 2*i real tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab_size, size=(batch, seq)).astype(np.int32)
    mask = np.zeros((batch, seq), np.int32)
    segments = np.zeros((batch, seq), np.int32)
    for row in range(batch):
        length = max(2, seq - 2 * row)
        mask[row, :length] = 1
        segments[row, length // 2:length] = 1
        ids[row, length:] = 0
    return ids, mask, segments
