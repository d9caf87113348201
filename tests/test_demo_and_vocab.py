"""The built-in corpus, vocabulary training and the demo's data preparation (the demo end to
end: tests/test_readme_install.py, in the environment scripts/demo.sh builds)."""
import os

import pytest

from data_prep.bertprep.builtin_corpus import module_document, write_corpus
from data_prep.wordpiece.tokenization import FullTokenizer
from data_prep.wordpiece.vocab import SPECIAL_TOKENS, VocabTrainingError, train_wordpiece_vocab


def test_module_document_reads_docstrings_without_importing(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text('"""Module prose that is long enough to keep.\n\n>>> code()\n"""\n'
                      'raise SystemExit("imported!")\n'
                      'def f():\n    """Function prose, also long enough to keep."""\n')
    text = module_document(str(source))
    assert text == ("Module prose that is long enough to keep. "
                    "Function prose, also long enough to keep.")
    (tmp_path / "broken.py").write_text("def (:\n")
    assert module_document(str(tmp_path / "broken.py")) == ""


@pytest.fixture(scope="module")
def stdlib_corpus(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("corpus") / "stdlib.txt")
    documents, size = write_corpus(path, max_documents=120)
    return path, documents, size


def test_stdlib_corpus_is_one_document_a_line(stdlib_corpus):
    path, documents, size = stdlib_corpus
    lines = open(path, encoding="utf-8").read().splitlines()
    assert documents == len(lines) == 120 and size == os.path.getsize(path)
    assert all(len(line) >= 200 and "\t" not in line for line in lines)
    assert not any(line.lstrip().startswith(">>>") for line in lines)


def test_trained_vocab_works_with_full_tokenizer(stdlib_corpus, tmp_path):
    path = stdlib_corpus[0]
    vocab = str(tmp_path / "vocab.txt")
    count = train_wordpiece_vocab([path], vocab, vocab_size=2000)
    tokens = open(vocab, encoding="utf-8").read().split("\n")[:-1]
    assert count == len(tokens) and 1500 <= count <= 2000
    assert tokens[:5] == SPECIAL_TOKENS and len(set(tokens)) == len(tokens)
    tokenizer = FullTokenizer(vocab, do_lower_case=True)
    pieces = tokenizer.tokenize("Return the iterator over the sequence.")
    assert "[UNK]" not in pieces and "the" in pieces
    assert any(p.startswith("##") for p in tokenizer.tokenize("Unbelievably frobnicated"))


def test_vocab_training_errors_name_the_file(tmp_path):
    with pytest.raises(VocabTrainingError, match=r"missing\.txt: no such input file"):
        train_wordpiece_vocab([str(tmp_path / "missing.txt")], str(tmp_path / "v.txt"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(VocabTrainingError, match=r"empty\.txt: no text"):
        train_wordpiece_vocab([str(tmp_path / "empty.txt")], str(tmp_path / "v.txt"))
    assert not (tmp_path / "v.txt").exists()


def test_the_demo_corpus_is_whole_sentences_the_segmenter_finds_again(tmp_path):
    """Each document of the demo's corpus, split by the segmenter sharding uses, gives
    sentences a short sequence holds whole (its docstrings used to run together into
    "sentences" of hundreds of tokens, and 28% of the tokens were cut)."""
    from cli.demo import write_stdlib_corpus
    from data_prep.bertprep.builtin_corpus import MAX_SENTENCE_CHARS, sentence_document
    from data_prep.bertprep.sentence_segmentation import get_splitter
    split = get_splitter("auto")
    path = tmp_path / "corpus.txt"
    assert write_stdlib_corpus(str(path), max_documents=80) == 80
    documents = [block for block in path.read_text(encoding="utf-8").split("\n\n") if block]
    assert len(documents) == 80
    for document in documents:
        sentences = split(document)
        assert len(sentences) >= 2
        assert all(len(sentence) <= MAX_SENTENCE_CHARS and sentence[-1] in ".!?\"')]"
                   for sentence in sentences), [s for s in sentences if len(s) > 160][:3]
        assert sentence_document(document, split) == document  # nothing more to drop
    run_on = "Return x " + " ".join(["value"] * 40) + " all of it."  # 250 characters
    assert sentence_document(f"First one here. {run_on} Last one here.",
                             split) == "First one here. Last one here."


def test_the_demo_s_data_preparation_warns_of_no_truncation(tmp_path, capfd):
    """The demo's step 1 as the demo runs it (bertPrep's actions, records of 64 and 128):
    no warning, so the demo teaches no one to ignore one (it warned five times that its own
    corpus lost 28% of its tokens to truncation)."""
    from cli.demo import prepare_demo_data
    vocab, records = prepare_demo_data(str(tmp_path))
    captured = capfd.readouterr()
    assert os.path.isfile(vocab) and sorted(records) == [64, 128]
    output = captured.out + captured.err
    assert "truncation" not in output and "warning" not in output.lower(), \
        [line for line in output.splitlines() if "warn" in line.lower()]


# The demo end to end runs in the environment scripts/demo.sh builds:
# tests/test_readme_install.py::test_demo_runs_end_to_end.
