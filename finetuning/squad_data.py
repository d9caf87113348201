"""SQuAD v1.1/v2.0 examples -> BERT features -> TFRecords, as Google's ``run_squad.py`` makes them.

* Reading: each paragraph is split on whitespace (space, tab, CR, LF, U+202F) into "doc
  tokens", with a map from every character to the index of its word. A training answer
  (the first listed) becomes the word span covering its characters; a question whose answer
  text cannot be found in that span (bad ``answer_start``, text not in the context) is skipped
  and logged. ``is_impossible`` (v2.0) questions get the span -1/-1 and the answer "".
* Features: the question's WordPieces (at most ``max_query_length``) and a window of the
  paragraph's WordPieces, ``[CLS] query [SEP] window [SEP]`` with segment ids 0...0 1...1,
  padded with 0 to ``max_seq_length``. Windows start every ``doc_stride`` pieces until the last
  one reaches the end of the paragraph. A piece seen in several windows is "max context" in
  the one where min(left, right) context + 0.01 * window length is largest (the first on ties).
* Training positions: the word span is narrowed to the WordPieces that spell the tokenized
  answer ("(1895-1943)." with answer "1895" -> just the piece "1895"), then expressed in
  window coordinates; a window not containing the whole answer, and an impossible question,
  point at [CLS] (0/0).

Feature ``unique_id`` is 1000000000 + running feature number. TFRecords hold ``unique_ids``,
``input_ids``, ``input_mask``, ``segment_ids`` and, for training, ``start_positions``,
``end_positions`` and ``is_impossible`` (all int64); ``feature_spec`` parses them.
"""
import dataclasses
import re
from typing import Dict, List, Optional

import numpy as np
from absl import logging

from data_prep.instances import tfrecord_writer
from finetuning.squad_eval import (SquadFileError, check_unique_ids, dataset_articles,
                                   load_json_file, repeated_ids)
from finetuning.squad_version import check_version

FIRST_UNIQUE_ID = 1000000000

# Google's SQuAD whitespace: space, tab, CR, LF and the narrow no-break space U+202F.
_DOC_WORD = re.compile("[^ \t\r\n\u202f]+")


@dataclasses.dataclass
class SquadExample:
    """One question on one paragraph.

    ``doc_tokens`` are the paragraph's whitespace-separated words (shared by the questions of
    a paragraph). Training examples carry the answer as a word span ``start_position`` ..
    ``end_position`` (inclusive; -1/-1 when ``is_impossible``); otherwise they are ``None``.
    ``answers`` lists every ground-truth text (for reference only).
    """
    qas_id: str
    question_text: str
    doc_tokens: List[str]
    orig_answer_text: Optional[str] = None
    start_position: Optional[int] = None
    end_position: Optional[int] = None
    is_impossible: bool = False
    answers: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class InputFeatures:
    """One window of one example, ready for the model.

    ``tokens`` are the unpadded WordPieces; ``token_to_orig_map`` maps a position of a window
    piece to its word in ``example.doc_tokens``; ``token_is_max_context`` says, for the same
    positions, whether this window is the one to predict that piece from. ``start_position``
    / ``end_position`` (training) index ``tokens``; 0/0 is [CLS] (no answer in this window).
    ``is_impossible`` is the example's flag (a window merely missing the answer keeps False).
    """
    unique_id: int
    example_index: int
    doc_span_index: int
    tokens: List[str]
    token_to_orig_map: Dict[int, int]
    token_is_max_context: Dict[int, bool]
    input_ids: List[int]
    input_mask: List[int]
    segment_ids: List[int]
    start_position: Optional[int] = None
    end_position: Optional[int] = None
    is_impossible: bool = False


# ---------------------------------------------------------------------------
# Reading SQuAD json.

