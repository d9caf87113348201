"""A frozen serving graph's self-attention as one op of ours, on the real rows alone.

The exported encoder computes its dense layers on the real tokens' rows only
(`modeling/real_rows.py`) and lays them out as [batch, seq] for attention alone: per layer,
three gathers pad the query, key and value back, three reshapes and transposes split the
heads, then the scores' product, the scale, the mask, the softmax, the context's product, a
transpose, a reshape and a gather packing the rows again. `BertPackedAttention`
(`finetuning/kernels/`, built by `custom_ops`) does all of that in one call on the packed rows:
each (sequence, head) attends over its own rows only, in float32, with no padding, no
layout changes and no cast around the softmax. In a 160-token SQuAD request (bf16, the Xeon
of bench/README.md) those ops were 3.7 of 13.0 ms: the softmax 1.27, the two products 1.29,
the 28 gathers 1.14.

The rewrite is made at load on the frozen GraphDef, under the packing gather's name so that
its readers are untouched; the SavedModel stays TensorFlow's own ops (TF Serving and Triton
serve it as exported). It matches the pattern `modeling/attention.py` exports with real rows,
structurally (ops, their order, one reader for every node it removes), and leaves anything
else as it is: exports without real rows, packed-row biases, a head size not a multiple of
16. Nothing is rewritten where a GPU would run the graph, where the kernel library cannot be
built (`custom_ops.library()` says why) or with `BERT_PACKED_ATTENTION=0`.
"""
import tensorflow as tf

from finetuning import custom_ops
from finetuning.graph_nodes import readers, rebuilt, scalar_of, static_shapes

tf1 = tf.compat.v1

OP = "BertPackedAttention"
_HEADS_FIRST = [0, 2, 1, 3]


def enabled():
    """Whether the rewrite may run in this process (no GPU, not switched off)."""
    return custom_ops.allowed("BERT_PACKED_ATTENTION")


def kernel_isa():
    """The widest vector code the op may use: AVX-512 unless oneDNN is capped below it
    (`ONEDNN_MAX_CPU_ISA=AVX2`, how an AVX2 CPU is stood in for), so that both stay below the
    same line; the op falls back further where the CPU lacks it."""
    from modeling.core import onednn_isa_cap
    cap = onednn_isa_cap()
    if not cap or cap in ("ALL", "DEFAULT") or "AVX512" in cap or "AVX10" in cap:
        return "avx512"
    return "avx2" if cap.startswith("AVX2") else "generic"


def pack_attention(graph_def):
    """`graph_def` with each matched self-attention made one `BertPackedAttention` node.
    Returns a new GraphDef and the number rewritten (0, the graph unchanged, where the
    rewrite may not run or the kernel cannot be had)."""
    if not enabled():
        return graph_def, 0
    matches = _matches(graph_def)
    if not matches:
        return graph_def, 0
    if custom_ops.library() is None:
        return graph_def, 0
    removed = {name for _, names in matches.values() for name in names}
    replaced = {name: node for name, (node, _) in matches.items()}
    return rebuilt(graph_def, replaced, removed), len(matches)


def _matches(graph_def):
    """{packing gather's name: (the new NodeDef, names of the nodes it replaces)}."""
    nodes = {node.name: node for node in graph_def.node}
    read_by = readers(graph_def)
    shapes = None
    isa = kernel_isa()
    matches = {}
    for node in graph_def.node:
        if node.op != "GatherV2" or not _is_zero_axis(nodes, node.input[2]):
            continue
        if shapes is None:
            shapes = static_shapes(graph_def)
        found = _match(node, nodes, read_by, shapes)
        if found is not None:
            replacement, removed = found
            replacement.attr["isa"].s = isa.encode()
            matches[node.name] = (replacement, removed)
    return matches


class _Chain:
    """Walks up a chain of nodes, keeping the names it passes to remove them."""

    def __init__(self, nodes, read_by):
        self.nodes, self.read_by, self.removed = nodes, read_by, set()

    def node(self, source, op, kept=False):
        """The node `source` names if it is a `op` (a str or a tuple of them), read by one
        node only unless `kept`, with no control input; else None."""
        if source.startswith("^") or ":" in source:
            return None
        node = self.nodes.get(source)
        ops = (op,) if isinstance(op, str) else op
        if node is None or node.op not in ops or any(i.startswith("^") for i in node.input):
            return None
        if not kept:
            if len(self.read_by.get(source, ())) != 1:
                return None
            self.removed.add(source)
        return node

    def skip_casts(self, source):
        """The first input up `source`'s chain of single-reader casts (those removed too)."""
        node = self.nodes.get(source)
        while node is not None and node.op == "Cast" and ":" not in source:
            if len(self.read_by.get(source, ())) != 1:
                return None
            self.removed.add(source)
            source = node.input[0]
            node = self.nodes.get(source)
        return source


