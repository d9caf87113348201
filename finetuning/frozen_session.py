"""The session a frozen serving graph runs in: the weights frozen to constants and the graph
rewritten once at load (`freeze`), and a served call as one C call (`SessionCall`)."""
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from finetuning.eigen_transpose import transpose_as_integers
from finetuning.fused_attention_scores import fuse_attention_scores
from finetuning.fused_layer_norm import MANY_ROWS, many_rows_variant

tf1 = tf.compat.v1


class SessionCall:
    """Runs a session's `outputs` (output name -> tensor name) on the `inputs` a call gives
    (a dict of arrays by input name; `inputs` maps input names to tensor names), returning
    a dict of numpy arrays by output name.

    Each set of inputs given gets one handle-based callable
    (`Session._make_callable_from_options`, what Keras's graph-mode functions call; private
    API of the pinned TensorFlow 2.15): a call is then one C call. `Session.make_callable`
    with feeds only wraps `session.run`, whose parsing of fetches and feeds each call cost
    0.38-0.40 ms of a ~4 ms batch-1 request (2-core Zen 5, paired in one process).

    `many_rows` ({output tensor name: the name of its many-rows copy}, empty for none): a
    call whose batch holds at least `fused_layer_norm.MANY_ROWS` real tokens fetches the copy
    (the graph's variant with oneDNN's layer norm, faster there and slower below)."""

    def __init__(self, session, inputs, outputs, many_rows=None):
        self._session, self._inputs, self._outputs = session, inputs, outputs
        self.many_rows = many_rows or {}
        self._callables = {}

    def __call__(self, inputs):
        names = tuple(sorted(inputs))
        fetches = list(self._outputs.values())
        if self.many_rows and _real_tokens(inputs) >= MANY_ROWS:
            fetches = [self.many_rows[name] for name in fetches]
        call = self._callables.get((names, fetches[0]))
        if call is None:
            options = config_pb2.CallableOptions(
                feed=[self._inputs[name] for name in names], fetch=fetches)
            make = self._session._make_callable_from_options  # pylint: disable=protected-access
            call = self._callables[(names, fetches[0])] = make(options)
        fetched = call(*[np.asarray(inputs[name], np.int32) for name in names])
        return dict(zip(self._outputs, fetched))


def _real_tokens(inputs):
    """The tokens a call's batch holds: its mask's ones (every position without a mask)."""
    mask = inputs.get("input_mask")
    if mask is None:
        return int(np.prod(np.shape(inputs["input_ids"])))
    return int(np.count_nonzero(mask))


# Frozen weights travel through one GraphDef (protobuf's 2 GB limit) and exist three times
# while it is made: larger models (BERT-large's 1.3 GB) are served from their variables.
FREEZE_LIMIT_BYTES = 512 * 1024 ** 2


def freeze(session, fetches, precision="fp32"):
    """A session of `session`'s graph pruned to `fetches` (tensor names) with its variables
    turned into constants (the old session is closed), computing in `precision`: no variable
    reads at serving time, and Grappler sees the weights as constants. Attention's scores
    are scaled and masked inside their product (`fused_attention_scores`), and its
    transposes run on TensorFlow's own kernel (`eigen_transpose`: oneDNN's costs ~40 us a
    call however small). Returns the session and {fetch: its name in the graph's copy with
    oneDNN's layer norm} (`fused_layer_norm.many_rows_variant`; empty without it)."""
    graph = session.graph
    keep = sorted({name.split(":")[0] for name in fetches})
    frozen = tf1.graph_util.convert_variables_to_constants(session, graph.as_graph_def(), keep)
    session.close()
    if precision == "int8":
        from finetuning.int8_dense import quantize_dense_layers
        frozen, _ = quantize_dense_layers(frozen, keep)
    elif precision == "bf16":
        from finetuning.bf16_graph import bfloat16_graph
        frozen = bfloat16_graph(frozen, keep)
    frozen, _ = fuse_attention_scores(frozen)  # scale and mask inside the product
    frozen, _ = transpose_as_integers(frozen)  # Eigen's transposes, not oneDNN's
    frozen, many_rows = many_rows_variant(frozen, fetches)  # oneDNN's layer norm for long calls
    target = tf.Graph()
    with target.as_default():
        tf1.import_graph_def(frozen, name="")
    return tf1.Session(graph=target), many_rows
