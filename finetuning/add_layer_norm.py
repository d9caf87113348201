"""A frozen serving graph's residual adds and layer norms as one op of ours each.

After each sublayer, our encoder adds the residual and normalises the sum with ten
element-wise ops (`modeling.core.layer_norm`: two means, a difference, a square, rsqrt, the
scale and shift), each a pass over the rows; in a bfloat16 graph a cast to float32 comes
before the add and a cast back to bfloat16 after the layer norm, for the next products.
`BertAddLayerNorm` (`finetuning/kernels/layer_norm.h`, built by `custom_ops`) does the cast,
the add, the layer norm and the cast back in one pass of each row, at every row count (where
oneDNN's `_MklLayerNorm` costs ~50 us a call however small: `fused_layer_norm`).

Matched on the frozen GraphDef at load, after `packed_attention`: each layer norm
`fused_layer_norm.layer_norms` finds whose input is an `AddV2` of two [rows, width] alike,
read only by the layer norm (the encoder's residual adds, not the embeddings' broadcast sum);
the op takes the add's two inputs (one through its cast from bfloat16, if it is one) under
the layer norm's last node's name, so its readers are untouched; casts of its output to
bfloat16 are replaced by the op's second output. The rest is left as it is; dead nodes are
pruned by the session. Not where a GPU would run the graph, without the kernel library
(`custom_ops.library()` says why) or with `BERT_ADD_LAYER_NORM=0`.
"""
import tensorflow as tf

from finetuning import custom_ops
from finetuning.fused_layer_norm import layer_norms
from finetuning.graph_nodes import readers, rebuilt, static_shapes
from finetuning.packed_attention import kernel_isa

tf1 = tf.compat.v1

OP = "BertAddLayerNorm"
_FLOAT, _BFLOAT16 = tf.float32.as_datatype_enum, tf.bfloat16.as_datatype_enum


def enabled():
    """Whether the rewrite may run in this process (no GPU, not switched off)."""
    return custom_ops.allowed("BERT_ADD_LAYER_NORM")


def fuse_add_layer_norms(graph_def):
    """`graph_def` with each matched residual add and layer norm one `BertAddLayerNorm`.
    Returns a new GraphDef and the number fused (0, the graph unchanged, where the rewrite
    may not run or the kernel cannot be had)."""
    if not enabled():
        return graph_def, 0
    fused, casts = _fusions(graph_def)
    if not fused:
        return graph_def, 0
    if custom_ops.library() is None:
        return graph_def, 0
    return (rebuilt(graph_def, fused, removed=set(casts),
                    source_of=lambda source: _through(source, casts)), len(fused))


def _through(source, casts):
    """`source`, or the op's second output where `source` names a replaced cast."""
    control = source.startswith("^")
    name = source.lstrip("^")
    if name.split(":")[0] not in casts or (":" in name and not name.endswith(":0")):
        return source
    output = casts[name.split(":")[0]]
    return "^" + output.split(":")[0] if control else output  # a control input names a node


def _fusions(graph_def):
    """({layer norm's last node's name: the op's NodeDef}, {replaced cast: "<op>:1"})."""
    nodes = {node.name: node for node in graph_def.node}
    read_by = readers(graph_def)
    shapes = static_shapes(graph_def)
    isa = kernel_isa()
    fused, casts = {}, {}
    for norm in layer_norms(graph_def, shapes):
        add = nodes.get(norm.x)
        if (add is None or add.op != "AddV2" or add.attr["T"].type != _FLOAT
                or any(source.startswith("^") for source in add.input)
                or not set(read_by.get(add.name, ())) <= norm.names
                or not _same_rows(shapes, add.input)):
            continue
        x, residual = _low_input(add.input[0], nodes, read_by), add.input[1]
        if x[1] == _FLOAT:  # the other side may be the one cast from bfloat16
            other = _low_input(add.input[1], nodes, read_by)
            if other[1] == _BFLOAT16:
                x, residual = other, add.input[0]
        shift = norm.shift
        low = [reader for reader in read_by.get(shift.name, ())
               if nodes[reader].op == "Cast" and nodes[reader].attr["SrcT"].type == _FLOAT
               and nodes[reader].attr["DstT"].type == _BFLOAT16]
        node = tf1.NodeDef(name=shift.name, op=OP, device=shift.device)
        node.input.extend([x[0], residual, norm.gamma, norm.beta])
        node.attr["T"].type = x[1]
        node.attr["Tlow"].type = _BFLOAT16 if low else _FLOAT
        node.attr["epsilon"].f = norm.epsilon
        node.attr["isa"].s = isa.encode()
        fused[shift.name] = node
        casts.update({cast: shift.name + ":1" for cast in low})
    return fused, casts


def _same_rows(shapes, inputs):
    """Whether the add's two inputs are [rows, width] alike, nothing broadcast (the encoder's
    residual adds are; the embeddings' sum adds [1, seq, width] positions to [batch, seq,
    width] words, which the op does not do)."""
    first, second = (shapes.get(source) for source in inputs)
    return (first is not None and second is not None and first.rank == 2
            and first.as_list() == second.as_list() and first[1] is not None)


def _low_input(source, nodes, read_by):
    """(the input to give the op, its type): a cast from bfloat16 read only here is skipped
    (the op converts as it reads), anything else given as it is, float32."""
    node = nodes.get(source)
    if (node is not None and node.op == "Cast" and ":" not in source
            and node.attr["SrcT"].type == _BFLOAT16 and node.attr["DstT"].type == _FLOAT
            and len(read_by.get(source, ())) == 1):
        return node.input[0], _BFLOAT16
    return source, _FLOAT
