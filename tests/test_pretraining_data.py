"""Tests of create_pretraining_data: record format, Google's algorithm, masking statistics,
determinism, bad input, and the command line."""
import bz2
import glob
import html
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from data_prep.errors import DataPrepError
from data_prep.instances import record_metadata
from data_prep.instances import tfrecord_writer as tw
from data_prep.instances.corpus import Corpus, read_corpus
from data_prep.instances.instance_plan import (InstancePlan, _uniform_stream, plan_instances,
                                               truncate_plan, truncated_lengths)
from data_prep.instances.masked_instances import build_instances
from data_prep.instances.pretraining_data import create_pretraining_tfrecords
from data_prep.instances.pretraining_data_options import PretrainingDataOptions, derive_shard_seed
from data_prep.instances.vocab_info import VocabInfo
import google_reference

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_SEQ = 128
MAX_PRED = 20


def google_name_to_features(max_seq_length=MAX_SEQ, max_predictions_per_seq=MAX_PRED):
    return google_reference.google_name_to_features(max_seq_length, max_predictions_per_seq)


def parse_with_tensorflow(path, max_seq_length=MAX_SEQ, max_predictions_per_seq=MAX_PRED):
    """All records of a file through tf.data + tf.io.parse_single_example, as numpy arrays."""
    import tensorflow as tf
    spec = google_name_to_features(max_seq_length, max_predictions_per_seq)
    ds = tf.data.TFRecordDataset(path).map(lambda r: tf.io.parse_single_example(r, spec))
    out = {k: [] for k in spec}
    for batch in ds.batch(8192):
        for k in spec:
            out[k].append(batch[k].numpy())
    return {k: np.concatenate(v) if v else np.zeros((0,)) for k, v in out.items()}


def read_records(path):
    return tw.read_tfrecord_file(path)


# --------------------------------------------------------------------------- test corpus

_SENT_END = re.compile(r"(?<=[.!?])[\"'”’)]*\s+(?=[\"'“‘(]?[A-Z0-9])")


def _sentences(paragraph):
    return [s for s in _SENT_END.split(" ".join(paragraph.split())) if s.strip()]


def _wiki_pages(path, max_pages):
    with bz2.open(path, "rt", encoding="utf-8") as f:
        xml = f.read()
    pages = []
    for m in re.finditer(r"<text[^>]*>(.*?)</text>", xml, flags=re.S):
        text = html.unescape(m.group(1))
        if text.lstrip().lower().startswith("#redirect"):
            continue
        text = re.sub(r"<ref[^>]*>.*?</ref>|<!--.*?-->|<[^>]+>", "", text, flags=re.S)
        for _ in range(3):
            text = re.sub(r"\{\{[^{}]*\}\}", "", text)
        text = re.sub(r"\[\[(?:[^|\]]*\|)?([^\]]*)\]\]", r"\1", text).replace("'''", "")
        paras = [" ".join(ln for ln in p.split("\n") if ln.strip()
                          and not ln.lstrip().startswith(("=", "|", "!", "{", "}", "*", "[")))
                 for p in re.split(r"\n\s*\n", text)]
        sents = [s for p in paras if p for s in _sentences(p)]
        if sents:
            pages.append(sents)
        if len(pages) >= max_pages:
            break
    return pages


def _book_docs(path, paragraphs_per_doc=30):
    with open(path, encoding="utf-8") as f:
        paras = [p for p in re.split(r"\n\s*\n", f.read()) if p.strip()]
    return [[s for p in paras[i:i + paragraphs_per_doc] for s in _sentences(p)]
            for i in range(0, len(paras), paragraphs_per_doc)]


def write_docs(docs, path):
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write("\n".join(doc) + "\n\n")
    return path


@pytest.fixture(scope="module")
def tokenizer(minilm_vocab):
    from data_prep.wordpiece import tokenization
    return tokenization.FullTokenizer(minilm_vocab, do_lower_case=True)


