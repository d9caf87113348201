"""BERT tokenization that reproduces Google's original ``tokenization.py`` exactly.

Checkpoints are only useful with the tokenization they were trained with, so the
behaviour here is Google's, including where HuggingFace differs:

* words longer than 200 characters become ``[UNK]`` (HuggingFace: 100);
* literal text such as ``"[CLS]"`` is ordinary text (``[``, ``cl``, ``##s``, ``]``
  when lower-casing); special tokens are only ever inserted by the caller;
* only categories Cc/Cf count as control characters (HuggingFace also drops
  unassigned and private-use characters) and there is no NFC step.

Two implementations live here:

* ``BasicTokenizer`` + ``WordpieceTokenizer``: a small pure-Python reference,
  character by character, that documents the algorithm;
* ``FullTokenizer``'s fast path: the same steps done on whole strings with CPython
  primitives (``str.translate``, ``str.lower``, ``unicodedata.normalize``,
  ``str.split``) driven by the same ``unicodedata`` tables, followed by WordPiece in
  the Rust ``tokenizers`` library. It gives identical output (the tests check it on
  real text and on every code point).

Why not ``tokenizers``' own ``BertNormalizer``/``BertPreTokenizer``: they carry
older Unicode tables than Python's, and differ from Google on about 800 assigned
code points (newer punctuation, combining marks and format characters, CJK
Extension C+ U+2B820-U+2CEAF not treated as CJK) and on Greek final sigma (Python's
``str.lower`` maps a word-final capital sigma to "ς", Rust lower-cases per
character to "σ"). Only the WordPiece model is delegated to Rust, which is where
the time goes.

A SentencePiece model (a ``.model`` file) can be used instead of a WordPiece vocab;
see ``FullTokenizer``.
"""
import collections
import os
import re
import unicodedata

# Tokens that BERT pre-training and fine-tuning insert; a vocab without them is unusable.
SPECIAL_TOKENS = ("[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Google's WordpieceTokenizer default: a longer word is a single [UNK].
MAX_INPUT_CHARS_PER_WORD = 200
CONTINUATION_PREFIX = "##"
SENTENCEPIECE_WORD_START = "\u2581"

# Google's "Chinese character" ranges (CJK Unified Ideographs and extensions A-E,
# compatibility ideographs). Other scripts (Hangul, kana, ...) are space separated.
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)


class VocabError(ValueError):
    """A vocab (or SentencePiece model) file that cannot be used; the message names the file."""

    def __init__(self, path, problem):
        self.path = path
        super().__init__(f"{path}: {problem}")


# ---------------------------------------------------------------------------
# Small helpers kept from Google's API, used by the data preparation scripts.

def convert_to_unicode(text):
    """Returns ``text`` as ``str``; bytes are decoded as UTF-8, dropping invalid bytes (as Google)."""
    if isinstance(text, str):
        return text
    if isinstance(text, bytes):
        return text.decode("utf-8", "ignore")
    raise ValueError(f"Unsupported string type: {type(text)}")


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
    """Raises ValueError when ``do_lower_case`` contradicts a known Google checkpoint name.

    The casing is not stored in ``bert_config.json``, so a mismatch would otherwise go
    unnoticed and silently hurt fine-tuning. Only Google's released model directory
    names are recognised (e.g. ``.../uncased_L-12_H-768_A-12/bert_model.ckpt``).
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
    raise ValueError(
        f"--do_lower_case={not expected} does not match --init_checkpoint={init_checkpoint}: "
        f"{model_name} is a {'lower-cased' if expected else 'cased'} model, "
        f"pass --do_lower_case={expected}")


# ---------------------------------------------------------------------------
# Vocab loading and validation.

def _read_bytes(path):
    """Reads a local file, or a remote one (gs://...) through TensorFlow when needed."""
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
# Google's character classes.

def _is_whitespace(char):
    """Space, tab, newline, carriage return and Unicode space separators (Zs)."""
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _is_control(char):
    """Cc/Cf characters other than tab/newline/carriage return (those are whitespace)."""
    return char not in "\t\n\r" and unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char):
    """Unicode P* plus every ASCII symbol (``$``, ``^``, ``` ` ``` ... are not P* in Unicode)."""
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_cjk(char):
    cp = ord(char)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


# ---------------------------------------------------------------------------
# Pure-Python reference.

