"""Tests of data_prep.wordpiece.tokenization, tokenization_reference and char_classes: Google's BERT
tokenization, exactly and fast.

The real text (two books, raw Wikipedia XML with accents, CJK, markup) is tokenized
once per module by the fast path, the pure-Python reference and HuggingFace, and the
results are shared by the tests below.
"""
import bz2
import glob
import os
import re
import unicodedata

import numpy as np
import pytest

from data_prep.wordpiece import tokenization
from data_prep.wordpiece.tokenization import (FullTokenizer, VocabError, load_vocab, printable_text,
                                              validate_case_matches_checkpoint, word_starts)
from data_prep.wordpiece.tokenization_reference import (BasicTokenizer, WordpieceTokenizer,
                                                        convert_to_unicode)

# Literal special-token text: HuggingFace keeps it atomic, Google tokenizes it as text.
SPECIAL_TEXT = re.compile(r"\[(?:CLS|SEP|PAD|MASK|UNK)\]")
# Appended to the real text so that both kinds of legitimate HF/Google difference occur.
CRAFTED_LINES = [
    "a " + "ab" * 75 + " word of 150 characters",
    "x" * 200 + " and " + "y" * 201,
    "[CLS] Alice was beginning to get very tired [SEP] of sitting [MASK] by her sister",
    "literal [PAD] and [UNK] text, and [C\u200bLS] with a zero-width space",
]


def _read_lines(shared_data, kind):
    pattern = "*.txt" if kind == "books" else "*.bz2"
    paths = sorted(glob.glob(os.path.join(shared_data, kind, pattern)))
    assert len(paths) == 2, f"expected 2 {kind} files, found {paths}"
    lines = []
    for path in paths:
        with (bz2.open if path.endswith(".bz2") else open)(path, "rt", encoding="utf-8") as f:
            lines += f.read().split("\n")
    return lines


@pytest.fixture(scope="module")
def book_lines(shared_data):
    return _read_lines(shared_data, "books")


@pytest.fixture(scope="module")
def corpus(shared_data, book_lines):
    """Every line of both books and of the raw Wikipedia XML, plus the crafted lines."""
    return book_lines + _read_lines(shared_data, "wiki") + CRAFTED_LINES


@pytest.fixture(scope="module")
def uncased(minilm_vocab):
    return FullTokenizer(minilm_vocab, do_lower_case=True)


@pytest.fixture(scope="module")
def fast_tokens(uncased, corpus):
    return uncased.tokenize_batch(corpus)


@pytest.fixture(scope="module")
def reference_tokens(uncased, corpus):
    return [uncased.tokenize_reference(line) for line in corpus]


def _hf_bert_modules():
    """HF's slow (pure-Python) BertTokenizer and its BasicTokenizer/WordpieceTokenizer.

    transformers 5 made ``BertTokenizer`` the Rust-backed one and kept the slow Python
    one as ``BertTokenizerLegacy``; in transformers 4 ``BertTokenizer`` is the slow one.
    """
    transformers = pytest.importorskip("transformers")
    if hasattr(transformers, "BertTokenizerLegacy"):
        from transformers.models.bert import tokenization_bert_legacy as module
        return transformers.BertTokenizerLegacy, module
    from transformers.models.bert import tokenization_bert as module
    return transformers.BertTokenizer, module


def _word_lengths(tokens):
    """Lengths of the words that WordPiece tokens spell out ([UNK] counts as 5)."""
    lengths = []
    for token, starts in zip(tokens, word_starts(tokens)):
        if starts:
            lengths.append(len(token))
        else:
            lengths[-1] += len(token) - 2
    return lengths


def _mismatch_report(mismatches):
    line, ours, theirs = mismatches[0]
    return (f"{len(mismatches)} lines differ; first {line[:200]!r}:\n"
            f"  ours  {ours[:40]}\n  other {theirs[:40]}")


# 1. Parity with HuggingFace -------------------------------------------------

