"""Dynamic masking: the masked-LM choice made in the tf.data pipeline, anew at every read.

RoBERTa (Liu et al. 2019) masks each instance afresh every time it is read, instead of
training on the `dupe_factor` choices frozen into static records: accuracy equal or better,
and the data is written once (`create_pretraining_data.py --masking=dynamic`, records
described in `data_prep.instances.unmasked_instances`).

`mask_batch` applies Google's rule (create_pretraining_data.py; our static masking in
`data_prep.instances.masked_instances` follows it exactly) to every row of a micro-batch:
* candidates: the real tokens (input_mask 1) other than [CLS] and [SEP];
* num_to_predict = min(max_predictions_per_seq, max(1, round(real tokens * masked_lm_prob))),
  rounding half to even (Python's round), and at most the number of candidates;
* units: single tokens, or with `whole_word` whole words (a `word_starts` token and the
  continuations after it; a continuation right after [CLS]/[SEP] starts a word); the units
  are visited in a uniformly random order and each is taken unless it would overshoot
  num_to_predict (Google's loop: a word is never cut, so a row may end a little short);
* each chosen token becomes [MASK] (80 %), stays (10 %) or becomes a uniformly random id of
  the vocabulary (10 %);
* `masked_lm_positions` ascending, padded with 0 (id 0, weight 0) to max_predictions_per_seq.
The result has exactly the features the model_fn reads from static records, same dtypes
and shapes. `word_starts` and `masking_vocab` are consumed; any other feature (e.g. the
instance and position ids of packed rows) passes through untouched. The rule is per row and
reads only `input_ids`, `input_mask`, `word_starts` and the row's `masking_vocab`.

Randomness: stateless (Philox) draws seeded by [stream key, micro-batch number]. The key
mixes --seed, the Horovod rank and train/eval (`stream_key`): ranks draw differently, and
each epoch differs because a record comes back in another micro-batch (another number, and
another row). `training.records.record_dataset` numbers micro-batches from the start of
the data order, records skipped on resume included, and the number is part of the saved
iterator state; so a resumed run, through the saved state or the skip fallback, masks every
micro-batch as the uninterrupted run did. Evaluation uses a fixed key (`EVAL_SEED`, not
--seed): its masks, hence its metrics, repeat across runs for the same eval files and
--eval_batch_size (the draws are laid out per micro-batch).

Vectorised over the micro-batch [B, L]; the only loop is the whole-word choice, a
tf.while_loop over the units in their random order that ends once every row is full (about
num_to_predict iterations).
"""
import dataclasses
import hashlib

import tensorflow as tf

from data_prep.instances.unmasked_instances import MASKING_VOCAB, MASKING_VOCAB_FIELDS, WORD_STARTS

DEFAULT_MASKED_LM_PROB = 0.15
MASK_SHARE, KEEP_SHARE = 0.8, 0.1  # the rest: a random id
# Evaluation's masks do not depend on --seed, so runs with other seeds evaluate alike.
EVAL_SEED = 12345


def unmasked_feature_spec(max_seq_length):
    """Parsing spec of dynamic-masking records."""
    sequence = tf.io.FixedLenFeature([max_seq_length], tf.int64)
    return {"input_ids": sequence, "input_mask": sequence, "segment_ids": sequence,
            "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
            WORD_STARTS: sequence,
            MASKING_VOCAB: tf.io.FixedLenFeature([len(MASKING_VOCAB_FIELDS)], tf.int64)}


