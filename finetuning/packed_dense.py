"""A serving graph's dense layers as one op of ours each, their weights packed at load:
float32 on our vector kernel, bfloat16 on AMX's tiles or AVX512_BF16, int8 on AMX's tiles,
AVX-512 VNNI or AVX2, where the CPU has them.

A served request is a few hundred rows (the real tokens of its sequences), and at that size
oneDNN's inner product (`_MklNativeFusedMatMul`, what the frozen graph's MatMul and BiasAdd
become) ran a 160-token SQuAD request's 36 encoder products at ~110 GFLOP/s on two cores of
a machine whose float32 ceiling is ~200-250 (bench/README.md). `BertDense`
(`finetuning/kernels/dense.h`, built by `custom_ops`) keeps a block of rows' sums in
registers over the whole depth and reads the weights in the order they are stored, packed
here once into panels of 32 columns; the bias and the exact GELU are applied before a block
is stored (the GELU's five element-wise ops go). In bfloat16, oneDNN's AMX inner product
ran a 170-row 384 -> 1536 layer with its GELU at ~260 GFLOP/s where one core's tile
products alone run at ~2,500: `BertDense` in bfloat16 (`finetuning/kernels/dense_amx.h`)
reads both operands as whole 1 KB tiles (the weight laid out so here, once; a call's rows by
the op), and adds the bias and GELU in float32 before its one rounding to bfloat16; on a
CPU with AVX512_BF16 and no AMX (Zen 4 and 5), the same op on VDPBF16PS
(`finetuning/kernels/dense_dpbf16.h`), W in the same layout, x read where it is.
`BertDenseInt8` does the same on AMX-INT8 for `--precision=int8` (float32 in and out, each
row of the activation quantized on the fly to its own 0..255 scale, each weight column to
its own int8 scale), in place of `int8_dense`'s oneDNN int8 matmul; on a CPU with AVX-512
VNNI and no AMX (Zen 4 and 5), the same op on VNNI (`finetuning/kernels/dense_vnni.h`),
and with AVX2 alone (Zen 2 and 3) on AVX2's byte products with codes 0..127
(`dense_int8_avx2.h`), each reading the same layout.

Matched on the frozen GraphDef at load, after `add_layer_norm`: each MatMul in the graph's
precision on a constant weight inside the encoder read only by a BiasAdd on a constant bias
(`graph_nodes.dense_layers`; in a bfloat16 graph the constants are float32 ones cast),
whose width is a multiple of 32 (and depth, in bfloat16 of 32, in int8 of 64; other
layers stay as they are); where the BiasAdd is read only by
the exact GELU's ops (`modeling.activations.gelu`: 0.5·x·(1 + erf(x/√2))), those too. The
op takes the last node's name, so its readers are untouched. bfloat16 only where AMX or
AVX512_BF16 is (`bf16_kernel`), int8 where AMX, VNNI or AVX2 is (`int8_kernel`); elsewhere
their products stay oneDNN's. Not where a GPU would run
the graph, without the kernel library (`custom_ops.library()` says why) or with
`BERT_DENSE=0` (int8 then on `int8_dense`).
"""
import math
import sys

import numpy as np
import tensorflow as tf

from finetuning import custom_ops
from finetuning.graph_nodes import constant_value, dense_layers, fed_by, readers, rebuilt, with_copy
from finetuning.packed_attention import kernel_isa

tf1 = tf.compat.v1

OP = "BertDense"
OP_INT8 = "BertDenseInt8"
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


