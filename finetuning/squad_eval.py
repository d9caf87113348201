"""The official SQuAD metric, v1.1 and v2.0 in one module, with the official scripts' CLI.

    python -m finetuning.squad_eval DATA_FILE PREDICTIONS_FILE
        [--na-prob-file F] [--na-prob-thresh T] [--out-file F] [--version-2]

The numbers are those of the official evaluation scripts (written here from their documented
behaviour, not copied):

* answers are normalized by lower-casing, deleting every ``string.punctuation`` character,
  replacing the whole words a/an/the by a space and collapsing whitespace;
* exact match compares normalized strings; F1 is the harmonic mean of precision and recall of
  the normalized tokens (a multiset intersection); each question takes the best score over its
  ground truths.

v1.1 (``{"exact_match": .., "f1": ..}``, percentages over every question): a prediction that
normalizes to nothing scores F1 = 0; a missing prediction scores 0 and prints the official
``Unanswered question <id> will receive score 0.`` to stderr.

v2.0 (``exact``, ``f1``, ``total``, ``HasAns_*``, ``NoAns_*`` and, with a no-answer
probability file, ``best_exact``/``best_exact_thresh``/``best_f1``/``best_f1_thresh``): an
unanswerable question has the single ground truth "" (as have answerable ones whose answers
all normalize to nothing); when either side has no tokens F1 is 1 if both are empty, else 0.
A question whose no-answer probability exceeds ``--na-prob-thresh`` (default 1.0) counts as
answered "no answer". v2 is chosen by ``--version-2``, by any ``is_impossible`` key in the data,
or by ``--na-prob-file``.

Where the official v2 script would crash (a missing prediction id, or a question missing from
the no-answer probability file), this module instead scores the missing prediction 0 (with a
``Missing prediction for <id>`` line on stderr) and rejects an incomplete probability file with
a one-line error.
"""
import argparse
import collections
import json
import os
import re
import string
import sys

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


class SquadFileError(ValueError):
    """A SQuAD data, prediction or probability file that cannot be used; names the file."""

    def __init__(self, path, problem):
        self.path = path
        super().__init__(f"{path}: {problem}")


# ---------------------------------------------------------------------------
# Reading files.