@pytest.fixture(scope="module")
def real_corpus_file(shared_data, tmp_path_factory):
    """Books (documents of 30 paragraphs) + Wikipedia pages, one sentence per line."""
    docs = []
    for book in sorted(glob.glob(os.path.join(shared_data, "books", "*.txt"))):
        docs.extend(_book_docs(book))
    wiki = glob.glob(os.path.join(shared_data, "wiki", "enwiki-latest-pages-articles1*.bz2"))
    docs.extend(_wiki_pages(wiki[0], max_pages=40))
    return write_docs(docs, str(tmp_path_factory.mktemp("corpus") / "corpus.txt"))


@pytest.fixture(scope="module")
def real_run(real_corpus_file, tokenizer, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("records") / "books_wiki.tfrecord")
    options = PretrainingDataOptions(dupe_factor=2, random_seed=7)
    stats = create_pretraining_tfrecords(real_corpus_file, out, tokenizer, options)
    corpus, _ = read_corpus([real_corpus_file], tokenizer)
    return {"path": out, "stats": stats, "records": parse_with_tensorflow(out),
            "corpus": corpus}


# --------------------------------------------------------------------------- format

def test_records_parse_with_googles_feature_spec(real_run):
    rec = real_run["records"]
    n = real_run["stats"].instances
    assert n > 5000
    assert rec["input_ids"].shape == (n, MAX_SEQ)
    assert rec["masked_lm_positions"].shape == (n, MAX_PRED)
    assert rec["masked_lm_weights"].dtype == np.float32
    assert rec["next_sentence_labels"].shape == (n, 1)
    assert len(read_records(real_run["path"])) == n


def test_sequence_structure(real_run, tokenizer):
    rec = real_run["records"]
    ids, mask, seg = rec["input_ids"], rec["input_mask"], rec["segment_ids"]
    cls_id, sep_id = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    assert (ids[:, 0] == cls_id).all()
    assert ids.max() < len(tokenizer.vocab) and ids.min() >= 0
    n_real = mask.sum(axis=1)
    pos = np.arange(MAX_SEQ)[None, :]
    # input_mask is 1 exactly over a prefix, and padding is 0 everywhere.
    assert (mask == (pos < n_real[:, None])).all()
    assert (ids[mask == 0] == 0).all() and (seg[mask == 0] == 0).all()
    assert (n_real <= MAX_SEQ).all() and (n_real >= 5).all()
    is_sep = ids == sep_id
    assert (is_sep.sum(axis=1) == 2).all()
    first_sep = np.argmax(is_sep, axis=1)
    last_sep = n_real - 1
    assert (ids[np.arange(len(ids)), last_sep] == sep_id).all()
    assert (first_sep >= 2).all() and (first_sep <= last_sep - 2).all()
    # segment 0 up to and including the first [SEP], 1 through the second.
    expected_seg = (pos > first_sep[:, None]) & (pos <= last_sep[:, None])
    assert (seg == expected_seg).all()
    # A long sequence budget is used: most instances are close to full.
    assert np.median(n_real) >= MAX_SEQ - 10


def test_masked_positions_and_counts(real_run, tokenizer):
    rec = real_run["records"]
    ids, mask = rec["input_ids"], rec["input_mask"]
    positions, weights = rec["masked_lm_positions"], rec["masked_lm_weights"]
    n_real = mask.sum(axis=1)
    n_pred = weights.sum(axis=1).astype(np.int64)
    expected = np.minimum(MAX_PRED, np.maximum(1, np.array([round(x * 0.15) for x in n_real])))
    assert (n_pred == expected).all()
    slot = np.arange(MAX_PRED)[None, :]
    real = slot < n_pred[:, None]
    assert (weights == real).all()
    assert (positions[~real] == 0).all() and (rec["masked_lm_ids"][~real] == 0).all()
    # strictly increasing, inside the real tokens, never [CLS] (0) nor a [SEP]
    diffs = np.diff(positions, axis=1)
    assert (diffs[real[:, 1:]] > 0).all()
    assert (positions[real] >= 1).all()
    assert (positions < n_real[:, None])[real].all()
    sep_id = tokenizer.vocab["[SEP]"]
    rows = np.nonzero(real)[0]
    original = ids.copy()
    original[rows, positions[real]] = rec["masked_lm_ids"][real]
    assert (original[rows, positions[real]] != sep_id).all()
    # 15 % of the tokens of uncapped sequences (Google's count includes [CLS]/[SEP]).
    uncapped = expected < MAX_PRED
    assert uncapped.sum() > 1000
    frac = n_pred[uncapped].sum() / n_real[uncapped].sum()
    assert abs(frac - 0.15) < 0.01, frac
    frac_non_special = n_pred[uncapped].sum() / (n_real[uncapped] - 3).sum()
    assert abs(frac_non_special - 0.15) < 0.01, frac_non_special


