"""BERT pre-training data (masked LM + next sentence prediction) as TFRecord files, fast.

Same algorithm and output format as Google's ``create_pretraining_data.py``, but built for
throughput: every line of an input shard is tokenized once, in one batch call
(``FullTokenizer.encode_batch``), into one flat id array; the ``dupe_factor`` passes reuse it;
instances are planned as (start, length) spans into that array; truncation, masking and
``tf.train.Example`` serialisation run vectorised over batches of instances with numpy; the
TFRecord framing is written directly (see ``data_prep.tfrecord_writer``).  TensorFlow is not
imported.

Algorithm (per call, i.e. per shard):

* Input: one sentence per line, a blank (or whitespace-only) line between documents.  Each
  input file also ends the current document (Google's script lets a document run on into the
  next file).  Lines that tokenize to nothing are skipped; empty documents are dropped.
* Documents are shuffled once; the same order is used in each of the ``dupe_factor`` passes.
* Per document: ``target_seq_length = max_seq_length - 3``, but with probability
  ``short_seq_prob`` a random length in ``[2, max_seq_length - 3]``.  Sentences are
  accumulated into a chunk until it reaches the target length (or the document ends); A is
  the first ``a_end`` segments (``a_end`` uniform in ``[1, len(chunk) - 1]``); with probability
  0.5, or always when the chunk has one segment, B is taken from a random *other* document
  starting at a random sentence (until it reaches ``target - len(A)`` tokens), and the unused
  segments of the chunk are put back; otherwise B is the rest of the chunk.
* The pair is truncated to ``max_seq_length - 3`` tokens by removing tokens from the longer
  side (B on ties), each removal from the front or the back with probability 0.5 (computed in
  closed form: the number of removals per side is deterministic, the number taken from the
  front is Binomial(removals, 0.5) - the same distribution as Google's loop).
* ``[CLS] A [SEP] B [SEP]``; ``num_to_predict = min(max_predictions_per_seq, max(1,
  round(len(tokens) * masked_lm_prob)))`` (round half to even, like Python's ``round``);
  candidates exclude ``[CLS]``/``[SEP]``; a uniformly random subset is chosen (with
  ``do_whole_word_mask``: words - a token plus its ``##`` continuations - taken in random
  order, skipping a word that would overshoot ``num_to_predict``, like Google's loop; a ``##``
  token right after ``[CLS]``/``[SEP]`` starts a word of its own, where Google's script would
  glue it to the word before the ``[SEP]``); each chosen token becomes ``[MASK]`` (80 %), stays
  (10 %) or becomes a uniformly random vocabulary id (10 %); positions are sorted.
* ``masking="dynamic"`` (``--masking=dynamic``) stops before the masked-LM choice and writes
  the instances unmasked, with the word starts and the vocabulary the input pipeline needs to
  mask them at every read (``data_prep.unmasked_instances``); planning and truncation draw
  the same random numbers, so for one seed its instances are those of the static records.
* All instances of the call are shuffled before writing and go round-robin to the output
  files - Google shuffles all instances of all inputs; here the shuffle covers one call, so
  a driver that runs one call per input shard shuffles within the shard (memory stays bounded
  by the shard: the token array plus 5 integers per instance; records are built and written
  in batches of ``BATCH_SIZE``).

Randomness: ``numpy.random.Generator`` (PCG64) streams spawned from
``SeedSequence(random_seed)``; the output depends only on the seed, the inputs and the
options (not on the number of processes, nor on timing).  A driver that runs one call per
shard should pass ``shard_key`` (the shard's index or base name), which seeds the shard with
``derive_shard_seed(random_seed, shard_key)``.

Other differences from Google's script: the random other document is drawn among the other
documents in one draw (Google: up to 10 draws among all, rarely ending on the same one); a
corpus with a single document takes its random-next B from a random sentence of that same
document (what Google's loop ends up doing) and logs a warning; inputs are local files
(Google's ``tf.gfile`` also reads ``gs://``); the random streams differ from Python's
``random``, so outputs are statistically, not byte-for-byte, Google's.

Errors that come from the input or the environment (missing/empty input, invalid UTF-8,
missing vocabulary, unwritable output) raise ``DataPrepError``, whose message is one line
``<file>: <problem>``.  Outputs are written to ``<output>.tmp-<pid>`` and renamed on success;
on any failure the temporary files are removed, so a record file under its final name is
always complete.  A killed run cannot remove them: the next run over the same outputs does
(those of a pid no longer running, ``data_prep.temporaries``), and input globs skip them.  Invalid UTF-8 is an error (Google's script crashes with a traceback):
the message names the file and the byte offset of the first bad byte.  Each output gets its
metadata in ``<output folder>.meta/`` (``data_prep.record_metadata``: vocabulary, lengths,
record count, masking kind), renamed into place just before the records, so pre-training can
check every file at start-up.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import glob
import itertools
import os
import time
import zlib
from typing import Iterable, List, Optional, Sequence, Union

import numpy as np
from absl import logging

from data_prep import forked, packing, record_metadata, tfrecord_writer
from data_prep.temporaries import is_temporary, remove_stale_temporaries
from data_prep.pause_point import pause_point

# Instances built, masked, serialised and written per step (fixed: the random streams are
# consumed per batch, so changing it changes the output of a given seed).
BATCH_SIZE = 4096
# Lines handed to the tokenizer per call (bounds the memory of the Python id lists).
TOKENIZE_LINES = 1 << 18
# Below this many lines a process, tokenizing is not worth a fork.
MIN_LINES_PER_PROCESS = 2000
# Instances logged at INFO, like Google's script.
MAX_LOGGED_INSTANCES = 20

FEATURE_KINDS = {
    "input_ids": tfrecord_writer.INT64,
    "input_mask": tfrecord_writer.INT64,
    "segment_ids": tfrecord_writer.INT64,
    "masked_lm_positions": tfrecord_writer.INT64,
    "masked_lm_ids": tfrecord_writer.INT64,
    "masked_lm_weights": tfrecord_writer.FLOAT,
    "next_sentence_labels": tfrecord_writer.INT64,
}
MASKINGS = ("static", "dynamic")


class DataPrepError(Exception):
    """Bad input or environment; ``str(err)`` is one line ``<file>: <problem>``."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem

    def __reduce__(self):
        # Rebuilt from both arguments when sent back from a worker process.
        return type(self), (self.path, self.problem)


