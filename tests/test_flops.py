"""training.flops against the matmuls really in the graph: the FLOP formulas behind every
throughput and MFU figure are checked by counting 2*m*n*k over the MatMul/BatchMatMul ops
of a built model (their static shapes), not by re-deriving the formula."""
import numpy as np
import pytest
import tensorflow as tf

from modeling import BertModel, masked_lm_output, named_config, next_sentence_output
from training.flops import executed_training_flops_per_sequence, forward_flops_per_sequence

tf1 = tf.compat.v1


def matmul_flops(graph):
    """2*m*n*k summed over the graph's MatMul and BatchMatMulV2 ops (static shapes)."""
    total = 0
    for op in graph.get_operations():
        if op.type not in ("MatMul", "BatchMatMulV2"):
            continue
        a = op.inputs[0].shape.as_list()
        out = op.outputs[0].shape.as_list()
        transpose_a = op.get_attr("transpose_a" if op.type == "MatMul" else "adj_x")
        inner = a[-2] if transpose_a else a[-1]
        total += 2 * int(np.prod(out)) * inner
    return total


@pytest.mark.parametrize("select", [False, True])
def test_forward_flops_equal_the_graphs_matmuls(select):
    config = named_config("tiny").replace(vocab_size=101)
    seq, predictions = 16, 3
    with tf.Graph().as_default() as graph:
        positions = tf.constant([[1, 5, 9]])
        model = BertModel(config, False, tf.zeros([1, seq], tf.int32),
                          output_positions=positions if select else None)
        masked_lm_output(config, model.get_sequence_output(), model.get_embedding_table(),
                         None if select else positions, tf.zeros([1, predictions], tf.int32),
                         tf.ones([1, predictions]))
        next_sentence_output(config, model.get_pooled_output(), tf.zeros([1], tf.int32))
    counted = matmul_flops(graph)
    if select:
        expected = executed_training_flops_per_sequence(config, seq, predictions,
                                                        predictions + 1) // 3
    else:
        expected = forward_flops_per_sequence(config, seq, predictions)
    assert counted == expected
    if select:
        assert counted < forward_flops_per_sequence(config, seq, predictions)