@pytest.mark.oracle
def test_matches_huggingface_bert_tokenizer_on_real_text(uncased, minilm_vocab, corpus,
                                                         fast_tokens, reference_tokens):
    hf_class, hf_module = _hf_bert_modules()
    hf = hf_class(minilm_vocab, do_lower_case=True)
    # HF's own pieces configured as Google: no protected special tokens, 200-char words
    # (HF's BasicTokenizer also applies NFC and drops all C* characters: not needed here).
    hf_basic = hf_module.BasicTokenizer(do_lower_case=True)
    hf_wordpiece = hf_module.WordpieceTokenizer(hf.vocab, "[UNK]", max_input_chars_per_word=200)
    removed = uncased._tables.removed
    ours_ids = uncased.encode_batch(corpus)

    compared = long_word_lines = special_text_lines = 0
    mismatches, google_mismatches = [], []
    for line, ours, ids, reference in zip(corpus, fast_tokens, ours_ids, reference_tokens):
        long_word = any(100 < n <= 200 for n in _word_lengths(ours))
        special_text = SPECIAL_TEXT.search(line) or SPECIAL_TEXT.search(removed.sub("", line))
        if long_word or special_text:
            # Legitimate differences: Google's behaviour is checked instead.
            long_word_lines += bool(long_word)
            special_text_lines += bool(special_text)
            google = [p for w in hf_basic.tokenize(line) for p in hf_wordpiece.tokenize(w)]
            if not ours == reference == google:
                google_mismatches.append((line, ours, google))
            continue
        compared += 1
        theirs = hf.tokenize(line)
        if ours != theirs or ids != hf.convert_tokens_to_ids(theirs):
            mismatches.append((line, ours, theirs))

    assert not mismatches, _mismatch_report(mismatches)
    assert not google_mismatches, _mismatch_report(google_mismatches)
    assert compared > 55_000
    # At least the crafted lines; the real text has none of either kind.
    assert long_word_lines >= 2 and special_text_lines >= 2, (long_word_lines, special_text_lines)
    print(f"compared {compared} lines with HF; excluded {long_word_lines} with 101-200 char "
          f"words, {special_text_lines} with literal special-token text")


@pytest.mark.oracle
def test_huggingface_really_differs_where_google_wins(minilm_vocab, uncased):
    """The exclusions above are real differences, and ours is Google's side of them."""
    hf_class, _ = _hf_bert_modules()
    hf = hf_class(minilm_vocab, do_lower_case=True)
    word = "ab" * 75
    assert hf.tokenize(word) == ["[UNK]"]
    assert _spelled(uncased.tokenize(word)) == word
    assert hf.tokenize("[CLS] hi") == ["[CLS]", "hi"]
    assert uncased.tokenize("[CLS] hi") == ["[", "cl", "##s", "]", "hi"]


# 2. Fast path == pure-Python reference -------------------------------------

def test_fast_path_equals_reference_on_real_text(corpus, fast_tokens, reference_tokens):
    mismatches = [(line, ours, ref)
                  for line, ours, ref in zip(corpus, fast_tokens, reference_tokens) if ours != ref]
    assert not mismatches, _mismatch_report(mismatches)
    assert sum(map(len, fast_tokens)) > 2_000_000


@pytest.mark.parametrize("text, expected", [
    ("Héllo Wörld", ["hello", "world"]),
    ("ÀÉÎÕÜ çñ", ["aeiou", "cn"]),
    ("a\x07b\u200bc\x7f", ["abc"]),                      # Cc and Cf characters vanish
    ("x\u0000y\ufffdz", ["xyz"]),                        # NUL and U+FFFD vanish
    ("hello\tworld\r\nfoo\u00a0bar\u2028baz\u3000qux",
     ["hello", "world", "foo", "bar", "baz", "qux"]),
    ("  \t\n ", []),
    ("", []),
    ("don't stop.", ["don", "'", "t", "stop", "."]),
    ("$5^2`~", ["$", "5", "^", "2", "`", "~"]),          # ASCII symbols count as punctuation
    ("a\u2e43b", ["a", "\u2e43", "b"]),                  # P* missing from tokenizers' tables
    ("[CLS] [sep]", ["[", "cls", "]", "[", "sep", "]"]),
    ("\u039f\u0394\u039f\u03a3", ["\u03bf\u03b4\u03bf\u03c2"]),  # final sigma, as str.lower()
    ("a\ue000b", ["a\ue000b"]),                          # private use is kept (HF drops it)
    ("x\U0002b820y", ["x", "\U0002b820", "y"]),          # CJK Extension C is CJK
])
def test_basic_tokenization_crafted(uncased, text, expected):
    assert BasicTokenizer(do_lower_case=True).tokenize(text) == expected
    assert uncased.tokenize(text) == uncased.tokenize_reference(text)


