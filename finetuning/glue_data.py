"""GLUE tasks: the original TSV files in, padded BERT features and TFRecords out.

Each task has a processor that reads the files exactly as GLUE distributes them
(``train.tsv``, ``dev.tsv``, ``test.tsv`` in one folder; MNLI has ``dev_matched.tsv``,
``dev_mismatched.tsv``, ``test_matched.tsv``, ``test_mismatched.tsv``). Lines are split on
tabs by ``csv`` with ``quoting=csv.QUOTE_NONE``, as Google does, because quotes in GLUE text
are literal characters. Files with a header row are read by column name (so MNLI's 12-column
train and 16-column dev files, or MRPC's ``Quality``/``index`` first column, need no special
case); every row must then have as many columns as the header. CoLA's train/dev files have no
header and exactly four columns: source, label, original-label marker, sentence.

Guids are ``<split>-<id>`` where ``<id>`` is the file's ``index``/``id`` column when it has
one (as Google does for MNLI) and otherwise the 0-based line number with the header counted
(as Google does for CoLA and MRPC). Test examples get a placeholder label (the first label, or
0.0 for STS-B) exactly like Google's processors.

Bad input raises ``GlueDataError`` whose message is one line ``<file>:<line>: <problem>``.
QQP is the exception Google makes: its train file has some malformed rows (wrong column
count), which are skipped with a warning.

Features follow Google's ``run_classifier.py``: ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``,
segment ids 0 for ``[CLS] a [SEP]`` and 1 for ``b [SEP]``, pairs truncated by popping the last
token of the longer side, everything zero-padded to ``max_seq_length``. ``PaddingInputExample``
(all-zero features with ``is_real_example=0``) fills eval/predict sets up to a multiple of the
batch size. TFRecords are written without TensorFlow (``data_prep.instances.tfrecord_writer``) with
the feature names of Google's ``file_based_convert_examples_to_features``; ``feature_spec`` gives
the matching parsing spec.
"""
import collections
import csv
import logging
import os

import numpy as np

from data_prep.instances import tfrecord_writer

logger = logging.getLogger(__name__)

InputExample = collections.namedtuple("InputExample", "guid text_a text_b label")
InputExample.__new__.__defaults__ = (None, None)

InputFeatures = collections.namedtuple(
    "InputFeatures", "input_ids input_mask segment_ids label_id is_real_example")


class PaddingInputExample:
    """A fake example that fills a batch; it becomes all-zero features with is_real_example=0.

    Dropping a partial last batch (TPU/XLA static shapes) would lose examples, so the
    eval/predict set is padded instead and the metrics ignore these (Google's approach).
    """

    guid = None
    text_a = None
    text_b = None
    label = None

    def __repr__(self):
        return "PaddingInputExample()"


class GlueDataError(ValueError):
    """Unusable GLUE input; ``str(err)`` is one line naming the file (and line)."""

    def __init__(self, path, problem, line=None):
        self.path = path
        self.line = line
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {problem}")


# ---------------------------------------------------------------------------
# Reading the TSV files

# A split's layout. With a header, columns are named by header strings; without one they are
# 0-based positions and ``num_columns`` is the exact count. ``guid``/``text_b``/``label`` may
# be None (no id column, single sentence, unlabelled test set).
Layout = collections.namedtuple("Layout", "text_a text_b label guid header num_columns")
Layout.__new__.__defaults__ = (None, None, None, True, None)


