"""Sentence segmentation for pre-training data, with nothing to download at run time.

BERT's next-sentence task and its packing of segments work on sentences, so every document is
split into sentences before it is written to a shard.  Two splitters:

* ``blingfire`` (Microsoft Bling Fire, PyPI ``blingfire``): a compiled finite-state model
  shipped inside the wheel; ~20 MB/s per core, handles abbreviations, quotes and CJK
  punctuation.  Its native library exists for x86-64 Linux, macOS and Windows only, and its
  API fails silently (it returns ``""`` when its buffer is too small, and truncates at a NUL),
  so every result is checked: if the sentences do not contain exactly the input's
  non-whitespace characters, the document is split by the rule-based splitter instead.
* ``rules``: a small regular-expression splitter (break after ``.``/``!``/``?`` plus closing
  quotes or brackets when followed by a space and an upper-case letter, digit or opening
  quote, except after common abbreviations and single-letter initials; break after
  ``。！？`` anywhere).  Used where blingfire cannot load (e.g. ARM machines), or on request.

``get_splitter("auto")`` takes blingfire when it loads, the rules otherwise.
"""
from __future__ import annotations

import re
from typing import Callable, List

SPLITTERS = ("auto", "blingfire", "rules")

# Abbreviations after which a period does not end a sentence (lower-cased, without the dot).
_ABBREVIATIONS = frozenset("""
mr mrs ms dr prof sr jr st mt rev gen col lt sgt capt cmdr gov sen rep pres hon fr
vs etc al approx dept est fig figs no nos vol vols pp ed eds inc ltd co corp bros
jan feb mar apr jun jul aug sep sept oct nov dec e.g i.e cf viz ca c u.s u.k a.m p.m
""".split())

_CANDIDATE = re.compile(r"[.!?]+[\"'”’»)\]]*(?=\s+[\"'“‘«(\[]?[A-Z0-9À-ÖØ-Þ\u4e00-\u9fff])|[。！？]+[”’」』）]*")
_WORD_BEFORE = re.compile(r"([\w.]+)$")


def split_rules(text: str) -> List[str]:
    """Rule-based sentence split of one document (whitespace-normalised sentences)."""
    text = " ".join(text.split())
    sentences, start = [], 0
    for m in _CANDIDATE.finditer(text):
        end = m.end()
        if text[m.start()] == ".":
            word = _WORD_BEFORE.search(text, start, m.start())
            token = word.group(1).lower().rstrip(".") if word else ""
            # "Mr." "e.g." or an initial such as "J." do not end a sentence.
            if token in _ABBREVIATIONS or (len(token) == 1 and token.isalpha()):
                continue
        piece = text[start:end].strip()
        if piece:
            sentences.append(piece)
        start = end
    rest = text[start:].strip()
    if rest:
        sentences.append(rest)
    return sentences


def _non_space(text: str) -> str:
    return "".join(text.split())


class BlingfireSplitter:
    """blingfire's ``text_to_sentences`` with a check that no text was lost (see module doc)."""

    def __init__(self):
        import blingfire  # noqa: F401 - fails here, not mid-corpus, when the library is absent
        self._split = blingfire.text_to_sentences
        # Load the native library now (import is lazy about it on some versions).
        self._split("Probe. Probe.")
        self.fallbacks = 0

    def __call__(self, text: str) -> List[str]:
        text = " ".join(text.replace("\x00", " ").split())
        if not text:
            return []
        out = self._split(text)
        sentences = [s.strip() for s in out.split("\n") if s.strip()]
        # Usually blingfire only turns spaces into newlines (cheap check); otherwise compare
        # the non-whitespace characters.
        if out.replace("\n", " ") != text and _non_space(out) != _non_space(text):
            self.fallbacks += 1
            return split_rules(text)
        return sentences


def get_splitter(name: str = "auto") -> Callable[[str], List[str]]:
    """A callable ``document text -> list of sentences`` (``name`` in ``SPLITTERS``)."""
    if name not in SPLITTERS:
        raise ValueError(f"unknown sentence splitter {name!r} (choose from {', '.join(SPLITTERS)})")
    if name in ("auto", "blingfire"):
        try:
            return BlingfireSplitter()
        except (ImportError, OSError) as e:
            if name == "blingfire":
                raise ValueError(f"blingfire cannot be loaded here ({e}); "
                                 f"use --sentence_splitter rules") from None
    return split_rules