def split_doc_words(text):
    """Whitespace split of a paragraph: (words, char_to_word_offset).

    ``char_to_word_offset[i]`` is the index of the word containing character i; whitespace
    maps to the word before it (-1 before the first word), as in Google's reader.
    """
    words, offsets, position = [], [], 0
    for index, match in enumerate(_DOC_WORD.finditer(text)):
        start, end = match.span()
        offsets.extend([index - 1] * (start - position))
        offsets.extend([index] * (end - start))
        words.append(match.group())
        position = end
    offsets.extend([len(words) - 1] * (len(text) - position))
    return words, offsets


def parse_squad_examples(dataset_json, is_training, source="<dataset>"):
    """Examples of a parsed SQuAD dataset: (examples, skipped [(qas_id, reason)]).

    Training needs an answer (the first of ``answers`` is used) for every question that is not
    ``is_impossible``; questions whose answer cannot be located are skipped.
    """
    examples, skipped = [], []
    for a, article in enumerate(dataset_articles(dataset_json, source)):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise SquadFileError(source, f"data[{a}] has no 'paragraphs' list")
        for p, paragraph in enumerate(paragraphs):
            where = f"data[{a}].paragraphs[{p}]"
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("context"), str):
                raise SquadFileError(source, f"{where} has no 'context' text")
            if not isinstance(paragraph.get("qas"), list):
                raise SquadFileError(source, f"{where} has no 'qas' list")
            context = paragraph["context"]
            doc_tokens, char_to_word = split_doc_words(context)
            for q, qa in enumerate(paragraph["qas"]):
                example, reason = _make_example(qa, f"{where}.qas[{q}]", context, doc_tokens,
                                                char_to_word, is_training, source)
                if example is None:
                    skipped.append((qa["id"], reason))
                else:
                    examples.append(example)
    return examples, skipped


def _make_example(qa, where, context, doc_tokens, char_to_word, is_training, source):
    if not isinstance(qa, dict) or "id" not in qa or not isinstance(qa.get("question"), str):
        raise SquadFileError(source, f"{where} needs an 'id' and a 'question'")
    answers = qa.get("answers", [])
    if not isinstance(answers, list) or not all(
            isinstance(x, dict) and isinstance(x.get("text"), str) for x in answers):
        raise SquadFileError(source, f"{where}: 'answers' must be a list of {{\"text\": ...}}")
    is_impossible = bool(qa.get("is_impossible", False))
    example = SquadExample(qas_id=qa["id"], question_text=qa["question"], doc_tokens=doc_tokens,
                           is_impossible=is_impossible, answers=[x["text"] for x in answers])
    if not is_training:
        return example, None
    if is_impossible:
        example.orig_answer_text, example.start_position, example.end_position = "", -1, -1
        return example, None
    if not answers:
        raise SquadFileError(source, f"{where} ('{qa['id']}'): a training question needs an "
                                     "answer (or is_impossible: true)")
    answer = answers[0]
    text, answer_start = answer["text"], answer.get("answer_start")
    if isinstance(answer_start, bool) or not isinstance(answer_start, int):
        raise SquadFileError(source, f"{where} ('{qa['id']}'): answer has no integer "
                                     "'answer_start'")
    # Surrounding whitespace in the answer text is not part of any word.
    stripped = text.lstrip()
    answer_start += len(text) - len(stripped)
    text = stripped.rstrip()
    if not text:
        return None, "empty answer text"
    answer_end = answer_start + len(text) - 1
    if answer_start < 0 or answer_end >= len(context):
        return None, f"answer_start {answer['answer_start']} outside the context"
    start_position, end_position = char_to_word[answer_start], char_to_word[answer_end]
    actual_text = " ".join(doc_tokens[start_position:end_position + 1])
    cleaned_answer = " ".join(text.split())
    if start_position < 0 or actual_text.find(cleaned_answer) == -1:
        return None, f"could not find answer {cleaned_answer!r} in {actual_text!r}"
    example.orig_answer_text = text
    example.start_position, example.end_position = start_position, end_position
    return example, None


