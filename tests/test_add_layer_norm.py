"""Our residual-add-and-layer-norm kernel (`BertAddLayerNorm`, finetuning/kernels/layer_norm.h)
and its load-time rewrite (finetuning/add_layer_norm.py): the op computes layer_norm(x +
residual) as a float64 reference does, with every vector code it has, from float32 or
bfloat16 x, and gives its bfloat16 cast; a served model's encoder layer norms become one op
each, no cast to bfloat16 left after them, and it answers as the graph of TensorFlow's ops."""
import numpy as np
import pytest
import tensorflow as tf

from finetuning import add_layer_norm
from finetuning.add_layer_norm import OP
from finetuning.inference import SavedModelRunner
from modeling import named_config
from modeling.core import cpu_has_native_bfloat16
from serving_models import (answers_of, assert_answers_as_before, served_nodes,
                            summation_order_tolerance)

ISAS = ("avx512", "avx2", "generic")
EPSILON = 1e-12
WIDTH = 72  # not a multiple of any vector width: the tails run too


def _reference(x, residual, gamma, beta):
    total = np.asarray(x, np.float64) + residual
    centred = total - total.mean(-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + EPSILON) * gamma + beta


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("x_type, low_type", [(tf.float32, tf.float32),
                                              (tf.bfloat16, tf.bfloat16),
                                              (tf.float32, tf.bfloat16)])
def test_the_op_is_a_layer_norm_of_the_sum(kernels, isa, x_type, low_type):
    rng = np.random.default_rng(2)
    x = tf.cast(rng.standard_normal((13, WIDTH)).astype(np.float32) * 3 + 1, x_type)
    residual = rng.standard_normal((13, WIDTH)).astype(np.float32)
    gamma, beta = (rng.standard_normal(WIDTH).astype(np.float32) for _ in range(2))
    y, low = kernels.bert_add_layer_norm(x, residual, gamma, beta, epsilon=EPSILON,
                                         Tlow=low_type, isa=isa)
    expected = _reference(tf.cast(x, tf.float32).numpy(), residual, gamma, beta)
    assert y.dtype == tf.float32 and low.dtype == low_type
    np.testing.assert_allclose(y.numpy(), expected, rtol=0,
                               atol=summation_order_tolerance(expected))
    # the second output is the first, rounded once to its type
    np.testing.assert_array_equal(tf.cast(low, tf.float32).numpy(),
                                  tf.cast(tf.cast(y, low_type), tf.float32).numpy())


def test_the_op_refuses_shapes_that_do_not_fit(kernels):
    x = np.zeros((3, WIDTH), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="one shape"):
        kernels.bert_add_layer_norm(x, x[:1], x[0], x[0], epsilon=EPSILON)
    with pytest.raises(tf.errors.InvalidArgumentError, match="gamma and beta"):
        kernels.bert_add_layer_norm(x, x, x[0, :8], x[0, :8], epsilon=EPSILON)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_served_model_fuses_its_encoders_layer_norms_and_answers_as_before(
        kernels, exported, precision, monkeypatch):
    """Two ops a layer (after attention, after the feed-forward pair; the embeddings' sum
    broadcasts its positions and keeps TensorFlow's ops), no cast to bfloat16 reading them;
    answers as without the rewrite: in float32 to its summation order, in bfloat16 no further
    from float32's than that graph's, give or take one bfloat16 rounding."""
    if precision == "bf16" and not cpu_has_native_bfloat16():
        pytest.skip("this CPU has no native bfloat16: no bf16 serving here")
    task, path = exported
    layers = named_config("tiny").num_hidden_layers
    served = SavedModelRunner(path, precision)
    nodes = {node.name: node for node in served_nodes(served)}
    fused = [node for node in nodes.values() if node.op == OP]
    assert len(fused) == 2 * layers
    assert all(node.attr["T"].type == (tf.bfloat16 if precision == "bf16" else tf.float32)
               .as_datatype_enum for node in fused)
    for node in nodes.values():
        if node.op == "Cast":
            assert not any(nodes.get(source.split(":")[0], node).op == OP for source in node.input)
    monkeypatch.setenv("BERT_ADD_LAYER_NORM", "0")
    unfused = SavedModelRunner(path, precision)
    assert OP not in [node.op for node in served_nodes(unfused)]
    got, before, exact = answers_of([served, unfused, SavedModelRunner(path, "fp32")], task, 6)
    assert_answers_as_before(got, before, exact, precision)


def test_switched_off_nothing_is_fused(monkeypatch):
    monkeypatch.setenv("BERT_ADD_LAYER_NORM", "0")
    assert not add_layer_norm.enabled()
    assert add_layer_norm.fuse_add_layer_norms(tf.compat.v1.GraphDef())[1] == 0


def test_with_our_layer_norm_there_is_no_onednn_copy(kernels, exported):
    """Our op serves every row count, so the graph holds no copy with oneDNN's layer norm for
    many rows (fused_layer_norm): one graph fewer to optimise and warm up."""
    from finetuning.fused_layer_norm import PREFIX
    _, path = exported
    served = SavedModelRunner(path, "bf16" if cpu_has_native_bfloat16() else "fp32")
    assert not any(name.startswith(PREFIX) for name in
                   (node.name for node in served._session.graph.as_graph_def().node))
