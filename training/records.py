"""Reading TFRecord examples for training, evaluation and prediction (any feature spec).

Reading is deterministic for a given seed, which is what makes an interrupted run resumable
to the exact example: the pipeline is rebuilt with the same seed and the records already
consumed are skipped before parsing (cheap: no decoding), so a resumed run never trains twice
on an example nor skips one.

Under Horovod each rank reads a disjoint part: whole files when there are at least as many
files as ranks, otherwise every rank reads all files and keeps every N-th record
(record-level sharding). No rank ever sees another rank's examples.
"""
import tensorflow as tf


def _decode(record, spec):
    """Parses one record; int64 -> int32 (what the model and TPUs/GPUs want)."""
    example = tf.io.parse_single_example(record, spec)
    return {name: tf.cast(value, tf.int32) if value.dtype == tf.int64 else value
            for name, value in example.items()}


def record_dataset(files, batch_size, spec, is_training, seed=12345, num_shards=1,
                   shard_index=0, skip_records=0, cycle_length=4, shuffle_buffer=100,
                   drop_remainder=True):
    """A dataset of feature dicts parsed with `spec`, each value [batch_size, ...].

    Training: files shuffled (seeded), repeated forever, read interleaved from `cycle_length`
    files, records shuffled in a `shuffle_buffer` window, `skip_records` records skipped (the
    resume position of this rank), batches of exactly `batch_size`.
    Evaluation/prediction: files in order, read once (the last batch may be short unless
    `drop_remainder`).
    """
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
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder or is_training)
    return dataset.prefetch(tf.data.AUTOTUNE)


def record_input_fn(files, batch_size, spec, is_training, **kwargs):
    """An Estimator input_fn (features only: the labels are features of the same record).

    `kwargs` may carry a callable `skip_records_fn` evaluated when the input_fn runs (i.e.
    after the Estimator found its checkpoint), returning how many records to skip.
    """
    skip_records_fn = kwargs.pop("skip_records_fn", None)

    def input_fn(params=None):
        skip = skip_records_fn() if skip_records_fn else kwargs.get("skip_records", 0)
        options = dict(kwargs, skip_records=skip)
        return record_dataset(files, batch_size, spec, is_training, **options)

    return input_fn
