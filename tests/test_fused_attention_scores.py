"""A frozen serving graph scales and masks attention's scores inside their product
(finetuning/fused_attention_scores.py): the pattern becomes one oneDNN op under the add's
name, whatever else is left as it was, and a served model answers as without it."""
import numpy as np
import pytest
import tensorflow as tf

from finetuning import frozen_session, fused_attention_scores
from finetuning.fused_attention_scores import FUSED_OP, fuse_attention_scores
from finetuning.inference import SavedModelRunner, run_in_batches
from modeling import named_config
from modeling.core import cpu_has_native_bfloat16
from serving_models import (assert_answers_as_before, request_features, served_nodes,
                            summation_order_tolerance)

tf1 = tf.compat.v1
BATCH, HEADS, SEQ, SIZE = 2, 3, 5, 4
SCALE = 0.5


def _scores_graph():
    """Four scaled products: `scores` and `scores_flipped` (the add's and the multiply's
    operands the other way round) are the pattern; `per_head` adds a [batch, heads, seq, seq]
    tensor, `kept` is a product also read elsewhere: those two stay as they are."""
    graph = tf.Graph()
    with graph.as_default():
        query = tf1.placeholder(tf.float32, [None, HEADS, None, SIZE], name="query")
        key = tf1.placeholder(tf.float32, [None, HEADS, None, SIZE], name="key")
        mask = tf1.placeholder(tf.float32, [None, None], name="mask")
        bias = (1.0 - mask[:, tf.newaxis, tf.newaxis, :]) * -10000.0
        scale = tf.constant(SCALE)
        tf.add(tf.matmul(query, key, transpose_b=True) * scale, bias, name="scores")
        tf.add(bias, scale * tf.matmul(query, key, transpose_b=True), name="scores_flipped")
        per_head = tf.tile(bias, [1, HEADS, SEQ, 1])
        tf.add(tf.matmul(query, key, transpose_b=True) * scale, per_head, name="per_head")
        product = tf.matmul(query, key, transpose_b=True, name="kept_product")
        tf.add(product * scale, bias, name="kept")
        tf.identity(product, name="product_read")
    return graph.as_graph_def()


def _run(graph_def, fetches, feeds):
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    with tf1.Session(graph=graph) as session:
        return session.run(fetches, feeds)


def _inputs():
    rng = np.random.default_rng(3)
    mask = np.ones((BATCH, SEQ), np.float32)
    mask[1, 3:] = 0
    return {"query:0": rng.standard_normal((BATCH, HEADS, SEQ, SIZE)).astype(np.float32),
            "key:0": rng.standard_normal((BATCH, HEADS, SEQ, SIZE)).astype(np.float32),
            "mask:0": mask}


@pytest.mark.skipif(not fused_attention_scores.fusion_available(),
                    reason="oneDNN is off in this process: there is no fused kernel to use")
def test_the_scaled_masked_product_is_one_op_and_computes_the_same():
    graph_def = _scores_graph()
    rewritten, fused = fuse_attention_scores(graph_def)
    assert fused == 2
    nodes = {node.name: node for node in rewritten.node}
    for name in ("scores", "scores_flipped"):
        assert nodes[name].op == FUSED_OP  # consumers read the same name
        assert [bytes(op) for op in nodes[name].attr["fused_ops"].list.s] == [b"Mul", b"Add"]
        assert nodes[name].attr["adj_y"].b
    assert nodes["per_head"].op == "AddV2" and nodes["kept"].op == "AddV2"
    assert nodes["kept_product"].op == "BatchMatMulV2"
    feeds = _inputs()
    fetches = ["scores:0", "scores_flipped:0", "per_head:0", "kept:0"]
    before, after = _run(graph_def, fetches, feeds), _run(rewritten, fetches, feeds)
    query, key, mask = (feeds[name].astype(np.float64) for name in ("query:0", "key:0", "mask:0"))
    expected = (np.einsum("bhqd,bhkd->bhqk", query, key) * SCALE
                + (1.0 - mask[:, None, None, :]) * -10000.0)
    for old, new in zip(before, after):
        np.testing.assert_allclose(new, expected, rtol=0, atol=summation_order_tolerance(expected))
        np.testing.assert_allclose(new, old, rtol=0, atol=summation_order_tolerance(expected))
    assert fuse_attention_scores(rewritten)[1] == 0  # nothing left to fuse


def test_without_the_kernel_nothing_is_rewritten(monkeypatch):
    monkeypatch.setattr(fused_attention_scores, "fusion_available", lambda: False)
    graph_def = _scores_graph()
    rewritten, fused = fuse_attention_scores(graph_def)
    assert fused == 0
    assert [node.op for node in rewritten.node] == [node.op for node in graph_def.node]


@pytest.mark.skipif(not fused_attention_scores.fusion_available(),
                    reason="oneDNN is off in this process: there is no fused kernel to use")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_served_model_fuses_every_layer_and_answers_as_before(exported, precision,
                                                                monkeypatch):
    """Each layer's scores are one fused op in the runner's graph, no unfused product is
    left, and the answers are those of the same graph unfused: in float32 to its summation
    order; in bfloat16 (where the CPU has it) to bfloat16's rounding, against float32's. The
    graph where TensorFlow's ops serve attention (without our kernel: packed_attention)."""
    monkeypatch.setenv("BERT_PACKED_ATTENTION", "0")
    if precision == "bf16" and not cpu_has_native_bfloat16():
        pytest.skip("this CPU has no native bfloat16: bf16 products are not fused here")
    task, path = exported
    layers = named_config("tiny").num_hidden_layers
    served = SavedModelRunner(path, precision)
    ops = [node.op for node in served_nodes(served)]
    # one fused product a layer; the other product left is the context's (probabilities x value)
    assert ops.count(FUSED_OP) == layers and ops.count("BatchMatMulV2") == layers
    monkeypatch.setattr(frozen_session, "fuse_attention_scores", lambda graph_def: (graph_def, 0))
    unfused = SavedModelRunner(path, precision)
    float32 = SavedModelRunner(path, "fp32")
    features = request_features(6, np.random.default_rng(9))
    got = run_in_batches(served, features, task.extra_serving_inputs)
    before = run_in_batches(unfused, features, task.extra_serving_inputs)
    exact = run_in_batches(float32, features, task.extra_serving_inputs)
    assert_answers_as_before(got, before, exact, precision)
