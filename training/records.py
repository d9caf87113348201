"""Reading TFRecord examples for training, evaluation and prediction (any feature spec).

Reading is deterministic for a given seed, so each rank's sequence of training batches is a
fixed function of its `TrainingInput`. A resumed run continues that sequence either from a
saved iterator state (`training.input_state`, O(1)) or, when there is none, by rebuilding the
pipeline and skipping the records already consumed (exact but O(records trained)).

Under Horovod each rank reads a disjoint part, chosen explicitly by the caller:
- "files": whole files per rank (needs at least as many files as ranks). Pre-training uses
  only this: every rank reads 1/N of the bytes.
- "records": every rank reads every file and keeps every N-th record. Fine-tuning uses this
  for its single training file (small, so reading it N times costs nothing).
No rank ever sees another rank's examples.

`batch_fn(number, batch)` transforms each batch (pre-training's dynamic masking); `number`
counts the batches of the stream from its start, skipped records included (so it is the same
for a batch whether the pipeline was resumed or not; it is saved with the iterator state).
Bad records (unreadable, unparsable, values out of range) stop the pipeline or, in
training with `skip_bad_records`, are dropped and counted: `resilience.record_guard`.
"""
import dataclasses
import hashlib
import os
from typing import Callable, Optional, Tuple

import tensorflow as tf

from resilience import record_guard

SHARD_BY = ("files", "records")
SHUFFLE_BUFFER = 100
CYCLE_LENGTH = 4
# The structure of the pipeline below, part of the identity of saved input states
# (`training.input_state.stream_id`): a state saved by another structure cannot be restored,
# so a resume across a change skips records instead (exact). 2: checks and casts per batch.
PIPELINE_VERSION = 2


def _checked_model_types(batch, value_ranges):
    """Fails on values outside `value_ranges` (before the cast, which would wrap ids >=
    2**31), then int64 -> int32 (what the model and TPUs/GPUs want). A batch at a time:
    vectorised, it costs nothing measurable; per record it slowed the pipeline by ~25%."""
    batch = record_guard.assert_in_range(batch, value_ranges)
    return {name: tf.cast(value, tf.int32) if value.dtype == tf.int64 else value
            for name, value in batch.items()}


def _file_facts(files, record_counts):
    """(paths, sizes in bytes, record counts or -1) for `record_guard.read_file_tolerantly`."""
    counts = [-1 if count is None else count for count in (record_counts or [None] * len(files))]
    sizes = [tf.io.gfile.stat(path).length for path in files]
    return (tf.constant(files), tf.constant(sizes, tf.int64), tf.constant(counts, tf.int64))


