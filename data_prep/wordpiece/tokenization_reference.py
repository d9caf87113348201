"""Google's BERT tokenization one character at a time: the readable reference.

``BasicTokenizer`` (cleaning, CJK spacing, lower-casing and accent stripping, punctuation
split) and ``WordpieceTokenizer`` (greedy longest-match-first) follow Google's
``tokenization.py`` step by step, on the predicates of ``data_prep.wordpiece.char_classes``. They
document the algorithm, and ``FullTokenizer``'s fast path (``data_prep.wordpiece.tokenization``) is
checked against them (``FullTokenizer.tokenize_reference``); SQuAD's answer alignment uses
``BasicTokenizer`` directly. They are kept apart from the fast path so that the algorithm
reads in one place, without the tables and caches that make it fast.
"""
import unicodedata

from data_prep.wordpiece.char_classes import is_cjk, is_control, is_punctuation, is_whitespace

# Google's WordpieceTokenizer default: a longer word is a single [UNK].
MAX_INPUT_CHARS_PER_WORD = 200
CONTINUATION_PREFIX = "##"


def convert_to_unicode(text):
    """Returns ``text`` as ``str``; bytes are decoded as UTF-8 minus invalid bytes (as Google)."""
    if isinstance(text, str):
        return text
    if isinstance(text, bytes):
        return text.decode("utf-8", "ignore")
    raise ValueError(f"Unsupported string type: {type(text)}")


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
            if char in "\x00\ufffd" or is_control(char):
                continue
            if is_whitespace(char):
                chars.append(" ")
            elif is_cjk(char):
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
            if is_punctuation(char):
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
