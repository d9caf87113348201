"""Sharding on the real formatted Wikipedia fragment and books: whole documents, balanced
shards, the test fraction, determinism, and the sentence splitters."""
import os

import pytest

from bertprep_support import formatted_corpus
from data_prep.bertprep import sentence_segmentation
from data_prep.bertprep import sharding


def formatted_files(shared_data, *datasets):
    root, _ = formatted_corpus(shared_data)
    return [os.path.join(root, "formatted_one_article_per_line", f"{d}.txt") for d in datasets]


def shard(inputs, out, **kwargs):
    options = sharding.ShardingOptions(**{"n_training_shards": 4, "n_test_shards": 2,
                                          "fraction_test_set": 0.1, **kwargs})
    return sharding.shard_corpus(inputs, str(out), "corpus", options, progress=False,
                                 log=lambda _m: None)


def read_documents(path):
    """Documents of a shard: lists of sentences, separated by blank lines."""
    text = open(path, encoding="utf-8").read()
    assert text.endswith("\n\n") and "\n\n\n" not in text
    return [block.split("\n") for block in text[:-2].split("\n\n")]


def non_space(text):
    return "".join(text.split())


def test_documents_are_never_split(shared_data, tmp_path):
    inputs = formatted_files(shared_data, "wikicorpus_en", "bookscorpus")
    stats = shard(inputs, tmp_path)
    originals = sorted(non_space(line) for path in inputs
                       for line in open(path, encoding="utf-8") if line.strip())
    found = []
    for path in stats.shard_files:
        for doc in read_documents(path):
            assert all(s and s == s.strip() for s in doc)
            found.append(non_space("".join(doc)))
    # Each document's sentences, concatenated, are exactly one whole input document:
    # a document split over two shards (or two blocks) would not match any.
    assert sorted(found) == originals
    assert stats.documents == len(originals)
    assert sum(stats.shard_sentences) > 5 * len(originals)


def test_shards_are_balanced_and_test_fraction_respected(shared_data, tmp_path):
    (wiki,) = formatted_files(shared_data, "wikicorpus_en")
    sizes = [len(line.rstrip(b"\n")) for line in open(wiki, "rb") if line.strip()]
    stats = shard([wiki], tmp_path, n_training_shards=4, n_test_shards=2, fraction_test_set=0.2)
    assert stats.test_documents == round(0.2 * len(sizes))
    assert stats.training_documents == len(sizes) - stats.test_documents
    train = stats.shard_bytes[:4]
    # Greedy largest-first: shards differ by at most the largest document, and here by far less.
    assert max(train) - min(train) <= max(sizes)
    assert max(train) / min(train) < 1.05, train
    test_docs = stats.shard_documents[4:]
    assert sum(test_docs) == stats.test_documents and min(test_docs) >= 1
    assert [os.path.basename(p) for p in stats.shard_files] == [
        "corpus_training_0.txt", "corpus_training_1.txt", "corpus_training_2.txt",
        "corpus_training_3.txt", "corpus_test_0.txt", "corpus_test_1.txt"]


def _contents(stats):
    return [open(p, "rb").read() for p in stats.shard_files]


def test_deterministic_given_seed_and_independent_of_processes(shared_data, tmp_path):
    inputs = formatted_files(shared_data, "wikicorpus_en")
    a = _contents(shard(inputs, tmp_path / "a", seed=7))
    b = _contents(shard(inputs, tmp_path / "b", seed=7, n_processes=2))
    c = _contents(shard(inputs, tmp_path / "c", seed=8))
    assert a == b
    assert a != c
    assert not [n for n in os.listdir(tmp_path / "b") if ".tmp-" in n]


def test_too_few_documents_for_the_shards(shared_data, tmp_path):
    (books,) = formatted_files(shared_data, "bookscorpus")
    with pytest.raises(sharding.ShardingError) as err:
        shard([books], tmp_path, n_training_shards=4, n_test_shards=0)
    assert "fewer than --n_training_shards=4" in str(err.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["blingfire", "rules"])
def test_sentence_splitters(name):
    if name == "blingfire":
        pytest.importorskip("blingfire", reason="blingfire not installed (pip install blingfire)")
    split = sentence_segmentation.get_splitter(name)
    text = ("Mr. Smith went to Washington D.C. on Monday. He said: “It is late!” "
            "Then he left (quickly). 3 days later, e.g. on Thursday, he came back.")
    sentences = split(text)
    assert sentences[0].startswith("Mr. Smith went to Washington")
    assert "He said: “It is late!”" in sentences
    assert non_space("".join(sentences)) == non_space(text)
    assert 3 <= len(sentences) <= 5
    assert split("") == []


@pytest.mark.faults
def test_a_failing_run_leaves_no_shards(tmp_path):
    corpus = tmp_path / "corpus.txt"
    good = "First sentence here. Second one follows.\n"
    corpus.write_bytes((good * 30).encode() + b"Bad \xff byte. Still bad.\n" + good.encode() * 5)
    out = tmp_path / "shards"
    with pytest.raises(sharding.ShardingError) as err:
        shard([str(corpus)], out, n_training_shards=3, n_test_shards=1, n_processes=2)
    assert str(err.value) == (f"{corpus}: invalid UTF-8 at byte offset {len(good) * 30 + 4} "
                              f"(byte 0xff)")
    # No shard under a final name; the shards written are kept, hidden, for a rerun.
    assert [name for name in os.listdir(out) if not name.startswith(".")] == []
    assert sharding.unfinished(str(out))