def test_mask_replacement_shares(real_run, tokenizer):
    rec = real_run["records"]
    real = rec["masked_lm_weights"] > 0
    rows = np.nonzero(real)[0]
    at_pos = rec["input_ids"][rows, rec["masked_lm_positions"][real]]
    label = rec["masked_lm_ids"][real]
    assert len(label) > 50000
    masked = np.mean(at_pos == tokenizer.vocab["[MASK]"])
    kept = np.mean(at_pos == label)
    other = 1.0 - masked - kept
    assert abs(masked - 0.8) < 0.02, masked
    assert abs(kept - 0.1) < 0.02, kept
    assert abs(other - 0.1) < 0.02, other


def _find_aligned(haystack: bytes, needle: bytes) -> bool:
    start = haystack.find(needle)
    while start != -1 and start % 4:
        start = haystack.find(needle, start + 1)
    return start != -1


def test_masked_lm_ids_restore_the_corpus_text(real_run, tokenizer):
    """Putting masked_lm_ids back gives A and B as contiguous runs of the tokenized text."""
    rec = real_run["records"]
    corpus_bytes = real_run["corpus"].tokens.astype("<i4").tobytes()
    sep_id = tokenizer.vocab["[SEP]"]
    rng = np.random.default_rng(0)
    sample = rng.choice(len(rec["input_ids"]), size=400, replace=False)
    for i in sample:
        ids = rec["input_ids"][i].copy()
        k = int(rec["masked_lm_weights"][i].sum())
        ids[rec["masked_lm_positions"][i, :k]] = rec["masked_lm_ids"][i, :k]
        n_real = int(rec["input_mask"][i].sum())
        first_sep = int(np.argmax(ids == sep_id))
        a, b = ids[1:first_sep], ids[first_sep + 1:n_real - 1]
        assert _find_aligned(corpus_bytes, a.astype("<i4").tobytes()), i
        assert _find_aligned(corpus_bytes, b.astype("<i4").tobytes()), i


def test_random_next_share(real_run):
    labels = real_run["records"]["next_sentence_labels"][:, 0]
    share = labels.mean()
    assert 0.5 < share < 0.6, share
    assert real_run["stats"].random_next == labels.sum()


# --------------------------------------------------------------------------- algorithm

class _GoogleRng:
    """random()/randint() over the same uniform stream as plan_instances."""

    def __init__(self, gen):
        self.next = _uniform_stream(gen).__next__

    def random(self):
        return self.next()

    def randint(self, a, b):
        return a + int(self.next() * (b - a + 1))


