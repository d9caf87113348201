"""The measuring program of the multi-node network check: timed allreduces of the recipe's
gradient size, one process a rank, rank 0 writing what it measured as JSON.

    horovodrun -np 16 -H node1:8,node2:8 python -m runtime.allreduce_check \\
        --bytes 672452216 --iterations 10 --output allreduce.json
    under Slurm: srun ... python -m runtime.slurm_launch task -- \\
        python -m runtime.allreduce_check ...

Started with NCCL_DEBUG=INFO, its ranks' output also says which transport NCCL took
(runtime/nccl_log.py reads it). Each rank allreduces (Horovod, op Sum) one tensor of --bytes:
float16 on its GPU, which Horovod hands to NCCL when built with it, or float32 on the CPU (Gloo
or MPI). A warm-up allreduce first (it includes NCCL's connection set-up, seconds on a large
job), its result checked; then --iterations timed ones, each started together on every rank
(a one-element allreduce before it) and timed to its result being usable. An iteration's time
is the slowest rank's (the collective ends when the last rank has its data); bandwidths are
nccl-tests' (runtime/allreduce_bandwidth.py) from the mean time, as nccl-tests reports.

TensorFlow use is eager TF2 and horovod.tensorflow, nothing of the training graph. Bad input
(--bytes, --iterations, --output) is one line on stderr and exit status 2; an output rank 0
cannot write is found before the first allreduce and every rank stops with the same line.
"""
import argparse
import json
import math
import os
import socket
import statistics
import sys
import time

from reporting.errors import UsageError
from runtime.allreduce_bandwidth import BYTES_PER_ELEMENT, algbw, busbw, bus_factor

DEFINITIONS = ("nccl-tests doc/PERFORMANCE.md: algbw = bytes / time, allreduce busbw = algbw x "
               "2(n-1)/n, GB = 1e9 bytes; time = the slowest rank's, bandwidths from the mean")


class CheckFailed(RuntimeError):
    """The allreduce ran but gave a wrong result."""


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m runtime.allreduce_check",
        description="Timed allreduces of one tensor, one process a Horovod rank.")
    parser.add_argument("--bytes", type=int, required=True,
                        help="size of the allreduced tensor in bytes (the recipe's gradients)")
    parser.add_argument("--iterations", type=int, default=10, help="timed allreduces")
    parser.add_argument("--warmup", type=int, default=1, help="untimed allreduces first")
    parser.add_argument("--output", required=True, help="JSON file rank 0 writes")
    parser.add_argument("--horovod", action="store_true",
                        help="accepted and ignored: the launchers add it to every trainer")
    parser.add_argument("--allow_cpu", action="store_true",
                        help="run on the CPU where a GPU was expected")
    args = parser.parse_args(argv)
    for flag, value, least in (("--bytes", args.bytes, 1), ("--iterations", args.iterations, 1),
                               ("--warmup", args.warmup, 1)):
        if value < least:
            raise UsageError(f"{flag} must be at least {least}, got {value}")
    folder = os.path.dirname(os.path.abspath(args.output))
    if os.path.isdir(args.output):
        raise UsageError(f"--output {args.output}: is a directory; name the JSON file")
    return args, folder


def output_problem(path, folder):
    """Why rank 0 cannot write `path`, or None."""
    if not os.path.isdir(folder):
        return f"--output {path}: folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"--output {path}: folder {folder} is not writable"
    return None


def nccl_version(code):
    """hvd.nccl_built()'s NCCL_VERSION_CODE as "2.16.5" (None: built without NCCL). The code
    is major*1000+minor*100+patch before NCCL 2.9, major*10000+minor*100+patch since."""
    if not code:
        return None
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def summary(nbytes, ranks, rank_times):
    """Per-iteration times agreed over ranks (each the slowest rank's) and the bandwidths of
    their mean. `rank_times`: one list of seconds per rank."""
    times = [max(column) for column in zip(*rank_times)]
    mean = statistics.fmean(times)
    return {
        "times_s": times,
        "time_s": {"mean": mean, "median": statistics.median(times), "min": min(times),
                   "max": max(times)},
        "algbw_GBps": algbw(nbytes, mean),
        "busbw_GBps": busbw(nbytes, mean, ranks),
        "busbw_best_GBps": busbw(nbytes, min(times), ranks),
        "bus_factor": bus_factor(ranks),
    }


