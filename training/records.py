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
"""
import dataclasses
import hashlib
import os
from typing import Callable, Optional, Tuple

import tensorflow as tf

SHARD_BY = ("files", "records")
SHUFFLE_BUFFER = 100
CYCLE_LENGTH = 4


def _decode(record, spec):
    """Parses one record; int64 -> int32 (what the model and TPUs/GPUs want)."""
    example = tf.io.parse_single_example(record, spec)
    return {name: tf.cast(value, tf.int32) if value.dtype == tf.int64 else value
            for name, value in example.items()}


def record_dataset(files, batch_size, spec, is_training, seed=12345, num_shards=1,
                   shard_index=0, shard_by="files", skip_records=0, cycle_length=CYCLE_LENGTH,
                   shuffle_buffer=SHUFFLE_BUFFER, drop_remainder=True, batch_fn=None):
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
    """
    if shard_by not in SHARD_BY:
        raise ValueError(f"shard_by must be one of {SHARD_BY}, got {shard_by!r}")
    sharded = num_shards > 1
    if sharded and shard_by == "files" and len(files) < num_shards:
        raise ValueError(f"{len(files)} files cannot be split by file over {num_shards} shards")
    record_sharding = sharded and shard_by == "records"
    dataset = tf.data.Dataset.from_tensor_slices(tf.constant(files))
    if sharded and not record_sharding:
        dataset = dataset.shard(num_shards, shard_index)
    if is_training:
        file_count = len(files[shard_index::num_shards]) if sharded and not record_sharding \
            else len(files)
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
    batch_fn: Optional[Callable] = dataclasses.field(default=None, compare=False, repr=False)

    def dataset(self, skip_records=0):
        """The batches, after skipping `skip_records` records of this rank's stream."""
        return record_dataset(list(self.files), self.batch_size, self.spec, True,
                              seed=self.seed, num_shards=self.num_shards,
                              shard_index=self.shard_index, shard_by=self.shard_by,
                              skip_records=skip_records, cycle_length=self.cycle_length,
                              shuffle_buffer=self.shuffle_buffer, batch_fn=self.batch_fn)

    def order(self):
        """The job-wide settings a resumed run must share for a data position (micro-batches
        consumed per rank) to mean the same records (JSON-able)."""
        return {"ranks": self.num_shards, "train_batch_size": self.batch_size,
                "seed": self.seed, "shuffle_buffer": self.shuffle_buffer,
                "cycle_length": self.cycle_length, "shard_by": self.shard_by,
                "input_files": len(self.files), "input_files_sha256": _files_digest(self.files)}
