"""Whether XLA compiled the model's own step, read from the graphs the session really runs.

Why not TensorFlow's "Compiled cluster using XLA" log line: it is printed once per process,
for whatever XLA compiles first, and the optimizer's fused update
(`optimization.decoupled_weight_decay`, a `jit_compile` function) is compiled by XLA in runs
without XLA auto-clustering too. So a run with `--nouse_xla`, or one where auto-clustering
silently did nothing, printed it all the same.

What auto-clustering leaves behind is certain: the graph a session executes (its
partition graphs, one per device, after Grappler and XLA's passes) holds an `_XlaCompile` /
`_XlaRun` pair for every XLA cluster, and the model's matrix multiplications it clustered are
gone from it, moved into the clusters. A jit_compile function called from the graph is
compiled apart and adds no `_XlaCompile` op. `XlaEvidenceHook` asks the session for its
partition graphs once, on one run of the training loop, and counts both: clusters, and the
matmuls left outside XLA against those the training graph holds. One line in the log, one
`{"event": "xla", ...}` record in the dllog (which `bert-preflight` reads).
"""
import json
import os

import tensorflow as tf
from absl import logging

tf1 = tf.compat.v1

CLUSTER_OP = "_XlaCompile"
# The training graph's matrix products, under every name the CPU (oneDNN rewrites) and GPU
# kernels give them in the executed graphs: MatMul, BatchMatMulV2, _FusedMatMul,
# _MklMatMul, _MklFusedBatchMatMulV2, Einsum ...
MATMUL_MARKS = ("MatMul", "Einsum")


def is_matmul(op_type):
    return any(mark in op_type for mark in MATMUL_MARKS)


def count_executed(partition_graphs):
    """(XLA clusters, matmul ops outside XLA) of a run's partition graphs (GraphDefs)."""
    clusters = outside = 0
    for graph in partition_graphs:
        for node in graph.node:
            if node.op == CLUSTER_OP:
                clusters += 1
            elif is_matmul(node.op):
                outside += 1
    return clusters, outside


def evidence(clusters, matmuls_outside, matmuls_in_graph):
    """The record of what XLA compiled: the counts, and `compiled`: XLA clustered the model's
    step, i.e. there are clusters and most of the graph's matmuls are inside them (a cluster
    of a few element-wise ops beside an unclustered model does not count)."""
    inside = max(matmuls_in_graph - matmuls_outside, 0)
    return {"event": "xla", "clusters": clusters, "matmuls": matmuls_in_graph,
            "matmuls_in_xla": inside,
            "compiled": bool(clusters and matmuls_in_graph and inside * 2 > matmuls_in_graph)}


def describe(record):
    """"XLA compiled the step: 12 clusters, 96 of 98 matmuls inside them" / "no XLA cluster in
    the step (its 98 matmuls run on TensorFlow's kernels)"."""
    if not record["clusters"]:
        return f"no XLA cluster in the step (its {record['matmuls']} matmuls run on " \
               "TensorFlow's kernels)"
    verdict = "XLA compiled the step" if record["compiled"] else "XLA clustered little"
    return (f"{verdict}: {record['clusters']} cluster{'s' * (record['clusters'] != 1)}, "
            f"{record['matmuls_in_xla']} of {record['matmuls']} matmuls inside them")


class XlaEvidenceHook(tf1.train.SessionRunHook):
    """Counts, on the `at_run`-th run of the loop, what XLA compiled (module docstring); logs
    it and appends it to `dllog_path`. The partition graphs are the executor's, built once,
    so asking for them on one run costs a copy of the graph, not a rebuild."""

    def __init__(self, dllog_path=None, at_run=2):
        self._dllog_path = dllog_path
        self._at_run = max(1, int(at_run))
        self.record = None

    def begin(self):
        self._runs = 0
        self._matmuls = sum(1 for op in tf1.get_default_graph().get_operations()
                            if is_matmul(op.type))

    def before_run(self, run_context):
        self._runs += 1
        if self._runs != self._at_run:
            return None
        return tf1.train.SessionRunArgs(
            fetches=None, options=tf1.RunOptions(output_partition_graphs=True))

    def after_run(self, run_context, run_values):
        if self._runs != self._at_run or run_values.run_metadata is None:
            return
        clusters, outside = count_executed(run_values.run_metadata.partition_graphs)
        self.record = evidence(clusters, outside, self._matmuls)
        logging.info("%s", describe(self.record))
        if self._dllog_path:
            os.makedirs(os.path.dirname(os.path.abspath(self._dllog_path)), exist_ok=True)
            with open(self._dllog_path, "a", encoding="utf-8") as writer:
                writer.write(json.dumps(self.record) + "\n")