def _write_json(path, result):
    """Whole or not at all: a temporary file renamed over `path`."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
        handle.write("\n")
    os.replace(temporary, path)


def measure(args, folder):
    import numpy as np
    import tensorflow as tf

    from runtime.distributed import Workers

    workers = Workers(use_horovod=True, allow_cpu=args.allow_cpu)
    import horovod.tensorflow as hvd

    # Rank 0's output is checked before anything is timed; every rank learns the verdict.
    problem = hvd.broadcast_object(
        output_problem(args.output, folder) if workers.rank == 0 else None, root_rank=0,
        name="allreduce_check_output")
    if problem:
        raise UsageError(problem)

    on_gpu = bool(workers.gpus)
    dtype = "float16" if on_gpu else "float32"
    elements = math.ceil(args.bytes / BYTES_PER_ELEMENT[dtype])
    nbytes = elements * BYTES_PER_ELEMENT[dtype]
    device = "/GPU:0" if on_gpu else "/CPU:0"  # a rank sees only its own GPU (Workers)
    try:
        with tf.device(device):
            tensor = tf.ones([elements], getattr(tf, dtype))
    except tf.errors.ResourceExhaustedError:
        raise UsageError(f"--bytes {args.bytes}: no room for the tensor on {device}") from None

    def barrier():
        with tf.device("/CPU:0"):
            hvd.allreduce(tf.zeros([1]), op=hvd.Sum, name="allreduce_check_barrier").numpy()

    def allreduce():
        with tf.device(device):
            result = hvd.allreduce(tensor, op=hvd.Sum, name="allreduce_check")
            return result[-1:].numpy()  # waits for the whole result, copies one element

    for _ in range(args.warmup):
        last = allreduce()
    if float(last[0]) != workers.size:
        raise CheckFailed(f"the warm-up allreduce summed {workers.size} ones to "
                           f"{float(last[0])}: the allreduce itself is broken")
    times = []
    for _ in range(args.iterations):
        barrier()
        start = time.perf_counter()
        allreduce()
        times.append(time.perf_counter() - start)

    with tf.device("/CPU:0"):
        gathered = hvd.allgather(tf.constant([times], tf.float64),
                                 name="allreduce_check_times").numpy()
    host = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
    hosts = hvd.allgather_object(host, name="allreduce_check_hosts")
    if workers.rank != 0:
        return None
    result = {
        "ranks": workers.size, "nodes": hvd.cross_size(), "local_size": hvd.local_size(),
        "hosts": list(hosts), "bytes": nbytes, "requested_bytes": args.bytes, "dtype": dtype,
        "elements": elements, "iterations": args.iterations, "warmup": args.warmup,
        "device": workers.describe_devices(),
        "controller": "mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else None,
        "nccl_built": bool(hvd.nccl_built()), "nccl_version_built": nccl_version(
            hvd.nccl_built()),
        "nccl_used": bool(hvd.nccl_built()) and on_gpu,
        "horovod_hierarchical_allreduce": os.environ.get("HOROVOD_HIERARCHICAL_ALLREDUCE"),
        # the launcher's choice of network and why (runtime/slurm_launch.py, launch_common.sh)
        "network": os.environ.get("BERT_NETWORK_CHOICE"),
        "interface": (os.environ.get("NCCL_SOCKET_IFNAME")
                      or os.environ.get("HOROVOD_GLOO_IFACE") or None),
        "tensorflow_version": tf.__version__, "rank_times_s": np.asarray(gathered).tolist(),
        "definitions": DEFINITIONS,
    }
    result.update(summary(nbytes, workers.size, result["rank_times_s"]))
    _write_json(args.output, result)
    return result


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args, folder = parse_args(argv)
        result = measure(args, folder)
    except UsageError as error:
        print(f"allreduce_check: {error}", file=sys.stderr)
        return 2
    except CheckFailed as error:
        print(f"allreduce_check: {error}", file=sys.stderr)
        return 1
    if result:
        print(f"allreduce_check: {result['bytes']:,} bytes ({result['dtype']}) over "
              f"{result['ranks']} rank(s) on {result['nodes']} node(s), "
              f"{'NCCL' if result['nccl_used'] else result['controller']}: mean "
              f"{result['time_s']['mean'] * 1e3:.2f} ms, algbw {result['algbw_GBps']:.3f} GB/s, "
              f"busbw {result['busbw_GBps']:.3f} GB/s -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
