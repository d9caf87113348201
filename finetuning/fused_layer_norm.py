"""A frozen serving graph's layer norms as one oneDNN op each, for calls with many rows.

Our layer norm is ten element-wise ops (`modeling.core.layer_norm`: mean, difference,
variance, rsqrt, scale, shift), each a pass over the rows; past a few hundred rows of 384 the
rows leave the L2 cache and every pass is a trip to memory. oneDNN's layer norm
(`_MklLayerNorm`, what TensorFlow's remapper fuses Keras's layer norm into) makes one pass,
but costs ~50 us a call however small (a 2-core Zen 5, float32, one layer norm with its
residual add):

| rows | 25 | 80 | 160 | 320 | 640 | 1,600 | 3,200 |
|---|---:|---:|---:|---:|---:|---:|---:|
| ten ops, us | 15 | 29 | 61 | 180 | 245 | 595 | 795 |
| `_MklLayerNorm`, us | 55 | 59 | 66 | 76 | 124 | 244 | 267 |

So neither is the one to serve every call with: the serving graph holds both. `many_rows_variant`
adds a copy of everything the layer norms feed, with each layer norm fused, sharing the
inputs and the weights' constants (no second copy of the weights); a call picks the copy's
outputs when its batch holds at least `many_rows()` real tokens (the dense layers and layer
norms compute only those: `modeling/real_rows.py`). Measured whole, 8 x 200 tokens of the
SQuAD model (all-MiniLM-L6-v2, paired in one process): bf16 53.9 -> 48.9 ms, fp32 87.9 ->
83.7 ms; the answers the same to float32's summation order.

Where the two cross depends on the CPU. On a 2-core Intel Xeon with AMX (family 6 model 207)
the fused copy served whole SQuAD requests of N tokens at batch 1 (paired in one process, 150
calls a side) at 0.91x the ten ops' speed at 24 tokens, 0.97x at 48, 1.00x at 64, 1.02x at
80, 1.11x at 96 and 144 in bf16, 1.06-1.07x at 96 and 144 in fp32; on the Zen 5 above the two
were level at 160 rows. So from 96 rows where oneDNN runs on AMX, from 192 elsewhere.
"""
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

from finetuning.graph_nodes import (fed_by, fusion_available, has_control_input, static_shapes,
                                    with_copy)

tf1 = tf.compat.v1

FUSED_OP = "_MklLayerNorm"
MANY_ROWS = 192  # a Zen 5: between 160 rows, where the two are level, and 320
MANY_ROWS_ON_AMX = 96  # a Xeon with AMX: level at 64, 1.11x at 96 (bf16)
PREFIX = "many_rows/"


def many_rows():
    """The fewest real tokens in a call that the fused copy serves, on this CPU."""
    from modeling.core import cpu_has_amx
    return MANY_ROWS_ON_AMX if cpu_has_amx() else MANY_ROWS


def many_rows_variant(graph_def, fetches):
    """(GraphDef, {fetch: its many-rows name}): `graph_def` with a copy (under PREFIX) of
    every node a layer norm feeds, its layer norms fused; `fetches` (tensor names) mapped to
    the copy's. ({}, the graph unchanged) where nothing is fused: no layer norm in it, or no
    oneDNN kernel in this process (`fusion_available`)."""
    fused = _fused_layer_norms(graph_def) if fusion_available() else {}
    if not fused:
        return graph_def, {}
    return with_copy(graph_def, fetches, fed_by(graph_def, set(fused)), PREFIX, fused)


def _fused_layer_norms(graph_def):
    """{the layer norm's last node's name: a `_MklLayerNorm` NodeDef of that name} for each
    layer norm `layer_norms` finds."""
    fused = {}
    for found in layer_norms(graph_def):
        node = tf1.NodeDef(name=found.shift.name, op=FUSED_OP, device=found.shift.device)
        node.input.extend([found.x, found.gamma, found.beta])
        node.attr["T"].CopyFrom(found.shift.attr["T"])
        node.attr["epsilon"].f = found.epsilon
        fused[found.shift.name] = node
    return fused


class LayerNorm:
    """A layer norm's pattern in a GraphDef: its last node (`shift`, the add of beta), its
    input x, gamma's and beta's names, epsilon, and the names of its ten nodes."""

    def __init__(self, shift, x, gamma, beta, epsilon, names):
        self.shift, self.x, self.gamma, self.beta = shift, x, gamma, beta
        self.epsilon, self.names = epsilon, names


def layer_norms(graph_def, shapes=None):
    """[LayerNorm] for each `(x - mean(x)) * rsqrt(mean((x - mean(x))^2) + eps) * gamma +
    beta` over x's last axis (`modeling.core.layer_norm`, as Grappler leaves it). `shapes`:
    `static_shapes(graph_def)` where the caller has them already."""
    nodes = {node.name: node for node in graph_def.node}
    shapes = static_shapes(graph_def) if shapes is None else shapes

    def node_of(source, op):
        node = nodes.get(source) if ":" not in source and not source.startswith("^") else None
        return node if node is not None and node.op == op else None

    def mean_over_last_axis(mean, x):
        axes = nodes.get(mean.input[1]) if mean is not None else None
        x_shape = shapes.get(x)
        if (axes is None or axes.op != "Const" or x_shape is None or x_shape.rank is None
                or not mean.attr["keep_dims"].b):
            return False
        axis = np.asarray(tensor_util.MakeNdarray(axes.attr["value"].tensor)).reshape(-1)
        return len(axis) == 1 and axis[0] in (-1, x_shape.rank - 1) and mean.input[0] == x

    found = []
    for shift in graph_def.node:
        if shift.op != "AddV2" or has_control_input(shift):
            continue
        scaled, beta = node_of(shift.input[0], "Mul"), shift.input[1]
        normed = node_of(scaled.input[0], "Mul") if scaled is not None else None
        if normed is None:
            continue
        gamma = scaled.input[1]
        centred, rsqrt = node_of(normed.input[0], "Sub"), node_of(normed.input[1], "Rsqrt")
        plus_epsilon = node_of(rsqrt.input[0], "AddV2") if rsqrt is not None else None
        if centred is None or plus_epsilon is None:
            continue
        x, mean = centred.input[0], node_of(centred.input[1], "Mean")
        variance = node_of(plus_epsilon.input[0], "Mean")
        squared = (node_of(variance.input[0], "SquaredDifference")
                   if variance is not None else None)
        epsilon = nodes.get(plus_epsilon.input[1])
        if (squared is None or squared.input[0] != x
                or _through_stop_gradient(squared.input[1], nodes) != centred.input[1]
                or not mean_over_last_axis(mean, x) or not mean_over_last_axis(variance,
                                                                               squared.name)
                or epsilon is None or epsilon.op != "Const"):
            continue
        width = shapes[x][-1]
        if any(shapes.get(name) is None or shapes[name].as_list() != [width]
               for name in (gamma, beta)):
            continue
        names = {shift.name, scaled.name, normed.name, centred.name, rsqrt.name,
                 plus_epsilon.name, mean.name, variance.name, squared.name,
                 squared.input[1].split(":")[0]}
        found.append(LayerNorm(shift, x, gamma, beta,
                               float(tensor_util.MakeNdarray(epsilon.attr["value"].tensor)),
                               names))
    return found


def _through_stop_gradient(source, nodes):
    node = nodes.get(source)
    return node.input[0] if node is not None and node.op in ("StopGradient", "Identity") else source
