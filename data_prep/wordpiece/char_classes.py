"""Google's character classes: the predicates the reference tokenizer asks of each character,
and the tables the fast path is built from.

``is_whitespace``, ``is_control``, ``is_punctuation`` and ``is_cjk`` are the definitions of
Google's ``tokenization.py``, used one character at a time by
``data_prep.wordpiece.tokenization_reference``. ``CharTables`` scans every code point with those
same predicates and turns the result into regular expressions and ``str.translate`` tables for
``FullTokenizer``'s fast path (``data_prep.wordpiece.tokenization``), so both paths share one
definition of each class (and Python's Unicode version, like Google's code). The two live in
one module because the scan's disk cache is keyed by this file's text: a change to any
predicate changes the key.
"""
import functools
import hashlib
import json
import os
import re
import unicodedata

# Google's "Chinese character" ranges (CJK Unified Ideographs and extensions A-E,
# compatibility ideographs). Other scripts (Hangul, kana, ...) are space separated.
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)


# ---------------------------------------------------------------------------
# Google's character classes (memoized: the reference asks for every character).

@functools.lru_cache(maxsize=1 << 16)
def is_whitespace(char):
    """Space, tab, newline, carriage return and Unicode space separators (Zs)."""
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


@functools.lru_cache(maxsize=1 << 16)
def is_control(char):
    """Cc/Cf characters other than tab/newline/carriage return (those are whitespace)."""
    return char not in "\t\n\r" and unicodedata.category(char) in ("Cc", "Cf")


@functools.lru_cache(maxsize=1 << 16)
def is_punctuation(char):
    """Unicode P* plus every ASCII symbol (``$``, ``^``, ``` ` ``` ... are not P* in Unicode)."""
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


@functools.lru_cache(maxsize=1 << 16)
def is_cjk(char):
    cp = ord(char)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


# ---------------------------------------------------------------------------
# Tables for the fast path, built from the predicates above.

def _to_ranges(code_points):
    """Sorted code points -> [first, last] runs, to keep regex character classes short."""
    ranges = []
    for cp in code_points:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return ranges


def _char_class(ranges):
    return "[%s]" % "".join(re.escape(chr(lo)) + (f"-{re.escape(chr(hi))}" if hi > lo else "")
                            for lo, hi in ranges)


class CharTables:
    """Patterns and translation tables for the fast path, built once.

    They come from scanning every code point with the reference's own predicates, so
    both paths share one definition of each character class (and Python's Unicode
    version, like Google's code).
    """
    _instance = None

    @classmethod
    def get(cls):
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def __init__(self):
        removed, marks, punctuation = self._load_or_scan()
        self.removed = re.compile(_char_class(_to_ranges(removed)))
        # re.split with a capturing group keeps the separators; " ".join then puts
        # spaces around each of them without a Python call per match.
        self.cjk = re.compile("(%s)" % _char_class(_CJK_RANGES))
        # str.translate tables: delete marks, isolate punctuation
        self.marks = dict.fromkeys(marks)
        self.punctuation = {cp: f" {chr(cp)} " for cp in punctuation}

    @staticmethod
    def _scan():
        """(removed, marks, punctuation) code points, from the reference's predicates."""
        removed, marks, punctuation = [], [], []
        # Only these categories (and ASCII) can match a predicate below; testing the
        # category first keeps the scan of all 1.1M code points to a fraction of a second.
        relevant = {"Cc", "Cf", "Mn", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po"}
        for cp in range(0x110000):
            char = chr(cp)
            category = unicodedata.category(char)
            if cp > 127 and category not in relevant and cp != 0xFFFD:
                continue
            if cp == 0 or cp == 0xFFFD or is_control(char):
                removed.append(cp)
            elif is_punctuation(char):
                punctuation.append(cp)
            if category == "Mn":
                marks.append(cp)
        return removed, marks, punctuation

    @classmethod
    def _load_or_scan(cls):
        """The scan takes ~0.5 s, paid by every data-preparation worker process; its
        result depends only on this module and Python's Unicode tables, so it is cached
        on disk under that key (recomputed whenever either changes)."""
        with open(__file__, "rb") as source:
            key = hashlib.sha256(source.read() + unicodedata.unidata_version.encode())
        cache_dir = os.environ.get("BERT_CACHE_DIR",
                                   os.path.join(os.path.expanduser("~"), ".cache", "bert-tf"))
        path = os.path.join(cache_dir, f"char_tables-{key.hexdigest()[:16]}.json")
        try:
            with open(path, encoding="utf-8") as reader:
                cached = json.load(reader)
            return cached["removed"], cached["marks"], cached["punctuation"]
        except (OSError, ValueError, KeyError):
            pass
        removed, marks, punctuation = cls._scan()
        try:
            os.makedirs(cache_dir, exist_ok=True)
            tmp = f"{path}.tmp-{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as writer:
                json.dump({"removed": removed, "marks": marks, "punctuation": punctuation},
                          writer)
            os.replace(tmp, path)
        except OSError:  # a read-only home: just scan every time
            pass
        return removed, marks, punctuation
