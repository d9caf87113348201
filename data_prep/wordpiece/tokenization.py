"""BERT tokenization that reproduces Google's original ``tokenization.py`` exactly.

Checkpoints are only useful with the tokenization they were trained with, so the
behaviour here is Google's, including where HuggingFace differs:

* words longer than 200 characters become ``[UNK]`` (HuggingFace: 100);
* literal text such as ``"[CLS]"`` is ordinary text (``[``, ``cl``, ``##s``, ``]``
  when lower-casing); special tokens are only ever inserted by the caller;
* only categories Cc/Cf count as control characters (HuggingFace also drops
  unassigned and private-use characters) and there is no NFC step.

Two implementations:

* ``BasicTokenizer`` + ``WordpieceTokenizer`` (``data_prep.wordpiece.tokenization_reference``): a
  small pure-Python reference, character by character, that documents the algorithm;
* ``FullTokenizer``'s fast path (this module): the same steps on whole strings with
  C-implemented primitives (``re``, ``str.lower``, ``unicodedata.normalize``,
  ``str.translate``, ``str.split``) driven by tables built from the reference's own
  predicates (``data_prep.wordpiece.char_classes``); each
  distinct word is then split on punctuation and run through WordPiece once, by the
  Rust ``tokenizers`` library (for pre-training data, all distinct words of a batch in
  one call). Its output is identical (the tests check real text and every character
  class).

Why not ``tokenizers``' own ``BertNormalizer``/``BertPreTokenizer``: they carry
older Unicode tables than Python's ``unicodedata`` and, scanned over every code
point (tokenizers 0.23, Python 3.11), differ from Google on 760 assigned characters
(newer punctuation, combining marks and format characters; CJK Extension C-F,
U+2B820-U+2CEAF, not treated as CJK), drop private-use characters that Google keeps,
and lower-case a word-final capital sigma to "σ" where Python's ``str.lower`` (and
so Google) gives "ς".

A SentencePiece model (a ``.model`` file) can be used instead of a WordPiece vocab;
see ``FullTokenizer``.
"""
import collections
import itertools
import os
import re
import unicodedata

import numpy as np

from data_prep.wordpiece.char_classes import CharTables, is_punctuation
from data_prep.wordpiece.tokenization_reference import (CONTINUATION_PREFIX,
                                                        MAX_INPUT_CHARS_PER_WORD, BasicTokenizer,
                                                        WordpieceTokenizer, convert_to_unicode)
from reporting.errors import UsageError

# Tokens that BERT pre-training and fine-tuning insert; a vocab without them is unusable.
SPECIAL_TOKENS = ("[UNK]", "[CLS]", "[SEP]", "[MASK]")
SENTENCEPIECE_WORD_START = "\u2581"


class VocabError(ValueError):
    """A vocab (or SentencePiece model) file that cannot be used; the message names the file."""

    def __init__(self, path, problem):
        self.path = path
        super().__init__(f"{path}: {problem}")


# ---------------------------------------------------------------------------
# Small helpers kept from Google's API, used by the data preparation scripts.

def printable_text(text):
    """Returns ``text`` in a form suitable for ``print``/logging (``str`` on Python 3)."""
    return convert_to_unicode(text)


def word_starts(tokens):
    """Marks which WordPiece tokens begin a word (``##`` marks a continuation).

    Whole-word masking masks all pieces of a word together, so it needs to know where
    words start.
    """
    return [not token.startswith(CONTINUATION_PREFIX) for token in tokens]


