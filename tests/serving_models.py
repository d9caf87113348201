"""Tiny exported models for the serving tests: a randomly initialised fine-tuned-looking
checkpoint of a task exported as `inference.py` serves it, requests for it, and a GraphDef
run on its own (for the serving graph's rewrites). The `exported` fixture (conftest.py)
exports one of each task once a test session."""
import math
import types

import numpy as np
import tensorflow as tf

from finetuning.export import export_saved_model
from finetuning.model_fn import make_model_fn
from modeling import named_config
from training.settings import TrainingSettings

tf1 = tf.compat.v1
LENGTH = 32


def export_tiny(task, folder, **config_changes):
    """A randomly initialised fine-tuned-looking checkpoint of `task` (the tiny BERT, with
    `config_changes`), exported at LENGTH; returns the SavedModel's path."""
    config = named_config("tiny").replace(vocab_size=101, **config_changes)
    model_fn = make_model_fn(task, TrainingSettings(bert_config=config))
    with tf.Graph().as_default():
        tf1.set_random_seed(7)
        tf1.train.get_or_create_global_step()
        features = {name: tf1.placeholder(tf.int32, [None, LENGTH], name)
                    for name in ("input_ids", "input_mask", "segment_ids")}
        for name in task.extra_serving_inputs:
            features[name] = tf1.placeholder(tf.int32, [None], name)
        model_fn(features, None, tf.estimator.ModeKeys.PREDICT)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            _randomise_offsets(session)
            tf1.train.Saver().save(session, str(folder / "model.ckpt"), global_step=1)
    estimator = tf.estimator.Estimator(model_fn, model_dir=str(folder))
    return export_saved_model(estimator, task, str(folder / "export"), LENGTH)


def _randomise_offsets(session):
    """Biases and layer-norm offsets drawn at random, as a trained model has them: BERT
    initialises them to zero, and Grappler folds a zero BiasAdd away, so the dense layers
    would run a plain GEMM instead of the inner product with a bias that real models run
    (finetuning/weight_blocking.py)."""
    rng = np.random.default_rng(11)
    for variable in tf1.global_variables():
        if variable.name.split("/")[-1].split(":")[0] in ("bias", "beta", "output_bias"):
            shape = variable.shape.as_list()
            variable.load(rng.normal(0.0, 0.1, shape).astype(np.float32), session)


def request_features(count, rng):
    """Requests of lengths 3..LENGTH, padded to LENGTH as make_features pads them."""
    items = []
    for index in range(count):
        real = int(rng.integers(3, LENGTH + 1))
        ids = np.zeros(LENGTH, np.int32)
        ids[:real] = rng.integers(5, 101, real)
        mask = (np.arange(LENGTH) < real).astype(np.int32)
        items.append(types.SimpleNamespace(input_ids=ids, input_mask=mask,
                                           segment_ids=np.zeros(LENGTH, np.int32),
                                           unique_id=1000 + index, example_index=index))
    return items


def summation_order_tolerance(reference):
    """Float32 summation-order noise of outputs as large as `reference`: a few hundred ulps
    of their scale. The computations compared run GEMMs of other shapes (a batch cut to
    another length, or only its real rows), so other blockings; that alone moves no output
    further."""
    return 256 * np.finfo(np.float32).eps * max(1.0, float(np.abs(reference).max()))


def answers_of(runners, task, seed, count=7, batch_size=4):
    """Each runner's answers (run_in_batches) to the same `count` requests of lengths
    3..LENGTH, `batch_size` a call: batches mixing short and long requests."""
    from finetuning.inference import run_in_batches
    features = request_features(count, np.random.default_rng(seed))
    return [run_in_batches(runner, features, task.extra_serving_inputs, batch_size=batch_size)
            for runner in runners]


