"""Static masking: Google's masked-LM choice over a batch of instance rows, vectorised.

``build_instances`` turns a batch of planned pairs into the features of Google's records
(``FEATURE_KINDS``): the rows of ``data_prep.instances.instance_rows``, ``num_to_predict`` per row,
a uniformly random subset of the candidates (or whole words with ``do_whole_word_mask``)
chosen for all rows at once with numpy, and each chosen token replaced by ``[MASK]`` (80 %),
kept (10 %) or a random id (10 %). The draws are made per batch, so the output of a seed
depends on ``data_prep.instances.batch_writing.BATCH_SIZE``.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from data_prep.instances import tfrecord_writer
from data_prep.instances.corpus import Corpus
from data_prep.instances.instance_plan import InstancePlan
from data_prep.instances.instance_rows import instance_rows, word_starts
from data_prep.instances.pretraining_data_options import PretrainingDataOptions
from data_prep.instances.vocab_info import VocabInfo

FEATURE_KINDS = {
    "input_ids": tfrecord_writer.INT64,
    "input_mask": tfrecord_writer.INT64,
    "segment_ids": tfrecord_writer.INT64,
    "masked_lm_positions": tfrecord_writer.INT64,
    "masked_lm_ids": tfrecord_writer.INT64,
    "masked_lm_weights": tfrecord_writer.FLOAT,
    "next_sentence_labels": tfrecord_writer.INT64,
}


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


class MaskingDraws(NamedTuple):
    """The random numbers that mask one batch, drawn in one place: a helper process that
    builds every other batch draws (and drops) those of the batches between its own, so
    that its generator is where it would be in one process (``masking_draws``)."""
    selection: np.ndarray    # (max_seq_length, n) or, whole words, (n, max_seq_length)
    replacement: np.ndarray  # (n, max_predictions): [MASK] 80 %, kept 10 %, random 10 %
    random_ids: np.ndarray   # (n, max_predictions) int64: the random ids


def masking_draws(rng: np.random.Generator, n: int, options: PretrainingDataOptions,
                  vocab_size: int) -> MaskingDraws:
    """The draws of ``build_instances`` for a batch of ``n`` rows, in its order: the
    selection keys, then the 80/10/10 choice and the random ids (one draw of each per row
    and slot, so the stream consumed depends on ``n`` only, not on the tokens)."""
    length, n_pred = options.max_seq_length, options.max_predictions_per_seq
    shape = (n, length) if options.do_whole_word_mask else (length, n)
    selection = rng.random(shape)
    replacement = rng.random((n, n_pred))
    return MaskingDraws(selection, replacement,
                        rng.integers(0, vocab_size, size=(n, n_pred), dtype=np.int64))


def _choose_single_tokens(cand: np.ndarray, num_to_predict: np.ndarray,
                          u: np.ndarray) -> np.ndarray:
    """(n, L) bool: a uniformly random subset of ``num_to_predict`` candidates per row.

    Selection sampling (Knuth's algorithm S) run over the columns for all rows at once: a
    candidate is taken with probability (still needed) / (candidates left), which gives
    every subset of the right size the same probability, without sorting.
    """
    n, length = cand.shape
    cand_t = np.ascontiguousarray(cand.T)
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
                        keys: np.ndarray) -> np.ndarray:
    """(n, L) bool: words in random order, each taken unless it would overshoot the budget."""
    n, length = cand.shape
    word_id = np.cumsum(word_start, axis=1) - 1          # word index of each position
    n_words = word_start.sum(axis=1)
    flat_word = (np.arange(n)[:, None] * (length + 1) + word_id)[cand]
    word_len = np.bincount(flat_word, minlength=n * (length + 1)).reshape(n, length + 1)
    keys = keys.copy()
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


def build_instances(corpus: Corpus, plan: InstancePlan, vocab: VocabInfo,
                    options: PretrainingDataOptions, rng: np.random.Generator) -> InstanceBatch:
    """Token rows, segment ids, masks and masked-LM choices for (truncated) planned pairs."""
    n = len(plan)
    n_pred = options.max_predictions_per_seq
    draws = masking_draws(rng, n, options, vocab.size)
    unmasked = instance_rows(corpus, plan, vocab, options)
    tokens, cand, total = unmasked.tokens, unmasked.candidates, unmasked.total

    num_cand = cand.sum(axis=1)
    num_to_predict = np.rint(total[:, 0] * options.masked_lm_prob).astype(np.int64)
    num_to_predict = np.minimum(n_pred, np.maximum(1, num_to_predict))
    num_to_predict = np.minimum(num_to_predict, num_cand)
    if options.do_whole_word_mask:
        chosen = _choose_whole_words(cand, word_starts(unmasked, vocab), num_to_predict,
                                     draws.selection)
    else:
        chosen = _choose_single_tokens(cand, num_to_predict, draws.selection)

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

    # 80 % [MASK], 10 % unchanged, 10 % random id.
    r = draws.replacement[rows, slot]
    random_ids = draws.random_ids[rows, slot]
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
