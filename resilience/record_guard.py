"""Keeps bad records out of training: stop at the first one (default), or skip and count them.

A bad record is one that cannot be read (corrupt or truncated framing), cannot be parsed
with the feature spec (missing feature, another length), or holds a value outside the range
the model can take (`value_ranges`, e.g. token ids >= the config's vocab_size). The value
check matters on GPUs: there an embedding lookup with an out-of-range id silently returns
zeros instead of failing, so it is checked here, on the CPU, in the input pipeline.

Strict mode (`assert_in_range`, on each batch: vectorised, as fast as no check): an
out-of-range record fails the input pipeline, like a corrupt or unparsable one;
`resilience.failures` then names the file and record.

Tolerant mode (`read_file_tolerantly` + `drop_bad_records`, pre-training's
--skip_bad_records): bad records are dropped and counted, and the running count travels
with every record as feature `BAD_RECORDS` (taken out of the features by
`BadRecordLimitHook.input_fn`, which logs it and stops the run over a bound). What is counted:
- a record that does not parse or fails the value check: 1 each, exactly (records are
  numbered before the parse; a parse failure dropped by `ignore_errors` leaves a gap in the
  numbers, and the gaps are counted);
- unreadable framing (a corrupt length or checksum, a truncated file): TFRecord has no
  resynchronisation point, so the rest of that file is lost. Each file's reader ends with a
  marker that compares the bytes read with the file's size: a file read short counts its
  missing records exactly when its metadata gives its record count, else as 1.
The count is state of the tf.data pipeline (`scan`), so it is saved and restored with the
input state of each rank (`training.input_state`) and recounted identically when a resume
rebuilds the pipeline and skips records; ranks' counts are summed for the bound, in the
session runs that close an accumulation window only (`resilience.window_boundaries`: a sum
over ranks every micro-batch would make each one a synchronisation point).
"""
import tensorflow as tf
from absl import logging

from resilience.window_boundaries import WindowFollower

tf1 = tf.compat.v1

BAD_RECORDS = "bad_records_skipped"
_FRAMING_BYTES = 16  # length (8) + its checksum (4) + the data's checksum (4)
_IS_RECORD = -1      # the "lost" tag of a real record; end-of-file markers carry >= 0


def in_range(features, value_ranges):
    """Whether every value of `features[name]` lies in [low, high) for each
    `value_ranges[name] = (low, high, why)` of a feature they have (one scalar bool, for a
    record or a batch; records of another kind may lack some features)."""
    checks = [tf.reduce_all((features[name] >= low) & (features[name] < high))
              for name, (low, high, _) in sorted(value_ranges.items()) if name in features]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def assert_in_range(features, value_ranges):
    """`features`, failing the pipeline (InvalidArgumentError) when a value is out of range."""
    if not value_ranges:
        return features
    bounds = ", ".join(f"{name} in [{low}, {high})"
                       for name, (low, high, _) in sorted(value_ranges.items()))
    check = tf.debugging.Assert(in_range(features, value_ranges),
                                [f"a record holds values out of range (needs {bounds})"])
    with tf.control_dependencies([check]):
        return {name: tf.identity(value) for name, value in features.items()}


def read_file_tolerantly(path, size, expected_records):
    """(record, lost) of one TFRecord file: lost == -1 for each record read, then one
    end-of-file marker ("", lost >= 0): 0 when all `size` bytes were read, else the records
    the corrupt or truncated part took with it (`expected_records` - read when known, i.e.
    >= 0, else 1)."""
    size, expected_records = tf.cast(size, tf.int64), tf.cast(expected_records, tf.int64)
    records = tf.data.TFRecordDataset(path).ignore_errors()  # ends the file at an error
    tagged = records.map(lambda record: (record, tf.constant(False))).concatenate(
        tf.data.Dataset.from_tensors((tf.constant(""), tf.constant(True))))
    zero = tf.constant(0, tf.int64)

    def step(state, element):
        read, read_bytes = state
        record, is_end = element
        missing = tf.maximum(tf.constant(1, tf.int64), expected_records - read)
        lost = tf.where(is_end, tf.where(tf.equal(read_bytes, size), zero, missing),
                        tf.constant(_IS_RECORD, tf.int64))
        length = tf.cast(tf.strings.length(record), tf.int64) + _FRAMING_BYTES
        return ((read + tf.where(is_end, zero, tf.constant(1, tf.int64)),
                 read_bytes + tf.where(is_end, zero, length)), (record, lost))

    return tagged.scan((zero, zero), step)


