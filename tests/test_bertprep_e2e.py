"""bertPrep.py end to end on the real material, every step through the command line:
download (from a local HTTP server) -> text_formatting -> sharding -> create_tfrecord_files,
then the records are parsed with Google's exact feature spec and checked."""
import glob
import io
import json
import os
import time
import zipfile

import numpy as np
import pytest

from bertprep_support import BOOKS, WIKI_DUMP, FixtureServer, run_bertprep
from data_prep.instances import record_metadata
from google_reference import google_name_to_features

SHARD_FLAGS = ["--n_training_shards", "3", "--n_test_shards", "1", "--fraction_test_set", "0.05"]




def parse_records(path, max_seq_length, max_predictions_per_seq):
    import tensorflow as tf
    spec = google_name_to_features(max_seq_length, max_predictions_per_seq)
    ds = tf.data.TFRecordDataset(path).map(lambda r: tf.io.parse_single_example(r, spec))
    out = {k: [] for k in spec}
    for batch in ds.batch(4096):
        for k in spec:
            out[k].append(batch[k].numpy())
    return {k: np.concatenate(v) for k, v in out.items()}


def check_invariants(f, vocab, max_seq_length):
    cls, sep = vocab.index("[CLS]"), vocab.index("[SEP]")
    ids, mask, seg = f["input_ids"], f["input_mask"], f["segment_ids"]
    pos, mids, w = f["masked_lm_positions"], f["masked_lm_ids"], f["masked_lm_weights"]
    n = mask.sum(1)
    cols = np.arange(max_seq_length)
    real = cols[None, :] < n[:, None]
    assert (mask == real).all()
    assert (ids[~real] == 0).all() and (seg[~real] == 0).all()
    assert (ids < len(vocab)).all() and (ids >= 0).all() and (mids < len(vocab)).all()
    assert (ids[:, 0] == cls).all()
    # The original tokens: masked positions restored from masked_lm_ids.
    original = ids.copy()
    rows = np.nonzero(w > 0)
    assert (pos[w == 0] == 0).all() and (mids[w == 0] == 0).all()
    original[rows[0], pos[rows]] = mids[rows]
    for i in range(len(ids)):
        k = int(n[i])
        seps = np.nonzero(original[i, :k] == sep)[0]
        assert len(seps) == 2 and seps[1] == k - 1 and 1 < seps[0] < k - 2, original[i, :k]
        # segment 0 up to and including the first [SEP], segment 1 after it.
        assert (seg[i, :seps[0] + 1] == 0).all() and (seg[i, seps[0] + 1:k] == 1).all()
        p = pos[i][w[i] > 0]
        assert len(p) >= 1 and (np.diff(p) > 0).all()
        assert (p > 0).all() and (p < k).all()
        assert not np.isin(original[i, p], [cls, sep]).any()
    labels = f["next_sentence_labels"][:, 0]
    assert set(labels.tolist()) == {0, 1}


@pytest.fixture(scope="module")
def prepared(shared_data, minilm_vocab, tmp_path_factory):
    """Runs the whole pipeline once; returns (working dir, vocab, timings)."""
    wd = str(tmp_path_factory.mktemp("e2e") / "wd")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for book in BOOKS:
            z.write(os.path.join(shared_data, book), "books/" + os.path.basename(book))
    dump_name = os.path.basename(WIKI_DUMP)
    timings = {}

    def step(name, *args):
        t0 = time.perf_counter()
        proc = run_bertprep(["--working_dir", wd, *args])
        timings[name] = time.perf_counter() - t0
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
        return proc

    with FixtureServer() as server:
        server.files["/dumps/" + dump_name] = open(os.path.join(shared_data, WIKI_DUMP),
                                                   "rb").read()
        server.files["/books.zip"] = buf.getvalue()
        step("download wiki", "--action", "download", "--dataset", "wikicorpus_en",
             "--url", server.url("/dumps/" + dump_name))
        step("download books", "--action", "download", "--dataset", "bookscorpus",
             "--url", server.url("/books.zip"))
    step("text_formatting", "--action", "text_formatting", "--dataset", "books_wiki_en_corpus",
         "--n_processes", "1")
    step("sharding", "--action", "sharding", "--dataset", "books_wiki_en_corpus",
         "--n_processes", "2", *SHARD_FLAGS)
    for seq, pred in ((128, 20), (48, 8)):
        step(f"create_tfrecord_files seq {seq}", "--action", "create_tfrecord_files",
             "--dataset", "books_wiki_en_corpus", *SHARD_FLAGS, "--vocab_file", minilm_vocab,
             "--max_seq_length", str(seq), "--max_predictions_per_seq", str(pred),
             "--dupe_factor", "1", "--n_processes", "2")
    print("e2e step timings:", {k: round(v, 1) for k, v in timings.items()})
    return wd, open(minilm_vocab, encoding="utf-8").read().splitlines(), timings


