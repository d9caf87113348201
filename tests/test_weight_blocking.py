"""A float32 serving graph holds a copy of what its dense layers feed for calls of 7-80 real
rows (finetuning/weight_blocking.py), the weights shared; a served call in that range takes
the copy and answers as the graph without it; and, as oneDNN reports its own work
(ONEDNN_VERBOSE), once each variant has run once (as `warm_up` runs them) no call reorders a
weight, where without the copy calls of the other blocking reorder them all."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from finetuning import frozen_session
from finetuning.graph_nodes import fusion_available
from finetuning.inference import SavedModelRunner, run_in_batches
from finetuning.weight_blocking import MID_ROWS, PREFIX, mid_rows_variant
from serving_models import LENGTH, request_features, summation_order_tolerance

tf1 = tf.compat.v1
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_onednn = pytest.mark.skipif(not fusion_available(), reason="oneDNN is off in this "
                                  "process: no inner product caches blocked weights")


def _frozen_dense(dtype=tf.float32):
    """x [rows, 8] -> matmul(w) + b -> tanh = "out"; "side" = 2x, fed by no matmul."""
    graph = tf.Graph()
    rng = np.random.default_rng(3)
    with graph.as_default():
        x = tf1.placeholder(dtype, [None, 8], name="x")
        w = tf.constant(rng.standard_normal((8, 8)), dtype, name="w")
        b = tf.constant(rng.standard_normal(8), dtype, name="b")
        tf.tanh(tf.nn.bias_add(tf.matmul(x, w), b), name="out")
        tf.identity(2 * x, name="side")
    return graph.as_graph_def()


@needs_onednn
def test_the_copy_holds_the_matmuls_and_what_they_feed_and_shares_the_weights():
    graph_def = _frozen_dense()
    combined, names = mid_rows_variant(graph_def, ["out:0", "side:0"])
    assert names == {"out:0": PREFIX + "out:0", "side:0": "side:0"}
    added = {node.name: node for node in combined.node[len(graph_def.node):]}
    assert set(added) == {PREFIX + "MatMul", PREFIX + "BiasAdd", PREFIX + "out"}
    assert list(added[PREFIX + "MatMul"].input) == ["x", "w"]  # the one constant, read twice
    x = np.random.default_rng(4).standard_normal((5, 8)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(combined, name="")
    with tf1.Session(graph=graph) as session:
        out, copy = session.run(["out:0", PREFIX + "out:0"], {"x:0": x})
    np.testing.assert_array_equal(out, copy)


def test_no_copy_without_a_float32_matmul_or_without_onednn(monkeypatch):
    for graph_def in (_frozen_dense(tf.bfloat16), tf1.GraphDef()):
        assert mid_rows_variant(graph_def, ["out:0"]) == (graph_def, {})
    float32 = _frozen_dense()
    named_apart = mid_rows_variant(float32, ["out:0"], skip_prefix="Mat")
    assert named_apart == (float32, {})  # another variant's matmuls are not copied again
    monkeypatch.setattr("finetuning.weight_blocking.fusion_available", lambda: False)
    assert mid_rows_variant(float32, ["out:0"]) == (float32, {})


def _requests_of(real_tokens, rng):
    """Requests of LENGTH positions holding `real_tokens` real ones in all."""
    features = []
    while real_tokens > 0:
        feature = request_features(1, rng)[0]
        real = min(real_tokens, LENGTH)
        feature.input_mask[:] = np.arange(LENGTH) < real
        feature.input_ids[real:] = 0
        features.append(feature)
        real_tokens -= real
    return features


@needs_onednn
def test_a_served_call_of_7_to_80_rows_takes_the_copy_and_answers_the_same(exported,
                                                                          monkeypatch):
    """(The copy is made where our dense layers are not: packed_dense.)"""
    monkeypatch.setenv("BERT_DENSE", "0")
    task, path = exported
    served = SavedModelRunner(path)
    assert [rows for rows, _ in served._call.variants][-1] == MID_ROWS
    assert not any(rows == MID_ROWS for rows, _ in SavedModelRunner(path, "bf16")._call.variants)
    monkeypatch.setattr(frozen_session, "mid_rows_variant",
                        lambda graph_def, fetches, skip_prefix="": (graph_def, {}))
    plain = SavedModelRunner(path)
    rng = np.random.default_rng(9)
    for tokens in (MID_ROWS.start - 1, MID_ROWS.start, 40, MID_ROWS.stop - 1, MID_ROWS.stop):
        features = _requests_of(tokens, rng)
        before = set(served._call._callables)
        got = run_in_batches(served, features, task.extra_serving_inputs, len(features))
        expected = run_in_batches(plain, features, task.extra_serving_inputs, len(features))
        for answer, reference in zip(got, expected):
            for name, value in reference.items():
                np.testing.assert_allclose(answer[name], value, rtol=0,
                                           atol=summation_order_tolerance(value))
        (_, fetch), = set(served._call._callables) - before or [(None, None)]
        if fetch is not None:  # a variant's first call
            assert fetch.startswith(PREFIX) == (tokens in MID_ROWS), (tokens, fetch)
    fetched = [fetch for _, fetch in served._call._callables]
    assert sum(f.startswith(PREFIX) for f in fetched) == 1 and len(fetched) == 2


@needs_onednn
def test_after_one_call_of_each_blocking_no_call_reorders_a_weight(tmp_path):
    """In a child process with ONEDNN_VERBOSE: a frozen dense layer of BERT-base's width
    (its operands pass any L2 cache, where TensorFlow runs oneDNN's inner product; smaller
    ones run a one-thread GEMM without blocking) served as `SavedModelRunner` serves, warmed
    up as `warm_up` does (one row, then the copy's least); then calls of 5, 40 and 100 rows
    (both blockings) reorder no weight. Without the copy the same calls do, on this CPU's
    inner product; where they do not (another oneDNN kernel), nothing is shown: skip."""
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{REPO!r}]
        import numpy as np
        import tensorflow as tf
        from finetuning import frozen_session
        tf1 = tf.compat.v1
        if sys.argv[1] == "without":
            frozen_session.mid_rows_variant = lambda g, f, skip_prefix="": (g, {{}})
        graph = tf.Graph()
        with graph.as_default():
            ids = tf1.placeholder(tf.int32, [None, 1], name="input_ids")
            rows = tf.tile(tf.cast(ids, tf.float32), [1, 768]) * tf.range(768, dtype=tf.float32)
            biases = tf1.random_normal_initializer()  # zeros: Grappler drops the add
            hidden = tf1.layers.dense(rows, 3072, tf.tanh, bias_initializer=biases)
            tf1.layers.dense(hidden, 768, name="out", bias_initializer=biases)
            session = tf1.Session(graph=graph)
            session.run(tf1.global_variables_initializer())
        session, variants = frozen_session.freeze(session, ["out/BiasAdd:0"])
        call = frozen_session.SessionCall(session, {{"input_ids": "input_ids:0"}},
                                          {{"out": "out/BiasAdd:0"}}, variants)
        for count in [1] + [rows.start for rows, _ in variants]:  # as warm_up
            call({{"input_ids": np.ones([count, 1], np.int32)}})
        for count in (5, 40, 100, 40, 5):
            print("CALL", count, flush=True)
            call({{"input_ids": np.ones([count, 1], np.int32)}})
    """))
    reorders = {}
    for case in ("with", "without"):
        result = subprocess.run([sys.executable, str(child), case], capture_output=True,
                                text=True, timeout=300, env=dict(os.environ, ONEDNN_VERBOSE="1",
                                                                 TF_CPP_MIN_LOG_LEVEL="2"))
        assert result.returncode == 0, result.stderr[-3000:]
        after_warm_up = result.stdout.split("CALL", 1)[1]
        reorders[case] = sum(",exec," in line and ",reorder," in line
                             for line in after_warm_up.splitlines())
        if ",inner_product," not in after_warm_up:
            pytest.skip("TensorFlow ran this dense layer on a GEMM without blocked weights")
    if reorders["without"] == 0:
        pytest.skip("this CPU's inner product keeps one weight blocking at every size")
    assert reorders["with"] == 0, reorders