def validate_case_matches_checkpoint(do_lower_case, init_checkpoint):
    """Raises ``UsageError`` (a ValueError) when ``do_lower_case`` contradicts a known
    Google checkpoint name.

    The casing is not stored in ``bert_config.json``, so a mismatch would otherwise go
    unnoticed and silently hurt fine-tuning. Only Google's released model directory
    names are recognised (e.g. ``.../uncased_L-12_H-768_A-12/bert_model.ckpt``).
    ``UsageError`` because two flags contradict each other: every command reports it in
    one line (a plain ValueError reached the user as a 27-line traceback from the
    fine-tuning commands, whose one-line path does not take every ValueError).
    """
    if not init_checkpoint:
        return
    match = re.match(r"^.*?([A-Za-z0-9_-]+)/bert_model\.ckpt", init_checkpoint)
    if match is None:
        return
    model_name = match.group(1)
    uncased = {"uncased_L-24_H-1024_A-16", "uncased_L-12_H-768_A-12",
               "multilingual_L-12_H-768_A-12", "chinese_L-12_H-768_A-12",
               "wwm_uncased_L-24_H-1024_A-16"}
    cased = {"cased_L-12_H-768_A-12", "cased_L-24_H-1024_A-16",
             "multi_cased_L-12_H-768_A-12", "wwm_cased_L-24_H-1024_A-16"}
    if model_name in uncased and not do_lower_case:
        expected = True
    elif model_name in cased and do_lower_case:
        expected = False
    else:
        return
    raise UsageError(
        f"--do_lower_case={not expected} does not match --init_checkpoint={init_checkpoint}: "
        f"{model_name} is a {'lower-cased' if expected else 'cased'} model, "
        f"pass --do_lower_case={expected}")


# ---------------------------------------------------------------------------
# Vocab loading and validation.

def _read_bytes(path):
    """Reads a local file, or a remote one (gs://...) through TensorFlow when needed."""
    path = os.fspath(path)
    if "://" in path:
        import tensorflow as tf  # only for remote paths: TensorFlow is slow to import
        if not tf.io.gfile.exists(path):
            raise VocabError(path, "file not found")
        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read()
    if not os.path.exists(path):
        raise VocabError(path, "file not found")
    if not os.path.isfile(path):
        raise VocabError(path, "is not a regular file")
    with open(path, "rb") as f:
        return f.read()


def load_vocab(vocab_file, required_tokens=SPECIAL_TOKENS):
    """Reads a WordPiece vocab (one token per line; id = 0-based line number).

    Tokens are stripped of surrounding whitespace, as Google does, so ids stay the line
    numbers the checkpoint was trained with. Anything that would make ids ambiguous or
    tokenization impossible raises ``VocabError``: a missing, empty or non-UTF-8 file,
    a token listed twice (Google would silently keep the later id), or a missing
    ``required_tokens`` entry.
    """
    vocab_file = os.fspath(vocab_file)
    data = _read_bytes(vocab_file)
    if not data.strip():
        raise VocabError(vocab_file, "vocab file is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise VocabError(vocab_file, f"line {line} is not valid UTF-8 "
                                     f"(byte {data[e.start]:#04x} at offset {e.start})") from None
    lines = text.split("\n")
    if lines[-1] == "":  # the newline that ends the last line does not start a token
        lines.pop()
    vocab = collections.OrderedDict()
    for index, line in enumerate(lines):
        token = line.strip()
        if token in vocab:
            raise VocabError(vocab_file, f"duplicate token {token!r} on lines "
                                         f"{vocab[token] + 1} and {index + 1}")
        vocab[token] = index
    missing = [t for t in required_tokens if t not in vocab]
    if missing:
        raise VocabError(vocab_file, "missing required special token(s) " + ", ".join(missing))
    return vocab


# ---------------------------------------------------------------------------
# Fast path: the reference's steps on whole strings.

def _normalized(text, do_lower_case, tables):
    """``BasicTokenizer.tokenize`` of a text already rid of the characters cleaning removes,
    without its final punctuation split, up to the split on whitespace.

    Same steps in the same order, on the whole string, with C-implemented str, re and
    unicodedata operations. Whole-string lower() and NFD equal Google's per-word ones:
    their only context-dependent parts (final sigma, reordering of combining marks)
    never reach across whitespace. Whitespace is not turned into spaces first because
    str.split() splits on all of it, exactly the characters Google ends up splitting on.
    """
    if not text.isascii():
        text = " ".join(tables.cjk.split(text))
    if do_lower_case:
        text = text.lower()
        if not text.isascii():
            text = unicodedata.normalize("NFD", text).translate(tables.marks)
    return text