def record_dataset(files, batch_size, spec, is_training, seed=12345, num_shards=1,
                   shard_index=0, shard_by="files", skip_records=0, cycle_length=CYCLE_LENGTH,
                   shuffle_buffer=SHUFFLE_BUFFER, drop_remainder=True, value_ranges=None,
                   skip_bad_records=False, record_counts=None, batch_fn=None):
    """A dataset of feature dicts parsed with `spec`, each value [batch_size, ...].

    Training: files shuffled (seeded), repeated forever, read interleaved from `cycle_length`
    files, records shuffled in a `shuffle_buffer` window, `skip_records` records skipped (the
    resume position of this rank when no saved iterator state exists), batches of exactly
    `batch_size`.
    Evaluation/prediction: files in order, read once (the last batch may be short unless
    `drop_remainder`).
    `shard_by` ("files" or "records", see the module docstring) applies when num_shards > 1;
    "files" with fewer files than shards raises ValueError.
    `batch_fn(number, batch) -> batch`, if given, maps every batch (see the module docstring;
    `skip_records` must then be whole batches).
    `value_ranges` ({feature: (low, high, why)}): a record with a value outside [low, high)
    fails the pipeline, as an unreadable or unparsable one does (`resilience.record_guard`).
    `skip_bad_records` (training only): such records are dropped instead and counted in the
    feature `record_guard.BAD_RECORDS`; `record_counts` (records per file, None where
    unknown) makes the count of a truncated file exact; `skip_records` then counts good
    records.
    """
    if shard_by not in SHARD_BY:
        raise ValueError(f"shard_by must be one of {SHARD_BY}, got {shard_by!r}")
    sharded = num_shards > 1
    if sharded and shard_by == "files" and len(files) < num_shards:
        raise ValueError(f"{len(files)} files cannot be split by file over {num_shards} shards")
    record_sharding = sharded and shard_by == "records"
    tolerant = is_training and skip_bad_records
    dataset = tf.data.Dataset.from_tensor_slices(
        _file_facts(files, record_counts) if tolerant else tf.constant(files))
    if sharded and not record_sharding:
        dataset = dataset.shard(num_shards, shard_index)
    if is_training:
        file_count = len(files[shard_index::num_shards]) if sharded and not record_sharding \
            else len(files)
        dataset = dataset.shuffle(max(file_count, 1), seed=seed, reshuffle_each_iteration=True)
        dataset = dataset.repeat()
        dataset = dataset.interleave(
            record_guard.read_file_tolerantly if tolerant else tf.data.TFRecordDataset,
            cycle_length=max(1, min(cycle_length, file_count)),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    else:
        dataset = tf.data.TFRecordDataset(dataset)
    if record_sharding:
        dataset = dataset.shard(num_shards, shard_index)
    if is_training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed + 1, reshuffle_each_iteration=True)
    if tolerant:  # bad records dropped here, so the skip counts good ones
        dataset = record_guard.drop_bad_records(dataset, spec, value_ranges)
        if skip_records:
            dataset = dataset.skip(skip_records)
    else:
        if is_training and skip_records:
            dataset = dataset.skip(skip_records)
        dataset = dataset.map(lambda record: tf.io.parse_single_example(record, spec),
                              num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder or is_training)
    checked = None if tolerant else value_ranges
    dataset = dataset.map(lambda batch: _checked_model_types(batch, checked),
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if batch_fn is not None:
        if skip_records % batch_size:
            raise ValueError(f"skip_records={skip_records} is not a whole number of batches "
                             f"of {batch_size}")
        dataset = dataset.enumerate(start=skip_records // batch_size if is_training else 0)
        dataset = dataset.map(batch_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def record_input_fn(files, batch_size, spec, is_training, **options):
    """An Estimator input_fn of `record_dataset(files, batch_size, spec, is_training,
    **options)` (features only: the labels are features of the same record)."""

    def input_fn(params=None):
        return record_dataset(files, batch_size, spec, is_training, **options)

    return input_fn


def _files_digest(files):
    """sha256 over the files' base names and sizes: the same data moved to another folder
    keeps its digest, re-generated shards under the same names usually do not."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{os.path.basename(path)}\0{tf.io.gfile.stat(path).length}\n".encode())
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class TrainingInput:
    """One rank's stream of training batches: what `record_dataset` reads, and (`order()`)
    the settings that fix the order of that stream across the job."""
    files: Tuple[str, ...]
    batch_size: int
    spec: dict = dataclasses.field(compare=False, repr=False)
    seed: int = 12345
    num_shards: int = 1
    shard_index: int = 0
    shard_by: str = "files"
    shuffle_buffer: int = SHUFFLE_BUFFER
    cycle_length: int = CYCLE_LENGTH
    value_ranges: Optional[dict] = dataclasses.field(default=None, compare=False, repr=False)
    skip_bad_records: bool = False
    record_counts: Optional[Tuple[Optional[int], ...]] = dataclasses.field(
        default=None, compare=False, repr=False)
    batch_fn: Optional[Callable] = dataclasses.field(default=None, compare=False, repr=False)
    # Settings of `batch_fn` that change the batches (dynamic masking's), as (name, value)
    # pairs: part of `order()`.
    batch_fn_order: Tuple[Tuple[str, object], ...] = ()

    def dataset(self, skip_records=0):
        """The batches, after skipping `skip_records` records of this rank's stream."""
        return record_dataset(list(self.files), self.batch_size, self.spec, True,
                              seed=self.seed, num_shards=self.num_shards,
                              shard_index=self.shard_index, shard_by=self.shard_by,
                              skip_records=skip_records, cycle_length=self.cycle_length,
                              shuffle_buffer=self.shuffle_buffer,
                              value_ranges=self.value_ranges,
                              skip_bad_records=self.skip_bad_records,
                              record_counts=self.record_counts, batch_fn=self.batch_fn)

    def rank_files(self):
        """The files this rank reads (all of them when sharding by records)."""
        if self.num_shards > 1 and self.shard_by == "files":
            return self.files[self.shard_index::self.num_shards]
        return self.files

    def order(self):
        """The job-wide settings a resumed run must share for a data position (micro-batches
        consumed per rank) to mean the same records (JSON-able). Skipping bad records
        changes the stream, so it is part of the order when on (and absent when off, as in
        folders written before the option existed); so are `batch_fn_order`'s settings."""
        order = {"ranks": self.num_shards, "train_batch_size": self.batch_size,
                 "seed": self.seed, "shuffle_buffer": self.shuffle_buffer,
                 "cycle_length": self.cycle_length, "shard_by": self.shard_by,
                 "input_files": len(self.files), "input_files_sha256": _files_digest(self.files)}
        if self.skip_bad_records:
            order["skip_bad_records"] = True
        order.update(self.batch_fn_order)
        return order
