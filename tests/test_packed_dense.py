"""Our float32 dense-layer kernel (`BertDense`, finetuning/kernels/dense.h) and its load-time
rewrite (finetuning/packed_dense.py): the op computes x · W + bias, and its exact GELU, as a
float64 reference does, with every vector code it has, at row counts that leave tails and
span several chunks and depth blocks; a served float32 model's encoder dense layers become
one op each (the GELU's ops gone), it answers as the graph of TensorFlow's ops, and with
AVX-512 a copy of that graph serves many rows. (bfloat16 and int8 on AMX:
tests/test_dense_amx.py.)"""
import math

import numpy as np
import pytest
import tensorflow as tf

from finetuning import packed_dense
from finetuning.inference import SavedModelRunner
from finetuning.packed_dense import OP, PANEL, pack_kernel
from modeling import named_config
from serving_models import (answers_of, assert_answers_as_before, dense_reference,
                            served_nodes, summation_order_tolerance, tensorflow_dense)

ISAS = ("avx512", "avx2", "generic")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation", ["linear", "gelu"])
@pytest.mark.parametrize("rows, depth, width", [(1, 64, 32), (13, 200, 96), (160, 384, 64),
                                                (300, 1536, 32)])
def test_the_op_is_the_dense_layer(kernels, isa, activation, rows, depth, width):
    """Rows not a multiple of any block (tails), depths not a multiple of the depth block
    (200) and several of them (1,536), and 300 rows of depth 1,536: several chunks of rows."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, depth)).astype(np.float32)
    weight = (rng.standard_normal((depth, width)) / math.sqrt(depth)).astype(np.float32)
    bias = rng.standard_normal(width).astype(np.float32)
    got = kernels.bert_dense(x, pack_kernel(weight), bias, activation=activation, isa=isa)
    expected = dense_reference(x, weight, bias, activation)
    float32_error = np.abs(tensorflow_dense(x, weight, bias, activation) - expected).max()
    assert got.shape == (rows, width)
    assert np.abs(got.numpy() - expected).max() <= 4 * float32_error + 1e-30


def test_the_packed_kernel_holds_each_panels_columns_row_after_row():
    weight = np.arange(5 * 64, dtype=np.float32).reshape(5, 64)
    packed = pack_kernel(weight)
    assert packed.shape == (2, 5, PANEL)
    np.testing.assert_array_equal(packed[1, 3], weight[3, 32:])


def test_the_op_refuses_shapes_that_do_not_fit(kernels):
    x = np.zeros((3, 8), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="packed_kernel must be"):
        kernels.bert_dense(x, np.zeros((1, 9, PANEL), np.float32), np.zeros(PANEL, np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="bias must be"):
        kernels.bert_dense(x, np.zeros((2, 8, PANEL), np.float32), np.zeros(PANEL, np.float32))


def test_a_served_float32_model_runs_its_dense_layers_on_the_op_and_answers_as_before(
        kernels, exported, monkeypatch):
    """Six ops a layer (query, key, value, attention output, intermediate with its GELU,
    output), no Erf left in the graph a call runs; the same answers as TensorFlow's ops."""
    task, path = exported
    layers = named_config("tiny").num_hidden_layers
    served = SavedModelRunner(path, "fp32")
    nodes = served_nodes(served)
    dense = [node for node in nodes if node.op == OP]
    assert len(dense) == 6 * layers
    assert sum(node.attr["activation"].s == b"gelu" for node in dense) == layers
    assert not [node for node in nodes if node.op == "Erf"]
    monkeypatch.setenv("BERT_DENSE", "0")
    before = SavedModelRunner(path, "fp32")
    assert OP not in [node.op for node in served_nodes(before)]
    got, expected = answers_of([served, before], task, 8)
    assert_answers_as_before(got, expected, expected, "fp32")


def test_with_avx512_a_copy_of_onednns_graph_serves_many_rows(kernels, exported, monkeypatch):
    """From AVX512_MANY_ROWS real tokens a call runs the copy with oneDNN's dense layers
    (faster there); its answers are the op's; under an AVX2 cap there is no copy."""
    task, path = exported
    monkeypatch.setattr(packed_dense, "AVX512_MANY_ROWS", 40)
    monkeypatch.setattr(packed_dense, "kernel_isa", lambda: "avx512")
    served = SavedModelRunner(path, "fp32")
    call = served._call
    (rows, names), = [variant for variant in call.variants
                      if any(name.startswith(packed_dense.PREFIX) for name in
                             variant[1].values())]
    assert rows.start == 40
    copy = [node for node in served._session.graph.as_graph_def().node
            if node.name.startswith(packed_dense.PREFIX)]
    assert copy and not [node for node in copy if node.op == OP]
    monkeypatch.setenv("BERT_DENSE", "0")
    before = SavedModelRunner(path, "fp32")
    got, expected = answers_of([served, before], task, 9, count=8, batch_size=4)
    assert_answers_as_before(got, expected, expected, "fp32")
    monkeypatch.setattr(packed_dense, "kernel_isa", lambda: "avx2")
    monkeypatch.delenv("BERT_DENSE")
    capped = SavedModelRunner(path, "fp32")
    assert not any(node.name.startswith(packed_dense.PREFIX)
                   for node in capped._session.graph.as_graph_def().node)


def test_switched_off_nothing_is_rewritten(monkeypatch):
    monkeypatch.setenv("BERT_DENSE", "0")
    assert not packed_dense.enabled()
    assert packed_dense.pack_dense_layers(tf.compat.v1.GraphDef(), [])[1] == 0


def _gelu_as_a_product(x):
    """The exact GELU with x/√2 written as x·(1/√2): a second Mul reading x, named to sort
    before 0.5·x's."""
    scaled = tf.multiply(x, tf.constant(1 / math.sqrt(2.0)), name="a_scaled")
    return 0.5 * x * (1.0 + tf.math.erf(scaled))


def _gelu_graph(activation):
    """x · W + b followed by `activation` (a modeling.activations name, or a function),
    frozen."""
    from modeling.activations import get_activation
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 32], name="x")
        with tf.name_scope("bert/encoder/layer_0/intermediate"):
            weight = tf.constant(np.eye(32, 64, dtype=np.float32))
            bias = tf.constant(np.linspace(-1, 1, 64, dtype=np.float32))
            hidden = tf.nn.bias_add(tf.matmul(x, weight), bias)
            out = tf.identity(get_activation(activation)(hidden), name="out")
    return graph.as_graph_def(), out.name


@pytest.mark.parametrize("activation, fused", [("gelu", b"gelu"), (_gelu_as_a_product, b"gelu"),
                                               ("gelu_new", b"linear"), ("relu", b"linear")])
def test_only_the_exact_gelu_goes_into_the_op(kernels, activation, fused):
    """The tanh form (gelu_new) and relu keep their ops after a linear op, and the answer is
    the graph's either way."""
    from serving_models import run_graph
    graph_def, out = _gelu_graph(activation)
    rewritten, count, _ = packed_dense.pack_dense_layers(graph_def, [out])
    assert count == 1
    (node,) = [node for node in rewritten.node if node.op == OP]
    assert node.attr["activation"].s == fused
    x = np.random.default_rng(3).standard_normal((5, 32)).astype(np.float32)
    (expected,), (got,) = (run_graph(graph, [out], x) for graph in (graph_def, rewritten))
    np.testing.assert_allclose(got, expected, rtol=0, atol=summation_order_tolerance(expected))