@dataclasses.dataclass(frozen=True)
class PretrainingOptions:
    """The options of Google's ``create_pretraining_data.py`` (same names and defaults)."""
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    random_seed: int = 12345
    dupe_factor: int = 10
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    do_whole_word_mask: bool = False
    do_lower_case: bool = True
    # "static": Google's masked records; "dynamic": unmasked records, masked anew by the
    # input pipeline at every read (``data_prep.unmasked_instances``).
    masking: str = "static"
    # Sequence packing (``data_prep.packing``): 0 writes one instance a record (Google's
    # layout); k >= 2 packs up to k whole instances into each max_seq_length row.
    max_sequences_per_row: int = 0

    def replace(self, **changes) -> "PretrainingOptions":
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        def bad(flag, problem):
            raise DataPrepError(f"--{flag}", problem)
        if self.max_seq_length < 5:
            bad("max_seq_length", f"must be at least 5, got {self.max_seq_length}")
        if self.max_predictions_per_seq < 1:
            bad("max_predictions_per_seq", f"must be at least 1, got {self.max_predictions_per_seq}")
        if self.dupe_factor < 1:
            bad("dupe_factor", f"must be at least 1, got {self.dupe_factor}")
        if not 0.0 <= self.masked_lm_prob <= 1.0:
            bad("masked_lm_prob", f"must be in [0, 1], got {self.masked_lm_prob}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            bad("short_seq_prob", f"must be in [0, 1], got {self.short_seq_prob}")
        if self.random_seed < 0:
            bad("random_seed", f"must be non-negative, got {self.random_seed}")
        if self.masking not in MASKINGS:
            bad("masking", f"must be one of {', '.join(MASKINGS)}, got {self.masking!r}")
        if self.max_sequences_per_row == 1 or self.max_sequences_per_row < 0:
            bad("max_sequences_per_row", "must be 0 (no packing) or at least 2, got "
                f"{self.max_sequences_per_row}")
        if self.masking == "dynamic" and self.do_whole_word_mask:
            bad("do_whole_word_mask", "dynamic-masking records keep every word start; choose "
                "whole-word masking when training (run_pretraining.py --do_whole_word_mask)")


@dataclasses.dataclass
class PretrainingStats:
    input_files: List[str]
    output_files: List[str]
    input_bytes: int = 0
    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    instances: int = 0
    instances_per_output: List[int] = dataclasses.field(default_factory=list)  # records
    padding_share: float = 0.0        # of the token slots written
    random_next: int = 0
    seconds: dict = dataclasses.field(default_factory=dict)


def derive_shard_seed(random_seed: int, shard_key: Union[str, int]) -> int:
    """A per-shard seed from the global seed and a stable shard key (index or file name).

    Use the shard's index or base name (not an absolute path) so that the output does not
    depend on where the data lives, nor on how shards are spread over processes.
    """
    key = shard_key if isinstance(shard_key, int) else zlib.crc32(str(shard_key).encode("utf-8"))
    seq = np.random.SeedSequence([int(random_seed), int(key) & 0xFFFFFFFF,
                                  0x5EED if isinstance(shard_key, int) else 0x57A7])
    return int(seq.generate_state(1, dtype=np.uint64)[0]) >> 1


# --------------------------------------------------------------------------- vocabulary

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
        vocab = tokenizer.vocab  # token -> id
        size = max(vocab.values()) + 1 if len(vocab) else 0
        tokens = [""] * size
        for t, i in vocab.items():
            tokens[i] = t
        # The tokenizer knows its word boundaries (WordPiece "##", SentencePiece "\u2581").
        word_starts = getattr(tokenizer, "word_starts", None)
        return cls.from_tokens(tokens, source,
                               word_starts(tokens) if word_starts is not None else None)


def load_tokenizer(vocab_file: str, do_lower_case: bool = True):
    """``data_prep.tokenization.FullTokenizer`` for ``vocab_file``, or ``DataPrepError``."""
    if not os.path.isfile(vocab_file):
        raise DataPrepError(vocab_file, "vocab file not found")
    from data_prep import tokenization  # the package's WordPiece tokenizer
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


# --------------------------------------------------------------------------- corpus

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


def _folder(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


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
    helpers, ``data_prep.forked``); the same arrays for any number."""
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


# --------------------------------------------------------------------------- planning

@dataclasses.dataclass
class InstancePlan:
    """Instances as spans of ``Corpus.tokens``: A = tokens[a_start:a_start+a_len], B likewise."""
    a_start: np.ndarray
    a_len: np.ndarray
    b_start: np.ndarray
    b_len: np.ndarray
    is_random_next: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.a_start)

    def take(self, index) -> "InstancePlan":
        return InstancePlan(self.a_start[index], self.a_len[index], self.b_start[index],
                            self.b_len[index], self.is_random_next[index])


def _uniform_stream(rng: np.random.Generator, block: int = 1 << 16):
    while True:
        yield from rng.random(block).tolist()


def plan_instances(corpus: Corpus, options: PretrainingOptions,
                   rng_order: np.random.Generator,
                   rng_stream: np.random.Generator) -> InstancePlan:
    """Google's chunking / next-sentence logic over all documents and dupes (untruncated)."""
    off = corpus.sent_offsets.tolist()
    doc_off = corpus.doc_offsets.tolist()
    n_docs = corpus.num_documents
    order = rng_order.permutation(n_docs).tolist()
    max_num_tokens = options.max_seq_length - 3
    short_prob = options.short_seq_prob
    uniform = _uniform_stream(rng_stream).__next__
    bisect_left = bisect.bisect_left
    a_s, a_l, b_s, b_l, rnd = [], [], [], [], []
    single_doc = n_docs < 2
    if single_doc and n_docs:
        logging.warning("the input has a single document: random-next sentences are taken from "
                        "a random position of that same document")
    for _ in range(options.dupe_factor):
        for pos, d in enumerate(order):
            s0, s1 = doc_off[d], doc_off[d + 1]
            target = max_num_tokens
            if uniform() < short_prob:
                target = 2 + int(uniform() * (max_num_tokens - 1))
            c0 = s0  # first sentence of the current chunk
            i = s0
            while i < s1:
                if i == s1 - 1 or off[i + 1] - off[c0] >= target:
                    n_chunk = i - c0 + 1
                    a_end = c0 + 1
                    if n_chunk >= 2:
                        a_end += int(uniform() * (n_chunk - 1))
                    a0 = off[c0]
                    al = off[a_end] - a0
                    if n_chunk == 1 or uniform() < 0.5:
                        target_b = target - al
                        if single_doc:
                            rd = d
                        else:
                            r = int(uniform() * (n_docs - 1))
                            rd = order[r + 1 if r >= pos else r]
                        r0, r1 = doc_off[rd], doc_off[rd + 1]
                        rs = r0 + int(uniform() * (r1 - r0))
                        b0 = off[rs]
                        e = bisect_left(off, b0 + target_b, rs + 1, r1)
                        b_s.append(b0)
                        b_l.append(off[e] - b0)
                        rnd.append(True)
                        i = a_end - 1  # put the unused segments back
                    else:
                        b0 = off[a_end]
                        b_s.append(b0)
                        b_l.append(off[i + 1] - b0)
                        rnd.append(False)
                    a_s.append(a0)
                    a_l.append(al)
                    c0 = i + 1
                i += 1
    return InstancePlan(np.array(a_s, dtype=np.int64), np.array(a_l, dtype=np.int64),
                        np.array(b_s, dtype=np.int64), np.array(b_l, dtype=np.int64),
                        np.array(rnd, dtype=bool))


def truncated_lengths(a_len: np.ndarray, b_len: np.ndarray, max_num_tokens: int):
    """Lengths after Google's truncate_seq_pair (remove from the longer side, B on ties)."""
    a_len = np.asarray(a_len, dtype=np.int64)
    b_len = np.asarray(b_len, dtype=np.int64)
    m = max_num_tokens
    over = a_len + b_len > m
    a_absorbs = 2 * b_len <= m           # only A shrinks, down to m - len(B)
    b_absorbs = 2 * a_len <= m + 1       # only B shrinks, down to m - len(A)
    new_a = np.where(a_absorbs, m - b_len, np.where(b_absorbs, a_len, (m + 1) // 2))
    new_b = np.where(a_absorbs, b_len, np.where(b_absorbs, m - a_len, m // 2))
    return np.where(over, new_a, a_len), np.where(over, new_b, b_len)


def truncate_plan(plan: InstancePlan, max_num_tokens: int,
                  rng: np.random.Generator) -> InstancePlan:
    la, lb = truncated_lengths(plan.a_len, plan.b_len, max_num_tokens)
    front_a = rng.binomial(plan.a_len - la, 0.5)
    front_b = rng.binomial(plan.b_len - lb, 0.5)
    return InstancePlan(plan.a_start + front_a, la, plan.b_start + front_b, lb,
                        plan.is_random_next)


def warn_truncation(corpus: Corpus, planned: InstancePlan, truncated: InstancePlan,
                    max_seq_length: int, most: float = 0.5):
    """One warning line when documents lose most of their tokens to truncation.

    Google's chunking cuts documents at sentence ends, so a document whose "sentences" are
    longer than a sequence (a text without sentence breaks, one 30 MB line) becomes a few
    instances with almost all of its tokens thrown away, which nothing else would say."""
    if not len(planned):
        return
    doc_token_starts = corpus.sent_offsets[corpus.doc_offsets[:-1]]
    # Segment A comes from the document being chunked, B from it or a random other one.
    documents = np.searchsorted(doc_token_starts, np.concatenate(
        [planned.a_start, planned.b_start]), side="right") - 1
    before = np.bincount(documents, np.concatenate([planned.a_len, planned.b_len]),
                         minlength=corpus.num_documents)
    kept = np.bincount(documents, np.concatenate([truncated.a_len, truncated.b_len]),
                       minlength=corpus.num_documents)
    lossy = before > 0
    lossy[lossy] = (before[lossy] - kept[lossy]) > most * before[lossy]
    if lossy.any():
        dropped = 1 - kept[lossy].sum() / before[lossy].sum()
        total = 1 - kept.sum() / before.sum()
        logging.warning(
            "%d of %d documents lose most of their tokens to truncation (%.1f%% of theirs, "
            "%.1f%% of the input's): their sentences are longer than --max_seq_length=%d "
            "(text without sentence breaks?)", int(lossy.sum()), corpus.num_documents,
            100 * dropped, 100 * total, max_seq_length)


# --------------------------------------------------------------------------- instances

@dataclasses.dataclass
class InstanceBatch:
    input_ids: np.ndarray            # (n, max_seq_length) int32
    input_mask: np.ndarray           # (n, max_seq_length) int8
    segment_ids: np.ndarray          # (n, max_seq_length) int8
    masked_lm_positions: np.ndarray  # (n, max_predictions) int32
    masked_lm_ids: np.ndarray        # (n, max_predictions) int32
    masked_lm_weights: np.ndarray    # (n, max_predictions) float32
    next_sentence_labels: np.ndarray  # (n, 1) int8
    KINDS = FEATURE_KINDS  # the record's features, in the writer's kinds

    def __len__(self) -> int:
        return len(self.input_ids)

    def features(self) -> dict:
        return {name: getattr(self, name) for name in self.KINDS}


def _choose_single_tokens(cand: np.ndarray, num_to_predict: np.ndarray,
                          rng: np.random.Generator) -> np.ndarray:
    """(n, L) bool: a uniformly random subset of ``num_to_predict`` candidates per row.

    Selection sampling (Knuth's algorithm S) run over the columns for all rows at once: a
    candidate is taken with probability (still needed) / (candidates left), which gives
    every subset of the right size the same probability, without sorting.
    """
    n, length = cand.shape
    cand_t = np.ascontiguousarray(cand.T)
    u = rng.random((length, n))
    need = num_to_predict.astype(np.float64)
    left = cand.sum(axis=1).astype(np.float64)
    chosen_t = np.zeros((length, n), dtype=bool)
    for j in range(length):
        c = cand_t[j]
        take = c & (u[j] * left < need)
        chosen_t[j] = take
        need -= take
        left -= c
    return chosen_t.T


def _choose_whole_words(cand: np.ndarray, word_start: np.ndarray, num_to_predict: np.ndarray,
                        rng: np.random.Generator) -> np.ndarray:
    """(n, L) bool: words in random order, each taken unless it would overshoot the budget."""
    n, length = cand.shape
    word_id = np.cumsum(word_start, axis=1) - 1          # word index of each position
    n_words = word_start.sum(axis=1)
    flat_word = (np.arange(n)[:, None] * (length + 1) + word_id)[cand]
    word_len = np.bincount(flat_word, minlength=n * (length + 1)).reshape(n, length + 1)
    keys = rng.random((n, length))
    keys[np.arange(length)[None, :] >= n_words[:, None]] = 2.0
    order = np.argsort(keys, axis=1)
    count = np.zeros(n, dtype=np.int64)
    taken = np.zeros(n * (length + 1), dtype=bool)
    word_len = word_len.reshape(-1)
    base = np.arange(n) * (length + 1)
    max_words = int(n_words.max()) if n else 0
    for j in range(max_words):
        idx = base + order[:, j]
        wl = word_len[idx]
        ok = (j < n_words) & (count + wl <= num_to_predict)
        count += wl * ok
        taken[idx] |= ok
        # Stop once no row has both budget and words left.
        if j % 8 == 7 and not ((count < num_to_predict) & (n_words > j + 1)).any():
            break
    taken = taken.reshape(n, length + 1)
    return cand & np.take_along_axis(taken, np.where(cand, word_id, length), axis=1)


@dataclasses.dataclass
class InstanceRows:
    """Planned pairs as ``[CLS] A [SEP] B [SEP]`` rows, unmasked (shared by both maskings)."""
    tokens: np.ndarray        # (n, max_seq_length) int32, 0 after the real tokens
    input_mask: np.ndarray    # (n, max_seq_length) int8
    segment_ids: np.ndarray   # (n, max_seq_length) int8
    candidates: np.ndarray    # (n, max_seq_length) bool: maskable (A and B, not [CLS]/[SEP])
    total: np.ndarray         # (n, 1) real tokens per row


def instance_rows(corpus: Corpus, plan: InstancePlan, vocab: VocabInfo,
                  options: PretrainingOptions) -> InstanceRows:
    """Token rows and segment ids of (truncated) planned pairs."""
    length = options.max_seq_length
    la = plan.a_len[:, None]
    lb = plan.b_len[:, None]
    pos = np.arange(length, dtype=np.int64)[None, :]
    in_a = (pos >= 1) & (pos <= la)
    in_b = (pos >= la + 2) & (pos <= la + lb + 1)
    cand = in_a | in_b
    total = la + lb + 3
    # Corpus index of every A/B position (0 elsewhere: overwritten just below).
    src = np.where(in_a, plan.a_start[:, None] + pos - 1,
                   np.where(in_b, plan.b_start[:, None] + pos - la - 2, 0))
    special = np.where((pos == la + 1) | (pos == total - 1), vocab.sep_id, 0)
    special[:, 0] = vocab.cls_id
    tokens = np.where(cand, np.take(corpus.tokens, src), special).astype(np.int32)
    input_mask = (pos < total).astype(np.int8)
    segment_ids = ((pos >= la + 2) & (pos < total)).astype(np.int8)
    return InstanceRows(tokens, input_mask, segment_ids, cand, total)


def word_starts(rows: InstanceRows, vocab: VocabInfo) -> np.ndarray:
    """(n, max_seq_length) bool: candidates that begin a word. A "##" token continues the word
    before it, unless that is [CLS]/[SEP]."""
    cand = rows.candidates
    prev_cand = np.zeros_like(cand)
    prev_cand[:, 1:] = cand[:, :-1]
    return cand & ~(vocab.is_continuation[rows.tokens] & prev_cand)


def build_instances(corpus: Corpus, plan: InstancePlan, vocab: VocabInfo,
                    options: PretrainingOptions, rng: np.random.Generator) -> InstanceBatch:
    """Token rows, segment ids, masks and masked-LM choices for (truncated) planned pairs."""
    n = len(plan)
    n_pred = options.max_predictions_per_seq
    unmasked = instance_rows(corpus, plan, vocab, options)
    tokens, cand, total = unmasked.tokens, unmasked.candidates, unmasked.total

    num_cand = cand.sum(axis=1)
    num_to_predict = np.rint(total[:, 0] * options.masked_lm_prob).astype(np.int64)
    num_to_predict = np.minimum(n_pred, np.maximum(1, num_to_predict))
    num_to_predict = np.minimum(num_to_predict, num_cand)
    if options.do_whole_word_mask:
        chosen = _choose_whole_words(cand, word_starts(unmasked, vocab), num_to_predict, rng)
    else:
        chosen = _choose_single_tokens(cand, num_to_predict, rng)

    # Sorted positions of the chosen tokens (at most n_pred per row), zero-padded:
    # np.nonzero walks rows in order and positions upwards within a row.
    rows, cols = np.nonzero(chosen)
    counts = np.bincount(rows, minlength=n)
    first = np.zeros(n, dtype=np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    slot = np.arange(len(rows)) - first[rows]
    labels_flat = tokens[rows, cols]
    positions = np.zeros((n, n_pred), dtype=np.int32)
    positions[rows, slot] = cols
    labels = np.zeros((n, n_pred), dtype=np.int32)
    labels[rows, slot] = labels_flat
    weights = np.zeros((n, n_pred), dtype=np.float32)
    weights[rows, slot] = 1.0

    # 80 % [MASK], 10 % unchanged, 10 % random id (one draw of each per row and slot, so the
    # stream consumed does not depend on how many tokens were chosen).
    r = rng.random((n, n_pred))[rows, slot]
    random_ids = rng.integers(0, vocab.size, size=(n, n_pred), dtype=np.int64)[rows, slot]
    tokens[rows, cols] = np.where(r < 0.8, vocab.mask_id,
                                  np.where(r < 0.9, labels_flat, random_ids))

    return InstanceBatch(
        input_ids=tokens.astype(np.int32, copy=False),
        input_mask=unmasked.input_mask,
        segment_ids=unmasked.segment_ids,
        masked_lm_positions=positions,
        masked_lm_ids=labels,
        masked_lm_weights=weights,
        next_sentence_labels=plan.is_random_next.astype(np.int8)[:, None],
    )


def _log_instances(batch: InstanceBatch, vocab: VocabInfo, count: int) -> None:
    id_to_token = vocab.id_to_token
    for i in range(min(count, len(batch))):
        n_real = int(batch.input_mask[i].sum())
        logging.info("*** Example ***")
        logging.info("tokens: %s", " ".join(id_to_token[t] for t in
                                            batch.input_ids[i, :n_real].tolist()))
        if hasattr(batch, "masked_lm_weights"):  # not in unmasked (dynamic) instances
            n_pred = int(batch.masked_lm_weights[i].sum())
            logging.info("masked_lm_labels: %s", " ".join(
                id_to_token[t] for t in batch.masked_lm_ids[i, :n_pred].tolist()))
        for name in batch.KINDS:
            values = getattr(batch, name)[i].tolist()
            logging.info("%s: %s", name, " ".join(str(v) for v in values))


# --------------------------------------------------------------------------- driver

def _as_tokenizer(tokenizer_or_vocab, options: PretrainingOptions):
    if isinstance(tokenizer_or_vocab, (str, os.PathLike)):
        return load_tokenizer(os.fspath(tokenizer_or_vocab), options.do_lower_case)
    return tokenizer_or_vocab


def _random_streams(seed: int):
    """Generators for planning, truncation, shuffling, masking and packing. Children of one
    SeedSequence are keyed by their index, so adding the packing stream changed none of the
    others (the unpacked outputs of a seed stay the same)."""
    order, stream, trunc, shuffle, mask, pack = np.random.SeedSequence(seed).spawn(6)
    return tuple(np.random.Generator(np.random.PCG64(s))
                 for s in (order, stream, trunc, shuffle, mask, pack))


class _CallHere:
    """A call done at once, with the interface of a ``forked.ForkedWorker`` call."""

    def __init__(self, function, *args):
        self.value = function(*args)

    def result(self):
        return self.value


def serialised_rows(features: dict, kinds: dict, n_out: int, records_before: int) -> list:
    """(TFRecord bytes, record count) of a batch's rows for each of ``n_out`` outputs: record
    number records_before + j goes to output (records_before + j) % n_out."""
    out = []
    for w_index in range(n_out):
        first = (w_index - records_before) % n_out
        sub = {name: arr[first::n_out] for name, arr in features.items()}
        count = len(sub["input_ids"])
        out.append((tfrecord_writer.encode_tfrecords(sub, kinds) if count else None, count))
    return out


def _write_rows(writers, rows) -> None:
    for writer, (framed, count) in zip(writers, rows):
        if count:
            try:
                writer.write_tfrecords(framed, count)
            except OSError as e:
                raise DataPrepError(writer.path, f"cannot write output: {e.strerror or e}") \
                    from None


def write_instances(corpus: Corpus, output_files: Sequence[str], vocab: VocabInfo,
                    options: PretrainingOptions, stats: Optional[PretrainingStats] = None,
                    log_instances: int = MAX_LOGGED_INSTANCES,
                    processes: int = 1) -> PretrainingStats:
    """Plans, shuffles, builds and writes all instances of ``corpus`` (round-robin outputs).
    ``processes`` > 1 serialises each batch in a forked helper while the next is built."""
    options.validate()
    if stats is None:
        stats = PretrainingStats(input_files=[], output_files=list(output_files))
    if not output_files:
        raise DataPrepError("--output_file", "no output files given")
    if corpus.tokens.size and int(corpus.tokens.max()) >= vocab.size:
        raise DataPrepError("tokens", f"token id {int(corpus.tokens.max())} is outside the "
                                      f"vocabulary of {vocab.size}")
    rng_order, rng_stream, rng_trunc, rng_shuffle, rng_mask, rng_pack = \
        _random_streams(options.random_seed)
    writers, pending = [], collections.deque()  # serialised batches not yet written
    serialiser = None  # a forked.ForkedWorker
    written_tokens = written_slots = records_before = 0
    try:
        for path in output_files:
            try:
                writers.append(tfrecord_writer.TFRecordFileWriter(path))
            except OSError as e:
                raise DataPrepError(path, f"cannot write output: {e.strerror or e}") from None
        pause_point("records_opened")  # tests: killed with the temporaries just created
        t0 = time.perf_counter()
        plan = plan_instances(corpus, options, rng_order, rng_stream)
        truncated = truncate_plan(plan, options.max_seq_length - 3, rng_trunc)
        warn_truncation(corpus, plan, truncated, options.max_seq_length)
        plan = truncated
        plan = plan.take(rng_shuffle.permutation(len(plan)))
        t1 = time.perf_counter()
        n_out = len(writers)
        build = build_instances
        if options.masking == "dynamic":
            from data_prep.unmasked_instances import build_unmasked_instances as build
        # Serialising batch k (in a forked helper when there are cores for it) runs while
        # this process builds batch k+1; batches are written in order.
        if processes > 1 and forked.fork_is_safe():
            serialiser = forked.ForkedWorker()
            submit = serialiser.submit
        else:
            submit = _CallHere
        for start in range(0, len(plan), BATCH_SIZE):
            pause_point("records_batch")  # tests: killed after start / BATCH_SIZE batches
            part = plan.take(slice(start, start + BATCH_SIZE))
            batch = build(corpus, part, vocab, options, rng_mask)
            if start == 0 and log_instances:
                _log_instances(batch, vocab, log_instances)
            features, kinds = batch.features(), batch.KINDS
            if options.max_sequences_per_row:
                features = packing.pack_instances(features, options.max_sequences_per_row,
                                                  rng_pack)
                kinds = packing.packed_kinds(kinds)
            written_tokens += int(features["input_mask"].sum())
            written_slots += features["input_mask"].size
            if pending:  # first: the helper takes the next batch only when this one is back
                _write_rows(writers, pending.popleft().result())
            pending.append(submit(serialised_rows, features, kinds, n_out, records_before))
            records_before += len(features["input_ids"])
        while pending:
            _write_rows(writers, pending.popleft().result())
        if serialiser is not None:
            serialiser.close()
        vocab_hash = record_metadata.vocab_sha256(vocab.id_to_token)
        for writer in writers:
            try:  # the metadata first: a record file under its final name always has it
                record_metadata.write(writer.path, record_metadata.describe(
                    writer.records, options.max_seq_length, options.max_predictions_per_seq,
                    vocab.size, vocab_hash, options.masking, options.max_sequences_per_row))
                writer.commit()
            except OSError as e:
                raise DataPrepError(writer.path, f"cannot write output: {e.strerror or e}") \
                    from None
        t2 = time.perf_counter()
    except BaseException:
        if serialiser is not None:
            serialiser.close(kill=True)
        for writer in writers:
            writer.abort()
        raise
    stats.instances = len(plan)
    stats.random_next = int(plan.is_random_next.sum())
    stats.instances_per_output = [w.records for w in writers]
    stats.padding_share = 1.0 - written_tokens / max(written_slots, 1)
    stats.seconds["plan"] = t1 - t0
    stats.seconds["build_and_write"] = t2 - t1
    return stats


def create_pretraining_tfrecords(input_files: Union[str, Sequence[str]],
                                 output_files: Union[str, Sequence[str]],
                                 tokenizer_or_vocab,
                                 options: Optional[PretrainingOptions] = None,
                                 log_instances: int = MAX_LOGGED_INSTANCES,
                                 shard_key: Optional[Union[str, int]] = None,
                                 processes: int = 1) -> PretrainingStats:
    """Reads text files, writes pre-training TFRecords; the entry point for one shard.

    ``input_files``: comma-separated globs or a list of paths/globs.  ``output_files``:
    comma-separated or a list; instances go round-robin to them.  ``tokenizer_or_vocab``: a
    ``FullTokenizer`` (anything with ``vocab`` and ``encode_batch``; reuse one across the
    shards of a worker to save its set-up) or a vocab file path (then
    ``options.do_lower_case`` applies).  ``shard_key`` (the shard's index or base name):
    when given, the seed used is ``derive_shard_seed(options.random_seed, shard_key)``, so a
    multiprocessing driver gets the same output whatever the number of processes.
    ``log_instances``: how many instances to log at INFO (Google logs 20).  ``processes``:
    how many processes tokenize the text (``read_corpus``; the output does not depend on it).
    Raises
    ``DataPrepError`` for bad input or output; returns counts and timings.
    """
    t0 = time.perf_counter()
    options = options or PretrainingOptions()
    options.validate()
    if shard_key is not None:
        options = options.replace(random_seed=derive_shard_seed(options.random_seed, shard_key))
    if isinstance(output_files, str):
        output_files = [p.strip() for p in output_files.split(",") if p.strip()]
    output_files = list(output_files)
    if not output_files:
        raise DataPrepError("--output_file", "no output files given")
    for path in output_files:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise DataPrepError(path, f"output folder {folder} does not exist")
        if os.path.isdir(path):
            raise DataPrepError(path, "output path is a directory")
    for folder, names in itertools.groupby(sorted(output_files, key=_folder), key=_folder):
        names = list(names)  # left by a killed run of these outputs (and their metadata):
        remove_stale_temporaries(folder, names + [record_metadata.legacy_metadata_path(n)
                                                  for n in names])
        remove_stale_temporaries(os.path.dirname(record_metadata.metadata_path(names[0])),
                                 [record_metadata.metadata_path(n) for n in names])
    if len(set(map(os.path.abspath, output_files))) != len(output_files):
        raise DataPrepError(",".join(output_files), "the same output file is named twice")
    files = expand_input_files(input_files)
    inputs = set(map(os.path.abspath, files))
    for path in output_files:
        if os.path.abspath(path) in inputs:
            raise DataPrepError(path, "output file is also an input file")
    tokenizer = _as_tokenizer(tokenizer_or_vocab, options)
    vocab = VocabInfo.from_tokenizer(tokenizer, source=str(
        tokenizer_or_vocab if isinstance(tokenizer_or_vocab, (str, os.PathLike)) else "tokenizer"))
    t1 = time.perf_counter()
    corpus, nbytes = read_corpus(files, tokenizer, processes)
    t2 = time.perf_counter()
    stats = PretrainingStats(input_files=files, output_files=output_files, input_bytes=nbytes,
                             documents=corpus.num_documents, sentences=corpus.num_sentences,
                             tokens=corpus.num_tokens)
    if corpus.num_documents == 0:
        raise DataPrepError(files[0] if len(files) == 1 else ",".join(files),
                            "no text: the input has no non-empty line")
    logging.info("Read %d documents, %d sentences, %d tokens from %d file(s) (%.1f MB)",
                 corpus.num_documents, corpus.num_sentences, corpus.num_tokens, len(files),
                 nbytes / 1e6)
    write_instances(corpus, output_files, vocab, options, stats, log_instances, processes)
    stats.seconds["setup"] = t1 - t0
    stats.seconds["read_tokenize"] = t2 - t1
    stats.seconds["total"] = time.perf_counter() - t0
    logging.info("Wrote %d total instances", stats.instances)
    return stats