def load_json_file(path, what="file"):
    """Parses a JSON file; any failure becomes one ``SquadFileError`` line naming the file."""
    path = os.fspath(path)
    try:
        if "://" in path:
            import tensorflow as tf  # remote paths only: TensorFlow is slow to import
            with tf.io.gfile.GFile(path, "rb") as f:
                raw = f.read()
        else:
            with open(path, "rb") as f:
                raw = f.read()
    except OSError as e:
        raise SquadFileError(path, f"cannot read {what}: {e.strerror or e}") from None
    except Exception as e:  # tf.errors.* for remote paths
        raise SquadFileError(path, f"cannot read {what}: {e}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SquadFileError(path, f"{what} is not UTF-8 text (byte {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SquadFileError(path, f"{what} is not valid JSON ({e.msg} at line {e.lineno} "
                                   f"column {e.colno})") from None


def dataset_articles(dataset_json, source="<dataset>"):
    """The article list of a SQuAD dataset (the parsed file, or its ``data`` list itself)."""
    if isinstance(dataset_json, dict):
        if "data" not in dataset_json:
            raise SquadFileError(source, "not a SQuAD dataset: no top-level 'data' key")
        articles = dataset_json["data"]
    else:
        articles = dataset_json
    if not isinstance(articles, list):
        raise SquadFileError(source, "not a SQuAD dataset: 'data' is not a list")
    return articles


def load_dataset(path):
    """Reads a SQuAD dataset file to score (or predict) it; returns the parsed JSON (checked
    to have a ``data`` list and no question id twice: ``check_unique_ids``)."""
    dataset = load_json_file(path, "SQuAD dataset")
    check_unique_ids(dataset, path)
    return dataset


def repeated_ids(dataset_json, source="<dataset>"):
    """[(id, where it first is, where it is again)] for every question after the first of
    its id, in file order (``where``: ``data[a].paragraphs[p].qas[q]``)."""
    first, repeats = {}, []
    for where, qa in iter_located_questions(dataset_articles(dataset_json, source), source):
        key = str(qa["id"])  # as a key of predictions.json: 7 and "7" are one
        if key in first:
            repeats.append((qa["id"], first[key], where))
        else:
            first[key] = where
    return repeats


def check_unique_ids(dataset_json, source="<dataset>"):
    """Raises SquadFileError naming the file, the first question id used twice and both
    places. Why refuse rather than predict both: predictions (``predictions.json``, the
    official evaluation scripts' input) are a JSON object keyed by question id, so one of
    the two answers overwrote the other and the scores covered one question fewer, in
    silence; no key for the second question could be read by the official scripts."""
    repeats = repeated_ids(dataset_json, source)
    if repeats:
        qid, first, again = repeats[0]
        more = f" ({len(repeats)} repeated in all)" if len(repeats) > 1 else ""
        raise SquadFileError(source, f"question id {qid!r} is used twice, by {first} and "
                                     f"{again}{more}: answers are keyed by id (predictions.json, "
                                     "the official evaluation), so one would overwrite the "
                                     "other; give each question its own id")


def iter_questions(articles, source="<dataset>"):
    """Yields every ``qa`` dict in file order, checking the structure the metric relies on."""
    for _, qa in iter_located_questions(articles, source):
        yield qa


def iter_located_questions(articles, source="<dataset>"):
    """``iter_questions`` with where each is: ``(data[a].paragraphs[p].qas[q], qa)``."""
    for a, article in enumerate(articles):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise SquadFileError(source, f"data[{a}] has no 'paragraphs' list")
        for p, paragraph in enumerate(paragraphs):
            qas = paragraph.get("qas") if isinstance(paragraph, dict) else None
            if not isinstance(qas, list):
                raise SquadFileError(source, f"data[{a}].paragraphs[{p}] has no 'qas' list")
            for q, qa in enumerate(qas):
                where = f"data[{a}].paragraphs[{p}].qas[{q}]"
                if not isinstance(qa, dict) or "id" not in qa:
                    raise SquadFileError(source, f"{where} has no 'id'")
                answers = qa.get("answers", [])
                if not isinstance(answers, list) or not all(
                        isinstance(x, dict) and isinstance(x.get("text"), str) for x in answers):
                    raise SquadFileError(source, f"{where} ('{qa['id']}'): 'answers' must be "
                                                 "a list of {{\"text\": ...}} objects")
                yield where, qa


def is_version_2(dataset_json):
    """True when any question of the dataset carries an ``is_impossible`` key."""
    try:
        articles = dataset_articles(dataset_json)
    except SquadFileError:
        return False
    return any("is_impossible" in qa
               for article in articles if isinstance(article, dict)
               for paragraph in article.get("paragraphs", []) if isinstance(paragraph, dict)
               for qa in paragraph.get("qas", []) if isinstance(qa, dict))


def load_predictions(path):
    """Reads a predictions file: a JSON object question id -> answer text."""
    predictions = load_json_file(path, "predictions file")
    check_predictions(predictions, path)
    return predictions


def check_predictions(predictions, source="<predictions>"):
    if not isinstance(predictions, dict):
        raise SquadFileError(source, "predictions must be a JSON object {question id: text}")
    for qid, text in predictions.items():
        if not isinstance(text, str):
            raise SquadFileError(source, f"prediction for '{qid}' is a "
                                         f"{type(text).__name__}, not a string")


def load_na_probs(path):
    """Reads a no-answer probability file: a JSON object question id -> number."""
    na_probs = load_json_file(path, "no-answer probability file")
    if not isinstance(na_probs, dict):
        raise SquadFileError(path, "no-answer probabilities must be a JSON object "
                                   "{question id: number}")
    for qid, value in na_probs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SquadFileError(path, f"no-answer probability of '{qid}' is not a number")
    return na_probs


# ---------------------------------------------------------------------------
# The metric.

def normalize_answer(text):
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def answer_tokens(text):
    return normalize_answer(text).split() if text else []


def exact_match_score(prediction, ground_truth):
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def _token_f1(prediction_tokens, truth_tokens):
    overlap = collections.Counter(prediction_tokens) & collections.Counter(truth_tokens)
    common = sum(overlap.values())
    if common == 0:
        return 0
    precision = 1.0 * common / len(prediction_tokens)
    recall = 1.0 * common / len(truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def f1_score(prediction, ground_truth):
    """v1.1 token F1 (0 when nothing is shared, including when both sides are empty)."""
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    return max(metric_fn(prediction, truth) for truth in ground_truths)


def compute_exact(gold, prediction):
    """v2.0 exact match as 0/1."""
    return int(normalize_answer(gold) == normalize_answer(prediction))


def compute_f1(gold, prediction):
    """v2.0 token F1: with an empty side it is 1 when both are empty, else 0."""
    gold_tokens, prediction_tokens = answer_tokens(gold), answer_tokens(prediction)
    if not gold_tokens or not prediction_tokens:
        return int(gold_tokens == prediction_tokens)
    return _token_f1(prediction_tokens, gold_tokens)


def evaluate_v1(dataset_json, predictions, source="<dataset>"):
    """The v1.1 metric: ``{"exact_match": %, "f1": %}`` over every question of the dataset."""
    exact_match = f1 = 0
    total = 0
    for qa in iter_questions(dataset_articles(dataset_json, source), source):
        total += 1
        if qa["id"] not in predictions:
            print(f"Unanswered question {qa['id']} will receive score 0.", file=sys.stderr)
            continue
        ground_truths = [answer["text"] for answer in qa["answers"]]
        if not ground_truths:
            raise SquadFileError(source, f"question '{qa['id']}' has no answers "
                                         "(a v2.0 file? pass --version-2)")
        prediction = predictions[qa["id"]]
        exact_match += metric_max_over_ground_truths(exact_match_score, prediction, ground_truths)
        f1 += metric_max_over_ground_truths(f1_score, prediction, ground_truths)
    if total == 0:
        raise SquadFileError(source, "the dataset has no questions")
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


def get_raw_scores(dataset_json, predictions, source="<dataset>"):
    """v2.0 per-question scores: (exact, f1, has_answer) dicts keyed by question id.

    Missing predictions score 0 (with a line on stderr).
    """
    exact_scores, f1_scores, has_answer = {}, {}, collections.OrderedDict()
    for qa in iter_questions(dataset_articles(dataset_json, source), source):
        qid = qa["id"]
        gold_answers = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])]
        has_answer[qid] = bool(gold_answers)
        if not gold_answers:  # unanswerable: the only correct prediction is ""
            gold_answers = [""]
        if qid not in predictions:
            print(f"Missing prediction for {qid}", file=sys.stderr)
            exact_scores[qid] = f1_scores[qid] = 0
            continue
        prediction = predictions[qid]
        exact_scores[qid] = max(compute_exact(a, prediction) for a in gold_answers)
        f1_scores[qid] = max(compute_f1(a, prediction) for a in gold_answers)
    return exact_scores, f1_scores, has_answer


def apply_no_answer_threshold(scores, na_probs, has_answer, na_prob_thresh):
    """Questions with a no-answer probability above the threshold count as answered ""."""
    new_scores = {}
    for qid, score in scores.items():
        if na_probs[qid] > na_prob_thresh:
            new_scores[qid] = float(not has_answer[qid])
        else:
            new_scores[qid] = score
    return new_scores


def _summary(exact_scores, f1_scores, qid_list=None):
    if qid_list is None:
        total = len(exact_scores)
        return collections.OrderedDict([
            ("exact", 100.0 * sum(exact_scores.values()) / total),
            ("f1", 100.0 * sum(f1_scores.values()) / total),
            ("total", total)])
    total = len(qid_list)
    return collections.OrderedDict([
        ("exact", 100.0 * sum(exact_scores[k] for k in qid_list) / total),
        ("f1", 100.0 * sum(f1_scores[k] for k in qid_list) / total),
        ("total", total)])


def find_best_threshold(predictions, scores, na_probs, has_answer):
    """Best score (in %) over all no-answer thresholds, and that threshold.

    Starting from "answer nothing" (every unanswerable question right), questions are switched
    to their prediction in increasing no-answer probability; the best running total wins.
    """
    current = sum(1 for qid in has_answer if not has_answer[qid])
    best_score, best_threshold = current, 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            diff = scores[qid]
        else:
            # A wrong answer to an unanswerable question costs the point "" would have earned.
            diff = -1 if predictions.get(qid, "missing") else 0
        current += diff
        if current > best_score:
            best_score, best_threshold = current, na_probs[qid]
    return 100.0 * best_score / len(scores), best_threshold


def evaluate_v2(dataset_json, predictions, na_probs=None, na_prob_thresh=1.0,
                source="<dataset>", na_prob_source="<na_probs>"):
    """The v2.0 metric dict (``best_*`` entries only when ``na_probs`` is given)."""
    exact_raw, f1_raw, has_answer = get_raw_scores(dataset_json, predictions, source)
    if not has_answer:
        raise SquadFileError(source, "the dataset has no questions")
    given_na_probs = na_probs is not None
    if na_probs is None:
        na_probs = {qid: 0.0 for qid in has_answer}
    else:
        missing = [qid for qid in has_answer if qid not in na_probs]
        if missing:
            raise SquadFileError(na_prob_source, f"no probability for {len(missing)} question(s), "
                                                 f"e.g. '{missing[0]}'")
    exact = apply_no_answer_threshold(exact_raw, na_probs, has_answer, na_prob_thresh)
    f1 = apply_no_answer_threshold(f1_raw, na_probs, has_answer, na_prob_thresh)
    result = _summary(exact, f1)
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid, has in has_answer.items() if has == wanted]
        if qids:
            for key, value in _summary(exact, f1, qids).items():
                result[f"{prefix}_{key}"] = value
    if given_na_probs:
        best_exact, exact_thresh = find_best_threshold(predictions, exact_raw, na_probs, has_answer)
        best_f1, f1_thresh = find_best_threshold(predictions, f1_raw, na_probs, has_answer)
        result["best_exact"] = best_exact
        result["best_exact_thresh"] = exact_thresh
        result["best_f1"] = best_f1
        result["best_f1_thresh"] = f1_thresh
    return dict(result)


