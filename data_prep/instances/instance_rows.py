"""Planned instances as ``[CLS] A [SEP] B [SEP]`` token rows, before any masking.

Shared by the two kinds of records: ``data_prep.instances.masked_instances`` (static masking,
Google's records) masks these rows, ``data_prep.instances.unmasked_instances`` (dynamic masking)
writes them as they are with their word starts. Keeping the rows in a module of their own lets both
build on them without importing each other or the writer above them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from data_prep.instances.corpus import Corpus
from data_prep.instances.instance_plan import InstancePlan
from data_prep.instances.pretraining_data_options import PretrainingDataOptions
from data_prep.instances.vocab_info import VocabInfo


@dataclasses.dataclass
class InstanceRows:
    """Planned pairs as ``[CLS] A [SEP] B [SEP]`` rows, unmasked (shared by both maskings)."""
    tokens: np.ndarray        # (n, max_seq_length) int32, 0 after the real tokens
    input_mask: np.ndarray    # (n, max_seq_length) int8
    segment_ids: np.ndarray   # (n, max_seq_length) int8
    candidates: np.ndarray    # (n, max_seq_length) bool: maskable (A and B, not [CLS]/[SEP])
    total: np.ndarray         # (n, 1) real tokens per row


def instance_rows(corpus: Corpus, plan: InstancePlan, vocab: VocabInfo,
                  options: PretrainingDataOptions) -> InstanceRows:
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
