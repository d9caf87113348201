"""Serving in int8: the encoder's dense layers of a frozen graph on oneDNN's int8 matmul,
where our own op cannot serve them (a CPU without AVX2, no kernel library, `BERT_DENSE=0`,
or a layer off its sizes; elsewhere each row of the activation has its own scale on AMX,
VNNI or AVX2: `packed_dense.int8_kernel`, finetuning/kernels/dense_int8.h).

A dense layer `x @ W + b` (a `MatMul` on a constant weight, then a `BiasAdd` on a constant
bias) becomes, per call:

    lo, step = min(x), (max(x) - min(x)) / 255     # over the whole activation tensor
    xq = round((x - lo) / step)                    # quint8 codes, 0..255
    p = QuantizedMatMulWithBiasAndDequantize(xq, Wq, (b + lo * colsum(W')) / (step * w))
    y = p * (step * w)                             # = (x - lo) @ W' + b + lo * colsum(W')

with `w = max|W| / 127`, `Wq = round(W / w)` (int8, one scale for the tensor, made once
here) and `W' = Wq * w`: `x @ W'` and the bias, back in float32. On CPUs without VNNI the
codes stop at 127, not 255 (`activation_levels`). The kernel is told unit scales (SCALED,
ranges 0..255 and -127..127): TensorFlow keys its oneDNN primitive on the scales, so scales
that change every call rebuilt it every call; the real scale multiplies its output instead.
Why not the op's own MIN_FIRST mode, made for inputs with negative values: in TensorFlow
2.15 (oneDNN 3) it adds its `min(x)` correction in integer units to a float bias, answers
off by a factor of ~200 (measured), and recomputes it every call with a loop over the
weight.

Only layers under `/encoder/` are rewritten: the pooler and the task's head are small and
decide the answer directly, so they stay float32. Layers reading the same activation (a
layer's query, key and value) share one quantization of it.

Measured on a 2-core Zen 5 (bench/README.md, "int8"): one 384 -> 1536 layer 1.15x float32's
speed at 24 rows, 3.1x at 128, 2.5x at 1,792, within 1.5-1.8% of float32's largest output.
At a few rows the int8 kernel costs about what float32's does (80-100 us at 25 rows,
profiled): it reorders the weight into oneDNN's layout on every call (mkl_qmatmul_op.cc
compiles its weight cache out for oneDNN 3), so int8 gains most from batch 8 up (1.30-1.66x
float32 under an AVX2 cap, 1.12-1.30x at batch 1 once the transposes left oneDNN).
"""
import os

import numpy as np
import tensorflow as tf

from finetuning.graph_nodes import ENCODER_SCOPE, dense_layers

tf1 = tf.compat.v1

SUFFIX = "_int8"


def onednn_enabled():
    """Whether this TensorFlow runs oneDNN's kernels (not with TF_ENABLE_ONEDNN_OPTS=0, nor
    on a CPU it does not serve): its int8 matmul is one of them."""
    from tensorflow.python.util import _pywrap_util_port
    return _pywrap_util_port.IsMklEnabled()


def int8_unavailable():
    """Why this process cannot serve in int8 (one line, naming the setting), or None. int8
    runs on the CPU, on our kernels (`packed_dense.int8_kernel`: AMX, VNNI or AVX2) or else
    on oneDNN's int8 matmul: a machine with a GPU serves on the GPU, which has neither; and
    TensorFlow without oneDNN (TF_ENABLE_ONEDNN_OPTS=0, or a CPU it does not serve) has no
    kernel for oneDNN's, and would fail at the first call, where ours cannot serve."""
    from finetuning.packed_dense import int8_kernel
    if tf.config.list_physical_devices("GPU"):
        return ("int8 serving runs on the CPU, and this machine serves on its GPU: "
                "serve in fp32 or bf16, or hide the GPU (CUDA_VISIBLE_DEVICES=)")
    if not onednn_enabled() and int8_kernel() is None:
        setting = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
        named = f" (TF_ENABLE_ONEDNN_OPTS={setting})" if setting is not None else ""
        return (f"oneDNN is off in this process{named}, and int8 serving runs on oneDNN's "
                "int8 matmul where our kernels do not (BERT_DENSE=0, no C++ compiler, or a "
                "CPU without AVX2): serve in fp32, or turn oneDNN on")
    return None


def quantize_weight(weight):
    """(int8 weight in -127..127, the weight one level stands for): one symmetric scale for
    the whole tensor."""
    step = (float(np.abs(weight).max()) or 1.0) / 127
    return np.clip(np.round(weight / step), -127, 127).astype(np.int8), step