def drop_bad_records(dataset, spec, value_ranges):
    """Turns `(record, lost)` elements (`read_file_tolerantly`) into parsed examples (`spec`'s
    types) of the good records only, each with BAD_RECORDS: bad records counted so far."""
    def check(index, element):
        record, lost = element
        is_record = lost < 0
        features = tf.cond(
            is_record, lambda: tf.io.parse_single_example(record, spec),
            lambda: {name: tf.zeros(f.shape, f.dtype) for name, f in spec.items()})
        good = in_range(features, value_ranges or {})
        bad = tf.where(is_record, tf.cast(tf.logical_not(good), tf.int64), lost)
        return index, features, is_record & good, bad

    dataset = dataset.enumerate().map(check, num_parallel_calls=tf.data.AUTOTUNE,
                                      deterministic=True)
    dataset = dataset.ignore_errors()  # unparsable records: their numbers go missing

    def count(state, element):
        previous, total = state
        index, features, keep, bad = element
        total = total + (index - previous - 1) + bad
        return (index, total), (dict(features, **{BAD_RECORDS: total}), keep)

    def kept(features, keep):
        return keep

    def features_only(features, keep):
        return features

    dataset = dataset.scan((tf.constant(-1, tf.int64), tf.constant(0, tf.int64)), count)
    return dataset.filter(kept).map(features_only)


class BadRecordLimitError(RuntimeError):
    """More bad records skipped than allowed (a RuntimeError: entry points print one line)."""


class BadRecordLimitHook(tf1.train.SessionRunHook):
    """Logs the bad records skipped (summed over ranks) whenever the total grows, and stops
    the run on every rank (BadRecordLimitError) once it exceeds `limit`, both at the end of
    an accumulation window (where ranks meet anyway). `describe` names the input (e.g. the
    --input_files_dir) in the message."""

    def __init__(self, limit, workers, describe):
        self._limit = int(limit)
        self._workers = workers
        self._describe = describe
        self._count = None
        self._windows = WindowFollower(workers.rank)
        self._checking = False
        self.total = 0
        self.sums_fetched = 0     # session runs that fetched the sum over ranks

    def input_fn(self, inner):
        """Wraps an input_fn whose features carry BAD_RECORDS: takes it out (the model never
        sees it) and keeps the batch's count to fetch with each step."""
        def input_fn():
            features = dict(inner())
            self._count = tf.reduce_max(features.pop(BAD_RECORDS))
            return features
        return input_fn

    def begin(self):
        if self._count is None:
            raise RuntimeError("BadRecordLimitHook used without its input_fn")
        # Every rank fetches the sum in the same runs (those closing a window), as
        # collectives require.
        self._total = self._workers.sum_over_ranks(tf.cast(self._count, tf.float64))
        self._windows.begin()

    def after_create_session(self, session, coord):
        self._windows.after_create_session(session)

    def before_run(self, run_context):
        self._checking = self._windows.closes_next_run()
        fetches = self._windows.fetches()
        if self._checking:
            fetches["total"] = self._total
        return tf1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        results = run_values.results
        self._windows.after_run(results, self._checking)
        if "total" not in results:
            return
        self.sums_fetched += 1
        total = int(results["total"])
        if total > self.total and self._workers.is_chief:
            logging.warning("%s: %d bad record%s skipped so far (--max_bad_records=%d)",
                            self._describe, total, "s" * (total != 1), self._limit)
        self.total = total
        if total > self._limit:
            raise BadRecordLimitError(
                f"{self._describe}: {total} bad records skipped, more than "
                f"--max_bad_records={self._limit}: regenerate or remove the damaged files "
                "(run without --skip_bad_records to stop at the first bad record and name it)")