def read_tsv(path):
    """Rows of a tab-separated file read like Google's ``_read_tsv`` (``csv``, QUOTE_NONE).

    Returns ``[(line_number, fields), ...]`` (1-based line numbers), blank lines left out.
    A UTF-8 byte-order mark at the start is dropped; ``\\r\\n`` line ends are accepted.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise GlueDataError(path, "file not found") from None
    except IsADirectoryError:
        raise GlueDataError(path, "is a directory, expected a GLUE .tsv file") from None
    except OSError as e:
        raise GlueDataError(path, f"cannot read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise GlueDataError(path, f"invalid UTF-8 at byte {e.start}", line) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    rows = []
    reader = csv.reader((line[:-1] if line.endswith("\r") else line for line in lines),
                        delimiter="\t", quoting=csv.QUOTE_NONE)
    line_number = 0
    try:
        for line_number, fields in enumerate(reader, 1):
            if fields and fields != [""]:
                rows.append((line_number, fields))
    except csv.Error as e:
        raise GlueDataError(path, f"unreadable line ({e})", line_number + 1) from None
    return rows


class DataProcessor:
    """Base class: a GLUE task's files, layouts and labels.

    Subclasses set ``task_name``, ``labels`` (strings; empty for regression),
    ``is_regression``, the file names and one ``Layout`` per split.
    """

    task_name = None
    labels = ()
    is_regression = False
    train_file = "train.tsv"
    dev_file = "dev.tsv"
    test_file = "test.tsv"
    train_layout = None
    dev_layout = None
    test_layout = None
    # QQP's train file has malformed rows that everybody skips (Google/HuggingFace).
    skip_malformed_rows = False

    def get_train_examples(self, data_dir):
        return self._create_examples(os.path.join(data_dir, self.train_file), "train",
                                     self.train_layout or self.dev_layout)

    def get_dev_examples(self, data_dir):
        return self._create_examples(os.path.join(data_dir, self.dev_file), "dev",
                                     self.dev_layout)

    def get_test_examples(self, data_dir):
        return self._create_examples(os.path.join(data_dir, self.test_file), "test",
                                     self.test_layout)

    def get_labels(self):
        """Label strings in id order; ``[]`` for a regression task (one output)."""
        return list(self.labels)

    @property
    def num_labels(self):
        """Outputs of the classifier head (1 for regression)."""
        return 1 if self.is_regression else len(self.labels)

    def placeholder_label(self):
        return 0.0 if self.is_regression else self.labels[0]

    def _create_examples(self, path, set_type, layout):
        rows = read_tsv(path)
        if layout.header:
            if not rows:
                raise GlueDataError(path, f"empty file, expected the GLUE {self.task_name} "
                                    f"{set_type} file with a header row")
            header_line, header = rows[0]
            columns = {}
            for role in ("text_a", "text_b", "label", "guid"):
                name = getattr(layout, role)
                if name is None:
                    continue
                if name not in header:
                    raise GlueDataError(
                        path, f"header has no column {name!r} (header: {' | '.join(header)}); "
                        f"not the GLUE {self.task_name} {set_type} file?", header_line)
                columns[role] = header.index(name)
            num_columns = len(header)
            body = rows[1:]
        else:
            columns = {role: getattr(layout, role) for role in ("text_a", "text_b", "label", "guid")
                       if getattr(layout, role) is not None}
            num_columns = layout.num_columns
            body = rows
        examples = []
        skipped = 0
        for line_number, fields in body:
            if len(fields) != num_columns:
                if self.skip_malformed_rows:
                    skipped += 1
                    continue
                raise GlueDataError(path, f"{len(fields)} columns, expected {num_columns} "
                                    f"(GLUE {self.task_name} {set_type} layout)", line_number)
            if "guid" in columns:
                guid = f"{set_type}-{fields[columns['guid']]}"
            else:
                guid = f"{set_type}-{line_number - 1}"
            text_a = fields[columns["text_a"]]
            text_b = fields[columns["text_b"]] if "text_b" in columns else None
            if "label" in columns:
                label = self._parse_label(fields[columns["label"]], path, line_number)
            else:
                label = self.placeholder_label()
            examples.append(InputExample(guid, text_a, text_b, label))
        if skipped:
            logger.warning("%s: skipped %d malformed line(s) (wrong column count)", path,
                           skipped)
        return examples

    def _parse_label(self, value, path, line_number):
        if self.is_regression:
            try:
                return float(value)
            except ValueError:
                raise GlueDataError(path, f"label {value!r} is not a number",
                                    line_number) from None
        if value not in self.labels:
            raise GlueDataError(path, f"label {value!r} is not one of "
                                f"{', '.join(self.labels)}", line_number)
        return value


class ColaProcessor(DataProcessor):
    """CoLA: train/dev without header (source, label, original marker, sentence)."""
    task_name = "cola"
    labels = ("0", "1")
    dev_layout = Layout(text_a=3, label=1, header=False, num_columns=4)
    test_layout = Layout(text_a="sentence", guid="index")


class Sst2Processor(DataProcessor):
    """SST-2: ``sentence label``; test ``index sentence``."""
    task_name = "sst-2"
    labels = ("0", "1")
    dev_layout = Layout(text_a="sentence", label="label")
    test_layout = Layout(text_a="sentence", guid="index")


class MrpcProcessor(DataProcessor):
    """MRPC: ``Quality #1 ID #2 ID #1 String #2 String`` (test: ``index`` or ``Quality`` first)."""
    task_name = "mrpc"
    labels = ("0", "1")
    dev_layout = Layout(text_a="#1 String", text_b="#2 String", label="Quality")
    test_layout = Layout(text_a="#1 String", text_b="#2 String")


