"""A frozen serving graph holds a copy of what its layer norms feed with each layer norm as
oneDNN's one op (finetuning/fused_layer_norm.py), the weights shared, and a served call with
many real tokens takes the copy: the same answers either way."""
import numpy as np
import pytest
import tensorflow as tf

from finetuning import frozen_session, fused_layer_norm
from finetuning.fused_attention_scores import fusion_available
from finetuning.fused_layer_norm import FUSED_OP, PREFIX, many_rows, many_rows_variant
from finetuning.inference import SavedModelRunner, run_in_batches
from modeling import core
from serving_models import request_features, summation_order_tolerance

tf1 = tf.compat.v1
WIDTH = 16
needs_kernel = pytest.mark.skipif(not fusion_available(), reason="oneDNN is off in this "
                                  "process: there is no fused layer norm to use")


def _frozen_two_layer_norms():
    """x [rows, WIDTH] -> layer norm -> matmul -> layer norm = "out"; "side" = 2x reads no
    layer norm. The model's own `core.layer_norm`, its variables frozen as a served graph's.
    Returns (GraphDef, {name: weight value})."""
    graph = tf.Graph()
    rng = np.random.default_rng(2)
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, WIDTH], name="x")
        first = core.layer_norm(x, name="first")
        weight = tf.constant(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), name="w")
        second = core.layer_norm(tf.matmul(first, weight), name="second")
        tf.identity(second, name="out")
        tf.identity(2.0 * x, name="side")
        with tf1.Session(graph=graph) as session:
            variables = tf1.global_variables()
            for variable in variables:
                session.run(variable.assign(
                    rng.standard_normal(variable.shape).astype(np.float32)))
            values = dict(zip([v.op.name for v in variables], session.run(variables)))
            values["w"] = session.run(weight)
            frozen = tf1.graph_util.convert_variables_to_constants(
                session, graph.as_graph_def(), ["out", "side"])
    return frozen, values


def _layer_norm64(x, gamma, beta):
    x = x.astype(np.float64)
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-12) * gamma + beta


def _run(graph_def, fetches, x):
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    with tf1.Session(graph=graph) as session:
        return session.run(fetches, {"x:0": x})


@needs_kernel
def test_the_copy_fuses_each_layer_norm_shares_the_weights_and_computes_the_same():
    graph_def, values = _frozen_two_layer_norms()
    combined, outputs = many_rows_variant(graph_def, ["out:0", "side:0"])
    assert outputs == {"out:0": PREFIX + "out:0", "side:0": "side:0"}
    originals = [node for node in combined.node if not node.name.startswith(PREFIX)]
    copies = [node for node in combined.node if node.name.startswith(PREFIX)]
    assert [(n.name, n.op) for n in originals] == [(n.name, n.op) for n in graph_def.node]
    assert sum(node.op == FUSED_OP for node in copies) == 2
    assert not any(node.op == "Const" and node.attr["value"].tensor.tensor_content
                   for node in copies)  # the weights are read from the originals
    assert not any(node.name == PREFIX + "side" for node in copies)
    x = np.random.default_rng(5).standard_normal((many_rows() + 7, WIDTH)).astype(np.float32) * 3
    plain, fused, side = _run(combined, ["out:0", PREFIX + "out:0", "side:0"], x)
    first = _layer_norm64(x, values["first/gamma"], values["first/beta"])
    expected = _layer_norm64(first @ values["w"], values["second/gamma"],
                             values["second/beta"])
    tolerance = summation_order_tolerance(expected)
    np.testing.assert_allclose(plain, expected, rtol=0, atol=tolerance)
    np.testing.assert_allclose(fused, expected, rtol=0, atol=tolerance)
    np.testing.assert_array_equal(side, 2 * x)


def test_no_layer_norm_or_no_kernel_leaves_the_graph_as_it_is(monkeypatch):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, WIDTH], name="x")
        tf.identity(x - tf.reduce_mean(x, -1, keepdims=True), name="out")
    plain = graph.as_graph_def()
    assert many_rows_variant(plain, ["out:0"]) == (plain, {})
    layer_norms, _ = _frozen_two_layer_norms()
    monkeypatch.setattr(fused_layer_norm, "fusion_available", lambda: False)
    assert many_rows_variant(layer_norms, ["out:0"]) == (layer_norms, {})


@needs_kernel
def test_a_served_call_takes_the_copy_from_many_real_tokens_and_answers_the_same(
        exported, monkeypatch):
    """A batch holding `many_rows()` real tokens or more is served by the copy, a smaller one by
    the graph as it was; both answer what a runner without the copy answers. (The copy is
    made where our own layer norm and dense layers are not: add_layer_norm, packed_dense.)"""
    monkeypatch.setenv("BERT_ADD_LAYER_NORM", "0")
    monkeypatch.setenv("BERT_DENSE", "0")
    task, path = exported
    served = SavedModelRunner(path)
    monkeypatch.setattr(frozen_session, "many_rows_variant", lambda graph_def, fetches: (graph_def, {}))
    plain = SavedModelRunner(path)
    features = request_features(24, np.random.default_rng(8))
    tokens = sum(int(f.input_mask.sum()) for f in features)
    assert tokens >= many_rows() > int(features[0].input_mask.sum())
    for batch_size in (len(features), 1):
        got = run_in_batches(served, features, task.extra_serving_inputs, batch_size)
        expected = run_in_batches(plain, features, task.extra_serving_inputs, batch_size)
        for answer, reference in zip(got, expected):
            for name, value in reference.items():
                np.testing.assert_allclose(answer[name], value, rtol=0,
                                           atol=summation_order_tolerance(value))
    fetched = [fetch for _, fetch in served._call._callables]
    assert any(f.startswith(PREFIX) for f in fetched)      # the whole batch: the copy
    assert any(not f.startswith(PREFIX) for f in fetched)  # one request: as it was


@needs_kernel
def test_warming_up_runs_every_variant_once(exported, monkeypatch):
    """`warm_up` leaves a callable of the graph and of each variant (this copy, made where our
    own layer norm is not; in float32 also `weight_blocking`'s, made where our dense layers
    are not), so no request pays a first run."""
    from finetuning.weight_blocking import PREFIX as MID_ROWS_PREFIX
    monkeypatch.setenv("BERT_ADD_LAYER_NORM", "0")
    monkeypatch.setenv("BERT_DENSE", "0")
    _, path = exported
    for precision, prefixes in (("fp32", (PREFIX, MID_ROWS_PREFIX)), ("bf16", (PREFIX,))):
        served = SavedModelRunner(path, precision)
        assert not served._call._callables
        served.warm_up()
        fetched = [fetch for _, fetch in served._call._callables]
        assert len(fetched) == 1 + len(prefixes), fetched
        for prefix in prefixes:
            assert sum(f.startswith(prefix) for f in fetched) == 1, (prefix, fetched)


@pytest.mark.parametrize("amx, least", [(True, 96), (False, 192)])
def test_the_copy_serves_from_fewer_rows_where_onednn_runs_on_amx(monkeypatch, amx, least):
    """The rows where the two layer norms cross were measured per CPU: 96 on a Xeon with AMX,
    192 on a Zen 5 (the module's docstring); the served ranges follow."""
    monkeypatch.setattr(core, "cpu_has_amx", lambda: amx)
    assert many_rows() == least
    from finetuning.weight_blocking import MID_ROWS
    assert least > MID_ROWS[-1]  # float32's mid-rows copy keeps its own range