def test_crafted_full_tokenization(uncased):
    assert uncased.tokenize("Héllo Wörld") == ["hello", "world"]
    cjk = uncased.tokenize("中文字符")
    assert len(cjk) == 4 and cjk[:2] == ["中", "文"]
    assert uncased.tokenize("[CLS]") == ["[", "cl", "##s", "]"]
    assert uncased.tokenize("unaffable") == ["una", "##ffa", "##ble"]
    word_150 = "ab" * 75
    assert _spelled(uncased.tokenize(word_150)) == word_150  # HF: [UNK] above 100
    assert _spelled(uncased.tokenize("x" * 200)) == "x" * 200
    assert uncased.tokenize("x" * 201) == ["[UNK]"]
    assert uncased.tokenize("a\ue000b") == ["[UNK]"]
    for text in ["x\u0000y\ufffdz\t\nq", "ΟΔΟΣ ΣΑΣ", "a" * 150 + "!",
                 "\u0301\u0301 e\u0301"]:
        assert uncased.tokenize(text) == uncased.tokenize_reference(text), text


def _spelled(tokens):
    assert "[UNK]" not in tokens
    return "".join(t[2:] if t.startswith("##") else t for t in tokens)


def _every_code_point_text():
    """Each code point in a final-sigma context, the homogeneous blocks thinned out."""
    parts = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        if unicodedata.category(chr(cp)) in ("Lo", "Co", "Cn") and cp % 97:
            continue
        parts.append(f"A\u03a3{chr(cp)}b ")
    return ["".join(parts[i:i + 2000]) for i in range(0, len(parts), 2000)]


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_fast_path_equals_reference_on_every_character_class(minilm_vocab, do_lower_case):
    tokenizer = FullTokenizer(minilm_vocab, do_lower_case=do_lower_case)
    texts = _every_code_point_text()
    fast = tokenizer.tokenize_batch(texts)
    for text, tokens in zip(texts, fast):
        assert tokens == tokenizer.tokenize_reference(text)


@pytest.fixture
def cased_vocab(tmp_path):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
              "Héllo", "World", "hello", "world", "##s", "!", "É", "##cole", "[", "]"]
    path = tmp_path / "cased_vocab.txt"
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return str(path)


def test_cased_keeps_case_and_accents(cased_vocab):
    cased = FullTokenizer(cased_vocab, do_lower_case=False)
    assert cased.do_lower_case is False
    cases = {
        "Héllo Worlds!": ["Héllo", "World", "##s", "!"],
        "École": ["É", "##cole"],
        "hello HELLO": ["hello", "[UNK]"],
        "He\u0301llo": ["[UNK]"],  # no Unicode normalization at all when cased
        "[CLS]": ["[", "[UNK]", "]"],
    }
    for text, expected in cases.items():
        assert cased.tokenize(text) == expected, text
        assert cased.tokenize_reference(text) == expected, text
    uncased = FullTokenizer(cased_vocab, do_lower_case=True)
    assert uncased.tokenize("Héllo WORLDS!") == ["hello", "world", "##s", "!"]


def test_wordpiece_reference_alone():
    vocab = {"un": 0, "##aff": 1, "##able": 2, "[UNK]": 3}
    wordpiece = WordpieceTokenizer(vocab)
    assert wordpiece.tokenize("unaffable unknown") == ["un", "##aff", "##able", "[UNK]"]
    assert wordpiece.max_input_chars_per_word == 200


def test_fallback_without_rust(minilm_vocab, book_lines):
    tokenizer = FullTokenizer(minilm_vocab)
    tokenizer._rust = None  # as when `tokenizers` is not installed
    lines = book_lines[:300] + CRAFTED_LINES
    assert tokenizer.tokenize_batch(lines) == [tokenizer.tokenize_reference(l) for l in lines]


# 3. Vocab errors -------------------------------------------------------------

GOOD_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world"]


def _write(tmp_path, content, name="vocab.txt"):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return str(path)


def _vocab_error(path):
    with pytest.raises(VocabError) as info:
        FullTokenizer(path)
    message = str(info.value)
    assert path in message and "\n" not in message
    assert isinstance(info.value, ValueError) and info.value.path == path
    return message


def test_vocab_missing_file(tmp_path):
    assert "not found" in _vocab_error(str(tmp_path / "nope.txt"))


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_vocab_empty_file(tmp_path, content):
    assert "empty" in _vocab_error(_write(tmp_path, content))