def evaluate(dataset_json, predictions, na_probs=None, na_prob_thresh=1.0,
             version_2_with_negative=None, source="<dataset>"):
    """The official metric of ``predictions`` (id -> text) on a parsed SQuAD dataset
    (``source``: its file, which errors name).

    v1.1 gives ``{"exact_match", "f1"}``; v2.0 (``version_2_with_negative=True``, or ``None``
    and the data has ``is_impossible`` keys or ``na_probs`` is given) the v2 script's dict.
    """
    check_predictions(predictions)
    if version_2_with_negative is None:
        version_2_with_negative = na_probs is not None or is_version_2(dataset_json)
    if version_2_with_negative:
        return evaluate_v2(dataset_json, predictions, na_probs, na_prob_thresh, source=source)
    return evaluate_v1(dataset_json, predictions, source)


# ---------------------------------------------------------------------------
# Command line.

def _parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m finetuning.squad_eval",
        description="Official SQuAD v1.1 / v2.0 evaluation (v2.0 when the data has "
                    "is_impossible, with --version-2 or with --na-prob-file).")
    parser.add_argument("data_file", metavar="data.json", help="SQuAD dataset file")
    parser.add_argument("pred_file", metavar="pred.json", help="predictions: {id: text}")
    parser.add_argument("--out-file", "-o", metavar="eval.json",
                        help="write the metrics to this file instead of stdout")
    parser.add_argument("--na-prob-file", "-n", metavar="na_prob.json",
                        help="model estimates of the probability of no answer (v2.0)")
    parser.add_argument("--na-prob-thresh", "-t", type=float, default=1.0,
                        help='predict "" when the no-answer probability exceeds this '
                             "(default 1.0)")
    parser.add_argument("--version-2", action="store_true", dest="version_2",
                        help="use the v2.0 metric even without is_impossible in the data")
    return parser.parse_args(argv)


