"""Sequence packing: several whole pre-training instances in one `max_seq_length` row.

Why: Google's instances are cut to a target length per document, so the last instance of
every document is short; at sequence length 512 on Wikipedia about 29% of every row is
padding, compute a GPU spends for nothing (Krell et al. 2021, "Efficient Sequence Packing
without Cross-contamination"). Packing puts whole instances (`[CLS] A [SEP] B [SEP]`, each
unchanged) side by side; the model keeps them apart (`modeling.PackedRows`: attention
inside each instance, positions restarting at each `[CLS]`, one next-sentence prediction
per instance), so a packed batch trains exactly like the same instances unpacked.

Packing happens at data creation, not in the input pipeline: the assignment is a bin-packing
problem over many instances (best-fit decreasing here, over each batch of a few thousand
instances), which is cheap once in NumPy and awkward per batch in `tf.data`; the records
then hold fixed-shape rows, so reading, resume and Horovod sharding are unchanged.

Row layout (`pack_features`), k = `max_sequences_per_row`:
  input_ids, input_mask, segment_ids, instance_ids, position_ids   [rows, max_seq_length]
  masked_lm_positions, masked_lm_ids, masked_lm_weights             [rows, max_predictions]
      (static masking only: each instance's predictions, shifted to its place in the row)
  next_sentence_positions, next_sentence_labels, next_sentence_weights   [rows, k]
`instance_ids` is 1..k for the tokens of the row's instances and 0 for padding.
Any other per-token feature (the `word_starts` of dynamic-masking records) is packed like
`input_ids`; any other per-instance feature (`masking_vocab`, the same for every instance)
is taken from the row's first instance.
"""
import bisect
from typing import Dict, List, Optional

import numpy as np

from data_prep.instances import tfrecord_writer

# Features that hold one value per token, per masked-LM prediction, per instance.
TOKEN_FEATURES = ("input_ids", "input_mask", "segment_ids")
PREDICTION_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
PACKED_TOKEN_FEATURES = ("instance_ids", "position_ids")
INSTANCE_FEATURES = ("next_sentence_positions", "next_sentence_labels",
                     "next_sentence_weights")


def packed_kinds(kinds: Dict[str, str]) -> Dict[str, str]:
    """The record feature kinds (`tfrecord_writer.INT64`/`FLOAT`) of packed rows of
    instances whose features have `kinds`."""
    out = dict(kinds)
    out.update({name: tfrecord_writer.INT64 for name in PACKED_TOKEN_FEATURES})
    out.update(next_sentence_positions=tfrecord_writer.INT64,
               next_sentence_labels=tfrecord_writer.INT64,
               next_sentence_weights=tfrecord_writer.FLOAT)
    return out


