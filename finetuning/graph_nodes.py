"""What the load-time rewrites of a frozen serving graph (`fused_attention_scores`,
`fused_layer_norm`, `int8_dense`, `packed_attention`, `add_layer_norm`, `packed_dense`) ask
of a GraphDef: who reads a node, whether it waits on a control input, the static shapes
TensorFlow infers, the encoder's dense layers, and whether oneDNN's fused kernels run."""
import numpy as np
import tensorflow as tf
from tensorflow.python.util import _pywrap_util_port

tf1 = tf.compat.v1

WEIGHT_BYTES = 4096  # constants larger than this are weights: their values shape nothing
ENCODER_SCOPE = "/encoder/"  # the dense layers int8 and our float32 kernel rewrite


def fusion_available():
    """Whether this process has oneDNN's fused batched matmul and no GPU to run the graph."""
    return _pywrap_util_port.IsMklEnabled() and not tf.config.list_physical_devices("GPU")


def readers(graph_def):
    """{node name: [names of the nodes reading it, once per input, control inputs too]}."""
    read_by = {}
    for node in graph_def.node:
        for source in node.input:
            read_by.setdefault(source.lstrip("^").split(":")[0], []).append(node.name)
    return read_by


def fed_by(graph_def, roots):
    """Names of `roots` and every node reading them, directly or not."""
    read_by = readers(graph_def)
    reached, pending = set(roots), list(roots)
    while pending:
        for reader in read_by.get(pending.pop(), ()):
            if reader not in reached:
                reached.add(reader)
                pending.append(reader)
    return reached


def with_copy(graph_def, fetches, copied, prefix, replaced=None):
    """(GraphDef, {fetch: its name in the copy}): `graph_def` plus a copy of the nodes named
    in `copied` (closed under readers: `fed_by`) under `prefix`, each NodeDef taken from
    `replaced` where it names one; the copy reads the original's nodes it did not copy (the
    inputs, the weights' constants: not held twice)."""
    replaced = replaced or {}

    def renamed(source):
        control, name = ("^", source[1:]) if source.startswith("^") else ("", source)
        return control + prefix + name if name.split(":")[0] in copied else source

    combined = tf1.GraphDef()
    combined.CopyFrom(graph_def)
    for node in graph_def.node:
        if node.name not in copied:
            continue
        copy = combined.node.add()
        copy.CopyFrom(replaced.get(node.name, node))
        copy.name = prefix + node.name
        copy.input[:] = [renamed(source) for source in copy.input]
    return combined, {fetch: renamed(fetch) for fetch in fetches}


def rebuilt(graph_def, replaced, removed=frozenset(), source_of=None):
    """A new GraphDef of `graph_def`'s nodes, each NodeDef taken from `replaced` (by name)
    where it names one, those named in `removed` left out, and every input passed through
    `source_of` (input name -> input name) where given; versions and library kept."""
    rewritten = tf1.GraphDef()
    rewritten.versions.CopyFrom(graph_def.versions)
    rewritten.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name in removed:
            continue
        copy = rewritten.node.add()
        copy.CopyFrom(replaced.get(node.name, node))
        if source_of is not None:
            copy.input[:] = [source_of(source) for source in copy.input]
    return rewritten


def scalar_of(node):
    """The float a scalar Const NodeDef holds; None for any other node (None too)."""
    if node is None or node.op != "Const":
        return None
    value = tf.make_ndarray(node.attr["value"].tensor)
    return float(value) if value.ndim == 0 else None


def constant_value(name, nodes, cast=True):
    """The value a tensor `name` always holds where it is a Const behind Identity and Cast
    nodes (each Cast applied: a float32 weight cast to bfloat16 is the bfloat16 values, as
    the bf16 graph computes them; the Const's own value with `cast` False), with `nodes`
    {name: NodeDef}; None for anything else."""
    node, casts = nodes.get(name.split(":")[0]), []
    while node is not None and node.op in ("Identity", "Cast"):
        if node.op == "Cast":
            casts.append(tf.as_dtype(node.attr["DstT"].type).as_numpy_dtype)
        node = nodes.get(node.input[0].split(":")[0])
    if node is None or node.op != "Const":
        return None
    value = tf.make_ndarray(node.attr["value"].tensor)
    for dtype in reversed(casts if cast else []):  # the Const's reader first
        value = value.astype(dtype)
    return value


class _Constants:
    """A GraphDef's nodes by name, with the constant behind a chain of Identity and Cast
    nodes."""

    def __init__(self, graph_def):
        self.nodes = {node.name: node for node in graph_def.node}
        self.consumers = {name: len(names) for name, names in readers(graph_def).items()}

    def constant(self, name):
        return constant_value(name, self.nodes)


def dense_layers(graph_def, scope=ENCODER_SCOPE, dtype=tf.float32):
    """The rewritable dense layers of `graph_def`: (BiasAdd node, activation tensor name,
    weight [in, out] float32, bias [out] float32) for each MatMul in `dtype` on a constant
    2-D weight whose one consumer is a BiasAdd on a constant bias, inside `scope`. In a
    bfloat16 graph the weight and bias are its bfloat16 values (exact in float32)."""
    graph = _Constants(graph_def)
    found = []
    for node in graph_def.node:
        if node.op != "BiasAdd" or scope not in "/" + node.name:
            continue
        matmul = graph.nodes.get(node.input[0].split(":")[0])
        if (matmul is None or matmul.op != "MatMul" or matmul.attr["transpose_a"].b
                or matmul.attr["transpose_b"].b or graph.consumers.get(matmul.name) != 1
                or matmul.attr["T"].type != dtype.as_datatype_enum):
            continue
        weight, bias = graph.constant(matmul.input[1]), graph.constant(node.input[1])
        if weight is None or bias is None or weight.ndim != 2 or bias.shape != weight.shape[1:]:
            continue
        activation = matmul.input[0] if ":" in matmul.input[0] else matmul.input[0] + ":0"
        found.append((node, activation, weight.astype(np.float32), bias.astype(np.float32)))
    return found


def has_control_input(node):
    return any(source.startswith("^") for source in node.input)


def static_shapes(graph_def):
    """{output name (node name for output 0): TensorShape} as TensorFlow infers them. The
    weights' constants stand in as placeholders of their shape: the same shapes follow,
    without copying the weights into a second graph."""
    outline = tf1.GraphDef()
    outline.versions.CopyFrom(graph_def.versions)
    outline.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        copy = outline.node.add()
        tensor = node.attr["value"].tensor if node.op == "Const" else None
        if tensor is not None and len(tensor.tensor_content) > WEIGHT_BYTES:
            copy.name, copy.op, copy.device = node.name, "Placeholder", node.device
            copy.attr["dtype"].type = tensor.dtype
            copy.attr["shape"].shape.CopyFrom(tensor.tensor_shape)
        else:
            copy.CopyFrom(node)
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(outline, name="")
    shapes = {}
    for operation in graph.get_operations():
        for index, output in enumerate(operation.outputs):
            name = operation.name if index == 0 else f"{operation.name}:{index}"
            shapes[name] = output.shape
    return shapes
