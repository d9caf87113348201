"""The pre-training `input_fn`: TFRecords of masked-LM + next-sentence examples to batches.

Records are those of Google's `create_pretraining_data.py` (ours writes the same): the
feature names, types and lengths below; or unmasked records (`--masking=dynamic`), which
this pipeline masks at every read (`pretraining.dynamic_masking`); `pretraining.record_kinds`
tells the two apart. The reading itself (deterministic order, exact resume, per-rank
sharding) is `training.records`, shared with fine-tuning.

The records' metadata (`data_prep.instances.record_metadata`: `<folder>.meta/<records>.meta.json`,
or `<records>.meta.json` beside them as written earlier) is never input;
`pretraining.record_checks` reads it.

Under Horovod, pre-training shards by whole files only: with fewer files than ranks it
refuses to start (InputError) instead of having every rank read every file and keep 1/N of
the records, which multiplies the I/O by the number of ranks without saying so.
"""
import os

import tensorflow as tf
from absl import logging

from data_prep.instances.record_metadata import is_metadata_name
from pretraining.dynamic_masking import EVAL_SEED, stream_key, unmasked_feature_spec
from pretraining.input_errors import InputError
from training.records import TrainingInput, record_dataset, record_input_fn



def packed_feature_spec(max_seq_length, sequences_per_row):
    """The features packed rows add (`data_prep.instances.packing`); `next_sentence_labels` becomes
    one per instance slot."""
    sequence = tf.io.FixedLenFeature([max_seq_length], tf.int64)
    slots = tf.io.FixedLenFeature([sequences_per_row], tf.int64)
    return {"instance_ids": sequence, "position_ids": sequence,
            "next_sentence_positions": slots, "next_sentence_labels": slots,
            "next_sentence_weights": tf.io.FixedLenFeature([sequences_per_row], tf.float32)}


