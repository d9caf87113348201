"""A float32 serving graph's dense layers as one op of ours each, their weights packed at load.

A served request is a few hundred rows (the real tokens of its sequences), and at that size
oneDNN's inner product (`_MklNativeFusedMatMul`, what the frozen graph's MatMul and BiasAdd
become) ran a 160-token SQuAD request's 36 encoder products at ~110 GFLOP/s on two cores of
a machine whose float32 ceiling is ~200-250 (bench/README.md). `BertDense`
(`finetuning/kernels/dense.h`, built by `custom_ops`) keeps a block of rows' sums in
registers over the whole depth and reads the weights in the order they are stored, packed
here once into panels of 32 columns; the bias and the exact GELU are applied before a block
is stored (the GELU's five element-wise ops go).

Matched on the frozen GraphDef at load, after `add_layer_norm`: each float32 MatMul on a
constant weight inside the encoder read only by a BiasAdd on a constant bias
(`graph_nodes.dense_layers`), whose width is a multiple of 32; where the BiasAdd is read only
by the exact GELU's ops (`modeling.activations.gelu`: 0.5·x·(1 + erf(x/√2))), those too. The
op takes the last node's name, so its readers are untouched. Not in a bfloat16 or int8
graph (their products are oneDNN's in those types), not where a GPU would run the graph,
without the kernel library (`custom_ops.library()` says why) or with `BERT_DENSE=0`.
"""
import math
import sys

import numpy as np
import tensorflow as tf

from finetuning import custom_ops
from finetuning.graph_nodes import dense_layers, fed_by, readers, rebuilt, scalar_of, with_copy
from finetuning.packed_attention import kernel_isa

tf1 = tf.compat.v1

OP = "BertDense"
PANEL = 32  # columns a panel holds (kDensePanel in finetuning/kernels/dense.h)
PREFIX = "dense_many_rows/"
# With AVX-512, oneDNN's inner product is the faster from a few hundred rows (the op against
# it on two threads: 0.83-1.06x at 640 rows, 0.76-0.92x at 1,300, 1.01-1.42x at 160 but for
# the GELU layer's 0.82x; a whole request of ~1,300 rows, batch 8 of SQuAD, 0.95x paired;
# bench/README.md), and a copy of the graph keeps it from this many; ours with its AVX2 code
# measured no slower than oneDNN's AVX2 at any size.
AVX512_MANY_ROWS = 512


def enabled():
    """Whether the rewrite may run in this process (no GPU, not switched off)."""
    return custom_ops.allowed("BERT_DENSE")