def best_fit_decreasing(lengths: np.ndarray, capacity: int, max_per_row: int,
                        predictions: Optional[np.ndarray] = None,
                        max_predictions: Optional[int] = None) -> List[List[int]]:
    """Groups instance indices into rows: each row's lengths sum to at most `capacity`, at
    most `max_per_row` instances, and (when given) predictions summing to at most
    `max_predictions`. Longest instances are placed first, each into the open row it fills
    most tightly (ties: the row opened first), a new row when none fits. Deterministic.

    lengths, predictions: [n] int. Returns rows as lists of indices, in order of opening.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and (lengths.min() < 1 or lengths.max() > capacity):
        raise ValueError(f"instance lengths must be within 1..{capacity}")
    if predictions is None:
        predictions = np.zeros_like(lengths)
        max_predictions = 0
    rows: List[List[int]] = []
    row_predictions: List[int] = []
    # open_rows[free] = rows (by index, opening order) with `free` tokens left and room for
    # one more instance: the tightest fit is the smallest free >= length with a usable row.
    open_rows: List[List[int]] = [[] for _ in range(capacity + 1)]
    free_of_row: List[int] = []
    for index in np.argsort(-lengths, kind="stable").tolist():
        length, preds = int(lengths[index]), int(predictions[index])
        chosen = None
        for free in range(length, capacity + 1):
            for candidate in open_rows[free]:
                if row_predictions[candidate] + preds <= max_predictions:
                    chosen = candidate
                    break
            if chosen is not None:
                open_rows[free].remove(chosen)
                break
        if chosen is None:
            chosen = len(rows)
            rows.append([])
            row_predictions.append(0)
            free_of_row.append(capacity)
        rows[chosen].append(index)
        row_predictions[chosen] += preds
        free_of_row[chosen] -= length
        if len(rows[chosen]) < max_per_row and free_of_row[chosen] > 0:
            bisect.insort(open_rows[free_of_row[chosen]], chosen)
    return rows


def pack_features(features: Dict[str, np.ndarray], rows: List[List[int]],
                  max_sequences_per_row: int) -> Dict[str, np.ndarray]:
    """Builds packed rows (layout in the module docstring) from unpacked instances.

    features: Google's per-instance arrays ([n, max_seq_length] token features,
    [n, max_predictions] masked-LM features when masked statically, [n, 1]
    `next_sentence_labels`), plus any other [n, max_seq_length] token feature (e.g. the word
    starts of dynamically masked records), which is packed like `input_ids`.
    rows: instance indices per row (`best_fit_decreasing`).
    """
    input_mask = features["input_mask"]
    n, seq_length = input_mask.shape
    lengths = input_mask.sum(axis=1).astype(np.int64)
    token_names = [name for name, value in features.items()
                   if name not in PREDICTION_FEATURES and value.ndim == 2
                   and value.shape[1] == seq_length]
    row_constant = [name for name in features if name not in token_names
                    and name not in PREDICTION_FEATURES and name != "next_sentence_labels"]
    n_rows, k = len(rows), max_sequences_per_row
    out = {name: np.zeros((n_rows, seq_length), features[name].dtype) for name in token_names}
    for name in row_constant:
        out[name] = np.asarray(features[name])[[members[0] for members in rows]]
    out["instance_ids"] = np.zeros((n_rows, seq_length), np.int8)
    out["position_ids"] = np.zeros((n_rows, seq_length), np.int32)
    out["next_sentence_positions"] = np.zeros((n_rows, k), np.int32)
    out["next_sentence_labels"] = np.zeros((n_rows, k), features["next_sentence_labels"].dtype)
    out["next_sentence_weights"] = np.zeros((n_rows, k), np.float32)
    static = "masked_lm_positions" in features
    if static:
        n_pred = features["masked_lm_positions"].shape[1]
        for name in PREDICTION_FEATURES:
            out[name] = np.zeros((n_rows, n_pred), features[name].dtype)
        pred_counts = (features["masked_lm_weights"] > 0).sum(axis=1)
    for r, members in enumerate(rows):
        if len(members) > k:
            raise ValueError(f"row {r} holds {len(members)} instances, more than {k}")
        start = pred_start = 0
        for slot, i in enumerate(members):
            length = int(lengths[i])
            end = start + length
            for name in token_names:
                out[name][r, start:end] = features[name][i, :length]
            out["instance_ids"][r, start:end] = slot + 1
            out["position_ids"][r, start:end] = np.arange(length)
            out["next_sentence_positions"][r, slot] = start
            out["next_sentence_labels"][r, slot] = features["next_sentence_labels"][i, 0]
            out["next_sentence_weights"][r, slot] = 1.0
            if static:
                count = int(pred_counts[i])
                pred_end = pred_start + count
                if pred_end > n_pred:
                    raise ValueError(f"row {r} needs {pred_end} predictions, more than "
                                     f"{n_pred}")
                out["masked_lm_positions"][r, pred_start:pred_end] = \
                    features["masked_lm_positions"][i, :count] + start
                out["masked_lm_ids"][r, pred_start:pred_end] = features["masked_lm_ids"][i, :count]
                out["masked_lm_weights"][r, pred_start:pred_end] = 1.0
                pred_start = pred_end
            start = end
    return out


def pack_instances(features: Dict[str, np.ndarray], max_sequences_per_row: int,
                   rng: Optional[np.random.Generator] = None) -> Dict[str, np.ndarray]:
    """Packs a batch of instances (best-fit decreasing) and, with `rng`, shuffles the rows:
    packing groups instances by length, which the reader's small shuffle buffer would
    otherwise pass on to the training batches."""
    lengths = features["input_mask"].sum(axis=1)
    seq_length = features["input_mask"].shape[1]
    predictions = max_predictions = None
    if "masked_lm_weights" in features:
        predictions = (features["masked_lm_weights"] > 0).sum(axis=1)
        max_predictions = features["masked_lm_weights"].shape[1]
    rows = best_fit_decreasing(lengths, seq_length, max_sequences_per_row, predictions,
                               max_predictions)
    if rng is not None:
        rows = [rows[i] for i in rng.permutation(len(rows))]
    return pack_features(features, rows, max_sequences_per_row)


def padding_fraction(input_mask: np.ndarray) -> float:
    """Share of the token slots of `input_mask` [rows, seq] that are padding."""
    return 1.0 - float(np.asarray(input_mask).sum()) / max(np.asarray(input_mask).size, 1)