def pack_kernel_tiles(weight):
    """[k, n] -> bfloat16 [n / PANEL, k, PANEL] laid out tile by tile for AMX
    (finetuning/kernels/dense_amx.h): panel, depth block of 32, column half, depth pair,
    column, the pair's two depths."""
    depth, width = weight.shape
    values = np.asarray(weight, np.float32).astype(tf.bfloat16.as_numpy_dtype)
    # (depth block, pair, depth in pair, panel, half, column) -> the order above
    tiles = values.reshape(depth // 32, 16, 2, width // PANEL, 2, 16).transpose(3, 0, 4, 1, 5, 2)
    return np.ascontiguousarray(tiles).reshape(width // PANEL, depth, PANEL)


def pack_int8_tiles(codes):
    """int8 [k, n] -> [n / PANEL, k, PANEL] laid out tile by tile for AMX-INT8, which the VNNI
    and AVX2 kernels read too (finetuning/kernels/dense_int8.h): panel, depth block of 64,
    column half, depth quad, column, the quad's four depths."""
    depth, width = codes.shape
    tiles = np.asarray(codes, np.int8).reshape(depth // 64, 16, 4, width // PANEL, 2, 16)
    return np.ascontiguousarray(tiles.transpose(3, 0, 4, 1, 5, 2)).reshape(width // PANEL, depth,
                                                                          PANEL)


def quantize_columns(weight):
    """(int8 codes in -127..127, each column's scale, scale · the column's sum of codes):
    one symmetric scale a column (output channel), so a column of small weights keeps its
    resolution; the sums carry each row's quantization offset (dense_amx.h)."""
    scale = np.abs(weight).max(axis=0).astype(np.float32) / 127
    scale[scale == 0] = 1.0
    codes = np.clip(np.round(weight / scale), -127, 127).astype(np.int8)
    return codes, scale, (scale * codes.astype(np.float32).sum(axis=0)).astype(np.float32)


def amx_available(kind="bf16"):
    """Whether this process may multiply on AMX tiles (`kind`: "bf16" or "int8"): the CPU has
    them, oneDNN is not capped below AMX (`ONEDNN_MAX_CPU_ISA`, how other CPUs are stood in
    for: our kernels keep below the same line), our library was built with AMX
    (`custom_ops.amx_built`: its compiler knew it), and Linux grants the process the tiles
    (arch_prctl ARCH_REQ_XCOMP_PERM; once granted, for the process's life)."""
    import ctypes
    from modeling.core import cpu_has_amx
    if not cpu_has_amx(kind) or sys.platform != "linux" or not custom_ops.amx_built():
        return False
    arch_prctl, request_permission, tile_data = 158, 0x1023, 18  # x86-64 Linux
    try:
        return ctypes.CDLL(None, use_errno=True).syscall(arch_prctl, request_permission,
                                                         tile_data) == 0
    except (OSError, AttributeError):
        return False


def bf16_kernel():
    """Which code of ours a bfloat16 graph's dense layers (`BertDense` in bfloat16) run on
    here: "amx" (AMX-BF16's tiles), "avx512_bf16" (AVX512_BF16's VDPBF16PS on a CPU without
    AMX: AMD Zen 4 and 5, Intel Cooper Lake; the same layout, dense_dpbf16.h), or None:
    oneDNN's bfloat16 products stay (no native bfloat16, oneDNN capped below it, no kernel
    library or one built by a compiler without AMX, which holds both codes, or
    `BERT_DENSE=0`)."""
    from modeling.core import cpu_has_avx512_bf16
    if not enabled():
        return None
    if amx_available("bf16"):
        return "amx"
    return "avx512_bf16" if cpu_has_avx512_bf16() and custom_ops.amx_built() else None


def int8_kernel():
    """Which code of ours an int8 graph's dense layers (`BertDenseInt8`) run on here: "amx"
    (AMX-INT8's tiles), "avx512_vnni" (a CPU with VNNI and no AMX: AMD Zen 4 and 5, Intel
    Cascade Lake to Ice Lake), "avx2" (AVX2 without VNNI: activation codes 0..127), or None:
    oneDNN's int8 matmul (`int8_dense`) serves them instead (an older CPU or oneDNN capped
    below AVX2, no kernel library, or `BERT_DENSE=0`)."""
    from modeling.core import cpu_has_avx2, cpu_has_avx512_vnni
    if not enabled():
        return None
    if amx_available("int8"):  # (amx_available: our library is loaded)
        return "amx"
    if custom_ops.library() is None:
        return None
    if cpu_has_avx512_vnni():
        return "avx512_vnni"
    return "avx2" if cpu_has_avx2() else None


def pack_dense_layers(graph_def, fetches, precision="fp32"):
    """(GraphDef, the number of dense layers rewritten, the variant `SessionCall` serves many
    rows from or None): `graph_def` with each matched dense layer one `BertDense` node and,
    in float32 where oneDNN is the faster for many rows (`AVX512_MANY_ROWS`), a copy under
    PREFIX of everything the dense layers feed as it was, `fetches` (tensor names) mapped to
    the copy's. "bf16" (a bfloat16 graph) and "int8" (a float32 graph whose dense layers go
    to `BertDenseInt8`) only where AMX or AVX512_BF16 (bf16: `bf16_kernel`) or AMX, VNNI or
    AVX2 (int8: `int8_kernel`) is.
    (graph_def, 0, None) where the rewrite may not run or the kernel cannot be had."""
    low_isa = int8_kernel() if precision == "int8" else \
        bf16_kernel() if precision == "bf16" else None  # None: fp32, or none of ours
    low_precision = precision in ("bf16", "int8")
    if not enabled() or (low_precision and low_isa is None):
        return graph_def, 0, None
    dtype = tf.bfloat16 if precision == "bf16" else tf.float32
    depth_unit = {"bf16": 32, "int8": 64}.get(precision, 1)
    layers = [layer for layer in dense_layers(graph_def, dtype=dtype)
              if layer[2].shape[1] % PANEL == 0 and layer[2].shape[0] % depth_unit == 0]
    if not layers or custom_ops.library() is None:
        return graph_def, 0, None
    isa = kernel_isa()
    replaced, removed, constants = _rewrites(graph_def, layers, low_isa or isa, precision)
    variant = None
    if isa == "avx512" and not low_precision:
        matmuls = {bias_add.input[0].split(":")[0] for bias_add, *_ in layers}
        graph_def, names = with_copy(graph_def, fetches, fed_by(graph_def, matmuls), PREFIX)
        variant = (range(AVX512_MANY_ROWS, sys.maxsize), names)
    rewritten = rebuilt(graph_def, replaced, removed)
    rewritten.node.extend(constants)
    return rewritten, len(layers), variant


def _constant(name, value, device):
    node = tf1.NodeDef(name=name, op="Const", device=device)
    node.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    return node


def _rewrites(graph_def, layers, isa, precision="fp32"):
    """({name: our op's NodeDef}, {names of the nodes it replaces}, [its constants]) for
    `layers` (`graph_nodes.dense_layers`' tuples): float32 `BertDense` on the packed weight;
    bf16 `BertDense` on the weight packed for AMX, `isa` "amx" or "avx512_bf16" (VDPBF16PS
    reads the same layout), the bias a float32 constant of the graph's bfloat16 values; int8
    `BertDenseInt8` on the weight's per-column codes, `isa` "amx", "avx512_vnni" or "avx2" (one
    layout serves all: finetuning/kernels/dense_int8.h)."""
    nodes = {node.name: node for node in graph_def.node}
    read_by = readers(graph_def)
    replaced, removed, constants = {}, set(), []
    for bias_add, x, weight, bias in layers:
        removed.add(bias_add.input[0].split(":")[0])  # the MatMul, read only by the BiasAdd
        gelu = _exact_gelu(bias_add.name, nodes, read_by)
        name = gelu[-1] if gelu else bias_add.name
        device = bias_add.device
        node = tf1.NodeDef(name=name, op=OP_INT8 if precision == "int8" else OP, device=device)
        if precision == "int8":
            codes, scale, sums = quantize_columns(weight)
            added = [_constant(bias_add.name + "/packed_codes", pack_int8_tiles(codes), device),
                     _constant(bias_add.name + "/column_scale", scale, device),
                     _constant(bias_add.name + "/column_sums", sums, device),
                     _constant(bias_add.name + "/float_bias", bias.astype(np.float32), device)]
        elif precision == "bf16":
            added = [_constant(bias_add.name + "/packed_kernel", pack_kernel_tiles(weight), device),
                     _constant(bias_add.name + "/float_bias", bias.astype(np.float32), device)]
        else:
            added = [_constant(bias_add.name + "/packed_kernel", pack_kernel(weight), device)]
        constants.extend(added)
        node.input.extend([x, *(constant.name for constant in added)])
        if precision != "int8":
            if precision == "fp32":
                node.input.append(bias_add.input[1])
            node.attr["T"].type = (tf.bfloat16 if precision == "bf16" else tf.float32
                                   ).as_datatype_enum
        node.attr["isa"].s = isa.encode()
        node.attr["activation"].s = b"gelu" if gelu else b"linear"
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
    """The float of the scalar constant `node` takes beside `source` (as written: a bfloat16
    graph's cast of it not applied, so its √2 is still √2), or None."""
    names = [_node_name(name) for name in node.input]
    if len(names) != 2 or source not in names:
        return None
    value = constant_value(names[1 - names.index(source)], nodes, cast=False)
    return float(value) if value is not None and np.ndim(value) == 0 else None


def _node_name(source):
    """A data input's node ("name:0" and "name" alike; other outputs keep their index)."""
    return source[:-2] if source.endswith(":0") else source
