"""int8 serving (finetuning/int8_dense.py): a dense layer on oneDNN's int8 matmul computes
what its quantization says, a whole exported model has every encoder dense layer rewritten
and its head left in float32, where int8 cannot run it is refused in one line, and with
oneDNN off it serves on our kernels (finetuning/packed_dense.py)."""
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from finetuning.int8_dense import activation_levels, quantize_dense_layers
from finetuning.inference import SavedModelRunner, run_in_batches
from finetuning.packed_dense import int8_kernel
from modeling import named_config

from serving_models import assert_int8_answers, request_features, run_graph, served_nodes

tf1 = tf.compat.v1
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _one_dense_layer(weight, bias):
    """(GraphDef of `x @ weight + bias` inside an encoder scope, output node name)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, weight.shape[0]], "x")
        with tf1.name_scope("bert/encoder/layer_0/intermediate"):
            product = tf.matmul(x, tf.identity(tf.constant(weight)))
            out = tf.nn.bias_add(product, tf.constant(bias), name="BiasAdd")
    return graph.as_graph_def(), out.op.name


@pytest.mark.parametrize("levels", [None, 127])
def test_a_dense_layer_computes_its_quantized_product_in_float64(levels):
    """The int8 layer against a float64 NumPy product of its quantized operands: the
    activation's codes (of `x - min(x)`, 0..levels, each within one of NumPy's rounding of
    the same) and the weights at one scale. The activations are off-centre, so a wrong `min(x)`
    correction of the bias (the op's own MIN_FIRST mode is ~200x off) would show."""
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((96, 64)) * 0.05).astype(np.float32)
    bias = (rng.standard_normal(64) * 0.1).astype(np.float32)
    x = (rng.standard_normal((40, 96)) * 0.7 + 1.5).astype(np.float32)
    graph_def, name = _one_dense_layer(weight, bias)
    rewritten, count = quantize_dense_layers(graph_def, [name], levels=levels)
    assert count == 1
    ops = {node.op for node in rewritten.node}
    assert "QuantizedMatMulWithBiasAndDequantize" in ops and "MatMul" not in ops
    def named(op):
        return next(node.name for node in rewritten.node if node.op == op) + ":0"

    got, codes, low, high = run_graph(rewritten, [name + ":0", named("Bitcast"), named("Min"),
                                                  named("Max")], x)
    assert (float(low), float(high)) == (float(x.min()), float(x.max()))
    top = levels or activation_levels()
    step = (float(high) - float(low)) / top
    codes = codes.astype(np.float64)
    assert codes.min() == 0 and codes.max() == top
    assert np.abs(codes - np.round((x - float(low)) / step)).max() <= 1
    w_step = np.abs(weight).max() / 127.0
    w_levels = np.clip(np.round(weight / w_step), -127, 127)
    reference = (float(low) + codes * step) @ (w_levels * w_step) + bias
    tolerance = 1e-5 * np.abs(reference).max()
    assert np.abs(got - reference).max() <= tolerance
    correction = abs(float(low)) * np.abs((w_levels * w_step).sum(0)).max()
    assert correction > 1000 * tolerance  # a lost correction would show
    exact = x.astype(np.float64) @ weight + bias
    assert np.abs(got - exact).max() <= 0.05 * np.abs(exact).max()


def test_a_served_model_has_every_encoder_dense_layer_in_int8_and_its_head_in_float(
        exported, monkeypatch):
    """`SavedModelRunner(precision="int8")`: the 6 dense layers of each encoder layer on
    the int8 matmul (query, key and value sharing a quantization of their input), the
    pooler and the task's head still float32 matmuls; outputs near fp32's (served, as the
    int8 graph's float32 matmuls, on TensorFlow's MatMul: packed_dense switched off)."""
    monkeypatch.setenv("BERT_DENSE", "0")
    task, path = exported
    layers = named_config("tiny").num_hidden_layers
    fp32_runner, int8_runner = SavedModelRunner(path), SavedModelRunner(path, "int8")

    def count(runner, op):
        return sum(node.op == op for node in served_nodes(runner))

    assert count(int8_runner, "QuantizedMatMulWithBiasAndDequantize") == 6 * layers
    # one a layer for query, key and value; the classifier's last layer asks its query of
    # the [CLS] row alone (`output_positions`), a quantization of its own
    codes = sum(node.op == "Bitcast" and node.attr["type"].type == tf.quint8.as_datatype_enum
                for node in served_nodes(int8_runner))
    assert 4 * layers <= codes <= 4 * layers + 1
    assert count(int8_runner, "MatMul") == count(fp32_runner, "MatMul") - 6 * layers >= 1
    features = request_features(6, np.random.default_rng(4))
    fp32 = run_in_batches(fp32_runner, features, task.extra_serving_inputs)
    assert_int8_answers(run_in_batches(int8_runner, features, task.extra_serving_inputs), fp32)


