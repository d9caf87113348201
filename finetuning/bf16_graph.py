"""Serving in bf16: a frozen graph rewritten once, at load, by oneDNN's automatic mixed precision.

Grappler's `auto_mixed_precision_onednn_bfloat16` puts the matmuls (and what follows them
without changing type: transposes, reshapes, adds) in bfloat16 with float32 accumulation,
casts around the rest (layer norm, softmax's inputs stay where its lists put them), and
folds the float32 weights to bfloat16 constants. It is run here, on the GraphDef, instead of
by the serving session: what comes out is a graph whose transposes are visibly bfloat16, so
`eigen_transpose` can move them off oneDNN as int16 bits. Left to the session, the rewrite
ran after that move and had to cast each transpose's bfloat16 input to float32 and back (48
casts in a 6-layer model: 5-10% slower at batch 8-32 on SQuAD, measured), where moved after
it they cost nothing extra.
"""
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.grappler import tf_optimizer

tf1 = tf.compat.v1

BFLOAT16_REWRITE = "auto_mixed_precision_onednn_bfloat16"


def bfloat16_graph(graph_def, keep):
    """`graph_def` (frozen: weights as constants) after Grappler's oneDNN bfloat16 rewrite
    alone, keeping the nodes named in `keep` (the outputs) as they are named."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
        for name in keep:  # Grappler keeps what the "train_op" collection names
            graph.add_to_collection("train_op", graph.get_operation_by_name(name))
        meta_graph = tf1.train.export_meta_graph(graph=graph)
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.optimizers.append(BFLOAT16_REWRITE)
    return tf_optimizer.OptimizeGraph(config, meta_graph)
