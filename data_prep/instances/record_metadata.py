"""The metadata of each pre-training record file: `<folder>.meta/<records>.meta.json`.

Why: a TFRecord file says nothing about itself; a folder that mixes sequence lengths,
vocabularies or masking kinds, or records whose ids exceed the model's vocabulary, would
otherwise be found out only when training reads the bad record, hours in. With one small
JSON file per record file, pre-training checks every file in O(files) at start-up
(`pretraining.record_checks`), and knows how many records each file holds (so a file cut
short can be counted exactly).

Where: in a folder beside the records' folder, named after it with `.meta` added
(`.../books_wiki_en_corpus/training/x.tfrecord` ->
`.../books_wiki_en_corpus/training.meta/x.tfrecord.meta.json`), never in the records' folder
itself: NVIDIA's `run_pretraining.py` reads every entry of `--input_files_dir/*` as a
TFRecord file (TensorFlow's glob matches hidden names too), so anything beside the records
would break it. Metadata written beside the records (`<records>.meta.json`, this project's
earlier place) is still read (`find_metadata`), and a writer that cannot create the `.meta`
folder (a parent it may not write to) falls back to that place.

Per file rather than per folder: `bertPrep.py --action create_tfrecord_files` writes shards
in parallel processes and resumes by skipping finished ones; a per-folder file would need
all of them to agree on one writer. The metadata is written (temporary name, then rename)
just before its record file is renamed into place, so a record file under its final name
always has its metadata; a kill between the two leaves metadata without records, which
readers never look at and the rerun overwrites. Records without metadata (Google's, or
written by hand) are still read: only the checks that need it are skipped.

Fields: `format`, `writer_version`, `records` (count), `max_seq_length`,
`max_predictions_per_seq`, `vocab_size`, `vocab_sha256` (of the vocabulary's tokens, one a
line: two files with the same hash used the same ids), `masking` ("static" for masks drawn
once at data preparation, "dynamic" for unmasked records masked at every read),
`sequences_per_row` (packed records: up to k instances a row; 0, or absent, unpacked).
This module does not import TensorFlow (data preparation never does).
"""
import hashlib
import json
import os

SUFFIX = ".meta.json"
FORMAT = "bert-pretraining-records"
WRITER_VERSION = 1
STATIC_MASKING = "static"
_INTEGER_FIELDS = ("records", "max_seq_length", "max_predictions_per_seq", "vocab_size")
_TEXT_FIELDS = ("vocab_sha256", "masking")


class MetadataError(ValueError):
    """A metadata file that cannot be used; `str(err)` is one line naming the file."""


FOLDER_SUFFIX = ".meta"


def metadata_path(records_path):
    """Where the metadata of `records_path` is written: `<folder>.meta/<name>.meta.json`
    (a local path is made absolute first; a URL such as gs://... keeps its form). A record
    file at the root of a filesystem keeps it beside itself (`legacy_metadata_path`)."""
    path = str(records_path)
    if "://" not in path:
        path = os.path.abspath(path)
    folder, _, name = path.rstrip("/").rpartition("/")
    if not folder or folder.endswith(":/") or folder.endswith("://"):
        return legacy_metadata_path(records_path)
    return f"{folder}{FOLDER_SUFFIX}/{name}{SUFFIX}"


def legacy_metadata_path(records_path):
    """The earlier place of the metadata: beside the records (`<records>.meta.json`)."""
    return str(records_path) + SUFFIX


def find_metadata(records_path, exists=os.path.exists):
    """The metadata file of `records_path` (its `.meta` folder's, else the one beside it),
    or None; `exists`: the existence test of the records' filesystem (tf.io.gfile.exists
    for remote ones)."""
    for path in (metadata_path(records_path), legacy_metadata_path(records_path)):
        if exists(path):
            return path
    return None


def is_metadata_name(name):
    """Whether a file name is a metadata file (never a record file to read)."""
    return name.endswith(SUFFIX)


def vocab_sha256(tokens):
    """Identifies a vocabulary by its tokens in id order."""
    return hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()


def describe(records, max_seq_length, max_predictions_per_seq, vocab_size, vocab_hash,
             masking=STATIC_MASKING, sequences_per_row=0):
    """The metadata of one record file, as written."""
    return {"format": FORMAT, "writer_version": WRITER_VERSION, "records": int(records),
            "max_seq_length": int(max_seq_length),
            "max_predictions_per_seq": int(max_predictions_per_seq),
            "vocab_size": int(vocab_size), "vocab_sha256": vocab_hash, "masking": str(masking),
            "sequences_per_row": int(sequences_per_row)}


def write(records_path, metadata):
    """Writes the metadata of `records_path` atomically (temporary name `.tmp-<pid>`, which
    `data_prep.processes.temporaries` cleans up after a killed writer), in its `.meta` folder, or
    beside the records when that folder cannot be created. Returns the path; raises
    OSError."""
    path = metadata_path(records_path)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError:
        path = legacy_metadata_path(records_path)
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temporary, "w", encoding="utf-8") as writer:
            writer.write(json.dumps(metadata, indent=1, sort_keys=True) + "\n")
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    stale = legacy_metadata_path(records_path)
    if path != stale and os.path.exists(stale):  # a rewrite must not leave the old one
        os.remove(stale)
    return path


def parse(text, path):
    """The metadata in `text` (the content of file `path`), validated; MetadataError (one
    line naming `path`) when it is not metadata this module wrote."""
    try:
        metadata = json.loads(text)
    except ValueError as err:
        raise MetadataError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise MetadataError(f"{path}: not a pre-training records metadata file (no "
                            f"\"format\": \"{FORMAT}\")")
    for name in _INTEGER_FIELDS:
        if not isinstance(metadata.get(name), int) or metadata[name] < 0:
            raise MetadataError(f"{path}: field {name!r} must be a non-negative integer, "
                                f"got {metadata.get(name)!r}")
    for name in _TEXT_FIELDS:
        if not isinstance(metadata.get(name), str):
            raise MetadataError(f"{path}: field {name!r} must be a string, got "
                                f"{metadata.get(name)!r}")
    return metadata
