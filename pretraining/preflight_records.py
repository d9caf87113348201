"""Synthetic pre-training records for the preflight, in Google's format with their metadata
(as data preparation writes them): random ids for the speed loops, where what is learned
does not matter, and a Markov chain's ids for the loss check, where the loss must fall.
"""
import os

import numpy as np

from data_prep.instances import record_metadata, tfrecord_writer
from data_prep.instances.masked_instances import FEATURE_KINDS
from pretraining import published_speed

SEQ = published_speed.PHASE1_SEQ                    # NVIDIA's phase 1
PREDICTIONS = published_speed.PHASE_PREDICTIONS[SEQ]
CLS, SEP, MASK = 101, 102, 103                      # Google's uncased vocabulary's ids

SUCCESSORS = 4    # learnable records: each token is followed by one of 4 tokens
CHAIN_TOKENS = 1000  # ... among at most this many tokens


def _markov_ids(rng, records, seq, first_id, vocab_size):
    """[records, seq] ids of a fixed random Markov chain over CHAIN_TOKENS tokens from
    first_id on, in which every token has SUCCESSORS possible next tokens. A model's
    masked-LM loss then falls in two stages within a few hundred steps: from ln(vocabulary)
    (10.3 for Google's 30,522) to about ln(CHAIN_TOKENS) (6.9) once it learns which tokens
    occur, then towards ln(SUCCESSORS) as it learns each token's neighbours. The chain is the
    same for every seed."""
    tokens = min(CHAIN_TOKENS, vocab_size - first_id)
    chain = first_id + np.random.default_rng(2024).integers(0, tokens, (vocab_size, SUCCESSORS))
    ids = np.empty((records, seq), np.int64)
    ids[:, 0] = first_id + rng.integers(0, tokens, records)
    choices = rng.integers(0, SUCCESSORS, (records, seq))
    for position in range(1, seq):
        ids[:, position] = chain[ids[:, position - 1], choices[:, position]]
    return ids


def write_records(folder, files, records, vocab_size, seed=12345, seq=SEQ,
                  predictions=PREDICTIONS, learnable=False):
    """`files` record files of `records` records each in Google's format (as data
    preparation writes them, with their metadata): [CLS] A [SEP] B [SEP] filling all `seq`
    tokens, `predictions` masked positions a row; random ids, or with `learnable` the ids of
    a Markov chain (`_markov_ids`) a model can learn. Ids 0-999 are kept for special tokens,
    as in Google's vocabularies. Returns the paths."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    first_id = min(1000, vocab_size // 2)
    paths = []
    for index in range(files):
        ids = (_markov_ids(rng, records, seq, first_id, vocab_size) if learnable
               else rng.integers(first_id, vocab_size, (records, seq)))
        split = rng.integers(seq // 4, 3 * seq // 4, records)
        ids[:, 0] = CLS % vocab_size
        ids[:, -1] = ids[np.arange(records), split] = SEP % vocab_size
        segments = (np.arange(seq)[None, :] > split[:, None]).astype(np.int64)
        order = rng.random((records, seq - 2))  # positions 1..seq-2, the middle [SEP] last
        order[np.arange(records), split - 1] = 2.0
        candidates = np.argsort(order, axis=1)[:, :predictions] + 1
        positions = np.sort(candidates, axis=1)
        features = {
            "input_ids": ids, "input_mask": np.ones((records, seq), np.int64),
            "segment_ids": segments, "masked_lm_positions": positions,
            "masked_lm_ids": np.take_along_axis(ids, positions, axis=1),
            "masked_lm_weights": np.ones((records, predictions), np.float32),
            "next_sentence_labels": rng.integers(0, 2, (records, 1)),
        }
        np.put_along_axis(features["input_ids"], positions, MASK % vocab_size, axis=1)
        path = os.path.join(folder, f"part-{index:05d}.tfrecord")
        with tfrecord_writer.TFRecordFileWriter(path) as writer:
            writer.write_tfrecords(tfrecord_writer.encode_tfrecords(features, FEATURE_KINDS),
                                   records)
        record_metadata.write(path, record_metadata.describe(
            records, seq, predictions, vocab_size,
            "synthetic: a Markov chain's ids" if learnable else "synthetic: random ids"))
        paths.append(path)
    return paths