def _match(pack, nodes, read_by, shapes):
    """(NodeDef, removed names) where `pack` packs an attention's context."""
    chain = _Chain(nodes, read_by)
    reshape = chain.node(pack.input[0], "Reshape")
    transpose = reshape and chain.node(reshape.input[0], "Transpose")
    if transpose is None or _const(nodes, transpose.input[1]) != _HEADS_FIRST:
        return None
    context = chain.node(transpose.input[0], "BatchMatMulV2")
    if context is None or context.attr["adj_x"].b or context.attr["adj_y"].b:
        return None
    probs_source = chain.skip_casts(context.input[0])
    softmax = probs_source and chain.node(probs_source, "Softmax")
    scores_source = softmax and chain.skip_casts(softmax.input[0])
    add = scores_source and chain.node(scores_source, "AddV2")
    if add is None:
        return None
    for scaled_side in (0, 1):  # the side that is a Mul of a BatchMatMulV2
        candidate = nodes.get(add.input[scaled_side])
        if (candidate is not None and candidate.op == "Mul"
                and any(getattr(nodes.get(source), "op", None) == "BatchMatMulV2"
                        for source in candidate.input)):
            mul = chain.node(add.input[scaled_side], "Mul")
            bias = add.input[1 - scaled_side]
            break
    else:
        return None
    if mul is None:
        return None
    bias_shape = shapes.get(bias)
    if bias_shape is None or bias_shape.rank != 4 or bias_shape[1] != 1 or bias_shape[2] != 1:
        return None  # a packed-row bias [batch, 1, seq, seq] masks per query: not ours
    for product_side in (0, 1):
        product = chain.node(mul.input[product_side], "BatchMatMulV2")
        if product is not None:
            scale = _scalar(nodes, mul.input[1 - product_side])
            break
    else:
        return None
    if scale is None or product.attr["adj_x"].b or not product.attr["adj_y"].b:
        return None
    heads_of = [_heads_input(chain, source, pack.input[1]) for source in
                (product.input[0], product.input[1], context.input[1])]
    if any(found is None for found in heads_of):
        return None
    projections = [projection for projection, _ in heads_of]
    shape = shapes.get(heads_of[0][1])
    if shape is None or shape.rank != 4 or shape[1] is None or shape[3] is None:
        return None
    heads, head_size = int(shape[1]), int(shape[3])
    dtype = pack.attr["Tparams"].type
    if head_size % 16 or dtype not in (tf.float32.as_datatype_enum, tf.bfloat16.as_datatype_enum):
        return None
    mask = _only_placeholder_above(nodes, bias)
    if mask is None or nodes[mask].attr["dtype"].type != tf.int32.as_datatype_enum:
        return None
    if dtype == tf.bfloat16.as_datatype_enum and nodes[mul.name].attr["T"].type == dtype:
        scale = float(tf.cast(tf.cast(scale, tf.bfloat16), tf.float32))  # as the graph rounds it
    replacement = tf1.NodeDef(name=pack.name, op=OP, device=pack.device)
    replacement.input.extend(projections + [mask])
    replacement.attr["T"].type = dtype
    replacement.attr["num_heads"].i = heads
    replacement.attr["scale"].f = scale
    return replacement, chain.removed - {pack.name}


def _heads_input(chain, source, rows):
    """(the projection [n, hidden], the transposed node's name) where `source` is
    Transpose(Reshape(GatherV2(projection, slots))) to heads first; the gather must not use
    the packing gather's indices `rows` (it pads, it does not pack)."""
    transpose = chain.node(source, "Transpose")
    if transpose is None or _const(chain.nodes, transpose.input[1]) != _HEADS_FIRST:
        return None
    reshape = chain.node(transpose.input[0], "Reshape")
    gather = reshape and chain.node(reshape.input[0], "GatherV2")
    if gather is None or gather.input[1] == rows or not _is_zero_axis(chain.nodes, gather.input[2]):
        return None
    return gather.input[0], transpose.name


def _const(nodes, source):
    node = nodes.get(source)
    if node is None or node.op != "Const":
        return None
    return tf.make_ndarray(node.attr["value"].tensor).tolist()


def _is_zero_axis(nodes, source):
    return _const(nodes, source) == 0


def _scalar(nodes, source):
    """The float a scalar constant (or a cast of one) holds, or None."""
    node = nodes.get(source)
    while node is not None and node.op == "Cast":
        node = nodes.get(node.input[0])
    return scalar_of(node)


def _only_placeholder_above(nodes, source):
    """The one Placeholder `source` is computed from, or None (none, or more than one)."""
    seen, pending, found = set(), [source], set()
    while pending:
        name = pending.pop().lstrip("^").split(":")[0]
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        if nodes[name].op == "Placeholder":
            found.add(name)
        pending.extend(nodes[name].input)
    return found.pop() if len(found) == 1 else None
