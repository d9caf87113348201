"""A frozen serving graph's attention scores in one oneDNN call instead of three.

Attention scores are `matmul(query, key^T) * 1/sqrt(head_size) + mask_bias`
([batch, heads, seq, seq] from [batch, 1, 1, seq]). As three ops, the scaled and the masked
scores are each written out and read back whole; in a bfloat16 graph the multiply and the
add also run on Eigen's element-wise bfloat16 kernels, which convert every element (at 160
tokens, 73 and 60 us against the product's 80). oneDNN does both inside the product as
post-ops (`_MklFusedBatchMatMulV2`, fused_ops Mul, Add): the kernel TensorFlow's own Grappler
remapper would use, but which it left unfused in our exports (it fused a toy graph of the
same pattern in bfloat16 only), so the rewrite is done here, on the frozen GraphDef, under
the add's name so that its consumers are untouched.

Measured on a 2-core Zen 5 serving all-MiniLM-L6-v2 (one process, the two graphs alternating,
paired medians): a 160-token SQuAD request 9.2 -> 8.4 ms in bf16 (8.8%), 13.4 -> 12.9 ms in
fp32; 8 x 170 tokens 45.8 -> 41.3 ms in bf16 (9.3%), 67.9 -> 66.4 in fp32; a 25-token SST-2
request 2-3% in both. fp32 answers are bit for bit the same; bfloat16's move by a rounding
(the scaled, masked scores now rounded once, in float32 inside the kernel, not three times).

The kernel exists only where oneDNN is on, on the CPU: nothing is rewritten without oneDNN
(TF_ENABLE_ONEDNN_OPTS=0) or where a GPU would run the graph, and bfloat16 products only on
a CPU that multiplies bfloat16 natively, which is where a bf16 serving graph runs them.
"""
import tensorflow as tf

from finetuning.graph_nodes import (fusion_available, has_control_input, readers, rebuilt,
                                    static_shapes)

tf1 = tf.compat.v1

FUSED_OP = "_MklFusedBatchMatMulV2"


def fuse_attention_scores(graph_def):
    """`graph_def` with each `AddV2(Mul(BatchMatMulV2(a, b), scalar), addend)` whose addend is
    [batch, 1, 1 or rows, columns] made one `_MklFusedBatchMatMulV2(a, b, scalar, addend)`
    named as the add; the rest copied as it is. Returns a new GraphDef and the number fused
    (0, the graph unchanged, where `fusion_available()` says no)."""
    fused = _fusions(graph_def) if fusion_available() else {}
    removed = {name for node in fused.values() for name in node.removed}
    replaced = {name: fusion.node for name, fusion in fused.items()}
    return rebuilt(graph_def, replaced, removed), len(fused)


class _Fusion:
    def __init__(self, node, removed):
        self.node, self.removed = node, removed


def _fusions(graph_def):
    """{add's name: _Fusion} for each add the pattern matches."""
    nodes = {node.name: node for node in graph_def.node}
    read_by = readers(graph_def)
    shapes = static_shapes(graph_def)
    fusible_types = _fusible_types()

    def only_output_read_once(name):
        node = nodes.get(name)
        return (node is not None and len(read_by.get(name, ())) == 1
                and not has_control_input(node))

    fused = {}
    for add in graph_def.node:
        if add.op != "AddV2" or has_control_input(add):
            continue
        for mul_side in (0, 1):
            mul_name, addend = add.input[mul_side], add.input[1 - mul_side]
            if ":" in mul_name or not only_output_read_once(mul_name):
                continue
            mul = nodes[mul_name]
            if mul.op != "Mul":
                continue
            match = _product_and_scale(mul, nodes, only_output_read_once, shapes)
            addend_shape = shapes.get(addend)
            if (match is None or addend_shape is None or addend_shape.rank != 4
                    or addend_shape[1] != 1 or add.attr["T"].type not in fusible_types):
                continue
            product, scale = match
            node = tf1.NodeDef(name=add.name, op=FUSED_OP, device=add.device)
            node.input.extend([product.input[0], product.input[1], scale, addend])
            for attr in ("T", "adj_x", "adj_y"):
                node.attr[attr].CopyFrom(product.attr[attr])
            node.attr["num_args"].i = 2
            node.attr["fused_ops"].list.s.extend([b"Mul", b"Add"])
            fused[add.name] = _Fusion(node, {product.name, mul.name})
            break
    return fused


def _product_and_scale(mul, nodes, only_output_read_once, shapes):
    """(the BatchMatMulV2 node, the scalar's input name) of `mul`, or None."""
    for product_side in (0, 1):
        product_name, scale = mul.input[product_side], mul.input[1 - product_side]
        if ":" in product_name or not only_output_read_once(product_name):
            continue
        product = nodes[product_name]
        scale_shape = shapes.get(scale)
        if (product.op == "BatchMatMulV2" and scale_shape is not None
                and scale_shape.rank == 0):
            return product, scale
    return None


def _fusible_types():
    from modeling.core import cpu_has_native_bfloat16, onednn_capped_below_bfloat16
    types = {tf.float32.as_datatype_enum}
    if cpu_has_native_bfloat16() and not onednn_capped_below_bfloat16():
        types.add(tf.bfloat16.as_datatype_enum)
    return types