class BasicTokenizer:
    """Google's basic tokenization, one character at a time: the readable reference.

    Steps: drop NUL, U+FFFD and control characters and turn whitespace into spaces;
    put spaces around CJK ideographs (those scripts do not separate words); split on
    whitespace; if ``do_lower_case``, lower-case each word, decompose it (NFD) and drop
    the combining marks (Mn) so "Héllo" becomes "hello"; split punctuation off as
    single-character words.
    """

    def __init__(self, do_lower_case=True):
        self.do_lower_case = do_lower_case

    def tokenize(self, text):
        chars = []
        for char in convert_to_unicode(text):
            if char in "\x00\ufffd" or _is_control(char):
                continue
            if _is_whitespace(char):
                chars.append(" ")
            elif _is_cjk(char):
                chars.append(f" {char} ")
            else:
                chars.append(char)
        words = []
        for word in "".join(chars).split():
            if self.do_lower_case:
                word = self._strip_accents(word.lower())
            words.extend(self._split_on_punctuation(word))
        # Lower-casing/NFD could in principle produce whitespace: split again, as Google.
        return " ".join(words).split()

    @staticmethod
    def _strip_accents(word):
        return "".join(c for c in unicodedata.normalize("NFD", word)
                       if unicodedata.category(c) != "Mn")

    @staticmethod
    def _split_on_punctuation(word):
        pieces, current = [], []
        for char in word:
            if _is_punctuation(char):
                if current:
                    pieces.append("".join(current))
                    current = []
                pieces.append(char)
            else:
                current.append(char)
        if current:
            pieces.append("".join(current))
        return pieces


class WordpieceTokenizer:
    """Greedy longest-match-first WordPiece: the readable reference.

    "unaffable" -> ["un", "##aff", "##able"]. A word that cannot be covered by vocab
    pieces, or is longer than ``max_input_chars_per_word`` characters, becomes one
    ``unk_token``.
    """

    def __init__(self, vocab, unk_token="[UNK]",
                 max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD):
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word

    def tokenize(self, text):
        """Tokenizes whitespace-separated words that went through ``BasicTokenizer``."""
        return [piece for word in text.split() for piece in self.tokenize_word(word)]

    def tokenize_word(self, word):
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_token]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else CONTINUATION_PREFIX + word[start:end]
                if piece in self.vocab:
                    break
            else:
                return [self.unk_token]
            pieces.append(piece)
            start = end
        return pieces


# ---------------------------------------------------------------------------
# Fast basic tokenization: the reference's steps on whole strings.