class StsbProcessor(DataProcessor):
    """STS-B: 10 columns ending ``sentence1 sentence2 score``; test has no score. Regression."""
    task_name = "sts-b"
    labels = ()
    is_regression = True
    dev_layout = Layout(text_a="sentence1", text_b="sentence2", label="score", guid="index")
    test_layout = Layout(text_a="sentence1", text_b="sentence2", guid="index")


class QqpProcessor(DataProcessor):
    """QQP: ``id qid1 qid2 question1 question2 is_duplicate``; test ``id question1 question2``."""
    task_name = "qqp"
    labels = ("0", "1")
    skip_malformed_rows = True
    dev_layout = Layout(text_a="question1", text_b="question2", label="is_duplicate", guid="id")
    test_layout = Layout(text_a="question1", text_b="question2", guid="id")


class MnliProcessor(DataProcessor):
    """MNLI matched: ``index ... sentence1 sentence2 [label1 ...] gold_label``."""
    task_name = "mnli"
    labels = ("contradiction", "entailment", "neutral")
    dev_file = "dev_matched.tsv"
    test_file = "test_matched.tsv"
    dev_mismatched_file = "dev_mismatched.tsv"
    test_mismatched_file = "test_mismatched.tsv"
    dev_layout = Layout(text_a="sentence1", text_b="sentence2", label="gold_label", guid="index")
    test_layout = Layout(text_a="sentence1", text_b="sentence2", guid="index")

    def get_dev_mismatched_examples(self, data_dir):
        return self._create_examples(os.path.join(data_dir, self.dev_mismatched_file),
                                     "dev_mismatched", self.dev_layout)

    def get_test_mismatched_examples(self, data_dir):
        return self._create_examples(os.path.join(data_dir, self.test_mismatched_file),
                                     "test_mismatched", self.test_layout)


class MnliMismatchedProcessor(MnliProcessor):
    """MNLI evaluated on the mismatched dev/test sets (same training data)."""
    task_name = "mnli-mm"

    def get_dev_examples(self, data_dir):
        return self.get_dev_mismatched_examples(data_dir)

    def get_test_examples(self, data_dir):
        return self.get_test_mismatched_examples(data_dir)


class QnliProcessor(DataProcessor):
    """QNLI: ``index question sentence label``."""
    task_name = "qnli"
    labels = ("entailment", "not_entailment")
    dev_layout = Layout(text_a="question", text_b="sentence", label="label", guid="index")
    test_layout = Layout(text_a="question", text_b="sentence", guid="index")


