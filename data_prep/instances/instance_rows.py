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
    """Token rows and segment ids of (truncated) planned pairs.

    Positions are compared as int32 (half the memory traffic of int64, the largest cost
    here); a token's corpus index is its position plus its side's offset."""
    length = options.max_seq_length
    la = plan.a_len.astype(np.int32)[:, None]
    total = la + plan.b_len.astype(np.int32)[:, None] + 3
    pos = np.arange(length, dtype=np.int32)[None, :]
    input_mask = pos < total
    in_b = (pos > la + 1) & input_mask
    cand = (pos > 0) & (pos != la + 1) & (pos < total - 1)  # A and B: not [CLS]/[SEP]
    # Corpus index of every A/B position (clipped elsewhere: overwritten just below).
    src = np.where(in_b, (plan.b_start - plan.a_len - 2)[:, None],
                   (plan.a_start - 1)[:, None]) + pos
    tokens = np.take(corpus.tokens, src, mode="clip")
    tokens[:, 0] = vocab.cls_id
    rows = np.arange(len(tokens))
    tokens[rows, la[:, 0] + 1] = vocab.sep_id
    tokens[rows, total[:, 0] - 1] = vocab.sep_id
    tokens[~input_mask] = 0
    return InstanceRows(tokens.astype(np.int32, copy=False), input_mask.view(np.int8),
                        in_b.view(np.int8), cand, total.astype(np.int64))


def word_starts(rows: InstanceRows, vocab: VocabInfo) -> np.ndarray:
    """(n, max_seq_length) bool: candidates that begin a word. A "##" token continues the word
    before it, unless that is [CLS]/[SEP]."""
    cand = rows.candidates
    prev_cand = np.zeros_like(cand)
    prev_cand[:, 1:] = cand[:, :-1]
    return cand & ~(vocab.is_continuation[rows.tokens] & prev_cand)
