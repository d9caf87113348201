"""Reading and tokenizing the input text of pre-training data into one ``Corpus``.

Input: one sentence per line, a blank (or whitespace-only) line between documents; each
input file also ends the current document. Every line of a shard is tokenized once, in
batch calls (``FullTokenizer.encode_batch_flat``), optionally split over forked helper
processes (``data_prep.processes.forked``), into one flat id array with sentence and document
offsets, so that the ``dupe_factor`` passes, the planning and the batched instance building work on
spans of that array instead of Python lists.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import itertools
import os
from typing import Iterable, List, Sequence, Union

import numpy as np
from absl import logging

from data_prep.errors import DataPrepError
from data_prep.processes import forked
from data_prep.processes.temporaries import is_temporary

# Lines handed to the tokenizer per call (bounds the memory of the Python id lists).
TOKENIZE_LINES = 1 << 18
# Below this many lines a process, tokenizing is not worth a fork.
MIN_LINES_PER_PROCESS = 2000


@dataclasses.dataclass
class Corpus:
    """All documents of a shard as one flat id array.

    Sentence ``s`` is ``tokens[sent_offsets[s]:sent_offsets[s + 1]]``; document ``d`` is
    sentences ``doc_offsets[d]`` to ``doc_offsets[d + 1] - 1``.  Sentences and documents are
    never empty, so the sentences of a document are a contiguous run of tokens.
    """
    tokens: np.ndarray        # int32 (n_tokens,)
    sent_offsets: np.ndarray  # int64 (n_sentences + 1,)
    doc_offsets: np.ndarray   # int64 (n_documents + 1,)

    @property
    def num_documents(self) -> int:
        return len(self.doc_offsets) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.sent_offsets) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_documents(cls, documents: Iterable[Iterable[Sequence[int]]]) -> "Corpus":
        """From documents given as lists of sentences (sequences of ids); drops empties."""
        sent_lens, doc_sizes, parts = [], [], []
        for doc in documents:
            n = 0
            for sent in doc:
                if len(sent):
                    parts.append(np.asarray(sent, dtype=np.int32))
                    sent_lens.append(len(sent))
                    n += 1
            if n:
                doc_sizes.append(n)
        return cls._build(parts, sent_lens, doc_sizes)

    @classmethod
    def _build(cls, parts, sent_lens, doc_sizes) -> "Corpus":
        tokens = np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)
        sent_offsets = np.zeros(len(sent_lens) + 1, dtype=np.int64)
        np.cumsum(sent_lens, out=sent_offsets[1:])
        doc_offsets = np.zeros(len(doc_sizes) + 1, dtype=np.int64)
        np.cumsum(doc_sizes, out=doc_offsets[1:])
        return cls(tokens, sent_offsets, doc_offsets)

    def document(self, d: int) -> List[np.ndarray]:
        s0, s1 = self.doc_offsets[d], self.doc_offsets[d + 1]
        return [self.tokens[self.sent_offsets[s]:self.sent_offsets[s + 1]] for s in range(s0, s1)]

def expand_input_files(spec: Union[str, Sequence[str]]) -> List[str]:
    """Comma-separated globs (or a list of them) to a list of files, each glob sorted."""
    patterns = spec.split(",") if isinstance(spec, str) else list(spec)
    files = []
    for pattern in patterns:
        pattern = pattern.strip()
        if not pattern:
            continue
        matches = ([m for m in sorted(glob.glob(pattern)) if not is_temporary(m)]
                   if glob.has_magic(pattern) else [pattern])  # unfinished writes: not input
        if not matches:
            raise DataPrepError(pattern, "no input file matches")
        for path in matches:
            if not os.path.isfile(path):
                raise DataPrepError(path, "input file not found")
            files.append(path)
    if not files:
        raise DataPrepError(str(spec) or "--input_file", "no input files given")
    return files


def _read_text(path: str) -> "tuple[str, int]":
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DataPrepError(path, f"cannot read: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8"), len(raw)
    except UnicodeDecodeError as e:
        raise DataPrepError(path, f"invalid UTF-8 at byte offset {e.start} "
                                  f"(byte 0x{raw[e.start]:02x})") from None


def encode_lines(tokenizer, lines: List[str]) -> "tuple[np.ndarray, np.ndarray]":
    """(ids of all lines concatenated as int32, number of ids of each line).

    One ``tokenizer.encode_batch`` call for all the lines (``FullTokenizer`` splits words
    in bulk and runs WordPiece once per distinct word); a tokenizer without
    ``encode_batch`` is called line by line.
    """
    if not lines:
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    encode_flat = getattr(tokenizer, "encode_batch_flat", None)
    if encode_flat is not None:
        return encode_flat(lines)
    encode_batch = getattr(tokenizer, "encode_batch", None)
    if encode_batch is not None:
        ids = encode_batch(lines)
    else:
        ids = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(line)) for line in lines]
    counts = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32,
                       count=int(counts.sum()))
    return flat, counts


def encode_lines_in_processes(tokenizer, lines: List[str],
                              processes: int) -> "tuple[np.ndarray, np.ndarray]":
    """``encode_lines``, on up to ``processes`` contiguous parts of the lines at once (forked
    helpers, ``data_prep.processes.forked``); the same arrays for any number."""
    processes = min(processes, len(lines) // MIN_LINES_PER_PROCESS)
    if processes <= 1 or not forked.fork_is_safe():
        return encode_lines(tokenizer, lines)
    bounds = [len(lines) * k // processes for k in range(processes + 1)]
    parts = forked.map_in_processes(functools.partial(encode_lines, tokenizer),
                                    [lines[a:b] for a, b in zip(bounds, bounds[1:])])
    return (np.concatenate([flat for flat, _ in parts]),
            np.concatenate([counts for _, counts in parts]))


def read_corpus(input_files: Sequence[str], tokenizer,
                processes: int = 1) -> "tuple[Corpus, int]":
    """Reads and tokenizes one-sentence-per-line files; returns (corpus, bytes read).
    ``processes``: see ``encode_lines_in_processes``."""
    parts, sent_lens, doc_sizes = [], [], []
    total_bytes = 0
    for path in input_files:
        text, nbytes = _read_text(path)
        total_bytes += nbytes
        # Lines as Python's text mode sees them (\n, \r\n and \r end a line), stripped.
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        del text
        # Keep non-blank lines; blank lines end documents (and so does the end of the file).
        # breaks[i] is True when a blank line (or the file start) precedes kept line i.
        kept, breaks = [], []
        pending_break = True
        for line in lines:
            line = line.strip()
            if line:
                kept.append(line)
                breaks.append(pending_break)
                pending_break = False
            else:
                pending_break = True
        del lines
        n_docs_before = len(doc_sizes)
        current = 0  # sentences in the current document
        for start in range(0, len(kept), TOKENIZE_LINES):
            flat, counts = encode_lines_in_processes(
                tokenizer, kept[start:start + TOKENIZE_LINES], processes)
            if len(flat):
                parts.append(flat)
            for brk, n in zip(breaks[start:start + TOKENIZE_LINES], counts.tolist()):
                if brk and current:
                    doc_sizes.append(current)
                    current = 0
                if n:
                    sent_lens.append(n)
                    current += 1
        if current:
            doc_sizes.append(current)
        if len(doc_sizes) == n_docs_before:
            logging.warning("%s: no text (empty input file)", path)
    return Corpus._build(parts, sent_lens, doc_sizes), total_bytes