class RteProcessor(DataProcessor):
    """RTE: ``index sentence1 sentence2 label``."""
    task_name = "rte"
    labels = ("entailment", "not_entailment")
    dev_layout = Layout(text_a="sentence1", text_b="sentence2", label="label", guid="index")
    test_layout = Layout(text_a="sentence1", text_b="sentence2", guid="index")


class WnliProcessor(RteProcessor):
    """WNLI: ``index sentence1 sentence2 label`` with labels 0/1."""
    task_name = "wnli"
    labels = ("0", "1")


PROCESSORS = {
    "cola": ColaProcessor,
    "sst-2": Sst2Processor,
    "sst2": Sst2Processor,
    "mrpc": MrpcProcessor,
    "sts-b": StsbProcessor,
    "stsb": StsbProcessor,
    "qqp": QqpProcessor,
    "mnli": MnliProcessor,
    "mnli-m": MnliProcessor,
    "mnli-mm": MnliMismatchedProcessor,
    "qnli": QnliProcessor,
    "rte": RteProcessor,
    "wnli": WnliProcessor,
}


def _registry_key(task_name):
    key = str(task_name).strip().lower().replace("_", "-")
    if key not in PROCESSORS:
        raise ValueError(f"unknown GLUE task {task_name!r}; known tasks: "
                         f"{', '.join(sorted(PROCESSORS))}")
    return key


def canonical_task_name(task_name):
    """``"SST2"``/``"sst_2"`` -> ``"sst-2"``, ``"MNLI-m"`` -> ``"mnli"``; ValueError if unknown."""
    return PROCESSORS[_registry_key(task_name)].task_name


def get_processor(task_name):
    """A processor instance for ``task_name`` (case-insensitive; ``_`` works as ``-``)."""
    return PROCESSORS[_registry_key(task_name)]()


# ---------------------------------------------------------------------------
# Examples to features