def _google_instances_from_document(all_documents, document_index, max_seq_length,
                                    short_seq_prob, rng):
    """Google's create_instances_from_document up to (untruncated) tokens_a/tokens_b.

    Only change: the random other document is drawn among the n - 1 others in one draw
    instead of up to 10 draws among all n.
    """
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    current_chunk = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])
                tokens_b = []
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    r = rng.randint(0, len(all_documents) - 2)
                    random_document_index = r + 1 if r >= document_index else r
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    num_unused_segments = len(current_chunk) - a_end
                    i -= num_unused_segments
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                instances.append((tokens_a, tokens_b, is_random_next))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def test_plan_follows_googles_loop():
    gen = np.random.default_rng(3)
    docs = []
    for d in range(60):
        n_sent = int(gen.integers(1, 25))
        docs.append([list(range(1000 * d + 100 * s, 1000 * d + 100 * s + int(gen.integers(1, 40))))
                     for s in range(n_sent)])
    corpus = Corpus.from_documents(docs)
    options = PretrainingDataOptions(max_seq_length=64, dupe_factor=3, short_seq_prob=0.2)
    plan = plan_instances(corpus, options, np.random.default_rng(11),
                          np.random.default_rng(12))
    order = np.random.default_rng(11).permutation(len(docs))
    shuffled = [docs[k] for k in order]
    rng = _GoogleRng(np.random.default_rng(12))
    expected = []
    for _ in range(options.dupe_factor):
        for index in range(len(shuffled)):
            expected.extend(_google_instances_from_document(shuffled, index, 64, 0.2, rng))
    assert len(plan) == len(expected) > 100
    tokens = corpus.tokens
    for k, (a, b, is_random) in enumerate(expected):
        got_a = tokens[plan.a_start[k]:plan.a_start[k] + plan.a_len[k]].tolist()
        got_b = tokens[plan.b_start[k]:plan.b_start[k] + plan.b_len[k]].tolist()
        assert (got_a, got_b, bool(plan.is_random_next[k])) == (a, b, is_random), k
    # one-sentence documents always take a random next sentence
    assert plan.is_random_next.mean() > 0.5


def test_truncation_matches_googles_loop():
    for m in (2, 5, 10, 25, 61):
        for la in range(1, 45):
            for lb in range(1, 45):
                a, b = la, lb
                while a + b > m:
                    if a > b:
                        a -= 1
                    else:
                        b -= 1
                got = truncated_lengths(np.array([la]), np.array([lb]), m)
                assert (int(got[0][0]), int(got[1][0])) == (a, b), (m, la, lb)


def test_truncation_removes_from_both_ends():
    n, m = 4000, 125
    plan = InstancePlan(np.full(n, 1000), np.full(n, 150), np.full(n, 5000),
                        np.full(n, 40), np.zeros(n, bool))
    out = truncate_plan(plan, m, np.random.default_rng(0))
    assert (out.a_len == m - 40).all() and (out.b_len == 40).all()
    front = out.a_start - plan.a_start
    removed = 150 - (m - 40)
    assert (front >= 0).all() and (front <= removed).all()
    assert abs(front.mean() - removed / 2) < 0.5
    assert (out.b_start == 5000).all()


def test_num_to_predict_rounds_like_python_round():
    """max(1, round(len * 0.15)) with round half to even, capped by max_predictions_per_seq."""
    totals = [5, 6, 7, 10, 17, 30, 50, 70, 128, 128]
    a_len = np.array([1, 1, 2, 3, 7, 13, 23, 33, 60, 100])
    b_len = np.array(totals) - 3 - a_len
    tokens = np.arange(1000, 1000 + 400, dtype=np.int32)
    corpus = Corpus(tokens, np.array([0, 400]), np.array([0, 1]))
    plan = InstancePlan(np.zeros(10, np.int64), a_len, np.full(10, 200), b_len,
                        np.zeros(10, bool))
    vocab = VocabInfo.from_tokens(["[PAD]", "[CLS]", "[SEP]", "[MASK]"] +
                                  [f"w{i}" for i in range(1996)])
    batch = build_instances(corpus, plan, vocab, PretrainingDataOptions(),
                            np.random.default_rng(0))
    assert batch.input_mask.sum(axis=1).tolist() == totals
    assert batch.masked_lm_weights.sum(axis=1).tolist() == [
        max(1, min(20, round(t * 0.15))) for t in totals]  # 1,1,1,2,3,4,8,10,19,19
    assert batch.masked_lm_weights.sum(axis=1).tolist()[5:7] == [4, 8]