def _serving_precision_in_a_process(env_changes):
    """What `serving_precision('int8')` says in a fresh process with `env_changes`: its
    ValueError, or "ok"."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", **env_changes)
    script = ("from finetuning.inference import serving_precision\n"
              "try:\n"
              "    serving_precision('int8')\n"
              "    print('ok')\n"
              "except ValueError as err:\n"
              "    print(err)\n")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_int8_where_it_cannot_run_is_refused_in_one_line():
    """Without oneDNN, TensorFlow has no kernel for oneDNN's int8 matmul: the first call
    failed with a graph-execution traceback ("Missing 0-th output"). Where our int8 kernels
    do not serve either (here: BERT_DENSE=0), refused before loading."""
    said = _serving_precision_in_a_process({"TF_ENABLE_ONEDNN_OPTS": "0", "BERT_DENSE": "0"})
    assert said == ("--precision=int8: oneDNN is off in this process (TF_ENABLE_ONEDNN_OPTS=0), "
                    "and int8 serving runs on oneDNN's int8 matmul where our kernels do not "
                    "(BERT_DENSE=0, no C++ compiler, or a CPU without AVX2): serve in fp32, or "
                    "turn oneDNN on")


def test_int8_without_onednn_serves_on_our_kernels(kernels, exported):
    """oneDNN off, our int8 kernels on (a CPU with AVX2 or more): int8 is not refused, and a
    served model's dense layers are ours, its answers near float32's."""
    if int8_kernel() is None:
        pytest.skip("our int8 kernels do not serve on this CPU (no AVX2)")
    assert _serving_precision_in_a_process({"TF_ENABLE_ONEDNN_OPTS": "0"}) == "ok"
    task, path = exported
    script = ("import sys, numpy as np\n"
              "from finetuning.inference import SavedModelRunner, run_in_batches\n"
              "from serving_models import assert_int8_answers, request_features, served_nodes\n"
              "path, extra = sys.argv[1], tuple(sys.argv[2:])\n"
              "int8, fp32 = SavedModelRunner(path, 'int8'), SavedModelRunner(path, 'fp32')\n"
              "features = request_features(6, np.random.default_rng(4))\n"
              "assert_int8_answers(*[run_in_batches(runner, features, extra)\n"
              "                      for runner in (int8, fp32)])\n"
              "ops = [node.op for node in served_nodes(int8)]\n"
              "print(ops.count('BertDenseInt8'), sum(op.startswith('Quantized') for op in ops))\n")
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0", TF_CPP_MIN_LOG_LEVEL="3",
               CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]))
    done = subprocess.run([sys.executable, "-c", script, path, *task.extra_serving_inputs],
                          env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    ours, onednn = map(int, done.stdout.split())
    assert ours == 6 * named_config("tiny").num_hidden_layers and onednn == 0


def test_int8_on_a_machine_serving_on_its_gpu_is_refused(monkeypatch):
    from finetuning.inference import serving_precision
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["/physical_device:GPU:0"] if kind == "GPU" else [])
    with pytest.raises(ValueError, match=r"^--precision=int8: int8 serving runs on the CPU, "
                                         r"and this machine serves on its GPU"):
        serving_precision("int8")


def test_without_vnni_the_codes_stop_where_avx2_sums_in_16_bits_cannot_saturate():
    """Under ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN's int8 matmul without VNNI adds two u8 x s8
    products in 16 bits): activations at the top of their range against weights of one
    sign saturated that sum, 5.5% off the exact product where VNNI was 0.18% off. The
    codes now stop at 127 there, and the product is as near as VNNI's."""
    script = (
        "import numpy as np, tensorflow as tf\n"
        "from finetuning.int8_dense import activation_levels, quantize_dense_layers\n"
        "from serving_models import run_graph\n"
        "from test_int8_serving import _one_dense_layer\n"
        "weight = np.abs(np.random.default_rng(0).standard_normal((64, 16))).astype('f4')\n"
        "weight[:, ::2] *= -1\n"
        "x = np.full((4, 64), 3.0, np.float32)\n"
        "x[0, 0] = -1.0\n"
        "graph_def, name = _one_dense_layer(weight, np.zeros(16, np.float32))\n"
        "got = run_graph(quantize_dense_layers(graph_def, [name])[0], name + ':0', x)\n"
        "exact = x.astype(np.float64) @ weight\n"
        "print(activation_levels(), np.abs(got - exact).max() / np.abs(exact).max())\n")
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", TF_ENABLE_ONEDNN_OPTS="1",
               TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    levels, error = done.stdout.split()
    assert int(levels) == 127
    # the weights' rounding is the error left (0.18% here); saturated pairs made it 5.5%
    assert float(error) < 0.01