def activation_levels():
    """The highest code an activation gets: 255 where oneDNN adds int8 products in 32 bits
    (VNNI, AMX); 127 elsewhere, so that two products (127 x 127 each) never pass the 16-bit
    sum AVX2's int8 dot product makes of them, as PyTorch's x86 int8 does (`reduce_range`).
    Measured under ONEDNN_MAX_CPU_ISA=AVX2 on a fine-tuned MiniLM: probabilities 0.09 off
    float32's at most this way, 0.21 with 63-level weights instead."""
    from modeling.core import cpu_sums_int8_in_32_bits
    return 255 if cpu_sums_int8_in_32_bits() else 127


def _quantize_activation(x, levels):
    """(quint8 codes of `x - min(x)` in 0..`levels`, min(x), the value of one code), with
    plain element-wise ops: QuantizeV2 builds a oneDNN reorder for each new range, which is
    every call (measured ~60 us a call at 25 rows, most of int8's gain at batch 1)."""
    low = tf.reduce_min(x)
    # all one value: every code 0 (and the bias divided by a scale that stays finite)
    span = tf.maximum(tf.reduce_max(x) - low, 1e-12)
    scaled = (x - low) * (levels / span) + 0.5  # 0.5 .. levels + 0.5: the cast floors it
    codes = tf.bitcast(tf.cast(scaled, tf.uint8), tf.quint8)
    return codes, low, span / levels


def quantize_dense_layers(graph_def, keep, scope=ENCODER_SCOPE, levels=None):
    """`graph_def` with its dense layers inside `scope` on int8 matmuls, pruned to `keep`
    (node names), activations in 0..`levels` (default: `activation_levels()`); (new
    GraphDef, how many layers were rewritten)."""
    layers = dense_layers(graph_def, scope)
    if not layers:
        return graph_def, 0
    levels = levels or activation_levels()
    taken = {node.name for node in graph_def.node}
    built = tf.Graph()
    placeholders = {}  # placeholder node name -> the activation tensor it stands for
    with built.as_default():
        quantized = {}  # activation tensor -> (codes, lowest value, value of one code)
        for bias_add, activation, weight, bias in layers:
            if activation not in quantized:
                with tf1.name_scope(activation.replace(":", "_") + SUFFIX + "/"):
                    x = tf1.placeholder(tf.float32, [None, weight.shape[0]], "x")
                    placeholders[x.op.name] = activation
                    quantized[activation] = _quantize_activation(x, levels)
            codes, low, step = quantized[activation]
            weight_codes, weight_step = quantize_weight(weight)
            column_sums = weight_codes.astype(np.float32).sum(0) * weight_step
            with tf1.name_scope(bias_add.name + SUFFIX + "/"):
                scale = step * weight_step  # of one unit of the integer product
                # the kernel adds the bias to the integer product, before `scale`
                bias_in_units = (tf.constant(bias) + low * tf.constant(column_sums)) / scale
                integer = tf.raw_ops.QuantizedMatMulWithBiasAndDequantize(
                    a=codes, b=tf.constant(weight_codes, tf.qint8), bias=bias_in_units,
                    min_a=tf.constant(0.0), max_a=tf.constant(255.0),
                    min_b=tf.constant(-127.0), max_b=tf.constant(127.0),
                    min_freezed_output=tf.constant(0.0), max_freezed_output=tf.constant(0.0),
                    Toutput=tf.float32, input_quant_mode="SCALED")
                product = integer * scale
            tf.identity(product, name=bias_add.name)  # the name its consumers read
    added = built.as_graph_def()
    replaced = {bias_add.name for bias_add, _, _, _ in layers}
    clash = (taken - replaced) & {node.name for node in added.node}
    if clash:
        raise ValueError(f"int8 rewrite: node names already taken: {sorted(clash)[:3]}")
    merged = tf1.GraphDef()
    merged.versions.CopyFrom(graph_def.versions)
    merged.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name not in replaced:
            merged.node.add().CopyFrom(node)
    for node in added.node:
        if node.name in placeholders:
            continue
        new = merged.node.add()
        new.CopyFrom(node)
        for index, source in enumerate(node.input):
            op_name = source.split(":")[0]
            if op_name in placeholders:
                new.input[index] = placeholders[op_name]
    return tf1.graph_util.extract_sub_graph(merged, list(keep)), len(layers)