def stream_key(seed, rank, purpose):
    """A 63-bit key of one rank's masking stream: `purpose` "train" or "eval"."""
    digest = hashlib.sha256(f"dynamic-masking/{purpose}/{seed}/{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclasses.dataclass(frozen=True)
class DynamicMasking:
    """The masking run_pretraining.py applies to dynamic-masking records."""
    max_predictions_per_seq: int
    masked_lm_prob: float = DEFAULT_MASKED_LM_PROB
    whole_word: bool = False

    @classmethod
    def from_options(cls, options):
        """From the options max_predictions_per_seq, masked_lm_prob, do_whole_word_mask (the
        last two None when not given)."""
        prob = options.masked_lm_prob
        prob = DEFAULT_MASKED_LM_PROB if prob is None else prob
        return cls(options.max_predictions_per_seq, prob, bool(options.do_whole_word_mask))

    def order(self):
        """The settings that fix which masks a (seed, rank, micro-batch) draws, by their flag
        names: part of the data order a resume must keep (`resilience.data_order`)."""
        return {"max_predictions_per_seq": self.max_predictions_per_seq,
                "masked_lm_prob": self.masked_lm_prob, "do_whole_word_mask": self.whole_word}

    def batch_fn(self, key):
        """`(micro-batch number, features) -> masked features`, for `record_dataset`'s
        `batch_fn`; `key` from `stream_key`."""
        def mask(number, features):
            return mask_batch(features, tf.stack([tf.constant(key, tf.int64), number]), self)
        return mask


def mask_batch(features, seed, masking):
    """Masks a micro-batch of unmasked rows.

    features: `input_ids`, `input_mask`, `word_starts` [B, L] int32, `masking_vocab` [B, 4]
      int32, anything else (passed through). seed: [2] int64. masking: DynamicMasking,
      with max_predictions_per_seq <= L.
    Returns the features with `input_ids` masked, plus `masked_lm_positions`,
      `masked_lm_ids` [B, P] int32 and `masked_lm_weights` [B, P] float32
      (P = max_predictions_per_seq), without `word_starts` and `masking_vocab`.
    """
    ids = features["input_ids"]
    vocab = features[MASKING_VOCAB]
    size, cls_id, sep_id, mask_id = (vocab[:, i:i + 1] for i in range(len(MASKING_VOCAB_FIELDS)))
    real = features["input_mask"] > 0
    candidates = real & tf.not_equal(ids, cls_id) & tf.not_equal(ids, sep_id)  # [B, L]
    shape = tf.shape(ids)
    draws = tf.random.stateless_uniform(tf.concat([[3], shape], 0), seed, dtype=tf.float64)
    order_keys, replacement, random_pick = draws[0], draws[1], draws[2]            # [B, L] each

    budget = _num_to_predict(real, candidates, masking)
    starts = _unit_starts(features[WORD_STARTS] > 0, candidates, masking.whole_word)
    chosen = _choose(candidates, starts, budget, order_keys, masking.whole_word)
    positions, labels, weights = _predictions(ids, chosen, masking.max_predictions_per_seq)

    random_ids = tf.minimum(tf.cast(random_pick * tf.cast(size, tf.float64), tf.int32), size - 1)
    replaced = tf.where(replacement < MASK_SHARE, mask_id,
                        tf.where(replacement < MASK_SHARE + KEEP_SHARE, ids, random_ids))
    masked = dict((name, value) for name, value in features.items()
                  if name not in (WORD_STARTS, MASKING_VOCAB))
    masked.update(input_ids=tf.where(chosen, replaced, ids), masked_lm_positions=positions,
                  masked_lm_ids=labels, masked_lm_weights=weights)
    return masked


def _num_to_predict(real, candidates, masking):
    """[B] int32: Google's count, in float64 like Python's `round(n * masked_lm_prob)`
    (tf.round rounds half to even, as Python's round does)."""
    n_real = tf.cast(tf.reduce_sum(tf.cast(real, tf.int32), axis=1), tf.float64)
    share = tf.cast(tf.round(n_real * masking.masked_lm_prob), tf.int32)
    count = tf.minimum(masking.max_predictions_per_seq, tf.maximum(1, share))
    return tf.minimum(count, tf.reduce_sum(tf.cast(candidates, tf.int32), axis=1))


def _unit_starts(word_starts, candidates, whole_word):
    """[B, L] bool: the first token of every masking unit (each candidate in token mode)."""
    if not whole_word:
        return candidates
    after_candidate = tf.concat([tf.zeros_like(candidates[:, :1]), candidates[:, :-1]], 1)
    return candidates & (word_starts | ~after_candidate)


def _choose(candidates, starts, budget, order_keys, whole_word):
    """[B, L] bool: the tokens to predict. Units are numbered in reading order; unit u of a
    row is visited at the rank of order_keys[:, u] among the row's units."""
    rows, length = tf.shape(candidates)[0], tf.shape(candidates)[1]
    unit = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1          # [B, L] unit of each token
    units = tf.reduce_sum(tf.cast(starts, tf.int32), axis=1)          # [B]
    slot = tf.where(candidates, unit + tf.range(rows)[:, None] * length, rows * length)
    unit_length = tf.reshape(tf.math.unsorted_segment_sum(
        tf.cast(candidates, tf.int32), slot, rows * length + 1)[:-1], [rows, length])
    index = tf.range(length)[None, :]
    order = tf.argsort(tf.where(index < units[:, None], order_keys, 2.0), axis=1, stable=True)
    if whole_word:
        taken_in_order = _take_whole_units(tf.gather(unit_length, order, batch_dims=1), budget)
    else:  # single tokens: the first num_to_predict, a uniform random subset
        taken_in_order = index < budget[:, None]
    taken = tf.gather(taken_in_order, tf.argsort(order, axis=1), batch_dims=1)  # by unit
    return candidates & tf.gather(taken, tf.maximum(unit, 0), batch_dims=1)


def _take_whole_units(lengths, budget):
    """[B, L] bool: Google's whole-word loop over units in visiting order (`lengths` [B, L],
    0 after the last unit): take a unit unless it would overshoot `budget` [B]; stop once
    every row is full or has no units left."""
    by_visit = tf.transpose(lengths)                                     # [L, B]
    left = tf.concat([tf.cumsum(by_visit, axis=0, reverse=True),
                      tf.zeros_like(by_visit[:1])], 0)                   # [L + 1, B]

    def unfinished(j, count, taken):
        return tf.reduce_any((count < budget) & (left[j] > 0))

    def visit(j, count, taken):
        take = count + by_visit[j] <= budget
        return (j + 1, count + tf.where(take, by_visit[j], 0),
                tf.tensor_scatter_nd_update(taken, [[j]], take[None, :]))

    _, _, taken = tf.while_loop(unfinished, visit, (0, tf.zeros_like(budget),
                                                    tf.zeros_like(by_visit, tf.bool)))
    return tf.transpose(taken)


def _predictions(ids, chosen, predictions):
    """Sorted positions [B, P], their original ids [B, P] and weights [B, P] (0-padded)."""
    length = tf.shape(ids)[1]
    index = tf.range(length)[None, :]
    _, first = tf.math.top_k(-tf.where(chosen, index, index + length), k=predictions)
    count = tf.reduce_sum(tf.cast(chosen, tf.int32), axis=1, keepdims=True)
    valid = tf.range(predictions)[None, :] < count
    positions = tf.where(valid, first, 0)
    labels = tf.where(valid, tf.gather(ids, positions, batch_dims=1), 0)
    return positions, labels, tf.cast(valid, tf.float32)