def truncate_seq_pair(tokens_a, tokens_b, max_length):
    """Pops the last token of the longer list (``b`` on ties) until the pair fits (in place)."""
    while len(tokens_a) + len(tokens_b) > max_length:
        (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def pad_examples(examples, batch_size):
    """``examples`` plus ``PaddingInputExample``s up to a multiple of ``batch_size``.

    Returns ``(padded_examples, num_real)``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    examples = list(examples)
    num_real = len(examples)
    examples.extend(PaddingInputExample() for _ in range(-num_real % batch_size))
    return examples, num_real


def _tokenize_all(tokenizer, texts):
    batch = getattr(tokenizer, "tokenize_batch", None)
    if batch is not None:
        return batch(texts)
    return [tokenizer.tokenize(text) for text in texts]


def convert_examples_to_features(examples, label_list, max_seq_length, tokenizer,
                                 is_regression=False):
    """``InputFeatures`` of each example (``PaddingInputExample`` -> all zeros, not real).

    ``label_id`` is the label's index in ``label_list`` (int) or, for regression, the
    float label. ``tokenizer`` needs ``tokenize`` (or ``tokenize_batch``) and
    ``convert_tokens_to_ids``.
    """
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be at least 3, got {max_seq_length}")
    label_map = {label: i for i, label in enumerate(label_list or ())}
    examples = list(examples)
    real = [ex for ex in examples if not isinstance(ex, PaddingInputExample)]
    tokens_a_all = _tokenize_all(tokenizer, [ex.text_a for ex in real])
    with_b = [ex.text_b for ex in real if ex.text_b]
    tokens_b_iter = iter(_tokenize_all(tokenizer, with_b) if with_b else [])
    zeros = [0] * max_seq_length
    features = []
    real_index = 0
    for example in examples:
        if isinstance(example, PaddingInputExample):
            features.append(InputFeatures(list(zeros), list(zeros), list(zeros),
                                          0.0 if is_regression else 0, False))
            continue
        tokens_a = list(tokens_a_all[real_index])
        real_index += 1
        tokens_b = list(next(tokens_b_iter)) if example.text_b else None
        if tokens_b is not None:
            truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)
        else:
            del tokens_a[max_seq_length - 2:]
        tokens = ["[CLS]"] + tokens_a + ["[SEP]"]
        segment_ids = [0] * len(tokens)
        if tokens_b is not None:
            tokens += tokens_b + ["[SEP]"]
            segment_ids += [1] * (len(tokens_b) + 1)
        input_ids = list(tokenizer.convert_tokens_to_ids(tokens))
        pad = max_seq_length - len(input_ids)
        if is_regression:
            try:
                label_id = float(example.label)
            except (TypeError, ValueError):
                raise GlueDataError(example.guid, f"label {example.label!r} is not a "
                                    "number") from None
        else:
            if example.label not in label_map:
                raise GlueDataError(example.guid, f"label {example.label!r} is not one of "
                                    f"{', '.join(map(str, label_list or ()))}")
            label_id = label_map[example.label]
        features.append(InputFeatures(input_ids + [0] * pad, [1] * len(input_ids) + [0] * pad,
                                      segment_ids + [0] * pad, label_id, True))
    return features


# ---------------------------------------------------------------------------
# TFRecords

# Records serialised per step (bounds the memory of the byte layout).
_RECORDS_PER_BATCH = 4096


def feature_kinds(is_regression=False):
    """Record feature name -> ``tfrecord_writer`` kind."""
    return {
        "input_ids": tfrecord_writer.INT64,
        "input_mask": tfrecord_writer.INT64,
        "segment_ids": tfrecord_writer.INT64,
        "label_ids": tfrecord_writer.FLOAT if is_regression else tfrecord_writer.INT64,
        "is_real_example": tfrecord_writer.INT64,
    }


def feature_spec(max_seq_length, is_regression=False):
    """``tf.io.parse_example`` spec of the records ``write_features_to_tfrecord`` writes."""
    import tensorflow as tf  # here, so reading TSV files does not pay for TensorFlow
    return {
        "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "label_ids": tf.io.FixedLenFeature([], tf.float32 if is_regression else tf.int64),
        "is_real_example": tf.io.FixedLenFeature([], tf.int64),
    }


def write_features_to_tfrecord(features, output_file, is_regression=False):
    """Writes ``InputFeatures`` as ``tf.train.Example`` records (atomically). Returns the count."""
    features = list(features)
    kinds = feature_kinds(is_regression)
    label_dtype = np.float32 if is_regression else np.int64
    with tfrecord_writer.TFRecordFileWriter(output_file) as writer:
        for start in range(0, len(features), _RECORDS_PER_BATCH):
            batch = features[start:start + _RECORDS_PER_BATCH]
            columns = {
                "input_ids": np.array([f.input_ids for f in batch], dtype=np.int64),
                "input_mask": np.array([f.input_mask for f in batch], dtype=np.int64),
                "segment_ids": np.array([f.segment_ids for f in batch], dtype=np.int64),
                "label_ids": np.array([[f.label_id] for f in batch], dtype=label_dtype),
                "is_real_example": np.array([[int(f.is_real_example)] for f in batch],
                                            dtype=np.int64),
            }
            widths = {columns[n].shape[1] for n in ("input_ids", "input_mask", "segment_ids")}
            if len(widths) != 1:
                raise ValueError(f"{output_file}: features of different lengths {sorted(widths)}")
            writer.write_tfrecords(tfrecord_writer.encode_tfrecords(columns, kinds), len(batch))
    return len(features)


def file_based_convert_examples_to_features(examples, label_list, max_seq_length, tokenizer,
                                            output_file, is_regression=False):
    """Google's name: converts ``examples`` and writes them to ``output_file``.

    Returns the number of records.
    """
    features = convert_examples_to_features(examples, label_list, max_seq_length, tokenizer,
                                            is_regression)
    return write_features_to_tfrecord(features, output_file, is_regression)
