"""How many threads a rank's TensorFlow session uses, chosen from the CPUs it may run on.

TensorFlow's defaults size both thread pools by every CPU of the machine. That is wrong in
three common cases, all of which oversubscribe the cores and slow each step:

* a container or batch job limited to some CPUs (cpuset via `sched_getaffinity`, or a CFS
  quota in the cgroup's `cpu.max`): the machine's count is not the job's;
* several Horovod ranks on one CPU-only node: each must use its share, not all cores;
* the inter-op pool: on a CPU the big ops (matmuls) already use every core through the
  intra-op pool, so running several of them at once only makes them fight for the cores.
  Two inter-op threads keep small ops (input, bookkeeping) from waiting behind a matmul.

With GPUs the host threads only feed the device, and TensorFlow's defaults are kept.
The choice is logged once per rank, and `BERT_INTRA_OP_THREADS`/`BERT_INTER_OP_THREADS`
override it.
"""
import math
import os

INTER_OP_THREADS_ON_CPU = 2


def cgroup_cpu_limit(path="/sys/fs/cgroup/cpu.max"):
    """CPUs allowed by a cgroup v2 CFS quota ("200000 100000" -> 2), or None."""
    try:
        with open(path, encoding="ascii") as reader:
            quota, period = reader.read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(1, math.ceil(int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def available_cpus():
    """CPUs this process may use: its affinity mask, capped by a cgroup quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        cpus = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return min(cpus, limit) if limit else cpus


def _override(name):
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def choose_threads(ranks_on_this_node=1, has_gpu=False, cpus=None):
    """(intra_op, inter_op, why): thread-pool sizes for one rank; 0 means TensorFlow's
    default. `why` is the sentence to log."""
    intra, inter = _override("BERT_INTRA_OP_THREADS"), _override("BERT_INTER_OP_THREADS")
    if has_gpu:
        why = "GPU: TensorFlow's default host threads"
        intra, inter = intra or 0, inter or 0
    else:
        cpus = cpus or available_cpus()
        share = max(1, cpus // max(1, ranks_on_this_node))
        why = (f"{cpus} CPUs available" + (f", {ranks_on_this_node} ranks on this node"
                                           if ranks_on_this_node > 1 else ""))
        intra = intra or share
        inter = inter or min(INTER_OP_THREADS_ON_CPU, intra)
    return intra, inter, f"threads: intra-op {intra or 'default'}, inter-op " \
                         f"{inter or 'default'} ({why})"
