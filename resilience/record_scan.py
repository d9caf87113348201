"""Finding the bad record behind a failed input pipeline: which file, which record, what.

When training stops on a bad record, TensorFlow's error says "corrupted record at 5877" or
"assertion failed" but not which file. Rather than tag every record with its file in the
training pipeline (a string per record on the hot path, and a different iterator state), the
files are scanned again after the failure, in order, until the first bad record: the same
checks as the pipeline (framing, parse with the feature spec, `value_ranges`), on batches of
records parsed at once. It costs reading this rank's files up to the bad one, once, only
when a run has already failed. `record_problem` describes one record in words (missing
feature, wrong length or type, value out of range) for that message and for start-up checks.
"""
import re

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

SCAN_BATCH = 1024
_KINDS = {tf.int64: "int64_list", tf.float32: "float_list", tf.string: "bytes_list"}


class BadRecordError(RuntimeError):
    """One line `<file>: record <i>: <problem>` (a RuntimeError: entry points print it)."""


def value_problem(name, values, value_ranges):
    """Why `values` of feature `name` break `value_ranges`, or None."""
    if name not in value_ranges or not len(values):
        return None
    low, high, why = value_ranges[name]
    values = np.asarray(values)
    if values.max() >= high:
        return f"{name} holds {int(values.max())} >= {high} ({why})"
    if values.min() < low:
        return f"{name} holds {int(values.min())} < {low} ({why})"
    return None


def record_problem(serialized, spec, value_ranges=None):
    """What is wrong with one serialized tf.train.Example for `spec` and `value_ranges`
    (FixedLenFeatures), in words, or None when nothing is."""
    try:
        features = tf.train.Example.FromString(serialized).features.feature
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and friends
        return "not a tf.train.Example"
    for name, feature in sorted(spec.items()):
        if name not in features:
            return f"no feature {name!r}"
        kind = _KINDS[feature.dtype]
        if features[name].WhichOneof("kind") != kind:
            return f"feature {name!r} is not an {kind}"
        values = getattr(features[name], kind).value
        expected = int(np.prod(feature.shape))
        if len(values) != expected:
            return f"feature {name!r} has {len(values)} values, expected {expected}"
        problem = value_problem(name, values, value_ranges or {})
        if problem:
            return problem
    return None


def _first_problem(batch, spec, value_ranges):
    """(row, problem) of the first bad record of `batch`, or None."""
    try:
        parsed = tf.io.parse_example(tf.constant(batch), spec)
    except tf.errors.InvalidArgumentError:  # find the record in words
        for row, record in enumerate(batch):
            problem = record_problem(record, spec, value_ranges)
            if problem:
                return row, problem
        return None
    bad_rows = []
    for name in sorted(set(value_ranges or {}) & set(parsed)):  # ranges of features it has
        low, high, _ = value_ranges[name]
        values = parsed[name].numpy()
        rows = np.flatnonzero(((values < low) | (values >= high)).reshape(len(batch), -1)
                              .any(axis=1))
        if rows.size:
            bad_rows.append(int(rows[0]))
    if not bad_rows:
        return None
    row = min(bad_rows)
    return row, record_problem(batch[row], spec, value_ranges)


def first_bad_record(path, spec, value_ranges=None):
    """`record <i>: <problem>` of the first bad record of file `path`, or None."""
    index, batch = 0, []

    def check():
        found = _first_problem(batch, spec, value_ranges) if batch else None
        return None if found is None else f"record {index + found[0]}: {found[1]}"

    try:
        for record in tf1.io.tf_record_iterator(path):
            batch.append(record)
            if len(batch) == SCAN_BATCH:
                problem = check()
                if problem:
                    return problem
                index, batch = index + len(batch), []
    except tf.errors.OpError as err:
        return check() or f"record {index + len(batch)}: {_unreadable(err)}"
    return check()


def _unreadable(err):
    """TensorFlow's "truncated record at 11985' failed with ..." in plain words."""
    found = re.search(r"(truncated|corrupted) record at (\d+)", err.message or "")
    if found and found.group(1) == "truncated":
        return f"truncated at byte {found.group(2)} (the file ends inside this record)"
    if found:
        return f"corrupt (checksum mismatch near byte {found.group(2)})"
    return f"unreadable ({(err.message or type(err).__name__).splitlines()[0]})"


def locate_bad_record(files, spec, value_ranges=None):
    """`<file>: record <i>: <problem>` for the first bad record of `files` (in order), or
    None when they are all fine."""
    for path in files:
        problem = first_bad_record(path, spec, value_ranges)
        if problem:
            return f"{path}: {problem}"
    return None
