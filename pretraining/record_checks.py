"""Start-up checks of the pre-training input: every file, in O(files), before anything is
written.

A run pointed at the wrong data (another sequence length, a larger vocabulary than the
model's, a file that is not records, a folder mixing two vocabularies) must stop at once
with one line naming the file, not hours later with a traceback. For each input file:
- its metadata, when data preparation wrote one (`data_prep.instances.record_metadata`): lengths
  against the flags, vocabulary size against the config (`training.vocab_fit`, the check
  every command that reads a vocabulary and a config makes), and, across the files, one
  vocabulary and one masking kind;
- its first record: a readable TFRecord of a known kind (`pretraining.record_kinds`: static
  or dynamic masking, packed or not), every feature of its spec at the flags' lengths,
  values in range (`value_ranges`); across the files, one kind, one packing, one
  vocabulary (`record_kinds.check_kinds`).
That is one small read per file (done in threads: on a network filesystem each is a round
trip). Records deeper in a file are checked as training reads them (`resilience.record_guard`).
"""
from concurrent.futures import ThreadPoolExecutor

import tensorflow as tf

from data_prep.instances.record_metadata import STATIC_MASKING, MetadataError, find_metadata, parse
from pretraining import record_kinds
from pretraining.input_pipeline import InputError, reading_spec, value_ranges
from resilience.record_scan import record_problem
from training.vocab_fit import vocab_fit_problem

tf1 = tf.compat.v1

THREADS = 16


def read_metadata(path):
    """The metadata of record file `path`, or None when there is none; InputError (naming
    the metadata file) when it is unusable."""
    meta_path = find_metadata(path, exists=tf.io.gfile.exists)
    if meta_path is None:
        return None
    with tf.io.gfile.GFile(meta_path) as reader:
        text = reader.read()
    try:
        return parse(text, meta_path)
    except MetadataError as err:
        raise InputError(str(err)) from None


def _first_record(path):
    try:
        for record in tf1.io.tf_record_iterator(path):
            return record
    except tf.errors.OpError as err:
        raise InputError(f"{path}: not a readable TFRecord file ({err.message.splitlines()[0]})") from None
    return None


def _check_metadata(path, metadata, max_seq_length, max_predictions_per_seq, config):
    where = f"{path} (per its metadata)"
    if metadata["max_seq_length"] != max_seq_length:
        raise InputError(f"{where}: records have sequence length {metadata['max_seq_length']} "
                         f"but --max_seq_length={max_seq_length}")
    if metadata["masking"] == STATIC_MASKING and \
            metadata["max_predictions_per_seq"] != max_predictions_per_seq:
        raise InputError(f"{where}: records have {metadata['max_predictions_per_seq']} "
                         f"masked-LM predictions but --max_predictions_per_seq="
                         f"{max_predictions_per_seq}")
    problem = vocab_fit_problem(metadata["vocab_size"], path, config.vocab_size, config.source,
                                "records made with a vocabulary of")
    if problem:
        raise InputError(problem)


def _check_first_record(path, record, max_seq_length, max_predictions_per_seq, config,
                        ranges):
    """The file's `record_kinds.RecordFacts`, after checking its first record."""
    try:
        example = tf.train.Example.FromString(record)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError
        raise InputError(f"{path}: record 0: not a tf.train.Example") from None
    facts = record_kinds.record_facts(path, example)
    record_kinds.check_kinds([facts], max_seq_length, max_predictions_per_seq, config)
    spec = reading_spec(max_seq_length, max_predictions_per_seq,
                        facts.kind == record_kinds.DYNAMIC, facts.sequences_per_row)
    problem = record_problem(record, spec, ranges)
    if problem:
        raise InputError(f"{path}: record 0: {problem}")
    return facts


def _check_file(path, max_seq_length, max_predictions_per_seq, config):
    """(metadata or None, RecordFacts or None when the file is empty) after checking both."""
    metadata = read_metadata(path)
    if metadata:
        _check_metadata(path, metadata, max_seq_length, max_predictions_per_seq, config)
    record = _first_record(path)
    if record is None:
        if metadata and metadata["records"]:
            raise InputError(f"{path}: empty, but its metadata says {metadata['records']} "
                             "records (truncated?)")
        return metadata, None
    return metadata, _check_first_record(
        path, record, max_seq_length, max_predictions_per_seq, config,
        value_ranges(config.vocab_size, config.type_vocab_size, max_seq_length))


_SAME_ACROSS_FILES = {
    "vocab_sha256": "made with another vocabulary than {other} (their ids mean other tokens)",
    "masking": "has masking {value!r} but {other} has {other_value!r} (one kind per run)",
}


def _check_consistent(files, metadata):
    first = {}
    for path, meta in zip(files, metadata):
        if not meta:
            continue
        for field, problem in _SAME_ACROSS_FILES.items():
            other, other_value = first.setdefault(field, (path, meta[field]))
            if meta[field] != other_value:
                raise InputError(f"{path}: " + problem.format(other=other, value=meta[field],
                                                              other_value=other_value))


def check_input_files(files, max_seq_length, max_predictions_per_seq, config, dynamic_flags=()):
    """Checks every file (see the module docstring); raises InputError naming the first bad
    one. `dynamic_flags`: `record_kinds.given_dynamic_flags`, refused with static records.
    Returns (the RecordFacts every file shares: kind and packing, each file's record count
    from its metadata, 0 for an empty file, None where it is not known)."""
    with ThreadPoolExecutor(min(THREADS, len(files))) as pool:
        results = list(pool.map(lambda path: _check_file(path, max_seq_length,
                                                         max_predictions_per_seq, config),
                                files))
    facts = [fact for _, fact in results if fact is not None]
    if not facts:
        raise InputError(f"{files[0]}: input files hold no records")
    shared = record_kinds.check_kinds(facts, max_seq_length, max_predictions_per_seq,
                                      config, dynamic_flags)
    metadata = [meta for meta, _ in results]
    _check_consistent(files, metadata)
    return shared, [meta["records"] if meta else (None if fact is not None else 0)
                    for meta, (_, fact) in zip(metadata, results)]
