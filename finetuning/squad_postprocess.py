"""Start/end logits -> SQuAD answer texts, as Google's ``run_squad.py`` ``write_predictions``.

For each example, over all of its windows (features):

* the ``n_best_size`` highest start logits and end logits give candidate spans; a span is kept
  when both ends lie in the paragraph part of the window, end >= start, it has at most
  ``max_answer_length`` pieces and its start piece has its maximum context in this window;
  its score is start logit + end logit;
* v2.0: the [CLS] score (start + end logit at position 0) of the window where it is lowest is
  the "null" score, and "" joins the candidates with it;
* the best distinct texts (at most ``n_best_size``) are kept. A span's text is its WordPieces
  joined (``##`` glued) and mapped back onto the original words by ``get_final_text``, which
  recovers the paragraph's own spelling, case and punctuation; probabilities are the softmax
  of the scores over the kept candidates;
* the prediction is the best candidate (v1.1); for v2.0 it is "" when
  null score - best non-null score > ``null_score_diff_threshold``, else the best non-null text.

Outputs (JSON, indent 4, written to a temporary file and renamed): predictions (id -> text),
n-best lists (id -> [{text, probability, start_logit, end_logit}]) and, for v2.0, the null
score differences (id -> float).
"""
import collections
import json
import math
import os

import numpy as np
from absl import logging

from data_prep.wordpiece.tokenization_reference import BasicTokenizer
from resilience.atomic_files import write_text_atomically

RawResult = collections.namedtuple("RawResult", ["unique_id", "start_logits", "end_logits"])

_Candidate = collections.namedtuple(
    "_Candidate", ["feature_index", "start_index", "end_index", "start_logit", "end_logit"])
_NbestEntry = collections.namedtuple("_NbestEntry", ["text", "start_logit", "end_logit"])


def _field(result, name):
    return result[name] if isinstance(result, dict) else getattr(result, name)


def best_indexes(logits, n_best_size):
    """Indexes of the ``n_best_size`` largest logits, largest first (lower index on ties)."""
    return np.argsort(-np.asarray(logits, dtype=np.float64), kind="stable")[:n_best_size].tolist()


def softmax(scores):
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(score - top) for score in scores]
    total = sum(exps)
    return [x / total for x in exps]


def _strip_spaces(text):
    """``text`` without " ", and for each kept character its index in ``text``."""
    kept, index_map = [], []
    for index, char in enumerate(text):
        if char != " ":
            kept.append(char)
            index_map.append(index)
    return "".join(kept), index_map


def get_final_text(pred_text, orig_text, do_lower_case, verbose_logging=False):
    """The part of ``orig_text`` (original words) that ``pred_text`` (normalized pieces) spells.

    ``pred_text`` is WordPiece text ("steve smith's" from "steve", "smith", "'", "s"); the
    original words may be "Steve Smith's." The original words are run through the
    BasicTokenizer and the prediction located in that; when the tokenized and original texts
    have the same characters apart from spaces, the prediction's first and last characters are
    carried over to the original text by position. Otherwise (prediction not found, lengths
    differ after normalization) the whole ``orig_text`` is returned.
    """
    tok_text = " ".join(BasicTokenizer(do_lower_case=do_lower_case).tokenize(orig_text))
    start = tok_text.find(pred_text)
    if start == -1:
        if verbose_logging:
            logging.info("Unable to find text: %r in %r", pred_text, orig_text)
        return orig_text
    end = start + len(pred_text) - 1

    orig_ns_text, orig_ns_to_s = _strip_spaces(orig_text)
    tok_ns_text, tok_ns_to_s = _strip_spaces(tok_text)
    if len(orig_ns_text) != len(tok_ns_text):
        if verbose_logging:
            logging.info("Length not equal after stripping spaces: %r vs %r",
                         orig_ns_text, tok_ns_text)
        return orig_text
    tok_s_to_ns = {s: ns for ns, s in enumerate(tok_ns_to_s)}
    orig_start = orig_ns_to_s[tok_s_to_ns[start]] if start in tok_s_to_ns else None
    orig_end = orig_ns_to_s[tok_s_to_ns[end]] if end in tok_s_to_ns else None
    if orig_start is None or orig_end is None:
        if verbose_logging:
            logging.info("Could not map the start or end of %r back to %r", pred_text, orig_text)
        return orig_text
    return orig_text[orig_start:orig_end + 1]


def pieces_to_text(pieces):
    """WordPieces -> text: "##" continuations glued to the previous piece, spaces cleaned."""
    text = " ".join(pieces).replace(" ##", "").replace("##", "")
    return " ".join(text.strip().split())