def read_squad_examples(input_file, is_training, version_2_with_negative=None):
    """Reads a SQuAD json file into ``SquadExample``s; skipped questions are logged.

    ``version_2_with_negative`` (True/False): the file is first checked to be data of that
    SQuAD version (``squad_version.check_version``); None: not checked.

    A question id used twice: refused to predict (``squad_eval.check_unique_ids``: answers
    are keyed by id, one would overwrite the other and the scores cover one question fewer);
    trained on with one warning line, as training never keys anything by id (each question
    still teaches its own answer), while the same file could not be predicted or scored.
    """
    dataset = load_json_file(input_file, "SQuAD dataset")
    if not is_training:
        check_unique_ids(dataset, input_file)
    else:
        _warn_repeated_ids(dataset, input_file)
    if version_2_with_negative is not None:
        check_version(dataset, version_2_with_negative, is_training, input_file)
    examples, skipped = parse_squad_examples(dataset, is_training, source=input_file)
    for qas_id, reason in skipped:
        logging.warning("Skipping SQuAD question %s: %s", qas_id, reason)
    if skipped:
        logging.warning("%s: skipped %d of %d questions", input_file, len(skipped),
                        len(skipped) + len(examples))
    return examples


def _warn_repeated_ids(dataset, input_file):
    repeats = repeated_ids(dataset, input_file)
    if repeats:
        qid, first, again = repeats[0]
        more = f" ({len(repeats)} repeated in all)" if len(repeats) > 1 else ""
        logging.warning("%s: question id %r is used twice, by %s and %s%s: both trained on, "
                        "but this file could not be predicted or scored (answers are keyed "
                        "by id)", input_file, qid, first, again, more)


# ---------------------------------------------------------------------------
# Examples to features.