def test_whole_word_masking(shared_data, tokenizer, tmp_path):
    path = write_docs(_book_docs(os.path.join(shared_data, "books",
                                              "pg11_alice_in_wonderland.txt")),
                      str(tmp_path / "alice.txt"))
    is_cont = np.array([t.startswith("##") for t in
                        tokenizer.convert_ids_to_tokens(range(len(tokenizer.vocab)))])

    def partial_words(wwm):
        out = str(tmp_path / f"wwm_{wwm}.tfrecord")
        create_pretraining_tfrecords(path, out, tokenizer, PretrainingDataOptions(
            dupe_factor=3, do_whole_word_mask=wwm), log_instances=0)
        rec = parse_with_tensorflow(out)
        n_pred = rec["masked_lm_weights"].sum(axis=1)
        expected = np.minimum(MAX_PRED, np.maximum(1, np.array(
            [round(x * 0.15) for x in rec["input_mask"].sum(axis=1)])))
        assert (n_pred <= expected).all() and np.mean(n_pred == expected) > 0.98
        partial = cont_masked = 0
        for i in range(len(rec["input_ids"])):
            k = int(rec["masked_lm_weights"][i].sum())
            pos = rec["masked_lm_positions"][i, :k]
            ids = rec["input_ids"][i].copy()
            ids[pos] = rec["masked_lm_ids"][i, :k]
            n_real = int(rec["input_mask"][i].sum())
            chosen = np.zeros(n_real, bool)
            chosen[pos] = True
            cont = is_cont[ids[:n_real]]
            cont[0] = False
            # A continuation and the token before it (same word) are both chosen or not;
            # a ## right after [SEP] starts a word of its own.
            prev_special = np.isin(ids[:n_real], [tokenizer.vocab["[CLS]"],
                                                  tokenizer.vocab["[SEP]"]])
            same_word = cont[1:] & ~prev_special[:-1]
            partial += int((chosen[1:] != chosen[:-1])[same_word].sum())
            cont_masked += int((chosen[1:] & same_word).sum())
        return partial, cont_masked

    partial, cont_masked = partial_words(True)
    assert partial == 0 and cont_masked > 50
    partial, _ = partial_words(False)
    assert partial > 50  # the check above would catch per-token masking


# --------------------------------------------------------------------------- determinism

def test_same_seed_same_bytes_other_seed_other_bytes(real_corpus_file, tokenizer, tmp_path):
    outs = []
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        out = str(tmp_path / f"{name}.tfrecord")
        create_pretraining_tfrecords(real_corpus_file, out, tokenizer,
                                     PretrainingDataOptions(dupe_factor=1,
                                                        random_seed=seed),
                                     log_instances=0)
        with open(out, "rb") as f:
            outs.append(f.read())
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]


def test_round_robin_outputs(real_corpus_file, tokenizer, tmp_path):
    options = PretrainingDataOptions(dupe_factor=1)
    single = str(tmp_path / "one.tfrecord")
    create_pretraining_tfrecords(real_corpus_file, single, tokenizer, options,
                                 log_instances=0)
    outs = [str(tmp_path / f"part{i}.tfrecord") for i in range(3)]
    stats = create_pretraining_tfrecords(real_corpus_file, ",".join(outs), tokenizer,
                                         options, log_instances=0)
    records = read_records(single)
    for i, out in enumerate(outs):
        assert read_records(out) == records[i::3]
    assert stats.instances_per_output == [len(records[i::3]) for i in range(3)]


def test_derive_shard_seed(tokenizer, tmp_path):
    src = _write(tmp_path / "in.txt", "\n\n".join(
        "\n".join(f"Doc {d} line {i} words here." for i in range(6)) for d in range(8)))
    outs = []
    for name, kwargs in (("key", {"shard_key": "shard_3.txt"}),
                         ("seed", {"options": PretrainingDataOptions(
                             dupe_factor=2, random_seed=derive_shard_seed(9, "shard_3.txt"))}),
                         ("plain", {})):
        out = str(tmp_path / f"{name}.tfrecord")
        kwargs.setdefault("options", PretrainingDataOptions(dupe_factor=2, random_seed=9))
        create_pretraining_tfrecords(src, out, tokenizer, log_instances=0, **kwargs)
        outs.append(read_records(out))
    assert outs[0] == outs[1] != outs[2]
    a = derive_shard_seed(12345, "wiki_shard_0001.txt")
    assert a == derive_shard_seed(12345, "wiki_shard_0001.txt")
    assert a != derive_shard_seed(12345, "wiki_shard_0002.txt")
    assert a != derive_shard_seed(12346, "wiki_shard_0001.txt")
    assert derive_shard_seed(1, 3) != derive_shard_seed(1, 4)
    assert 0 <= a < 2 ** 63


