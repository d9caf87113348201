"""The pre-training `input_fn`: TFRecords of masked-LM + next-sentence examples to batches.

Records are those of Google's `create_pretraining_data.py` (ours writes the same): the
feature names, types and lengths below. Reading is deterministic for a given seed, which is
what makes an interrupted run resumable to the exact example: the pipeline is rebuilt with
the same seed and the records already consumed are skipped before parsing (cheap: no
decoding), so a resumed run never trains twice on an example nor skips one.

Under Horovod each rank reads a disjoint part: whole files when there are at least as many
files as ranks, otherwise every rank reads all files and keeps every N-th record
(record-level sharding). No rank ever sees another rank's examples.
"""
import os

import tensorflow as tf

tf1 = tf.compat.v1


class InputError(ValueError):
    """Input files missing, unreadable, or not matching the model's flags."""


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


def list_input_files(path_or_glob):
    """Files of a directory (sorted, hidden and temporary ones left out), or of a glob/
    comma-separated list. Raises InputError when nothing matches."""
    files = []
    for part in str(path_or_glob).split(","):
        part = part.strip()
        if not part:
            continue
        if tf.io.gfile.isdir(part):
            names = sorted(tf.io.gfile.listdir(part))
            files.extend(os.path.join(part, n) for n in names
                         if not n.startswith(".") and ".tmp" not in n
                         and not tf.io.gfile.isdir(os.path.join(part, n)))
        else:
            files.extend(sorted(tf.io.gfile.glob(part)))
    if not files:
        raise InputError(f"{path_or_glob}: no input files")
    return files


def _first_record(path):
    try:
        for record in tf1.io.tf_record_iterator(path):
            return record
    except tf.errors.OpError as err:
        raise InputError(f"{path}: not a readable TFRecord file ({err.message.splitlines()[0]})") from None
    return None


def check_records_match(files, max_seq_length, max_predictions_per_seq):
    """Reads the first record of the first non-empty file and checks its lengths against the
    flags, so a phase-2 run pointed at phase-1 data fails at start-up in one line."""
    for path in files:
        record = _first_record(path)
        if record is None:
            continue
        example = tf.train.Example.FromString(record)
        features = example.features.feature
        missing = [name for name in feature_spec(1, 1) if name not in features]
        if missing:
            raise InputError(f"{path}: not a pre-training record (no feature {missing[0]!r})")
        seq = len(features["input_ids"].int64_list.value)
        predictions = len(features["masked_lm_positions"].int64_list.value)
        if seq != max_seq_length:
            raise InputError(f"{path}: records have sequence length {seq} but "
                             f"--max_seq_length={max_seq_length}")
        if predictions != max_predictions_per_seq:
            raise InputError(f"{path}: records have {predictions} masked-LM predictions but "
                             f"--max_predictions_per_seq={max_predictions_per_seq}")
        return
    raise InputError(f"{files[0]}: input files hold no records")


def _decode(record, spec):
    """Parses one record; int64 -> int32 (what the model and TPUs/GPUs want)."""
    example = tf.io.parse_single_example(record, spec)
    return {name: tf.cast(value, tf.int32) if value.dtype == tf.int64 else value
            for name, value in example.items()}


def make_dataset(files, batch_size, max_seq_length, max_predictions_per_seq, is_training,
                 seed=12345, num_shards=1, shard_index=0, skip_records=0, cycle_length=4,
                 shuffle_buffer=100):
    """A dataset of feature dicts, each value [batch_size, ...].

    Training: files shuffled (seeded), repeated forever, read interleaved from `cycle_length`
    files, records shuffled in a `shuffle_buffer` window, `skip_records` records skipped (the
    resume position of this rank), batches of exactly `batch_size`.
    Evaluation: files in order, read once, batches of exactly `batch_size`.
    """
    spec = feature_spec(max_seq_length, max_predictions_per_seq)
    record_sharding = num_shards > 1 and len(files) < num_shards
    dataset = tf.data.Dataset.from_tensor_slices(tf.constant(files))
    if num_shards > 1 and not record_sharding:
        dataset = dataset.shard(num_shards, shard_index)
    if is_training:
        file_count = len(files) if record_sharding or num_shards == 1 else \
            len(files[shard_index::num_shards])
        dataset = dataset.shuffle(max(file_count, 1), seed=seed, reshuffle_each_iteration=True)
        dataset = dataset.repeat()
        dataset = dataset.interleave(tf.data.TFRecordDataset,
                                     cycle_length=max(1, min(cycle_length, file_count)),
                                     num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    else:
        dataset = tf.data.TFRecordDataset(dataset)
    if record_sharding:
        dataset = dataset.shard(num_shards, shard_index)
    if is_training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed + 1, reshuffle_each_iteration=True)
        if skip_records:
            dataset = dataset.skip(skip_records)
    dataset = dataset.map(lambda record: _decode(record, spec),
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def make_input_fn(files, batch_size, max_seq_length, max_predictions_per_seq, is_training,
                  **kwargs):
    """An Estimator input_fn (features only: the labels are features of the same record).

    `kwargs` may carry a callable `skip_records_fn` evaluated when the input_fn runs (i.e.
    after the Estimator found its checkpoint), returning how many records to skip.
    """
    skip_records_fn = kwargs.pop("skip_records_fn", None)

    def input_fn(params=None):
        skip = skip_records_fn() if skip_records_fn else kwargs.get("skip_records", 0)
        options = dict(kwargs, skip_records=skip)
        return make_dataset(files, batch_size, max_seq_length, max_predictions_per_seq,
                            is_training, **options)

    return input_fn
