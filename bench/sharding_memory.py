"""Peak memory and throughput of bertPrep's sharding step on a big corpus, in a child process.

Sharding must stream: its memory should be bounded by a document and a shard's buffers, not
by the corpus (a full English Wikipedia is ~20 GB of text).  This builds a formatted corpus
(one document per line) of ``--size_mb`` MB by repeating the real text of ../shared/data (the
Wikipedia fragment through ``text_formatting`` plus the two books), then runs
``data_prep.bertprep.sharding.shard_corpus`` on it in a fresh Python process and prints a table:
corpus MB, seconds, MB/s, peak RSS of the sharding process and of its largest worker.

    python bench/sharding_memory.py [--size_mb 1024] [--n_processes 1] [--keep DIR]
        [--n_training_shards 256] [--n_test_shards 256] [--sentence_splitter auto]

Needs free disk space of about twice ``--size_mb`` (the corpus and the shards).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("BERT_SHARED_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))
WIKI = os.path.join(SHARED, "wiki", "enwiki-latest-pages-articles1.xml-p000000010p000030302-"
                                    "shortened.bz2")

# Run in the child: shard, then report its own peak RSS and its workers' (KiB on Linux).
CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {repo!r})
from data_prep.bertprep import sharding
options = sharding.ShardingOptions(**{options!r})
t0 = time.perf_counter()
stats = sharding.shard_corpus([{corpus!r}], {out!r}, "bench", options, progress=False,
                              log=lambda m: None)
seconds = time.perf_counter() - t0
print(json.dumps({{"seconds": seconds, "stages": stats.seconds, "documents": stats.documents,
    "sentences": sum(stats.shard_sentences), "shard_bytes": stats.shard_bytes,
    "self_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "children_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}}))
"""


def build_corpus(path, size_mb, work):
    """Repeats the formatted real text (Wikipedia fragment + books) up to ``size_mb`` MB."""
    sys.path.insert(0, REPO)
    from data_prep.bertprep import text_formatting
    seed = os.path.join(work, "seed.txt")
    text_formatting.format_wikipedia([WIKI], seed, progress=False)
    books = os.path.join(work, "books.txt")
    text_formatting.format_books([os.path.join(SHARED, "books")], books, progress=False)
    with open(seed, "rb") as f:
        block = f.read()
    with open(books, "rb") as f:
        block += f.read()
    target = int(size_mb * 1e6)
    written = 0
    with open(path, "wb") as out:
        while written < target:
            out.write(block)
            written += len(block)
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size_mb", type=float, default=1024.0)
    parser.add_argument("--n_processes", type=int, default=1)
    parser.add_argument("--n_training_shards", type=int, default=256)
    parser.add_argument("--n_test_shards", type=int, default=256)
    parser.add_argument("--fraction_test_set", type=float, default=0.1)
    parser.add_argument("--sentence_splitter", default="auto")
    parser.add_argument("--keep", help="folder for the corpus and the shards (default: temporary)")
    args = parser.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="bench_sharding_")
    os.makedirs(work, exist_ok=True)
    try:
        corpus = os.path.join(work, "corpus.txt")
        if not os.path.exists(corpus) or os.path.getsize(corpus) < args.size_mb * 1e6:
            t0 = time.perf_counter()
            build_corpus(corpus, args.size_mb, work)
            print(f"built {corpus} in {time.perf_counter() - t0:.1f} s")
        size_mb = os.path.getsize(corpus) / 1e6
        out = os.path.join(work, "shards")
        shutil.rmtree(out, ignore_errors=True)
        options = dict(n_training_shards=args.n_training_shards,
                       n_test_shards=args.n_test_shards,
                       fraction_test_set=args.fraction_test_set,
                       sentence_splitter=args.sentence_splitter, n_processes=args.n_processes)
        code = CHILD.format(repo=REPO, options=options, corpus=corpus, out=out)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-3000:])
            raise SystemExit(f"sharding failed with status {proc.returncode}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        shard_mb = [b / 1e6 for b in r["shard_bytes"]]
        print(f"{r['documents']} documents, {r['sentences']} sentences; shards "
              f"{min(shard_mb):.2f}..{max(shard_mb):.2f} MB; stages (s): "
              + ", ".join(f"{k} {v:.1f}" for k, v in r["stages"].items())
              + f"; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
        header = (f"{'corpus MB':>10}{'processes':>10}{'seconds':>9}{'MB/s':>8}"
                  f"{'peak RSS MB':>13}{'worker peak MB':>16}")
        print(header)
        print("-" * len(header))
        worker = f"{r['children_kb'] / 1024:.0f}" if args.n_processes > 1 else "-"
        print(f"{size_mb:>10.0f}{args.n_processes:>10}{r['seconds']:>9.1f}"
              f"{size_mb / r['seconds']:>8.1f}{r['self_kb'] / 1024:>13.0f}{worker:>16}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