def test_vocab_duplicate_token(tmp_path):
    tokens = GOOD_TOKENS + ["foo", "hello"]
    message = _vocab_error(_write(tmp_path, "\n".join(tokens) + "\n"))
    assert "duplicate token 'hello' on lines 6 and 9" in message


@pytest.mark.parametrize("special", ["[UNK]", "[CLS]", "[SEP]", "[MASK]"])
def test_vocab_missing_special_token(tmp_path, special):
    tokens = [t for t in GOOD_TOKENS if t != special]
    message = _vocab_error(_write(tmp_path, "\n".join(tokens) + "\n"))
    assert "missing required special token" in message and special in message
    assert all(t not in message for t in tokenization.SPECIAL_TOKENS if t != special)


def test_vocab_not_utf8(tmp_path):
    content = "\n".join(GOOD_TOKENS).encode("utf-8") + b"\ncaf\xe9\n"
    message = _vocab_error(_write(tmp_path, content))
    assert "line 8" in message and "UTF-8" in message


def test_vocab_ids_are_line_numbers(tmp_path):
    path = _write(tmp_path, "\r\n".join(GOOD_TOKENS) + "\r\n")
    vocab = load_vocab(path)
    assert list(vocab.items()) == [(t, i) for i, t in enumerate(GOOD_TOKENS)]
    tokenizer = FullTokenizer(path)
    assert tokenizer.vocab == vocab and tokenizer.vocab_size == len(GOOD_TOKENS)
    assert tokenizer.inv_vocab == {i: t for i, t in enumerate(GOOD_TOKENS)}
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id,
            tokenizer.mask_id) == (0, 1, 2, 3, 4)


def test_bad_sentencepiece_model(tmp_path):
    message = _vocab_error(_write(tmp_path, b"not a model", name="broken.model"))
    assert "SentencePiece" in message


# 4. SentencePiece ------------------------------------------------------------

def _train_sentencepiece(tmp_path, book_lines, symbols):
    spm = pytest.importorskip("sentencepiece")
    prefix = str(tmp_path / "tiny")
    lines = [l for l in book_lines if l.strip()][:400]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(l.lower() for l in lines), model_prefix=prefix, vocab_size=300,
        user_defined_symbols=symbols, pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, minloglevel=2)
    return prefix + ".model", spm.SentencePieceProcessor(model_file=prefix + ".model")


def test_sentencepiece_model(tmp_path, book_lines):
    model, sp = _train_sentencepiece(tmp_path, book_lines, ["[CLS]", "[SEP]", "[MASK]"])
    tokenizer = FullTokenizer(model, do_lower_case=True)
    assert tokenizer.is_sentencepiece and tokenizer.vocab_size == 300
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id,
            tokenizer.mask_id) == (0, 1, 2, 3, 4)
    assert tokenizer.unk_token == "<unk>"

    text = "Alice was VERY tired of sitting by her sister, Zzyzx!"
    tokens = tokenizer.tokenize(text)
    assert tokens == sp.encode(text.lower(), out_type=str)
    assert tokens[0].startswith("\u2581") and len(tokens) > 8
    ids = tokenizer.encode_batch([text])[0]
    assert ids == sp.encode(text.lower()) == tokenizer.convert_tokens_to_ids(tokens)
    assert tokenizer.convert_ids_to_tokens(ids) == tokens
    assert tokenizer.convert_tokens_to_ids(["[MASK]", "no-such-piece"]) == [4, 1]
    # SentencePiece matches user-defined symbols in text, but only as written:
    # lower-casing turns a literal "[CLS]" into plain text.
    assert "[CLS]" not in tokenizer.tokenize("a [CLS] b")
    assert FullTokenizer(model, do_lower_case=False).tokenize("a [CLS] b").count("[CLS]") == 1
    starts = tokenizer.word_starts(tokens)
    assert starts[0] and sum(starts) >= 9 and not all(starts)

    lines = [l for l in book_lines if l.strip()][400:600]
    assert tokenizer.tokenize_batch(lines) == [tokenizer.tokenize(l) for l in lines]
    assert tokenizer.encode_batch(lines) == [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(l))
                                             for l in lines]
    flat, counts = tokenizer.encode_batch_flat(lines)
    per_text = np.split(flat, np.cumsum(counts)[:-1])
    assert [ids.tolist() for ids in per_text] == tokenizer.encode_batch(lines)