def test_layout_of_every_step(prepared, shared_data):
    wd, _, _ = prepared
    dump = os.path.join(wd, "download", "wikicorpus_en", os.path.basename(WIKI_DUMP))
    assert open(dump, "rb").read() == open(os.path.join(shared_data, WIKI_DUMP), "rb").read()
    for book in BOOKS:
        assert os.path.isfile(os.path.join(wd, "download", "bookscorpus", "books",
                                           os.path.basename(book)))
    formatted = os.path.join(wd, "formatted_one_article_per_line")
    assert sorted(os.listdir(formatted)) == ["bookscorpus.txt", "wikicorpus_en.txt"]
    shards = os.path.join(wd, "sharded_training_shards_3_test_shards_1_fraction_0.05",
                          "books_wiki_en_corpus")
    names = ["books_wiki_en_corpus_training_0", "books_wiki_en_corpus_training_1",
             "books_wiki_en_corpus_training_2", "books_wiki_en_corpus_test_0"]
    # The shards, and (hidden) the plan that lets the same command again skip them.
    assert sorted(os.listdir(shards)) == sorted([n + ".txt" for n in names]
                                                + [".sharding-plan.json"])
    for seq, pred in ((128, 20), (48, 8)):
        records = os.path.join(
            wd, f"tfrecord_lower_case_1_seq_len_{seq}_max_pred_{pred}_masked_lm_prob_0.15"
                f"_random_seed_12345_dupe_factor_1", "books_wiki_en_corpus")
        # NVIDIA's layout: training/ and test/ folders of records only (their reader takes
        # every file there), each file's metadata in the folder's `.meta` sibling.
        assert sorted(os.listdir(records)) == ["test", "test.meta", "training", "training.meta"]
        for split in ("training", "test"):
            split_names = [n for n in names if f"_{split}_" in n]
            assert sorted(os.listdir(os.path.join(records, split))) == sorted(
                n + ".tfrecord" for n in split_names)
            assert sorted(os.listdir(os.path.join(records, split + ".meta"))) == sorted(
                n + ".tfrecord.meta.json" for n in split_names)


@pytest.mark.parametrize("seq, pred", [(128, 20), (48, 8)])
def test_records_parse_with_google_spec_and_are_well_formed(prepared, seq, pred):
    wd, vocab, _ = prepared
    folder = os.path.join(
        wd, f"tfrecord_lower_case_1_seq_len_{seq}_max_pred_{pred}_masked_lm_prob_0.15"
            f"_random_seed_12345_dupe_factor_1", "books_wiki_en_corpus")
    total = 0
    for name in sorted(glob.glob(os.path.join(folder, "*", "*.tfrecord"))):
        features = parse_records(name, seq, pred)
        assert len(features["input_ids"]) > 50
        check_invariants(features, vocab, seq)
        total += len(features["input_ids"])
        metadata = json.load(open(record_metadata.metadata_path(name)))  # what is checked
        assert metadata["records"] == len(features["input_ids"]) and metadata["masking"] == \
            "static"
        assert (metadata["max_seq_length"], metadata["max_predictions_per_seq"]) == (seq, pred)
    assert total > 1000


def test_create_vocab_is_used_when_no_vocab_file_is_given(shared_data, tmp_path):
    from bertprep_support import copy_working_dir, formatted_corpus
    from data_prep.bertprep import prep_actions
    from data_prep.bertprep.prep_layout import PrepOptions
    from data_prep.instances import tfrecord_writer
    from data_prep.instances.pretraining_data import create_pretraining_tfrecords
    from data_prep.instances.pretraining_data_options import (PretrainingDataOptions,
                                                              derive_shard_seed)
    root, _ = formatted_corpus(shared_data)
    wd = copy_working_dir(root, str(tmp_path / "wd"))
    common = dict(dataset="bookscorpus", working_dir=wd, n_training_shards=2, n_test_shards=0,
                  fraction_test_set=0.0, vocab_size=3000, max_seq_length=64,
                  max_predictions_per_seq=10, dupe_factor=1, n_processes=1, progress=False)
    for action in ("create_vocab", "sharding", "create_tfrecord_files"):
        assert prep_actions.run(PrepOptions(action=action, **common)) == 0
    vocab_file = os.path.join(wd, "vocab", "bookscorpus_lower_case_1_vocab.txt")
    vocab = open(vocab_file, encoding="utf-8").read().splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert 1000 < len(vocab) <= 3000
    folder = os.path.join(wd, "tfrecord_lower_case_1_seq_len_64_max_pred_10_masked_lm_prob_0.15"
                              "_random_seed_12345_dupe_factor_1", "bookscorpus", "training")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".tfrecord"))
    assert names == ["bookscorpus_training_0.tfrecord", "bookscorpus_training_1.tfrecord"]
    for name in names:
        records = tfrecord_writer.read_tfrecord_file(os.path.join(folder, name))
        assert len(records) > 100
    # The records are those of the trained vocab: same bytes as passing it explicitly.
    explicit = tmp_path / "explicit"
    shard_dir = os.path.join(wd, "sharded_training_shards_2_test_shards_0_fraction_0")
    stats = create_pretraining_tfrecords(
        os.path.join(shard_dir, "bookscorpus", "bookscorpus_training_0.txt"), str(explicit),
        vocab_file, PretrainingDataOptions(
            max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1,
            random_seed=derive_shard_seed(12345, "bookscorpus_training_0.txt")),
        log_instances=0)
    assert stats.instances > 100
    assert open(explicit, "rb").read() == open(os.path.join(folder, names[0]), "rb").read()