class _DocCache:
    """WordPieces of each paragraph, computed once for all of its questions."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._docs = {}

    def get(self, doc_tokens):
        entry = self._docs.get(id(doc_tokens))
        if entry is None or entry[0] is not doc_tokens:
            entry = (doc_tokens,) + self._tokenize(doc_tokens)
            self._docs[id(doc_tokens)] = entry
        return entry[1:]

    def _tokenize(self, doc_tokens):
        """(pieces, piece ids, piece -> word index, word -> first piece index)."""
        batch = getattr(self.tokenizer, "tokenize_batch", None)
        word_pieces = (batch(doc_tokens) if batch is not None
                       else [self.tokenizer.tokenize(w) for w in doc_tokens])
        pieces, piece_to_word, word_to_piece = [], [], []
        for index, word in enumerate(word_pieces):
            word_to_piece.append(len(pieces))
            pieces.extend(word)
            piece_to_word.extend([index] * len(word))
        ids = self.tokenizer.convert_tokens_to_ids(pieces)
        return pieces, ids, piece_to_word, word_to_piece


def doc_spans(num_pieces, max_pieces_per_span, doc_stride):
    """Windows (start, length) over ``num_pieces`` pieces; the last one reaches the end."""
    spans, start = [], 0
    while start < num_pieces:
        length = min(num_pieces - start, max_pieces_per_span)
        spans.append((start, length))
        if start + length == num_pieces:
            break
        start += min(length, doc_stride)
    return spans


def max_context_spans(spans, num_pieces):
    """For each piece, the index of the window where it has the most context.

    Score = min(pieces to the left, pieces to the right) + 0.01 * window length; the first
    window wins ties.
    """
    best_span = [-1] * num_pieces
    best_score = [float("-inf")] * num_pieces
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        bonus = 0.01 * length
        for position in range(start, end + 1):
            score = min(position - start, end - position) + bonus
            if score > best_score[position]:
                best_score[position] = score
                best_span[position] = index
    return best_span


def improve_answer_span(doc_pieces, start, end, tokenizer, answer_text):
    """The sub-span of pieces ``start..end`` that spells the tokenized answer, if any.

    Word-level spans can be wider than the answer ("(1895-1943)." for "1895"); the smallest
    offset from the left is taken, as Google's ``_improve_answer_span``; without a match the
    span is kept.
    """
    target = tokenizer.tokenize(answer_text)
    if not target:
        return start, end
    size = len(target)
    for new_start in range(start, end - size + 2):
        if doc_pieces[new_start:new_start + size] == target:
            return new_start, new_start + size - 1
    return start, end


def convert_examples_to_features(examples, tokenizer, max_seq_length, doc_stride,
                                 max_query_length, is_training, output_fn=None):
    """``SquadExample``s -> ``InputFeatures`` (one per window); see the module docstring.

    ``output_fn``, when given, is also called with each feature as it is made (e.g.
    ``FeatureWriter.process_feature``).
    """
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be at least 1, got {doc_stride}")
    if max_query_length < 0:
        raise ValueError(f"max_query_length must be >= 0, got {max_query_length}")
    cls_id, sep_id = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
    cache = _DocCache(tokenizer)
    features = []
    unique_id = FIRST_UNIQUE_ID
    cut = []  # (qas_id, pieces) of the questions longer than max_query_length
    for example_index, example in enumerate(examples):
        query = tokenizer.tokenize(example.question_text)
        if len(query) > max_query_length:
            cut.append((example.qas_id, len(query)))
            query = query[:max_query_length]
        query_ids = tokenizer.convert_tokens_to_ids(query)
        max_pieces_per_span = max_seq_length - len(query) - 3
        if max_pieces_per_span < 1:
            raise ValueError(f"max_seq_length {max_seq_length} leaves no room for the "
                             f"paragraph after a {len(query)}-piece question; lower "
                             f"max_query_length ({max_query_length}) or raise max_seq_length")
        pieces, piece_ids, piece_to_word, word_to_piece = cache.get(example.doc_tokens)

        answer_start = answer_end = None
        if is_training and not example.is_impossible:
            answer_start = word_to_piece[example.start_position]
            if example.end_position < len(example.doc_tokens) - 1:
                answer_end = word_to_piece[example.end_position + 1] - 1
            else:
                answer_end = len(pieces) - 1
            answer_start, answer_end = improve_answer_span(
                pieces, answer_start, answer_end, tokenizer, example.orig_answer_text)

        spans = doc_spans(len(pieces), max_pieces_per_span, doc_stride)
        best_span = max_context_spans(spans, len(pieces))
        offset = len(query) + 2  # [CLS] query [SEP]
        for span_index, (span_start, span_length) in enumerate(spans):
            span_end = span_start + span_length  # exclusive
            tokens = ["[CLS]"] + query + ["[SEP]"] + pieces[span_start:span_end] + ["[SEP]"]
            input_ids = [cls_id] + query_ids + [sep_id] + piece_ids[span_start:span_end] + [sep_id]
            segment_ids = [0] * offset + [1] * (span_length + 1)
            token_to_orig_map = {offset + i: piece_to_word[span_start + i]
                                 for i in range(span_length)}
            token_is_max_context = {offset + i: best_span[span_start + i] == span_index
                                    for i in range(span_length)}
            padding = max_seq_length - len(input_ids)
            input_mask = [1] * len(input_ids) + [0] * padding
            input_ids = input_ids + [0] * padding
            segment_ids = segment_ids + [0] * padding

            start_position = end_position = None
            if is_training:
                if (example.is_impossible or answer_start < span_start
                        or answer_end >= span_end):
                    start_position = end_position = 0
                else:
                    start_position = answer_start - span_start + offset
                    end_position = answer_end - span_start + offset
            feature = InputFeatures(
                unique_id=unique_id, example_index=example_index, doc_span_index=span_index,
                tokens=tokens, token_to_orig_map=token_to_orig_map,
                token_is_max_context=token_is_max_context, input_ids=input_ids,
                input_mask=input_mask, segment_ids=segment_ids,
                start_position=start_position, end_position=end_position,
                is_impossible=example.is_impossible)
            features.append(feature)
            if output_fn is not None:
                output_fn(feature)
            unique_id += 1
    if cut:
        logging.warning("%s", query_cut_warning(cut, len(examples), max_query_length))
    return features


def query_cut_warning(cut, num_questions, max_query_length):
    """The one line saying which questions lost their end to ``max_query_length``: the model
    answers what remains, which may be another question. Google's run_squad.py cuts them
    silently (as it still is cut here, so features stay Google's)."""
    qas_id, pieces = cut[0]
    if len(cut) == 1:
        return (f"question {qas_id} has {pieces} WordPiece tokens: cut to its first "
                f"{max_query_length} (max_query_length), the part the model answers")
    return (f"{len(cut)} of {num_questions} questions have more than {max_query_length} "
            f"WordPiece tokens (max_query_length; the first, {qas_id}, has {pieces}): each "
            f"cut to its first {max_query_length}, the part the model answers")


# ---------------------------------------------------------------------------
# TFRecords.

_BATCH = 1024


def _feature_arrays(features, is_training):
    arrays = {
        "unique_ids": np.array([[f.unique_id] for f in features], dtype=np.int64),
        "input_ids": np.array([f.input_ids for f in features], dtype=np.int64),
        "input_mask": np.array([f.input_mask for f in features], dtype=np.int64),
        "segment_ids": np.array([f.segment_ids for f in features], dtype=np.int64),
    }
    if is_training:
        arrays["start_positions"] = np.array([[f.start_position] for f in features], np.int64)
        arrays["end_positions"] = np.array([[f.end_position] for f in features], np.int64)
        arrays["is_impossible"] = np.array([[int(f.is_impossible)] for f in features], np.int64)
    return arrays


class FeatureWriter:
    """Writes ``InputFeatures`` to a TFRecord file (``tf.train.Example``s, all int64).

    Written to ``<file>.tmp-<pid>`` and renamed by ``close``; leaving a ``with`` block by an
    exception removes the temporary file.
    """

    def __init__(self, filename, is_training):
        self.filename = filename
        self.is_training = is_training
        self.num_features = 0
        self._pending = []
        self._writer = tfrecord_writer.TFRecordFileWriter(filename)

    def process_feature(self, feature):
        if self.is_training and feature.start_position is None:
            raise ValueError(f"feature {feature.unique_id} has no start_position: convert the "
                             "examples with is_training=True to write training records")
        self._pending.append(feature)
        self.num_features += 1
        if len(self._pending) >= _BATCH:
            self._flush()

    def _flush(self):
        if not self._pending:
            return
        kinds = dict.fromkeys(_FEATURE_NAMES_TRAIN if self.is_training else _FEATURE_NAMES,
                              tfrecord_writer.INT64)
        framed = tfrecord_writer.encode_tfrecords(
            _feature_arrays(self._pending, self.is_training), kinds)
        self._writer.write_tfrecords(framed, len(self._pending))
        self._pending = []

    def close(self):
        self._flush()
        self._writer.commit()

    def abort(self):
        self._pending = []
        self._writer.abort()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False


_FEATURE_NAMES = ("unique_ids", "input_ids", "input_mask", "segment_ids")
_FEATURE_NAMES_TRAIN = _FEATURE_NAMES + ("start_positions", "end_positions", "is_impossible")


def write_features(features, output_file, is_training):
    """Writes features to one TFRecord file (atomically); returns how many."""
    with FeatureWriter(output_file, is_training) as writer:
        for feature in features:
            writer.process_feature(feature)
    return writer.num_features


def feature_spec(max_seq_length, is_training):
    """``tf.io.parse_single_example`` spec of the records ``FeatureWriter`` writes."""
    import tensorflow as tf  # only here: the rest of the module does not need TensorFlow
    spec = {
        "unique_ids": tf.io.FixedLenFeature([], tf.int64),
        "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
    }
    if is_training:
        spec["start_positions"] = tf.io.FixedLenFeature([], tf.int64)
        spec["end_positions"] = tf.io.FixedLenFeature([], tf.int64)
        spec["is_impossible"] = tf.io.FixedLenFeature([], tf.int64)
    return spec
