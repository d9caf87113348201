"""A float32 serving graph's dense layers for 7 to 80 rows in a copy of their own, so that
no call reorders the weights.

oneDNN's inner product (`_MklFusedMatMul`, what every dense layer of the frozen graph runs
on) wants its float32 weights in blocks whose shape follows the rows of the call: in the
oneDNN of TensorFlow 2.15 (3.2.1), 16 x 64 blocks (8 x 24 on AVX2) for 1-6 and for 81 or
more rows, 16 x 32 (8 x 16) for 7-80, the same for every dense shape of the model. A
constant weight is reordered into its blocks once and cached by the op, in the blocking of
its first call; a call that wants the other blocking reorders every weight of the model
again, each time. Real requests are of every length and the dense layers compute only their
real rows (`modeling/real_rows.py`), so a server met both: a 40-token SST-2 request took 16
ms instead of 11 (30 reorders, 4.5 ms; a 2-core Xeon with AMX, `ONEDNN_VERBOSE`), the
stream of SST-2 dev sentences at batch 1 72 instead of 103 a second.

bfloat16 weights keep one blocking at every size (AMX and AVX512_BF16, the same oneDNN), so
only a float32 graph gets the copy: everything its dense layers feed (`graph_nodes.fed_by`),
the weights' constants shared, the copy's ops with caches of their own. A call whose batch
holds `MID_ROWS` real tokens is served by the copy (`frozen_session.SessionCall`), the rest
by the graph as it was, which `SavedModelRunner.warm_up` first runs on one token.
"""
import tensorflow as tf

from finetuning.graph_nodes import fed_by, fusion_available, with_copy

MID_ROWS = range(7, 81)
PREFIX = "mid_rows/"


def mid_rows_variant(graph_def, fetches, skip_prefix=""):
    """(GraphDef, {fetch: its mid-rows name}): `graph_def` with a copy (under PREFIX) of its
    float32 matmuls and every node they feed, nodes named from `skip_prefix` (another
    variant's copy) aside. ({}, the graph unchanged) without a float32 matmul, or without
    oneDNN in this process (`graph_nodes.fusion_available`)."""
    roots = {node.name for node in graph_def.node
             if node.op == "MatMul" and node.attr["T"].type == tf.float32.as_datatype_enum
             and not (skip_prefix and node.name.startswith(skip_prefix))}
    if not roots or not fusion_available():
        return graph_def, {}
    return with_copy(graph_def, fetches, fed_by(graph_def, roots), PREFIX)
