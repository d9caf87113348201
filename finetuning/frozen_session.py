"""The session a frozen serving graph runs in: the weights frozen to constants and the graph
rewritten once at load (`freeze`), and a served call as one C call (`SessionCall`)."""
import os
import sys

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from finetuning.add_layer_norm import fuse_add_layer_norms
from finetuning.eigen_transpose import transpose_as_integers
from finetuning.fused_attention_scores import fuse_attention_scores
from finetuning.fused_layer_norm import many_rows, many_rows_variant
from finetuning.fused_layer_norm import PREFIX as MANY_ROWS_PREFIX
from finetuning.int8_dense import onednn_enabled, quantize_dense_layers
from finetuning.packed_attention import pack_attention
from finetuning.packed_dense import int8_kernel, pack_dense_layers
from finetuning.weight_blocking import MID_ROWS, mid_rows_variant

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

    `variants` ([(range of real tokens, {output tensor name: its name in the variant's
    copy})], none by default): a call whose batch's real tokens fall in a variant's range
    fetches that copy, the first such; any other call the graph as it was. `freeze` makes
    them: oneDNN's dense layers from `packed_dense.AVX512_MANY_ROWS` tokens where ours serve
    fewer, oneDNN's layer norm from `fused_layer_norm.many_rows()` tokens (faster there, slower
    below), float32 dense layers whose weights stay blocked for `weight_blocking.MID_ROWS`."""

    def __init__(self, session, inputs, outputs, variants=()):
        self._session, self._inputs, self._outputs = session, inputs, outputs
        self.variants = list(variants)
        self._callables = {}

    def __call__(self, inputs):
        names = tuple(sorted(inputs))
        fetches = list(self._outputs.values())
        if self.variants:
            real = _real_tokens(inputs)
            copy = next((names_in for rows, names_in in self.variants if real in rows), None)
            if copy is not None:
                fetches = [copy[name] for name in fetches]
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
    reads at serving time, and Grappler sees the weights as constants. Each layer's
    attention is our one op on the real rows (`packed_attention`), each residual add and
    layer norm another (`add_layer_norm`) and each dense layer with its GELU another
    (`packed_dense`: in float32, with AVX-512 a copy keeping oneDNN's for many rows; in
    bfloat16 on AMX's tiles or AVX512_BF16, in int8 on AMX's, VNNI or AVX2, where the CPU has
    them), where our kernels can be had (`custom_ops`).
    Without them, attention's scores are scaled and masked inside their product
    (`fused_attention_scores`), its transposes run on TensorFlow's own kernel
    (`eigen_transpose`: oneDNN's costs ~40 us a call however small), and a copy of the
    graph with oneDNN's layer norm serves calls of many rows (`fused_layer_norm`). Returns
    the session (its ops one at a time where ours are in it: `session_config`) and the
    variants `SessionCall` picks from: those copies and, in float32
    without our dense layers, the copy whose dense layers serve 7-80 rows
    (`weight_blocking`); none where there is no such copy."""
    graph = session.graph
    keep = sorted({name.split(":")[0] for name in fetches})
    frozen = tf1.graph_util.convert_variables_to_constants(session, graph.as_graph_def(), keep)
    session.close()
    ours_int8 = precision == "int8" and int8_kernel() is not None  # AMX, VNNI or AVX2
    if precision == "int8" and not ours_int8:  # else our op, below
        frozen, _ = quantize_dense_layers(frozen, keep)
    elif precision == "bf16":
        from finetuning.bf16_graph import bfloat16_graph
        frozen = bfloat16_graph(frozen, keep)
    frozen, attentions = pack_attention(frozen)  # attention on the real rows, one op a layer
    frozen, ours = fuse_add_layer_norms(frozen)  # residual add and layer norm, one op each
    # dense layers (and GELU) one op each; bf16 on AMX or AVX512_BF16, int8 on AMX, VNNI or AVX2
    frozen, dense, many_dense = pack_dense_layers(frozen, fetches, precision)
    if ours_int8 and onednn_enabled():
        # the layers our op cannot take (a depth not a multiple of 64, a width not of 32)
        frozen, _ = quantize_dense_layers(frozen, keep)
    frozen, _ = fuse_attention_scores(frozen)  # scale and mask inside the product
    frozen, _ = transpose_as_integers(frozen)  # Eigen's transposes, not oneDNN's
    variants = [many_dense] if many_dense else []
    if not ours and not many_dense:  # oneDNN's layer norms for many rows, where ours are not
        frozen, many = many_rows_variant(frozen, fetches)
        variants += [(range(many_rows(), sys.maxsize), many)] if many else []
    if precision == "fp32" and not dense:  # weight blocking follows the rows (weight_blocking)
        frozen, mid_rows = mid_rows_variant(frozen, fetches, skip_prefix=MANY_ROWS_PREFIX)
        variants += [(MID_ROWS, mid_rows)] if mid_rows else []
    target = tf.Graph()
    with target.as_default():
        tf1.import_graph_def(frozen, name="")
    return tf1.Session(graph=target, config=session_config(attentions or ours or dense)), variants


def session_config(our_ops):
    """The serving session's ConfigProto: where the graph runs `our_ops` (a count), one
    inter-op thread, so that its ops run one after another, each on the team of threads our
    kernels share (finetuning/kernels/team.h). With TensorFlow's default (a thread a core) a
    layer's query, key and value ran beside one another, one holding the team and the others
    on TensorFlow's pool: on a Zen 4 capped at AVX2, SQuAD requests at batch 1 took 1.025x
    less time with the team, 1.07x with the team and one inter-op thread, 1.005x with one
    inter-op thread alone (bench/README.md). A TF_NUM_INTEROP_THREADS the user set stands."""
    config = config_pb2.ConfigProto()
    if our_ops and not os.environ.get("TF_NUM_INTEROP_THREADS"):
        # a pool of its own: `inter_op_parallelism_threads` would size the process's shared
        # pool, made by the first session (the SavedModel's loading) and not by this one
        config.session_inter_op_thread_pool.add(num_threads=1)
    return config