def test_sentencepiece_without_special_pieces(tmp_path, book_lines):
    model, _ = _train_sentencepiece(tmp_path, book_lines, ["[CLS]", "[SEP]"])
    message = _vocab_error(model)
    assert "[MASK]" in message and "[CLS]" not in message


# 5. Batch API ------------------------------------------------------------------

def test_batch_equals_per_line(minilm_vocab, book_lines):
    per_line = FullTokenizer(minilm_vocab)
    batch = FullTokenizer(minilm_vocab)
    tokens = [per_line.tokenize(line) for line in book_lines]
    assert batch.tokenize_batch(book_lines) == tokens
    ids = [per_line.convert_tokens_to_ids(t) for t in tokens]
    assert batch.encode_batch(book_lines) == ids
    assert FullTokenizer(minilm_vocab).encode_batch(book_lines) == ids  # cold word cache

    # The flat form (pre-training data): the same ids, texts without words included.
    texts = [book_lines[0], "", "   \x00\t ", *book_lines[1:50], "\x01", book_lines[0]]
    expected = [per_line.convert_tokens_to_ids(per_line.tokenize(t)) for t in texts]
    flat, counts = FullTokenizer(minilm_vocab).encode_batch_flat(texts)
    assert counts.tolist() == [len(e) for e in expected]
    assert flat.dtype == np.int32 and flat.tolist() == [i for e in expected for i in e]
    assert [a.tolist() for a in FullTokenizer(minilm_vocab).encode_batch_flat([])] == [[], []]
    # Its safety nets give the same ids: WordPiece word by word where the pieces cannot be
    # told apart by their "##" (forced here), or where `tokenizers` is missing.
    untold = FullTokenizer(minilm_vocab)
    untold._word_start = np.ones(untold.vocab_size, dtype=bool)
    no_rust = FullTokenizer(minilm_vocab)
    no_rust._rust = None
    for tokenizer in (untold, no_rust):
        flat_again, counts_again = tokenizer.encode_batch_flat(texts)
        assert flat_again.tolist() == flat.tolist()
        assert counts_again.tolist() == counts.tolist()

    small_cache = FullTokenizer(minilm_vocab)
    small_cache.word_cache_size = 500  # forces the cache to be dropped and refilled
    chunks = [book_lines[i:i + 20] for i in range(0, len(book_lines), 20)]
    assert [t for chunk in chunks for t in small_cache.tokenize_batch(chunk)] == tokens
    assert len(small_cache._word_cache) <= 500


# Smaller helpers ---------------------------------------------------------------

def test_ids_and_word_starts(uncased):
    tokens = uncased.tokenize("The unaffable Zzyzx.")
    ids = uncased.convert_tokens_to_ids(tokens)
    assert uncased.convert_ids_to_tokens(ids) == tokens
    assert uncased.convert_tokens_to_ids(["hello", "no-such-token"]) == [7592, uncased.unk_id]
    assert uncased.vocab_size == 30522 and uncased.cls_id == 101 and uncased.pad_id == 0
    with pytest.raises(KeyError, match="30522"):
        uncased.convert_ids_to_tokens([30522])
    assert word_starts(tokens) == [not t.startswith("##") for t in tokens]
    assert uncased.word_starts(["un", "##aff", "##able", "."]) == [True, False, False, True]


def test_text_helpers():
    assert convert_to_unicode(b"caf\xc3\xa9\xff") == "café"
    assert printable_text("x") == "x" and printable_text(b"y") == "y"
    with pytest.raises(ValueError):
        convert_to_unicode(3)


def test_validate_case_matches_checkpoint():
    validate_case_matches_checkpoint(True, "/m/uncased_L-12_H-768_A-12/bert_model.ckpt")
    validate_case_matches_checkpoint(False, "/m/cased_L-12_H-768_A-12/bert_model.ckpt")
    validate_case_matches_checkpoint(False, "/m/my_model/bert_model.ckpt")
    validate_case_matches_checkpoint(True, None)
    with pytest.raises(ValueError, match="do_lower_case=True"):
        validate_case_matches_checkpoint(False, "gs://b/uncased_L-24_H-1024_A-16/bert_model.ckpt")
    with pytest.raises(ValueError, match="do_lower_case=False"):
        validate_case_matches_checkpoint(True, "/m/multi_cased_L-12_H-768_A-12/bert_model.ckpt")
