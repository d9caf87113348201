"""A formatted corpus of any size from the real text in ../shared/data, for data-prep benchmarks.

Benchmarks of data preparation across machines need corpora of 0.01 to several GB, and the
real material here is ~3.5 MB (a Wikipedia dump fragment and two books). This script takes
the distinct documents of that material (cleaned by ``bench/data_prep.py``'s own
``wiki_documents`` and ``book_documents``, imported, not copied) and writes them one document
per line (UTF-8, whitespace collapsed to single spaces, no empty lines): the format that
``bertPrep.py --action sharding --dataset custom --input FILE`` and NVIDIA's TextSharding read.
The documents are repeated, each pass in a fresh shuffled order drawn from ``--seed``, until
the next document would pass the requested size, so the size is within one document of it.

Only the distinct documents (a few MB) are held in memory; the output is streamed, so a 4 GB
corpus costs the same memory as a 10 MB one. The same seed and size give the same bytes. The
file is written under a temporary name and renamed when complete, so a stopped run never
leaves a partial corpus under the final name, and ``corpus_path`` reuses a finished one.

    python bench/scaled_corpus.py --size_gb 0.01 [--seed 12345] [--out FILE]

Other bench scripts call ``corpus_path(size_gb, seed)``, which builds the corpus once (under
``$BERT_BENCH_CORPUS_DIR``, default ``/tmp/bert_bench_corpora``) and returns its path.
"""
import argparse
import glob
import importlib.util
import os
import random
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SEED = 12345
DEFAULT_DIR = os.environ.get("BERT_BENCH_CORPUS_DIR", "/tmp/bert_bench_corpora")


def load_bench_data_prep():
    """bench/data_prep.py, loaded by path: the name ``data_prep`` is also the project's
    package, so a plain import would find whichever comes first on sys.path."""
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)  # data_prep.py imports its neighbour `machine`
    spec = importlib.util.spec_from_file_location("bench_data_prep",
                                                  os.path.join(BENCH, "data_prep.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def distinct_documents(shared=None):
    """The cleaned documents of ../shared/data, each one line of text (paragraphs joined)."""
    prep = load_bench_data_prep()
    shared = shared or prep.SHARED
    wikis = sorted(glob.glob(os.path.join(shared, "wiki", "*.bz2")))
    books = sorted(glob.glob(os.path.join(shared, "books", "*.txt")))
    if not wikis and not books:
        raise SystemExit(f"scaled_corpus: no wiki/*.bz2 or books/*.txt under {shared} "
                         f"(set BERT_SHARED_DATA)")
    docs = []
    for path in wikis:
        docs.extend(prep.wiki_documents(path))
    for path in books:
        docs.extend(prep.book_documents(path))
    # str.split() also breaks on \r, \x85, \u2028...: nothing that a reader could take for a
    # line end survives inside a document.
    lines = [" ".join(" ".join(doc).split()) for doc in docs]
    return [line for line in lines if line]


def write_scaled_corpus(path, size_bytes, seed=DEFAULT_SEED, shared=None):
    """Writes the corpus to `path` (atomically); returns (bytes, documents, distinct)."""
    encoded = [(line + "\n").encode("utf-8") for line in distinct_documents(shared)]
    if size_bytes < min(len(d) for d in encoded):
        raise SystemExit(f"scaled_corpus: {size_bytes} bytes is smaller than any document")
    rng = random.Random(seed)
    order = list(range(len(encoded)))
    written = documents = 0
    partial = f"{path}.partial-{os.getpid()}"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        with open(partial, "wb") as out:
            full = False
            while not full:
                rng.shuffle(order)
                for index in order:
                    if written + len(encoded[index]) > size_bytes:
                        full = True
                        break
                    out.write(encoded[index])
                    written += len(encoded[index])
                    documents += 1
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return written, documents, len(encoded)


def _size_tag(size_gb):
    return f"{size_gb:g}".replace(".", "p")


def corpus_path(size_gb, seed=DEFAULT_SEED, directory=DEFAULT_DIR, shared=None):
    """Path of the scaled corpus of `size_gb` GB (1e9 bytes) for `seed`, built if absent."""
    path = os.path.join(directory, f"corpus_{_size_tag(size_gb)}gb_seed{seed}.txt")
    if not os.path.isfile(path):
        size, docs, distinct = write_scaled_corpus(path, int(size_gb * 1e9), seed, shared)
        print(f"scaled_corpus: wrote {path}: {size:,} bytes, {docs:,} documents "
              f"({distinct} distinct)", file=sys.stderr)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size_gb", type=float, required=True,
                        help="target size in GB (1e9 bytes), e.g. 0.01, 0.1, 1, 4")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--out", help=f"output file (default: {DEFAULT_DIR}/corpus_<size>gb_"
                                      f"seed<seed>.txt, reused when it exists)")
    args = parser.parse_args()
    if args.size_gb <= 0:
        parser.error("--size_gb must be positive")
    if args.out:
        if os.path.exists(args.out):
            parser.error(f"--out {args.out} exists: remove it or name another file")
        size, docs, distinct = write_scaled_corpus(args.out, int(args.size_gb * 1e9), args.seed)
        path = args.out
    else:
        path = corpus_path(args.size_gb, args.seed)
        size = os.path.getsize(path)
        with open(path, "rb") as reader:
            docs = sum(chunk.count(b"\n") for chunk in iter(lambda: reader.read(1 << 24), b""))
        distinct = None
    extra = f" ({distinct} distinct)" if distinct else ""
    print(f"{path}: {size:,} bytes ({size / 1e6:.1f} MB), {docs:,} documents{extra}")


if __name__ == "__main__":
    main()