def feature_spec(max_seq_length, max_predictions_per_seq):
    """Google's `name_to_features` for pre-training records."""
    return {
        "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def value_ranges(vocab_size, type_vocab_size, max_seq_length):
    """{feature: (low, high, why)}: the values the model can take. A token id >= vocab_size
    fails the embedding lookup on a CPU and reads zeros on a GPU; the input pipeline checks
    them instead (`resilience.record_guard`)."""
    vocab = "the config's vocab_size"
    return {"input_ids": (0, vocab_size, vocab), "masked_lm_ids": (0, vocab_size, vocab),
            "segment_ids": (0, type_vocab_size, "the config's type_vocab_size"),
            "masked_lm_positions": (0, max_seq_length, "--max_seq_length"),
            "input_mask": (0, 2, "a mask is 0 or 1"),
            "next_sentence_labels": (0, 2, "a label is 0 or 1"),
            # packed rows (data_prep.instances.packing)
            "position_ids": (0, max_seq_length, "--max_seq_length"),
            "next_sentence_positions": (0, max_seq_length, "--max_seq_length")}


def _is_input_name(name):
    """Hidden files, writers' unfinished outputs (`*.tmp*`, e.g. the `<file>.tmp-<pid>` a
    killed create_pretraining_data.py leaves) and the records' metadata files are never
    input, however they were named."""
    return not name.startswith(".") and ".tmp" not in name and not is_metadata_name(name)


def list_input_files(path_or_glob):
    """Files of a directory (sorted), or of a glob/comma-separated list, hidden and temporary
    ones left out (`_is_input_name`). Raises InputError when nothing is left.

    A folder's subfolders are not read, as NVIDIA's run_pretraining.py reads
    `glob(<dir>/*)` (a subfolder there fails as a file), but one holding input files is
    said in a warning line (`_warn_unread_subfolder`): it used to be skipped without a word,
    training on part of the data the user meant."""
    found = []
    for part in str(path_or_glob).split(","):
        part = part.strip()
        if not part:
            continue
        if tf.io.gfile.isdir(part):
            names = sorted(tf.io.gfile.listdir(part))
            for name in names:
                path = os.path.join(part, name.rstrip("/"))
                if tf.io.gfile.isdir(path):
                    _warn_unread_subfolder(path, path_or_glob)
                else:
                    found.append(path)
        else:  # folders a glob matches (training/, training.meta/ ...) are not files
            found.extend(path for path in sorted(tf.io.gfile.glob(part))
                         if not tf.io.gfile.isdir(path))
    files = [path for path in found if _is_input_name(os.path.basename(path))]
    if not files:
        ignored = f" ({len(found)} hidden or temporary ignored)" if found else ""
        raise InputError(f"{path_or_glob}: no input files{ignored}")
    return files


def _warn_unread_subfolder(folder, given):
    """One warning line for a subfolder of an input folder that holds input files (at any
    depth, hidden folders left out): how many, and how to read them (`given`: the flag's
    value)."""
    if not _is_input_name(os.path.basename(folder)):
        return  # hidden (.git) or a writer's temporary folder
    count = 0
    for root, _, names in tf.io.gfile.walk(folder):
        if any(part.startswith(".") for part in os.path.relpath(root, folder).split(os.sep)
               if part != "."):
            continue
        count += sum(1 for name in names if _is_input_name(name))
    if count:
        logging.warning("%s: a subfolder holding %d input file%s, not read (only the files "
                        "directly in the folder are, as NVIDIA's run_pretraining.py reads "
                        "them); to read them too, add it after a comma: %s,%s",
                        folder, count, "s" * (count != 1), given, folder)


def check_file_sharding(files, ranks):
    """Each rank reads whole files: refuses (InputError) fewer files than ranks."""
    if len(files) < ranks:
        raise InputError(
            f"{len(files)} training input file{'s' * (len(files) != 1)} for {ranks} ranks: "
            "each rank reads whole files, so there must be at least one per rank; re-shard "
            "with `bertPrep.py --action sharding --n_training_shards=K` (K a multiple of "
            f"{ranks})")


def check_rank_records(files, record_counts, ranks):
    """Refuses (InputError naming the files) a rank whose files are all empty: it would read
    nothing and the others would wait for it in their first allreduce, forever, since the
    training stream repeats (an empty stream repeats without end)."""
    for rank in range(ranks):
        counts = record_counts[rank::ranks]
        if counts and all(count == 0 for count in counts):
            names = ", ".join(files[rank::ranks][:3])
            raise InputError(f"{names}: empty, and rank {rank} of {ranks} reads nothing else: "
                             "remove the empty file(s) or re-shard")


def reading_spec(max_seq_length, max_predictions_per_seq, dynamic, sequences_per_row=0):
    """The parsing spec of records of one kind (`dynamic`: unmasked records), packed
    `sequences_per_row` a row when not 0."""
    packed = packed_feature_spec(max_seq_length, sequences_per_row) if sequences_per_row \
        else {}
    base = (unmasked_feature_spec(max_seq_length) if dynamic
            else feature_spec(max_seq_length, max_predictions_per_seq))
    return {**base, **packed}


def _reading(max_seq_length, max_predictions_per_seq, masking, is_training, seed=12345,
             shard_index=0, sequences_per_row=0, **_):
    """(spec, batch_fn): how to parse and finish batches of static records (masking None)
    or dynamic-masking ones (masking: a `DynamicMasking`; training draws from the stream of
    (seed, rank = shard_index), evaluation from the fixed EVAL_SEED), packed
    `sequences_per_row` a row when not 0. Takes the options of `record_dataset` (the seed
    default is its)."""
    spec = reading_spec(max_seq_length, max_predictions_per_seq, masking is not None,
                        sequences_per_row)
    if masking is None:
        return spec, None
    key = (stream_key(seed, shard_index, "train") if is_training
           else stream_key(EVAL_SEED, 0, "eval"))
    return spec, masking.batch_fn(key)


def training_input(files, batch_size, max_seq_length, max_predictions_per_seq, seed, ranks,
                   rank, shuffle_buffer, masking=None, sequences_per_row=0, ranges=None,
                   skip_bad_records=False, record_counts=None):
    """This rank's pre-training stream (`training.records.TrainingInput`), whole files per
    rank; raises InputError when there are fewer files than ranks. `masking`: a
    `DynamicMasking` for dynamic-masking records, None for static ones;
    `sequences_per_row`: k of packed records, 0 for unpacked ones; `ranges`
    (`value_ranges`), `skip_bad_records` and `record_counts`: see
    `training.records.record_dataset`."""
    check_file_sharding(files, ranks)
    spec, batch_fn = _reading(max_seq_length, max_predictions_per_seq, masking, True, seed,
                              rank, sequences_per_row)
    return TrainingInput(tuple(files), batch_size, spec, seed=seed, num_shards=ranks,
                         shard_index=rank, shard_by="files", shuffle_buffer=shuffle_buffer,
                         batch_fn=batch_fn, value_ranges=ranges,
                         batch_fn_order=tuple(masking.order().items()) if masking else (),
                         skip_bad_records=skip_bad_records,
                         record_counts=tuple(record_counts) if record_counts else None)


def make_dataset(files, batch_size, max_seq_length, max_predictions_per_seq, is_training,
                 masking=None, sequences_per_row=0, **options):
    """Pre-training batches; see `training.records.record_dataset` for `options` (sharding is
    by whole files: InputError with fewer files than `num_shards`) and `training_input` for
    `masking`."""
    check_file_sharding(files, options.get("num_shards", 1))
    spec, batch_fn = _reading(max_seq_length, max_predictions_per_seq, masking, is_training,
                              sequences_per_row=sequences_per_row, **options)
    return record_dataset(files, batch_size, spec, is_training, shard_by="files",
                          batch_fn=batch_fn, **options)


def make_input_fn(files, batch_size, max_seq_length, max_predictions_per_seq, is_training,
                  masking=None, sequences_per_row=0, **options):
    """Estimator input_fn of pre-training records; see `training.records.record_input_fn`
    and `training_input` for `masking` and `sequences_per_row`."""
    spec, batch_fn = _reading(max_seq_length, max_predictions_per_seq, masking, is_training,
                              sequences_per_row=sequences_per_row, **options)
    return record_input_fn(files, batch_size, spec, is_training, batch_fn=batch_fn, **options)
