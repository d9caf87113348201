"""The pre-training `input_fn`: TFRecords of masked-LM + next-sentence examples to batches.

Records are those of Google's `create_pretraining_data.py` (ours writes the same): the
feature names, types and lengths below; or unmasked records (`--masking=dynamic`), which
this pipeline masks at every read (`pretraining.dynamic_masking`); `pretraining.record_kinds`
tells the two apart. The reading itself (deterministic order, exact resume, per-rank
sharding) is `training.records`, shared with fine-tuning.

Under Horovod, pre-training shards by whole files only: with fewer files than ranks it
refuses to start (InputError) instead of having every rank read every file and keep 1/N of
the records, which multiplies the I/O by the number of ranks without saying so.
"""
import os

import tensorflow as tf

from pretraining import record_kinds
from pretraining.dynamic_masking import EVAL_SEED, stream_key, unmasked_feature_spec
from pretraining.input_errors import InputError
from training.records import TrainingInput, record_dataset, record_input_fn

tf1 = tf.compat.v1


def packed_feature_spec(max_seq_length, sequences_per_row):
    """The features packed rows add (`data_prep.packing`); `next_sentence_labels` becomes
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


def _is_input_name(name):
    """Hidden files and writers' unfinished outputs (`*.tmp*`, e.g. the `<file>.tmp-<pid>` a
    killed create_pretraining_data.py leaves) are never input, however they were named."""
    return not name.startswith(".") and ".tmp" not in name


def list_input_files(path_or_glob):
    """Files of a directory (sorted), or of a glob/comma-separated list, hidden and temporary
    ones left out (`_is_input_name`). Raises InputError when nothing is left."""
    found = []
    for part in str(path_or_glob).split(","):
        part = part.strip()
        if not part:
            continue
        if tf.io.gfile.isdir(part):
            names = sorted(tf.io.gfile.listdir(part))
            found.extend(os.path.join(part, n) for n in names
                         if not tf.io.gfile.isdir(os.path.join(part, n)))
        else:
            found.extend(sorted(tf.io.gfile.glob(part)))
    files = [path for path in found if _is_input_name(os.path.basename(path))]
    if not files:
        ignored = f" ({len(found)} hidden or temporary ignored)" if found else ""
        raise InputError(f"{path_or_glob}: no input files{ignored}")
    return files


def _first_record(path):
    try:
        for record in tf1.io.tf_record_iterator(path):
            return record
    except tf.errors.OpError as err:
        raise InputError(f"{path}: not a readable TFRecord file ({err.message.splitlines()[0]})") from None
    return None


def check_records_match(files, max_seq_length, max_predictions_per_seq, vocab_size=None,
                        dynamic_flags=()):
    """Reads the first record of every non-empty file and checks them against each other and
    the flags (`record_kinds.check_kinds`), so a phase-2 run pointed at phase-1 data, or a
    folder mixing static and dynamic-masking records, fails at start-up in one line.
    Returns the first file's `record_kinds.RecordFacts` (kind STATIC or DYNAMIC, and
    `sequences_per_row` of packed records), which every file shares."""
    facts = []
    for path in files:
        record = _first_record(path)
        if record is not None:
            facts.append(record_kinds.record_facts(path, tf.train.Example.FromString(record)))
    if not facts:
        raise InputError(f"{files[0]}: input files hold no records")
    return record_kinds.check_kinds(facts, max_seq_length, max_predictions_per_seq,
                                    vocab_size, dynamic_flags)


def check_file_sharding(files, ranks):
    """Each rank reads whole files: refuses (InputError) fewer files than ranks."""
    if len(files) < ranks:
        raise InputError(
            f"{len(files)} training input file{'s' * (len(files) != 1)} for {ranks} ranks: "
            "each rank reads whole files, so there must be at least one per rank; re-shard "
            "with `bertPrep.py --action sharding --n_training_shards=K` (K a multiple of "
            f"{ranks})")


def _reading(max_seq_length, max_predictions_per_seq, masking, is_training, seed=12345,
             shard_index=0, sequences_per_row=0, **_):
    """(spec, batch_fn): how to parse and finish batches of static records (masking None)
    or dynamic-masking ones (masking: a `DynamicMasking`; training draws from the stream of
    (seed, rank = shard_index), evaluation from the fixed EVAL_SEED), packed
    `sequences_per_row` a row when not 0. Takes the options of `record_dataset` (the seed
    default is its)."""
    packed = packed_feature_spec(max_seq_length, sequences_per_row) if sequences_per_row \
        else {}
    if masking is None:
        return {**feature_spec(max_seq_length, max_predictions_per_seq), **packed}, None
    key = (stream_key(seed, shard_index, "train") if is_training
           else stream_key(EVAL_SEED, 0, "eval"))
    return {**unmasked_feature_spec(max_seq_length), **packed}, masking.batch_fn(key)


def training_input(files, batch_size, max_seq_length, max_predictions_per_seq, seed, ranks,
                   rank, shuffle_buffer, masking=None, sequences_per_row=0):
    """This rank's pre-training stream (`training.records.TrainingInput`), whole files per
    rank; raises InputError when there are fewer files than ranks. `masking`: a
    `DynamicMasking` for dynamic-masking records, None for static ones;
    `sequences_per_row`: k of packed records, 0 for unpacked ones."""
    check_file_sharding(files, ranks)
    spec, batch_fn = _reading(max_seq_length, max_predictions_per_seq, masking, True, seed,
                              rank, sequences_per_row)
    return TrainingInput(tuple(files), batch_size, spec, seed=seed, num_shards=ranks,
                         shard_index=rank, shard_by="files", shuffle_buffer=shuffle_buffer,
                         batch_fn=batch_fn)


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