def _split_many(texts, do_lower_case, tables):
    """The words of each text: cleaned (``tables.removed``), then ``_normalized`` and split.
    The common case is inline: an ASCII text needs no CJK split, NFD or mark removal, and
    when it is printable (no tab or control character) nothing to clean either (a call per
    text, and a regular expression run over every one, were a sizeable share of tokenizing
    for pre-training data)."""
    clean, word_lists = tables.removed.sub, []
    append = word_lists.append
    for text in texts:
        if type(text) is not str:  # bytes
            text = convert_to_unicode(text)
        if text.isascii():
            if not text.isprintable():
                text = clean("", text)
            append(text.lower().split() if do_lower_case else text.split())
        else:
            append(_normalized(clean("", text), do_lower_case, tables).split())
    return word_lists


def _gather(table, length, which, words_per_text):
    """(ids of all texts, one after another; ids per text) from the ids of the distinct
    words (``table``, ``length`` of each) and which distinct word each word is."""
    start = np.cumsum(length) - length                   # of each distinct word in table
    per_word = length[which]                             # ids of each word of the texts
    word_ends = np.concatenate([[0], np.cumsum(per_word)])
    # Id k of the output is table[start[word] + (k - first output id of that word)].
    flat = table[np.repeat(start[which] - word_ends[:-1], per_word)
                 + np.arange(int(word_ends[-1]))]
    text_ends = np.cumsum(words_per_text)
    return flat, word_ends[text_ends] - word_ends[text_ends - words_per_text]


# ---------------------------------------------------------------------------

