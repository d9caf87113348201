"""A frozen serving graph's transposes on TensorFlow's own kernel instead of oneDNN's.

With oneDNN on, TensorFlow's layout pass turns every float32 and bfloat16 `Transpose` into
`_MklTranspose`, a oneDNN reorder that costs ~40 us a call however small its tensor (the
primitive's set-up; a 2-core Zen 5, [1, 25, 12, 32]); TensorFlow's Eigen transpose of the
same tensor costs a few. Attention transposes four tensors a layer (query, key and value to
heads-first, the context back), so a short request's 24 transposes in a 6-layer model cost
~1 ms there. oneDNN has no transpose of integers, so the rewrite moves the same bits as
integers of their width: `Bitcast` (no copy) -> `Transpose` -> `Bitcast`, under the original
node's name so that its consumers are untouched. The result is the same bits.

Measured on a 2-core Zen 5 serving all-MiniLM-L6-v2 real requests (bench/README.md,
"Transposes off oneDNN"): at batch 1, 1.21x the requests a second in bf16, 1.10x in fp32,
1.17-1.23x in int8 under an AVX2 cap, 1.0x in fp32 there (its GEMMs are the time); larger
batches level; Eigen's transpose is no slower than oneDNN's at 32 x 384 tokens either.
"""
import tensorflow as tf

tf1 = tf.compat.v1

# float type -> the integer type of its width, which oneDNN has no transpose for
_SAME_WIDTH_INTEGER = {tf.float32.as_datatype_enum: tf.int32.as_datatype_enum,
                       tf.bfloat16.as_datatype_enum: tf.int16.as_datatype_enum}
SUFFIX = "/as_integers"


def transpose_as_integers(graph_def):
    """`graph_def` (a GraphDef) with each float32/bfloat16 `Transpose` done on its bits as
    integers of the same width; other nodes copied as they are. Returns a new GraphDef and
    the number of transposes moved."""
    names = {node.name for node in graph_def.node}
    rewritten = tf1.GraphDef()
    rewritten.versions.CopyFrom(graph_def.versions)
    rewritten.library.CopyFrom(graph_def.library)
    moved = 0
    for node in graph_def.node:
        float_type = node.attr["T"].type if node.op == "Transpose" else None
        if float_type not in _SAME_WIDTH_INTEGER:
            rewritten.node.add().CopyFrom(node)
            continue
        integer_type = _SAME_WIDTH_INTEGER[float_type]
        as_integers, transposed = node.name + SUFFIX, node.name + SUFFIX + "/transpose"
        if {as_integers, transposed} & names:
            raise ValueError(f"graph already holds a node named {as_integers!r}: "
                             "transposed twice?")
        _bitcast(rewritten.node.add(), as_integers, node.input[0], float_type, integer_type,
                 node.device)
        transpose = rewritten.node.add()
        transpose.CopyFrom(node)  # its perm input and any control inputs stay as they were
        transpose.name = transposed
        transpose.input[0] = as_integers
        transpose.attr["T"].type = integer_type
        _bitcast(rewritten.node.add(), node.name, transposed, integer_type, float_type,
                 node.device)
        moved += 1
    return rewritten, moved


def _bitcast(node, name, source, from_type, to_type, device):
    node.name, node.op, node.device = name, "Bitcast", device
    node.input.append(source)
    node.attr["T"].type = from_type
    node.attr["type"].type = to_type