# --------------------------------------------------------------------------- serialisation

def test_serialisation_is_tensorflows():
    import tensorflow as tf
    rng = np.random.default_rng(1)
    n = 40
    feats = {"input_ids": rng.integers(0, 30522, (n, 16)),
             "flags": rng.integers(0, 2, (n, 5)),
             "big": rng.integers(0, 2 ** 40, (n, 3)),
             "weights": rng.normal(size=(n, 4)).astype(np.float32),
             "label": rng.integers(0, 2, (n, 1))}
    kinds = {k: tw.FLOAT if v.dtype == np.float32 else tw.INT64 for k, v in feats.items()}
    data, lengths = tw.encode_examples(feats, kinds)
    records = tw.split_records(data, lengths)
    for i in range(n):
        ex = tf.train.Example()
        for k, v in feats.items():
            if kinds[k] == tw.INT64:
                ex.features.feature[k].int64_list.value.extend(v[i].tolist())
            else:
                ex.features.feature[k].float_list.value.extend(v[i].tolist())
        assert records[i] == ex.SerializeToString(deterministic=True)
        assert tf.train.Example.FromString(records[i]) == ex
    framed = tw.encode_tfrecords(feats, kinds).tobytes()
    assert framed == tw.frame_records(data, lengths).tobytes()
    starts = np.cumsum(lengths) - lengths
    assert (tw.crc32c_many_numpy(data, starts, lengths)
            == tw.crc32c_many(data, starts, lengths)).all()
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        with tf.io.TFRecordWriter(os.path.join(d, "tf.rec")) as w:
            for r in records:
                w.write(r)
        with open(os.path.join(d, "tf.rec"), "rb") as f:
            assert f.read() == framed


# --------------------------------------------------------------------------- edge cases

def _write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


def test_single_sentence_documents_and_long_lines(tokenizer, tmp_path):
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    long_line = " ".join(words * 40)  # ~400 tokens, longer than a sequence
    docs = [f"Document {i} has only one sentence about {words[i % 10]}." for i in range(30)]
    text = "\n\n".join(docs) + "\n\n" + long_line + "\n" + long_line + "\n"
    src = _write(tmp_path / "in.txt", text)
    out = str(tmp_path / "out.tfrecord")
    stats = create_pretraining_tfrecords(src, out, tokenizer, PretrainingDataOptions(
        dupe_factor=2, max_seq_length=64, max_predictions_per_seq=10), log_instances=0)
    rec = parse_with_tensorflow(out, 64, 10)
    assert stats.documents == 31 and stats.instances == len(rec["input_ids"]) > 60
    assert (rec["input_mask"].sum(axis=1) <= 64).all()
    one_sentence = rec["input_mask"].sum(axis=1) < 40
    assert (rec["next_sentence_labels"][one_sentence, 0] == 1).all()


def test_single_document_corpus(tokenizer, tmp_path):
    src = _write(tmp_path / "in.txt", "\n".join(
        f"Sentence number {i} of the only document." for i in range(40)) + "\n")
    out = str(tmp_path / "out.tfrecord")
    stats = create_pretraining_tfrecords(src, out, tokenizer, PretrainingDataOptions(
        dupe_factor=2), log_instances=0)
    assert stats.documents == 1 and stats.instances > 0
    assert len(read_records(out)) == stats.instances


def _assert_clean_failure(excinfo, path, folder):
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    leftovers = [f for f in os.listdir(folder)
                 if ".tfrecord" in f and not os.path.isdir(os.path.join(folder, f))]
    assert leftovers == [], leftovers


@pytest.mark.parametrize("case", ["empty", "blank_lines", "non_utf8", "missing_input",
                                  "missing_vocab", "missing_folder", "output_is_folder"])