class FullTokenizer:
    """End-to-end tokenizer: text -> WordPiece (or SentencePiece) tokens and ids.

    ``vocab_file`` is a WordPiece vocab (one token per line), or a SentencePiece model
    if it ends with ``.model``. No special tokens are ever added or recognised in text;
    callers insert ``[CLS]``/``[SEP]``/``[MASK]`` ids themselves.

    SentencePiece models must contain the pieces ``[CLS]``, ``[SEP]`` and ``[MASK]``,
    as ``control_symbols`` (never matched in text, like the WordPiece path) or
    ``user_defined_symbols`` (SentencePiece then matches them in text as written). The
    unknown token is the model's unk piece (``<unk>`` by default, or ``[UNK]``); the
    padding token is ``[PAD]`` or ``<pad>`` when present, else id 0. With
    ``do_lower_case`` the text is lower-cased before SentencePiece (as ALBERT does), so
    the model must have been trained on lower-cased text, and a literal "[CLS]" becomes
    plain "[cls]".
    """

    # Distinct words remembered with their WordPiece ids (about 40 MB when full).
    word_cache_size = 200_000

    def __init__(self, vocab_file, do_lower_case=True):
        self.vocab_file = os.fspath(vocab_file)
        self.do_lower_case = do_lower_case
        self.is_sentencepiece = self.vocab_file.endswith(".model")
        if self.is_sentencepiece:
            self._sp = _load_sentencepiece(self.vocab_file)
            self.vocab = collections.OrderedDict(
                (self._sp.id_to_piece(i), i) for i in range(self._sp.get_piece_size()))
            self.unk_token = self._sp.id_to_piece(self._sp.unk_id())
            missing = [t for t in SPECIAL_TOKENS[1:] if t not in self.vocab]
            if missing:
                raise VocabError(self.vocab_file, "SentencePiece model lacks piece(s) "
                                 + ", ".join(missing) + " (train with user_defined_symbols)")
        else:
            self.vocab = load_vocab(self.vocab_file)
            self.unk_token = "[UNK]"
            self.basic_tokenizer = BasicTokenizer(do_lower_case)
            self.wordpiece_tokenizer = WordpieceTokenizer(self.vocab, self.unk_token)
            self._tables = CharTables.get()
            self._rust = _rust_wordpiece(self.vocab, self.unk_token)
            self._word_cache = {}
            self._word_start = None
        self.inv_vocab = {i: t for t, i in self.vocab.items()}
        self._id_to_token = [self.inv_vocab[i] for i in range(len(self.vocab))]
        self.unk_id = self.vocab[self.unk_token]
        self.cls_id = self.vocab["[CLS]"]
        self.sep_id = self.vocab["[SEP]"]
        self.mask_id = self.vocab["[MASK]"]
        # Padding is masked out anyway; Google pads with id 0 when there is no [PAD].
        self.pad_id = self.vocab.get("[PAD]", self.vocab.get("<pad>", 0))

    @property
    def vocab_size(self):
        return len(self.vocab)

    # -- text to tokens -----------------------------------------------------
    def tokenize(self, text):
        return self.tokenize_batch([text])[0]

    def tokenize_batch(self, texts):
        """Tokenizes many texts at once; the fast path for data preparation."""
        if self.is_sentencepiece:
            return self._sp.encode(self._sp_inputs(texts), out_type=str)
        word_lists, word_ids = self._words_and_ids(texts)
        token = self._id_to_token
        return [[token[i] for word in words for i in word_ids[word]] for words in word_lists]

    def encode_batch(self, texts):
        """Token ids of many texts, without special tokens."""
        if self.is_sentencepiece:
            return self._sp.encode(self._sp_inputs(texts), out_type=int)
        word_lists, word_ids = self._words_and_ids(texts)
        lookup, chain = word_ids.__getitem__, itertools.chain.from_iterable
        return [list(chain(map(lookup, words))) for words in word_lists]

    def encode_batch_flat(self, texts):
        """``encode_batch`` as (all ids concatenated, int32; the number of ids of each text),
        built with NumPy gathers instead of one Python list per text: about a third of the
        time of tokenizing for pre-training data went to those lists."""
        if self.is_sentencepiece:
            ids = self.encode_batch(texts)
            counts = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
            return (np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32,
                                count=int(counts.sum())), counts)
        word_lists = _split_many(texts, self.do_lower_case, self._tables)
        words_per_text = np.fromiter(map(len, word_lists), dtype=np.int64,
                                     count=len(word_lists))
        words = list(itertools.chain.from_iterable(word_lists))
        del word_lists
        position = dict(zip(dict.fromkeys(words), itertools.count()))  # distinct words, in order
        which = np.fromiter(map(position.__getitem__, words), dtype=np.int64, count=len(words))
        table, length = self._wordpiece_table(list(position))
        return _gather(table, length, which, words_per_text)

    def _wordpiece_table(self, words):
        """(the WordPiece ids of ``words`` one after another, int32; how many each has).

        One Rust call on all the words joined, rather than one per word: the per-word
        results (an ``Encoding`` and a Python list each) cost twice the WordPiece work.
        Which word a piece belongs to is found from where the pieces start: a word's first
        piece never begins with ``##`` (a word holds no ``#`` but as punctuation, which is
        a piece of its own) and every further piece does.
        """
        punctuation = self._tables.punctuation
        if self._rust is not None:
            punctuation_split = "\n".join(words).translate(punctuation)
            parts = np.fromiter(map(len, map(str.split, punctuation_split.split("\n"))),
                                dtype=np.int64, count=len(words))  # pre-tokens of each word
            encode = getattr(self._rust, "encode_batch_fast", self._rust.encode_batch)
            ids = np.array(encode([punctuation_split], add_special_tokens=False)[0].ids,
                           dtype=np.int32)
            piece_starts = self._word_start_ids()[ids]
            if int(piece_starts.sum()) == int(parts.sum()):
                pre_token = np.cumsum(piece_starts) - 1
                word = np.searchsorted(np.cumsum(parts), pre_token, side="right")
                return ids, np.bincount(word, minlength=len(words)).astype(np.int64)
        # `tokenizers` missing, or a vocabulary whose pieces defeat the rule: word by word.
        pieces = self._wordpiece_ids([w.translate(punctuation) for w in words])
        length = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        return (np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int32,
                            count=int(length.sum())), length)

    def _word_start_ids(self):
        """A bool per vocabulary id: whether the piece begins a word (``word_starts``)."""
        if self._word_start is None:
            self._word_start = np.array(word_starts(self._id_to_token), dtype=bool)
        return self._word_start

    def tokenize_reference(self, text):
        """The pure-Python reference (slow); ``tokenize`` must always agree with it."""
        if self.is_sentencepiece:
            return self.tokenize(text)
        return [piece for word in self.basic_tokenizer.tokenize(text)
                for piece in self.wordpiece_tokenizer.tokenize_word(word)]

    def _sp_inputs(self, texts):
        texts = [convert_to_unicode(t) for t in texts]
        return [t.lower() for t in texts] if self.do_lower_case else texts

    def _words_and_ids(self, texts):
        """Splits texts into words; returns them and a table word -> WordPiece ids.

        There are far fewer distinct words than words, so each distinct word is split on
        punctuation and run through WordPiece (``_wordpiece_table``) once, then remembered.
        """
        word_lists = _split_many(texts, self.do_lower_case, self._tables)
        table = self._word_cache
        new = {word for words in word_lists for word in words if word not in table}
        if len(table) + len(new) > self.word_cache_size:
            # Start afresh; a new dict (not clear()) leaves a concurrent caller's intact.
            table = self._word_cache = {}
            new = {word for words in word_lists for word in words}
        if new:
            new = list(new)
            ids, length = self._wordpiece_table(new)
            ids, ends = ids.tolist(), np.cumsum(length).tolist()
            table.update(zip(new, (ids[end - n:end] for end, n in zip(ends, length.tolist()))))
        return word_lists, table

    def _wordpiece_ids(self, words):
        """WordPiece ids of each word, given with spaces around its punctuation."""
        if self._rust is None:  # `tokenizers` not installed: the reference WordPiece
            wordpiece = self.wordpiece_tokenizer.tokenize
            return [self.convert_tokens_to_ids(wordpiece(w)) for w in words]
        # encode_batch_fast (tokenizers >= 0.21) skips computing offsets.
        encode = getattr(self._rust, "encode_batch_fast", self._rust.encode_batch)
        return [e.ids for e in encode(words, add_special_tokens=False)]

    # -- tokens and ids -----------------------------------------------------
    def convert_tokens_to_ids(self, tokens):
        """Unknown tokens map to the unknown token's id."""
        return [self.vocab.get(token, self.unk_id) for token in tokens]

    def convert_ids_to_tokens(self, ids):
        try:
            return [self.inv_vocab[int(i)] for i in ids]
        except KeyError as e:
            raise KeyError(f"token id {e.args[0]} is outside the vocabulary of "
                           f"{self.vocab_file} (size {self.vocab_size})") from None

    def word_starts(self, tokens):
        """Which tokens begin a word, for whole-word masking.

        WordPiece: every token not starting with ``##``. SentencePiece: pieces starting
        with "▁", special pieces and single punctuation characters (as ALBERT does).
        """
        if not self.is_sentencepiece:
            return word_starts(tokens)
        return [t.startswith(SENTENCEPIECE_WORD_START) or t.startswith(("[", "<"))
                or (len(t) == 1 and is_punctuation(t)) for t in tokens]


def _rust_wordpiece(vocab, unk_token):
    """A ``tokenizers.Tokenizer`` doing WordPiece on text that we normalized and split.

    Its input has spaces around every word and punctuation character, so splitting on
    whitespace is all that is left; no normalizer, and no added special tokens (they
    would make literal "[CLS]" atomic).
    """
    try:
        from tokenizers import Tokenizer
        from tokenizers.models import WordPiece
        from tokenizers.pre_tokenizers import WhitespaceSplit
    except ImportError:
        return None
    tokenizer = Tokenizer(WordPiece(dict(vocab), unk_token=unk_token,
                                    continuing_subword_prefix=CONTINUATION_PREFIX,
                                    max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    # Rust's whitespace (Unicode White_Space) is a subset of Python's str.isspace(), and
    # the words it gets contain no str.isspace() character: the split is exact.
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return tokenizer


def _load_sentencepiece(path):
    import sentencepiece as spm
    proto = _read_bytes(path)
    try:
        return spm.SentencePieceProcessor(model_proto=proto)
    except (RuntimeError, OSError) as e:
        raise VocabError(path, f"not a valid SentencePiece model ({e})") from None