def pack_kernel(weight):
    """[k, n] -> [n / PANEL, k, PANEL]: panel p holds columns p*PANEL ... p*PANEL + 31, row
    after row, as the kernel reads them."""
    depth, width = weight.shape
    return np.ascontiguousarray(
        weight.reshape(depth, width // PANEL, PANEL).transpose(1, 0, 2), np.float32)


def pack_dense_layers(graph_def, fetches):
    """(GraphDef, the number of dense layers rewritten, the variant `SessionCall` serves many
    rows from or None): `graph_def` with each matched dense layer one `BertDense` node and,
    where oneDNN is the faster for many rows (`AVX512_MANY_ROWS`), a copy under PREFIX of
    everything the dense layers feed as it was, `fetches` (tensor names) mapped to the copy's.
    (graph_def, 0, None) where the rewrite may not run or the kernel cannot be had."""
    if not enabled():
        return graph_def, 0, None
    layers = [layer for layer in dense_layers(graph_def) if layer[2].shape[1] % PANEL == 0]
    if not layers or custom_ops.library() is None:
        return graph_def, 0, None
    isa = kernel_isa()
    replaced, removed, constants = _rewrites(graph_def, layers, isa)
    variant = None
    if isa == "avx512":
        matmuls = {bias_add.input[0].split(":")[0] for bias_add, *_ in layers}
        graph_def, names = with_copy(graph_def, fetches, fed_by(graph_def, matmuls), PREFIX)
        variant = (range(AVX512_MANY_ROWS, sys.maxsize), names)
    rewritten = rebuilt(graph_def, replaced, removed)
    rewritten.node.extend(constants)
    return rewritten, len(layers), variant


def _rewrites(graph_def, layers, isa):
    """({name: `BertDense` NodeDef}, {names of the nodes it replaces}, [packed weights'
    constants]) for `layers` (`graph_nodes.dense_layers`' tuples)."""
    nodes = {node.name: node for node in graph_def.node}
    read_by = readers(graph_def)
    replaced, removed, constants = {}, set(), []
    for bias_add, x, weight, _ in layers:
        removed.add(bias_add.input[0].split(":")[0])  # the MatMul, read only by the BiasAdd
        gelu = _exact_gelu(bias_add.name, nodes, read_by)
        name = gelu[-1] if gelu else bias_add.name
        kernel = tf1.NodeDef(name=bias_add.name + "/packed_kernel", op="Const",
                             device=bias_add.device)
        kernel.attr["dtype"].type = tf.float32.as_datatype_enum
        kernel.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(pack_kernel(weight)))
        constants.append(kernel)
        node = tf1.NodeDef(name=name, op=OP, device=bias_add.device)
        node.input.extend([x, kernel.name, bias_add.input[1]])
        node.attr["activation"].s = b"gelu" if gelu else b"linear"
        node.attr["isa"].s = isa.encode()
        replaced[name] = node
        if gelu:
            removed.update([bias_add.name, *gelu[:-1]])
    return replaced, removed, constants


def _exact_gelu(source, nodes, read_by):
    """The names of the exact GELU's five nodes reading `source` (0.5·x, x/√2, erf, 1 + erf,
    the product; the last is its output), or None where `source`'s readers are anything
    else."""
    readers_of = sorted(read_by.get(source, ()))
    if len(readers_of) != 2:
        return None
    # 0.5·x is the Mul by 0.5 (whichever name sorts first: x·(1/√2) is a Mul too)
    half = next((name for name in readers_of if nodes[name].op == "Mul"
                 and _other_scalar(nodes[name], source, nodes) == 0.5), None)
    scaled = next((name for name in readers_of if nodes[name].op in ("RealDiv", "Mul")
                   and name != half), None)
    if half is None or scaled is None:
        return None
    divisor = _other_scalar(nodes[scaled], source, nodes)
    if divisor is None or not math.isclose(
            divisor if nodes[scaled].op == "RealDiv" else 1 / divisor, math.sqrt(2), rel_tol=1e-6):
        return None
    erf = _only_reader(scaled, "Erf", nodes, read_by)
    one_plus = erf and _only_reader(erf, "AddV2", nodes, read_by)
    if one_plus is None or _other_scalar(nodes[one_plus], erf, nodes) != 1.0:
        return None
    product = _only_reader(one_plus, "Mul", nodes, read_by)
    if product is None or set(map(_node_name, nodes[product].input)) != {half, one_plus} or \
            read_by.get(half) != [product]:
        return None
    return [half, scaled, erf, one_plus, product]


def _only_reader(source, op, nodes, read_by):
    """The one node reading `source`, where there is one and it is an `op`; else None."""
    names = read_by.get(source, ())
    return names[0] if len(names) == 1 and nodes[names[0]].op == op else None


def _other_scalar(node, source, nodes):
    """The float of the scalar constant `node` takes beside `source`, or None."""
    names = [_node_name(name) for name in node.input]
    if len(names) != 2 or source not in names:
        return None
    return scalar_of(nodes.get(names[1 - names.index(source)]))


def _node_name(source):
    """A data input's node ("name:0" and "name" alike; other outputs keep their index)."""
    return source[:-2] if source.endswith(":0") else source