class _CharTables:
    """Translation tables and patterns for the fast path, built once from ``unicodedata``.

    Built from the same predicates as the reference, over every code point, so both
    paths share one definition of each character class.
    """
    _instance = None

    @classmethod
    def get(cls):
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def __init__(self):
        clean, marks, punctuation = {}, {}, []
        # Only these categories (and ASCII) can match a predicate below; testing the
        # category first keeps the scan of all 1.1M code points to a fraction of a second.
        relevant = {"Cc", "Cf", "Zs", "Zl", "Zp", "Mn", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po"}
        for cp in range(0x110000):
            char = chr(cp)
            category = unicodedata.category(char)
            if cp > 127 and category not in relevant and cp != 0xFFFD:
                continue
            if cp == 0 or cp == 0xFFFD or _is_control(char):
                clean[cp] = None
            elif _is_whitespace(char) or char.isspace():
                # Other str.isspace() characters (U+2028, U+2029) survive Google's
                # cleaning but then separate words in its str.split(): a space too.
                clean[cp] = " "
            elif _is_punctuation(char):
                punctuation.append(cp)
            if category == "Mn":
                marks[cp] = None
        self.clean = clean
        self.marks = marks
        self.punctuation = {cp: f" {chr(cp)} " for cp in punctuation}
        # re.split with a capturing group keeps the separators; " ".join then puts
        # spaces around each of them without a Python call per match.
        self.cjk = re.compile("([%s])" % "".join(
            f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in _CJK_RANGES))


def _basic_tokenize_fast(text, do_lower_case, tables):
    """Same output as ``BasicTokenizer.tokenize`` (same steps in the same order).

    Lower-casing and NFD on the whole string equal Google's per-word ones: the only
    context-dependent parts, final sigma and canonical reordering of marks, never
    look across a space.
    """
    text = convert_to_unicode(text).translate(tables.clean)
    ascii_only = text.isascii()
    if not ascii_only:
        text = " ".join(tables.cjk.split(text))
    if do_lower_case:
        text = text.lower()
        if not ascii_only:
            text = unicodedata.normalize("NFD", text).translate(tables.marks)
    return text.translate(tables.punctuation).split()


# ---------------------------------------------------------------------------

class FullTokenizer:
    """End-to-end tokenizer: text -> WordPiece (or SentencePiece) tokens and ids.

    ``vocab_file`` is a WordPiece vocab (one token per line), or a SentencePiece model
    if it ends with ``.model``. No special tokens are ever added or recognised in text;
    callers insert ``[CLS]``/``[SEP]``/``[MASK]`` ids themselves.

    SentencePiece models must contain the pieces ``[CLS]``, ``[SEP]`` and ``[MASK]``
    (train with ``user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"]``, which also
    makes those literal strings atomic in text, unlike the WordPiece path). The unknown
    token is the model's unk piece (``<unk>`` by default, or ``[UNK]``); the padding
    token is ``[PAD]`` or ``<pad>`` when present. With ``do_lower_case`` the text is
    lower-cased before SentencePiece (as ALBERT does); the model must have been
    trained that way.
    """

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
            self._tables = _CharTables.get()
            self._rust = _rust_wordpiece(self.vocab, self.unk_token)
        self.inv_vocab = {i: t for t, i in self.vocab.items()}
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
        return [encoding.tokens for encoding in self._encode_words(texts, want_tokens=True)]

    def encode_batch(self, texts):
        """Token ids of many texts, without special tokens."""
        if self.is_sentencepiece:
            return self._sp.encode(self._sp_inputs(texts), out_type=int)
        return [encoding.ids for encoding in self._encode_words(texts, want_tokens=False)]

    def tokenize_reference(self, text):
        """The pure-Python reference (slow); ``tokenize`` must always agree with it."""
        if self.is_sentencepiece:
            return self.tokenize(text)
        return [piece for word in self.basic_tokenizer.tokenize(text)
                for piece in self.wordpiece_tokenizer.tokenize_word(word)]

    def _sp_inputs(self, texts):
        texts = [convert_to_unicode(t) for t in texts]
        return [t.lower() for t in texts] if self.do_lower_case else texts

    def _encode_words(self, texts, want_tokens):
        words = [_basic_tokenize_fast(t, self.do_lower_case, self._tables) for t in texts]
        if self._rust is None:  # `tokenizers` not installed: reference WordPiece
            return [_Encoding(self, [p for w in ws for p in self.wordpiece_tokenizer.tokenize_word(w)])
                    for ws in words]
        encode = self._rust.encode_batch
        if not want_tokens:  # encode_batch_fast (tokenizers >= 0.21) skips tokens and offsets
            encode = getattr(self._rust, "encode_batch_fast", encode)
        return encode(words, is_pretokenized=True, add_special_tokens=False)

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
                or (len(t) == 1 and _is_punctuation(t)) for t in tokens]


class _Encoding:
    """Tokens and ids, shaped like a ``tokenizers.Encoding``, for the no-Rust fallback."""

    def __init__(self, tokenizer, tokens):
        self.tokens = tokens
        self.ids = tokenizer.convert_tokens_to_ids(tokens)


def _rust_wordpiece(vocab, unk_token):
    """A ``tokenizers.Tokenizer`` doing WordPiece only, on words already split by us.

    No normalizer, no pre-tokenizer and no added special tokens: text splitting is ours
    (see the module docstring), and added tokens would make literal "[CLS]" atomic.
    """
    try:
        from tokenizers import Tokenizer
        from tokenizers.models import WordPiece
    except ImportError:
        return None
    return Tokenizer(WordPiece(dict(vocab), unk_token=unk_token,
                               continuing_subword_prefix=CONTINUATION_PREFIX,
                               max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))


def _load_sentencepiece(path):
    import sentencepiece as spm
    proto = _read_bytes(path)
    try:
        return spm.SentencePieceProcessor(model_proto=proto)
    except (RuntimeError, OSError) as e:
        raise VocabError(path, f"not a valid SentencePiece model ({e})") from None