def _example_predictions(example, features, results_by_id, n_best_size, max_answer_length,
                         do_lower_case, version_2_with_negative, verbose_logging):
    candidates = []
    score_null = float("inf")
    null_feature_index = 0
    null_start_logit = null_end_logit = 0.0
    for feature_index, feature in enumerate(features):
        result = results_by_id.get(feature.unique_id)
        if result is None:
            raise ValueError(f"no result for feature unique_id {feature.unique_id} "
                             f"(question {example.qas_id})")
        start_logits = np.asarray(_field(result, "start_logits"), dtype=np.float64)
        end_logits = np.asarray(_field(result, "end_logits"), dtype=np.float64)
        if version_2_with_negative:
            feature_null_score = float(start_logits[0] + end_logits[0])
            if feature_null_score < score_null:
                score_null = feature_null_score
                null_feature_index = feature_index
                null_start_logit = float(start_logits[0])
                null_end_logit = float(end_logits[0])
        num_tokens = len(feature.tokens)
        end_candidates = best_indexes(end_logits, n_best_size)
        for start_index in best_indexes(start_logits, n_best_size):
            if (start_index >= num_tokens or start_index not in feature.token_to_orig_map
                    or not feature.token_is_max_context.get(start_index, False)):
                continue
            for end_index in end_candidates:
                if end_index >= num_tokens or end_index not in feature.token_to_orig_map:
                    continue
                if end_index < start_index or end_index - start_index + 1 > max_answer_length:
                    continue
                candidates.append(_Candidate(feature_index, start_index, end_index,
                                             float(start_logits[start_index]),
                                             float(end_logits[end_index])))
    if version_2_with_negative and features:
        candidates.append(_Candidate(null_feature_index, 0, 0, null_start_logit, null_end_logit))
    candidates.sort(key=lambda c: c.start_logit + c.end_logit, reverse=True)

    nbest, seen = [], set()
    for candidate in candidates:
        if len(nbest) >= n_best_size:
            break
        if candidate.start_index > 0:
            feature = features[candidate.feature_index]
            pieces = feature.tokens[candidate.start_index:candidate.end_index + 1]
            word_start = feature.token_to_orig_map[candidate.start_index]
            word_end = feature.token_to_orig_map[candidate.end_index]
            orig_text = " ".join(example.doc_tokens[word_start:word_end + 1])
            text = get_final_text(pieces_to_text(pieces), orig_text, do_lower_case,
                                  verbose_logging)
        else:
            text = ""
        if text in seen:
            continue
        seen.add(text)
        nbest.append(_NbestEntry(text, candidate.start_logit, candidate.end_logit))

    if version_2_with_negative:
        if "" not in seen and features:
            nbest.append(_NbestEntry("", null_start_logit, null_end_logit))
        # Only the null answer survived: add a placeholder non-null one (as Google does).
        if len(nbest) == 1:
            nbest.insert(0, _NbestEntry("empty", 0.0, 0.0))
    if not nbest:
        nbest.append(_NbestEntry("empty", 0.0, 0.0))

    probabilities = softmax([e.start_logit + e.end_logit for e in nbest])
    nbest_json = [collections.OrderedDict([("text", e.text), ("probability", p),
                                           ("start_logit", e.start_logit),
                                           ("end_logit", e.end_logit)])
                  for e, p in zip(nbest, probabilities)]
    if not version_2_with_negative:
        return nbest_json[0]["text"], nbest_json, None
    best_non_null = next(e for e in nbest if e.text)
    if not features:  # nothing to read the answer from
        return "", nbest_json, None
    score_diff = score_null - best_non_null.start_logit - best_non_null.end_logit
    return best_non_null.text, nbest_json, score_diff


def write_predictions(examples, features, results, n_best_size, max_answer_length, do_lower_case,
                      output_prediction_file, output_nbest_file, output_null_log_odds_file=None,
                      version_2_with_negative=False, null_score_diff_threshold=0.0,
                      verbose_logging=False):
    """Writes (and returns) predictions, n-best lists and, for v2.0, null score differences.

    ``results``: objects or dicts with ``unique_id``, ``start_logits``, ``end_logits`` (one
    per feature; logits over ``max_seq_length`` positions). Returns
    ``(predictions, nbest, null_odds)``; ``null_odds`` is empty unless
    ``version_2_with_negative``. Any output file argument may be None to skip that file.
    """
    features_by_example = collections.defaultdict(list)
    for feature in features:
        features_by_example[feature.example_index].append(feature)
    results_by_id = {int(_field(r, "unique_id")): r for r in results}

    predictions = collections.OrderedDict()
    nbest_json = collections.OrderedDict()
    null_odds = collections.OrderedDict()
    for example_index, example in enumerate(examples):
        text, nbest, score_diff = _example_predictions(
            example, features_by_example.get(example_index, []), results_by_id, n_best_size,
            max_answer_length, do_lower_case, version_2_with_negative, verbose_logging)
        nbest_json[example.qas_id] = nbest
        if version_2_with_negative:
            if score_diff is None:  # an example without features
                predictions[example.qas_id] = ""
                continue
            null_odds[example.qas_id] = score_diff
            predictions[example.qas_id] = "" if score_diff > null_score_diff_threshold else text
        else:
            predictions[example.qas_id] = text

    _write_json_atomic(output_prediction_file, predictions)
    _write_json_atomic(output_nbest_file, nbest_json)
    if version_2_with_negative:
        _write_json_atomic(output_null_log_odds_file, null_odds)
    return predictions, nbest_json, null_odds


def _write_json_atomic(path, value):
    if path is None:
        return
    write_text_atomically(os.fspath(path), json.dumps(value, indent=4) + "\n")