def test_bad_input(case, minilm_vocab, tmp_path):
    src = _write(tmp_path / "in.txt", "One sentence here.\nAnother one.\n\nSecond doc.\n")
    out = str(tmp_path / "out.tfrecord")
    vocab = minilm_vocab
    culprit = src
    if case == "empty":
        _write(src, "")
    elif case == "blank_lines":
        _write(src, "\n  \n\t\n")
    elif case == "non_utf8":
        with open(src, "wb") as f:
            f.write("Fine text.\nBad: ".encode() + b"\xff\xfe here\n")
    elif case == "missing_input":
        culprit = src = str(tmp_path / "nope.txt")
    elif case == "missing_vocab":
        culprit = vocab = str(tmp_path / "no_vocab.txt")
    elif case == "missing_folder":
        culprit = out = str(tmp_path / "no_such_dir" / "out.tfrecord")
    elif case == "output_is_folder":
        os.makedirs(out)
        culprit = out
    with pytest.raises(DataPrepError) as excinfo:
        create_pretraining_tfrecords(src, out, vocab, PretrainingDataOptions(
            dupe_factor=1), log_instances=0)
    _assert_clean_failure(excinfo, culprit, tmp_path)
    if case == "non_utf8":
        assert "byte offset 16" in str(excinfo.value)
    if case != "output_is_folder":
        assert not os.path.exists(out)


# --------------------------------------------------------------------------- command line

def _cli(args):
    return subprocess.run([sys.executable, os.path.join(REPO, "create_pretraining_data.py")]
                          + args, capture_output=True, text=True, cwd=REPO, timeout=120)


def test_cli_writes_readable_records_and_reports_errors(minilm_vocab, tmp_path):
    src = _write(tmp_path / "in.txt", "\n\n".join(
        "\n".join(f"Document {d} sentence {s} talks about topic {d * s}." for s in range(8))
        for d in range(6)) + "\n")
    out = str(tmp_path / "out.tfrecord")
    logs = str(tmp_path) + "_logs"
    proc = _cli([f"--input_file={src}", f"--output_file={out}", f"--vocab_file={minilm_vocab}",
                 "--max_seq_length=32", "--max_predictions_per_seq=5", "--dupe_factor=2",
                 f"--log_dir={logs}"])
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"Wrote (\d+) total instances", proc.stderr)
    assert m and int(m.group(1)) > 0
    assert "*** Example ***" in proc.stderr
    # The command ends without the interpreter's teardown: its log file is whole all the same.
    with open(os.path.join(logs, "create_pretraining_data.log"), encoding="utf-8") as log:
        assert log.read().rstrip().endswith(m.group(0))
    records = read_records(out)
    assert len(records) == int(m.group(1))
    import tensorflow as tf
    parsed = tf.io.parse_single_example(records[0], google_name_to_features(32, 5))
    assert parsed["input_ids"].shape == (32,)
    vocab = open(minilm_vocab, encoding="utf-8").read().splitlines()
    # The metadata goes beside the output's folder (NVIDIA's reader takes every file of a
    # records folder as records), never into it.
    meta = record_metadata.metadata_path(out)
    assert meta == str(tmp_path) + ".meta/out.tfrecord.meta.json"
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.tfrecord"]
    assert record_metadata.parse(open(meta).read(), out) == {
        "format": "bert-pretraining-records", "writer_version": 1, "records": len(records),
        "max_seq_length": 32, "max_predictions_per_seq": 5, "vocab_size": len(vocab),
        "vocab_sha256": record_metadata.vocab_sha256(vocab), "masking": "static",
        "sequences_per_row": 0}

    with open(src, "ab") as f:
        f.write(b"caf\xe9\n")
    bad_out = str(tmp_path / "bad.tfrecord")
    proc = _cli([f"--input_file={src}", f"--output_file={bad_out}",
                 f"--vocab_file={minilm_vocab}"])
    assert proc.returncode == 1
    error_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert error_lines == [f"error: {src}: invalid UTF-8 at byte offset "
                           f"{os.path.getsize(src) - 2} (byte 0xe9)"], proc.stderr
    assert not os.path.exists(bad_out)
    assert not os.path.exists(record_metadata.metadata_path(bad_out))
    assert not [f for f in os.listdir(tmp_path) if ".tmp-" in f]