def run_eval_script(script, predict_file, predictions_file, timeout=3600):
    """Runs an evaluation script as NVIDIA's run_squad.py runs its --eval_script (`python
    SCRIPT predict_file predictions_file`, the official evaluate-v1.1.py/-v2.0.py interface)
    and returns the numbers of the JSON it prints, prefixed `eval_script_`. A script that
    fails or prints no JSON costs a warning, not the run's results: {} then."""
    import logging
    import subprocess
    try:
        done = subprocess.run([sys.executable, script, predict_file, predictions_file],
                              capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        logging.warning("--eval_script %s did not run: %s", script, err)
        return {}
    output = done.stdout.strip()
    try:
        scores = json.loads(output[output.index("{"):]) if done.returncode == 0 else None
    except ValueError:
        scores = None
    if not isinstance(scores, dict):
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        logging.warning("--eval_script %s gave no scores (%s)", script, last)
        return {}
    numbers = {f"eval_script_{key}": float(value) for key, value in scores.items()
               if isinstance(value, (int, float))}
    logging.info("--eval_script %s: %s", script, ", ".join(
        f"{key} = {value:.4f}" for key, value in numbers.items()))
    return numbers


def main(argv=None):
    args = _parse_args(argv)
    try:
        dataset = load_dataset(args.data_file)
        predictions = load_predictions(args.pred_file)
        na_probs = load_na_probs(args.na_prob_file) if args.na_prob_file else None
        version_2 = args.version_2 or na_probs is not None or is_version_2(dataset)
        if version_2:
            result = evaluate_v2(dataset, predictions, na_probs, args.na_prob_thresh,
                                 source=args.data_file, na_prob_source=args.na_prob_file)
            text = json.dumps(result, indent=2)
        else:
            if str(dataset.get("version", "1.1")) != "1.1":
                print(f"Evaluation expects v-1.1, but got dataset with v-{dataset['version']}",
                      file=sys.stderr)
            result = evaluate_v1(dataset, predictions, source=args.data_file)
            text = json.dumps(result)
        if args.out_file:
            _write_text_atomic(args.out_file, json.dumps(result))
        else:
            print(text)
    except (SquadFileError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _write_text_atomic(path, text):
    tmp_path = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp_path, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp_path, path)
    except OSError as e:
        raise SquadFileError(path, f"cannot write: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)


if __name__ == "__main__":
    sys.exit(main())
