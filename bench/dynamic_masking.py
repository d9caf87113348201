"""Dynamic vs static masking: the data each needs and the input pipeline's speed (tables,
not tests; nothing passes or fails).

1. Data. ``create_pretraining_data.py`` on one corpus (built from ../shared/data as in
   ``bench/data_prep.py``, seq 128, 20 predictions): static masks at ``--dupe_factor 5``
   vs ``--masking=dynamic`` at ``--dupe_factor 1``. Instances, instances/s (wall), CPU
   seconds, bytes on disk. Then how many distinct masks a run sees: each training stream
   (run_pretraining.py's pipeline, seed 12345) is read for the same number of sequences,
   ``--passes`` passes over the static records, counting distinct masked sequences
   (``input_ids`` with ``masked_lm_positions``) and, for dynamic records, masks per instance.
2. Input pipeline alone, as run_pretraining.py builds it for training (file shuffle,
   interleaved reads, record shuffle, parse, batch, and for dynamic records the masking):
   sequences/s at seq 128 (batch 64, 20 predictions) and seq 512 (batch 16, 80
   predictions), NVIDIA's per-GPU batch sizes on A100, for static records (today's read +
   parse), dynamic, and dynamic with whole-word masking, unpacked and packed
   (``--pack``, up to 3 instances a row: a batch of rows then holds more sequences, and
   sequences/s counts the instances, from the rows' next-sentence weights; a GPU trains a
   packed row as fast as an unpacked one, so it then needs instances-per-row times the
   sequences). Against what one host core must
   feed at NVIDIA's published 8-GPU rate (DGX A100 40GB, BERT-large, TF1, mixed precision:
   2,871.89 seq/s at 128, 572.112 at 512; 2 x 64-core EPYC 7742 per DGX A100).

Each measurement runs in a fresh child process (TensorFlow's default thread pools: all
cores). The machine may be shared: the load average is printed, compare runs only at a
similar load.

    python bench/dynamic_masking.py [--corpus FILE] [--vocab_file VOCAB] [--seconds 10]
        [--passes 2] [--keep DIR]
"""
import argparse
import functools
import hashlib
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# NVIDIA DeepLearningExamples, TensorFlow/LanguageModeling/BERT README: pre-training on one
# DGX A100 (8x A100 40GB), TF 20.06, BERT-large, mixed precision, sequences/s.
NVIDIA_8_GPU = {128: 2871.89, 512: 572.112}
DGX_A100_HOST_CORES = 128
PIPELINES = {128: (64, 20), 512: (16, 80)}  # seq: (batch per GPU, predictions)
MASKINGS = ("static", "dynamic", "dynamic+wwm")
PACKED_MASKINGS = ("dynamic", "dynamic+wwm")
PER_ROW = 3  # --max_sequences_per_row of the packed records