def test_documents_lost_to_truncation_are_warned_with_the_share(tokenizer, tmp_path, caplog):
    """A document without sentence breaks becomes a few instances and loses almost all of its
    tokens: one warning line says how much; a normal corpus gets no such warning."""
    words = ("the cat sat on a mat while it rained " * 2000).strip()
    src = _write(tmp_path / "one_line.txt", words + "\n\nA short document.\nWith two lines.\n")
    options = PretrainingDataOptions(dupe_factor=1)
    with caplog.at_level("WARNING"):
        create_pretraining_tfrecords(src, str(tmp_path / "long.tfrecord"), tokenizer,
                                     options, log_instances=0)
    warnings = [r.getMessage() for r in caplog.records if "truncation" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("1 of 2 documents lose most"), warnings
    share = float(re.search(r"\(([\d.]+)% of theirs", warnings[0]).group(1))
    kept = (options.max_seq_length - 3) / len(tokenizer.tokenize(words))
    assert share == pytest.approx(100 * (1 - kept), abs=1.0)
    caplog.clear()
    normal = _write(tmp_path / "normal.txt", "\n\n".join(
        "\n".join(f"Doc {d} line {i} words here." for i in range(6)) for d in range(8)))
    with caplog.at_level("WARNING"):
        create_pretraining_tfrecords(normal, str(tmp_path / "n.tfrecord"), tokenizer,
                                     options, log_instances=0)
    assert not [r for r in caplog.records if "truncation" in r.getMessage()]


# ------------------------------------------- settings whose records no run can read

def test_records_no_run_can_read_are_refused_before_anything_is_read(minilm_vocab, tmp_path):
    """--max_predictions_per_seq above --max_seq_length: run_pretraining.py refuses such
    static records (pretraining/runner.py), so they are refused before the input is read
    (its absence is not what is reported) and nothing is written. Dynamic-masking records
    hold no predictions: the same flags are theirs to ignore, also packed."""
    src = _write(tmp_path / "in.txt", "\n\n".join(
        "\n".join(f"Document {d} sentence {s} talks about topic {d * s}." for s in range(8))
        for d in range(4)) + "\n")
    out = str(tmp_path / "out.tfrecord")
    for options in (PretrainingDataOptions(max_seq_length=32, max_predictions_per_seq=33),
                    PretrainingDataOptions(max_seq_length=32, max_predictions_per_seq=33,
                                           max_sequences_per_row=2)):
        with pytest.raises(DataPrepError) as refused:
            create_pretraining_tfrecords(str(tmp_path / "missing.txt"), out, minilm_vocab,
                                         options, log_instances=0)
        assert str(refused.value) == (
            "--max_predictions_per_seq=33 with --max_seq_length=32: run_pretraining.py refuses "
            "records with more masked-LM predictions (--max_predictions_per_seq) than tokens "
            "(--max_seq_length): pass at most the sequence length (NVIDIA's: 20 for 128, 80 "
            "for 512)")
    assert sorted(os.listdir(tmp_path)) == ["in.txt"]
    stats = create_pretraining_tfrecords(src, out, minilm_vocab, PretrainingDataOptions(
        max_seq_length=32, max_predictions_per_seq=33, masking="dynamic",
        max_sequences_per_row=2, dupe_factor=1), log_instances=0)
    assert stats.instances > 0
    # the same settings end a command line as it is parsed: before the log file or any output
    logs = tmp_path / "logs"
    for pack in ([], ["--pack"]):
        proc = _cli([f"--input_file={src}", f"--output_file={tmp_path / 'cli.tfrecord'}",
                     f"--vocab_file={minilm_vocab}", "--max_seq_length=32",
                     "--max_predictions_per_seq=40", f"--log_dir={logs}"] + pack)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines() == [
            "error: flags max_seq_length=32, max_predictions_per_seq=40, masking=static: "
            "run_pretraining.py refuses records with more masked-LM predictions "
            "(--max_predictions_per_seq) than tokens (--max_seq_length): pass at most the "
            "sequence length (NVIDIA's: 20 for 128, 80 for 512) (--help lists the flags)"]
        assert not logs.exists() and not (tmp_path / "cli.tfrecord").exists()
        assert not os.path.exists(record_metadata.metadata_path(str(tmp_path / "cli.tfrecord")))
