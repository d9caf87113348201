"""Unmasked pre-training instances: the records of ``create_pretraining_data.py --masking=dynamic``.

RoBERTa's dynamic masking (Liu et al. 2019) draws a new masked-LM choice every time an
instance is read, instead of freezing ``dupe_factor`` choices at creation: the records hold
each instance once, unmasked, and the input pipeline masks it
(``pretraining.dynamic_masking``). ``--dupe_factor 1`` is then enough.

Features (all int64, fixed length):

* ``input_ids``, ``input_mask``, ``segment_ids`` [max_seq_length] and ``next_sentence_labels``
  [1]: Google's features, with the original tokens (no ``[MASK]``).
* ``word_starts`` [max_seq_length]: 1 where a maskable token begins a word (a token that
  does not start with ``##``, or that follows ``[CLS]``/``[SEP]``); 0 at ``##``
  continuations, ``[CLS]``, ``[SEP]`` and padding. Only the tokenizer knows word boundaries
  (WordPiece ``##``, SentencePiece), so whole-word masking at read time needs them here.
* ``masking_vocab`` [4]: ``[vocabulary size, [CLS] id, [SEP] id, [MASK] id]`` of the
  vocabulary the ids come from (``MASKING_VOCAB_FIELDS``). The masker needs these four
  numbers (which tokens are never masked, what replaces a masked token, the range of random
  replacements); carried by every record (29 bytes of ~810 at seq 128) they cannot
  disagree with the ids, whatever vocabulary or flags a training run is given. Padding is
  recognised by ``input_mask``, never by an id.

The absence of ``masked_lm_positions`` and the presence of ``word_starts`` is how readers
tell these records from Google's (``pretraining.record_kinds``).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from data_prep.instances import tfrecord_writer
from data_prep.instances.corpus import Corpus
from data_prep.instances.instance_plan import InstancePlan
from data_prep.instances.instance_rows import instance_rows, word_starts
from data_prep.instances.pretraining_data_options import PretrainingDataOptions
from data_prep.instances.vocab_info import VocabInfo

WORD_STARTS = "word_starts"
MASKING_VOCAB = "masking_vocab"
MASKING_VOCAB_FIELDS = ("vocab_size", "cls_id", "sep_id", "mask_id")

UNMASKED_FEATURE_KINDS = {
    "input_ids": tfrecord_writer.INT64,
    "input_mask": tfrecord_writer.INT64,
    "segment_ids": tfrecord_writer.INT64,
    "next_sentence_labels": tfrecord_writer.INT64,
    WORD_STARTS: tfrecord_writer.INT64,
    MASKING_VOCAB: tfrecord_writer.INT64,
}


@dataclasses.dataclass
class UnmaskedBatch:
    """A batch of unmasked instances, one row per record."""
    input_ids: np.ndarray             # (n, max_seq_length) int32
    input_mask: np.ndarray            # (n, max_seq_length) int8
    segment_ids: np.ndarray           # (n, max_seq_length) int8
    next_sentence_labels: np.ndarray  # (n, 1) int8
    word_starts: np.ndarray           # (n, max_seq_length) int8
    masking_vocab: np.ndarray         # (n, 4) int32, the same row repeated
    KINDS = UNMASKED_FEATURE_KINDS

    def __len__(self) -> int:
        return len(self.input_ids)

    def features(self) -> dict:
        return {name: getattr(self, name) for name in self.KINDS}


def masking_vocab(vocab: VocabInfo) -> np.ndarray:
    """(4,) int32: the ``masking_vocab`` feature of ``vocab``."""
    return np.array([vocab.size, vocab.cls_id, vocab.sep_id, vocab.mask_id], dtype=np.int32)


def build_unmasked_instances(corpus: Corpus, plan: InstancePlan, vocab: VocabInfo,
                             options: PretrainingDataOptions, rng=None) -> UnmaskedBatch:
    """The rows of ``build_instances`` before masking. ``rng`` is unused (same signature as
    ``build_instances``, so the writer calls either)."""
    del rng
    rows = instance_rows(corpus, plan, vocab, options)
    n = len(plan)
    return UnmaskedBatch(
        input_ids=rows.tokens,
        input_mask=rows.input_mask,
        segment_ids=rows.segment_ids,
        next_sentence_labels=plan.is_random_next.astype(np.int8)[:, None],
        word_starts=word_starts(rows, vocab).astype(np.int8),
        masking_vocab=np.broadcast_to(masking_vocab(vocab), (n, 4)),
    )