@functools.lru_cache(maxsize=None)
def _bench_data_prep():
    """bench/data_prep.py (corpus builder, one timed create_pretraining_data.py run)."""
    spec = importlib.util.spec_from_file_location(
        "bench_data_prep", os.path.join(REPO, "bench", "data_prep.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_records(corpus, vocab, work, seq, predictions, masking, dupe_factor, per_row=0):
    """create_pretraining_data.py into work/<name>/bench.tfrecord (packed `per_row` a row
    when not 0); returns its measurements."""
    packed = f"_packed{per_row}" if per_row else ""
    folder = os.path.join(work, f"{masking}_seq{seq}_dupe{dupe_factor}{packed}")
    os.makedirs(folder, exist_ok=True)
    pack = ["--pack", f"--max_sequences_per_row={per_row}"] if per_row else []
    result = _bench_data_prep().run_once(corpus, vocab, folder, dupe_factor, seq, predictions,
                                         [f"--masking={masking}", *pack])
    result["path"] = os.path.join(folder, "bench.tfrecord")
    return result


def child(kind, path, seq, masking, seconds=0.0, sequences=0, per_row=0):
    """Runs this script as a child measuring one pipeline (of records packed `per_row` a
    row when not 0); returns its JSON result."""
    batch, predictions = PIPELINES[seq]
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--path", path,
           "--seq", str(seq), "--batch", str(batch), "--predictions", str(predictions),
           "--masking", masking, "--seconds", str(seconds), "--sequences", str(sequences),
           "--per_row", str(per_row)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"child {kind} {masking} seq {seq} failed")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_child(args):
    """In the child: build run_pretraining.py's training pipeline and measure it."""
    sys.path.insert(0, REPO)
    from pretraining.dynamic_masking import DynamicMasking
    from pretraining.input_pipeline import make_dataset
    masking = None if args.masking == "static" else DynamicMasking(
        args.predictions, whole_word=args.masking == "dynamic+wwm")
    dataset = make_dataset([args.path], args.batch, args.seq, args.predictions, True,
                           masking=masking, sequences_per_row=args.per_row, seed=12345,
                           shuffle_buffer=1000)
    batches = iter(dataset)
    if args.child == "distinct":
        seen, texts = set(), {}
        for _ in range(args.sequences // args.batch):
            rows = next(batches)
            ids, positions = rows["input_ids"].numpy(), rows["masked_lm_positions"].numpy()
            labels, weights = rows["masked_lm_ids"].numpy(), rows["masked_lm_weights"].numpy()
            for row in range(len(ids)):
                masked = ids[row].tobytes() + positions[row].tobytes()
                seen.add(hashlib.blake2b(masked, digest_size=16).digest())
                original = ids[row].copy()
                real = weights[row] > 0
                original[positions[row][real]] = labels[row][real]
                texts.setdefault(original.tobytes(), set()).add(masked)
        masks = [len(m) for m in texts.values()]
        print(json.dumps({"read": args.sequences // args.batch * args.batch,
                          "distinct": len(seen), "texts": len(texts),
                          "masks_per_text": sum(masks) / len(masks)}))
        return
    for _ in range(20):  # warm-up: graph building, autotuning, buffers filled
        next(batches)
    start, cpu_start, count, instances = time.perf_counter(), _cpu(), 0, 0.0
    while time.perf_counter() - start < args.seconds:
        rows = next(batches)
        count += 1
        weights = rows.get("next_sentence_weights")  # packed rows: 1 per instance
        instances += args.batch if weights is None else float(weights.numpy().sum())
    wall, cpu = time.perf_counter() - start, _cpu() - cpu_start
    print(json.dumps({"seq_per_s": instances / wall, "rows_per_s": count * args.batch / wall,
                      "cores_busy": cpu / wall}))


def _cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def data_table(corpus, vocab, work, passes):
    static = make_records(corpus, vocab, work, 128, 20, "static", 5)
    dynamic = make_records(corpus, vocab, work, 128, 20, "dynamic", 1)
    print("\n| seq 128 | instances | seconds | instances/s | CPU s | MB on disk | "
          "bytes/instance |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in (("static, dupe_factor 5", static), ("dynamic, dupe_factor 1", dynamic)):
        print(f"| {name} | {r['instances']:,} | {r['seconds']:.2f} | "
              f"{r['instances'] / r['seconds']:,.0f} | {r['cpu']:.1f} | "
              f"{r['out_bytes'] / 1e6:.1f} | "
              f"{r['out_bytes'] / r['instances']:.0f} |")
    sequences = passes * static["instances"]
    print(f"\nDistinct masks in a run of {sequences:,} sequences ({passes} passes over the "
          f"static records, {sequences / dynamic['instances']:.1f} over the dynamic ones):\n")
    print("| records | sequences read | distinct masked sequences | distinct instances | "
          "masks per instance |")
    print("|---|---:|---:|---:|---:|")
    for name, r in (("static, dupe_factor 5", static), ("dynamic, dupe_factor 1", dynamic)):
        masking = "static" if name.startswith("static") else "dynamic"
        d = child("distinct", r["path"], 128, masking, sequences=sequences)
        print(f"| {name} | {d['read']:,} | {d['distinct']:,} | {d['texts']:,} | "
              f"{d['masks_per_text']:.2f} |")
    return static, dynamic


def pipeline_table(corpus, vocab, work, records_128, seconds):
    print(f"\nInput pipeline alone (read + parse [+ mask]), {seconds:g} s per row after 20 "
          "warm-up batches:\n")
    print("| seq | batch (rows) | records | rows/s | seq/s | CPU cores busy | seq/s per busy "
          "core | needed per DGX A100 host core | headroom |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for seq, (batch, predictions) in PIPELINES.items():
        if seq == 128:
            paths = {"static": records_128[0]["path"], "dynamic": records_128[1]["path"]}
        else:
            paths = {m: make_records(corpus, vocab, work, seq, predictions, m, 1)["path"]
                     for m in ("static", "dynamic")}
        paths["dynamic, packed"] = make_records(corpus, vocab, work, seq, predictions,
                                                "dynamic", 1, PER_ROW)["path"]
        runs = [(m, paths[m.split("+")[0]], m, 0) for m in MASKINGS]
        runs += [(f"{m}, packed", paths["dynamic, packed"], m, PER_ROW) for m in PACKED_MASKINGS]
        for label, path, masking, per_row in runs:
            r = child("throughput", path, seq, masking, seconds, per_row=per_row)
            per_core = r["seq_per_s"] / max(r["cores_busy"], 1e-9)
            # a GPU trains a packed row as fast as an unpacked one: NVIDIA's rows/s, but
            # instances/row times the sequences
            needed = (NVIDIA_8_GPU[seq] / DGX_A100_HOST_CORES
                      * r["seq_per_s"] / r["rows_per_s"])
            print(f"| {seq} | {batch} | {label} | {r['rows_per_s']:,.0f} | "
                  f"{r['seq_per_s']:,.0f} | {r['cores_busy']:.2f} | {per_core:,.0f} | "
                  f"{needed:.1f} | {per_core / needed:,.0f}x |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", help="one-sentence-per-line text (default: built from "
                                         "../shared/data)")
    parser.add_argument("--vocab_file", default=None)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--keep", help="folder for the corpus and records (default: temporary)")
    for name, kind in (("child", str), ("path", str), ("seq", int), ("batch", int),
                       ("predictions", int), ("masking", str), ("sequences", int),
                       ("per_row", int)):
        parser.add_argument(f"--{name}", type=kind, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args)
        return
    work = args.keep or tempfile.mkdtemp(prefix="bench_dynamic_masking_")
    os.makedirs(work, exist_ok=True)
    try:
        prep = _bench_data_prep()
        corpus = args.corpus or os.path.join(work, "corpus.txt")
        if not args.corpus and not os.path.exists(corpus):
            prep.build_corpus(corpus)
        vocab = args.vocab_file or prep.default_vocab()
        print(f"corpus {corpus} ({os.path.getsize(corpus) / 1e6:.2f} MB); {os.cpu_count()} "
              f"cores, load average {os.getloadavg()[0]:.2f} at start")
        records_128 = data_table(corpus, vocab, work, args.passes)
        pipeline_table(corpus, vocab, work, records_128, args.seconds)
        print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