def assert_answers_as_before(got, before, float32_answers, precision):
    """Each answer of `got` (run_in_batches' dicts) is `before`'s: integers exactly; floats in
    fp32 to float32's summation order; in bf16 no further from `float32_answers` (the same
    requests served in fp32) than `before`'s are, give or take one bfloat16 rounding of their
    scale."""
    for answer, reference, full in zip(got, before, float32_answers):
        assert sorted(answer) == sorted(reference)
        for name, value in reference.items():
            if value.dtype.kind != "f":
                np.testing.assert_array_equal(answer[name], value)
            elif precision == "fp32":
                np.testing.assert_allclose(answer[name], value, rtol=0,
                                           atol=summation_order_tolerance(value))
            else:
                rounding = 2.0 ** -8 * max(1.0, float(np.abs(full[name]).max()))
                assert (np.abs(answer[name] - full[name]).max()
                        <= np.abs(value - full[name]).max() + rounding)


def dense_reference(x, weight, bias, activation):
    """x · W + bias, and the exact GELU where `activation` is "gelu", in float64."""
    y = np.asarray(x, np.float64) @ np.asarray(weight, np.float64) + bias
    if activation == "gelu":
        y = 0.5 * y * (1.0 + np.vectorize(math.erf)(y / math.sqrt(2.0)))
    return y


def tensorflow_dense(x, weight, bias, activation):
    """The same layer in TensorFlow's own ops, in the inputs' type: how far float32 (or
    bfloat16) arithmetic is from `dense_reference` on this CPU, the measure our ops are held
    to."""
    y = tf.nn.bias_add(tf.matmul(x, weight), bias)
    if activation == "gelu":
        y = 0.5 * y * (1.0 + tf.math.erf(y / math.sqrt(2.0)))
    return y.numpy()


def assert_int8_answers(got, float32_answers, other=None):
    """Each answer of `got` (an int8 runner's run_in_batches dicts) near float32's: integers
    exactly, floats within a tenth of their scale (8-bit operands, two layers deep: a few
    percent); with `other` (another int8 path's answers to the same requests) no further
    from float32's than those are, give or take a hundredth of the scale."""
    others = other if other is not None else [None] * len(got)
    for answer, reference, theirs in zip(got, float32_answers, others):
        for name, value in reference.items():
            if not np.issubdtype(value.dtype, np.floating):
                np.testing.assert_array_equal(answer[name], value)
                continue
            scale = max(1.0, float(np.abs(value).max()))
            error = np.abs(answer[name] - value).max()
            assert error <= 0.1 * scale, name
            if theirs is not None:
                assert error <= np.abs(theirs[name] - value).max() + 0.01 * scale, name


def assert_onednn_cap_chooses(monkeypatch, chooser, cap, expected, uncapped):
    """`chooser()` (`packed_dense.bf16_kernel` or `int8_kernel`) with ONEDNN_MAX_CPU_ISA at
    `cap` is `expected`; with no cap ("") `uncapped`, the best this CPU has; with
    `BERT_DENSE=0` None: how other CPUs are stood in for, and the switch that turns ours off."""
    if cap:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    else:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        expected = uncapped
    assert chooser() == expected
    monkeypatch.setenv("BERT_DENSE", "0")
    assert chooser() is None


def served_nodes(runner):
    """The NodeDefs a `SavedModelRunner` serves a call of one row with: its frozen graph
    without the copies that repeat the encoder for other sizes (finetuning/fused_layer_norm.py,
    finetuning/weight_blocking.py, finetuning/packed_dense.py)."""
    from finetuning.fused_layer_norm import PREFIX as MANY_ROWS
    from finetuning.packed_dense import PREFIX as DENSE_MANY_ROWS
    from finetuning.weight_blocking import PREFIX as MID_ROWS
    return [node for node in runner._session.graph.as_graph_def().node
            if not node.name.startswith((MANY_ROWS, MID_ROWS, DENSE_MANY_ROWS))]


def run_graph(graph_def, fetches, x):
    """`fetches` (tensor names) of `graph_def` imported into a graph of its own, with `x` fed
    to its placeholder "x"."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    with tf1.Session(graph=graph) as session:
        return session.run(fetches, {"x:0": x})
