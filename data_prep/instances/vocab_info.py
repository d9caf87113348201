"""What building pre-training instances needs from a vocabulary, and loading one.

``VocabInfo`` holds the special ids ([CLS], [SEP], [MASK]), the vocabulary size (the range
of random replacements) and which tokens continue a word (whole-word masking); it is taken
from a tokenizer, which knows its word boundaries (WordPiece ``##``, SentencePiece).
``load_tokenizer`` opens a vocab file as ``data_prep.wordpiece.tokenization.FullTokenizer`` and
turns its failures into ``DataPrepError``. Static and dynamic (unmasked) instances both use it.
"""
from __future__ import annotations

import dataclasses
import os
import weakref
from typing import Optional, Sequence

import numpy as np

from data_prep.errors import DataPrepError


@dataclasses.dataclass
class VocabInfo:
    """What the instance builder needs from a WordPiece vocabulary."""
    size: int
    cls_id: int
    sep_id: int
    mask_id: int
    is_continuation: np.ndarray  # bool per id: token starts with "##"
    id_to_token: Sequence[str]

    @classmethod
    def from_tokens(cls, tokens: Sequence[str], source: str = "vocabulary",
                    word_starts: Optional[Sequence[bool]] = None) -> "VocabInfo":
        """``word_starts[i]``: token i begins a word (default: it does not start with ##)."""
        index = {}
        for i, t in enumerate(tokens):
            index.setdefault(t, i)
        missing = [t for t in ("[CLS]", "[SEP]", "[MASK]") if t not in index]
        if missing:
            raise DataPrepError(source, f"vocabulary lacks {', '.join(missing)}")
        if word_starts is None:
            cont = np.fromiter((t.startswith("##") for t in tokens), dtype=bool,
                               count=len(tokens))
        else:
            cont = ~np.asarray(word_starts, dtype=bool)
        return cls(size=len(tokens), cls_id=index["[CLS]"], sep_id=index["[SEP]"],
                   mask_id=index["[MASK]"], is_continuation=cont, id_to_token=list(tokens))

    @classmethod
    def from_tokenizer(cls, tokenizer, source: str = "vocabulary") -> "VocabInfo":
        """Built once per tokenizer and then shared (read-only): a worker reuses one
        tokenizer for all its shards, and building this for a 30k vocabulary took two thirds
        of the time of a small shard (NVIDIA's 1472-shard layout of a small corpus)."""
        try:
            return _FROM_TOKENIZER[tokenizer]
        except (KeyError, TypeError):  # TypeError: a tokenizer that takes no weak reference
            pass
        info = cls._build_from_tokenizer(tokenizer, source)
        info.is_continuation.setflags(write=False)
        try:
            _FROM_TOKENIZER[tokenizer] = info
        except TypeError:
            pass
        return info

    @classmethod
    def _build_from_tokenizer(cls, tokenizer, source: str) -> "VocabInfo":
        vocab = tokenizer.vocab  # token -> id
        size = max(vocab.values()) + 1 if len(vocab) else 0
        tokens = [""] * size
        for t, i in vocab.items():
            tokens[i] = t
        # The tokenizer knows its word boundaries (WordPiece "##", SentencePiece "\u2581").
        word_starts = getattr(tokenizer, "word_starts", None)
        return cls.from_tokens(tokens, source,
                               word_starts(tokens) if word_starts is not None else None)


_FROM_TOKENIZER: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def load_tokenizer(vocab_file: str, do_lower_case: bool = True):
    """``data_prep.wordpiece.tokenization.FullTokenizer`` for ``vocab_file``, or
    ``DataPrepError``."""
    if not os.path.isfile(vocab_file):
        raise DataPrepError(vocab_file, "vocab file not found")
    from data_prep.wordpiece import tokenization  # the package's WordPiece tokenizer
    try:
        return tokenization.FullTokenizer(vocab_file=vocab_file, do_lower_case=do_lower_case)
    except getattr(tokenization, "VocabError", ValueError) as e:
        path = getattr(e, "path", vocab_file)
        problem = str(e)
        if problem.startswith(f"{path}: "):
            problem = problem[len(path) + 2:]
        raise DataPrepError(path, problem) from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataPrepError(vocab_file, f"cannot read vocab file: {e}") from None
