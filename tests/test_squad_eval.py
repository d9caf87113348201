"""The SQuAD metric (finetuning.squad_eval) against hand-computed values and an independent
re-implementation, on the real SQuAD v1.1 sample and a small hand-written v2.0 file."""
import itertools
import json
import os
import string
import subprocess
import sys

import pytest

from finetuning import squad_eval

SAMPLE = "squad/sample-v1.1.json"


# ---------------------------------------------------------------------------
# An independent, deliberately plain re-implementation of the v1.1 metric.

def _ref_normalize(text):
    text = text.lower()
    text = text.translate({ord(c): None for c in string.punctuation})
    # Whole-word articles: runs of word characters (what \w matches) equal to a/an/the.
    out = []
    for is_word, run in itertools.groupby(text, key=lambda c: c.isalnum() or c == "_"):
        run = "".join(run)
        out.append(" " if is_word and run in ("a", "an", "the") else run)
    return " ".join("".join(out).split())


def _ref_f1(prediction, truth):
    p, t = _ref_normalize(prediction).split(), _ref_normalize(truth).split()
    remaining = list(t)
    common = 0
    for token in p:
        if token in remaining:
            remaining.remove(token)
            common += 1
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(t)
    return 2 * precision * recall / (precision + recall)


def _ref_evaluate_v1(dataset, predictions):
    em = f1 = 0.0
    n = 0
    for article in dataset["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                n += 1
                if qa["id"] not in predictions:
                    continue
                pred = predictions[qa["id"]]
                truths = [a["text"] for a in qa["answers"]]
                em += max(float(_ref_normalize(pred) == _ref_normalize(t)) for t in truths)
                f1 += max(_ref_f1(pred, t) for t in truths)
    return {"exact_match": 100 * em / n, "f1": 100 * f1 / n}


def _questions(dataset):
    return [qa for a in dataset["data"] for p in a["paragraphs"] for qa in p["qas"]]


def _only(dataset, qid):
    """The dataset reduced to one question."""
    for article in dataset["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                if qa["id"] == qid:
                    return {"version": "1.1", "data": [{"title": article["title"], "paragraphs": [
                        {"context": paragraph["context"], "qas": [qa]}]}]}
    raise KeyError(qid)


@pytest.fixture(scope="module")
def sample(shared_data):
    path = os.path.join(shared_data, SAMPLE)
    with open(path, encoding="utf-8") as f:
        return path, json.load(f)


def _variant(text, i):
    """Same normalized text, different surface: case, punctuation, articles, whitespace."""
    kind = i % 4
    if kind == 0:
        return text.upper()
    if kind == 1:
        return f"  The {text} !!"
    if kind == 2:
        return "\t" + "   ".join(text.split()) + " ."
    return f"a {text.lower()}, an"


def _mixed_predictions(dataset):
    """Exact copies, partial overlaps, empty strings, variants, unrelated text, missing ids."""
    predictions = {}
    for i, qa in enumerate(_questions(dataset)):
        first = qa["answers"][0]["text"]
        kind = i % 7
        if kind == 0:
            predictions[qa["id"]] = first
        elif kind == 1:
            words = first.split()
            predictions[qa["id"]] = " ".join(words[:-1] if len(words) > 1 else words + ["extra"])
        elif kind == 2:
            predictions[qa["id"]] = ""
        elif kind == 3:
            predictions[qa["id"]] = _variant(first, i)
        elif kind == 4:
            predictions[qa["id"]] = qa["answers"][-1]["text"] + " and more words here"
        elif kind == 5:
            predictions[qa["id"]] = "zebra quantum"
        # kind 6: missing
    return predictions


# ---------------------------------------------------------------------------
# Hand-computed cases.

@pytest.mark.parametrize("qid, prediction, exact, f1", [
    # "American Football Conference" (all three): 2 of 3 tokens, precision 1, recall 2/3.
    ("56be8e613aeaaa14008c90d3", "American Conference", 0.0, 2 * (1 * 2 / 3) / (1 + 2 / 3)),
    # Case, article, punctuation and whitespace do not matter.
    ("56be4db0acb8001400a502ec", "  THE denver\tBroncos!! ", 1.0, 1.0),
    # 'Santa Clara, California' gives 0.8; the 11-token third answer only 2*(2/11)/(1+2/11).
    ("56be4db0acb8001400a502ee", "Santa Clara", 0.0, 0.8),
    # Punctuation is deleted, not replaced by a space: "gold-themed" -> "goldthemed".
    ("56be8e613aeaaa14008c90d1", "Gold themed", 0.0, 0.0),
    ("56be8e613aeaaa14008c90d1", "gold-Themed.", 1.0, 1.0),
    # "the 2015 season" normalizes to "2015 season".
    ("56beace93aeaaa14008c91e3", "2015 season", 1.0, 1.0),
    # Multiset overlap: "february" counts once against 'February 7, 2016' (p = r = 2/3).
    ("56bf10f43aeaaa14008c9501", "February February 7", 0.0, 2 / 3),
    # Best of '"golden anniversary"' (p 2/3, r 1 -> 0.8) and 'gold' (p 1/3, r 1 -> 0.5).
    ("56bea9923aeaaa14008c91b9", "golden gold anniversary", 0.0, 0.8),
    ("56be4e1facb8001400a502f9", "", 0.0, 0.0),
    # Only articles: nothing left to share, F1 0 (v1.1).
    ("56be4e1facb8001400a502f9", "the an a", 0.0, 0.0),
    # The en dash is not in string.punctuation: "24–10" stays one token.
    ("56bf10f43aeaaa14008c9500", "24 10", 0.0, 0.0),
    ("56bf10f43aeaaa14008c9500", "24–10.", 1.0, 1.0),
])
def test_v1_hand_computed(sample, qid, prediction, exact, f1):
    _, dataset = sample
    result = squad_eval.evaluate(_only(dataset, qid), {qid: prediction})
    assert result == pytest.approx({"exact_match": 100 * exact, "f1": 100 * f1}, abs=1e-9)


def test_v1_missing_prediction_scores_zero(sample, capsys):
    _, dataset = sample
    qid = "56be4db0acb8001400a502ec"
    assert squad_eval.evaluate(_only(dataset, qid), {}) == {"exact_match": 0.0, "f1": 0.0}
    assert f"Unanswered question {qid} will receive score 0." in capsys.readouterr().err


def test_normalization_and_token_f1():
    assert squad_eval.normalize_answer("  The Cat's  HAT, a thing! ") == "cats hat thing"
    # Articles only as whole words; "theatre" and "analyst" keep their letters.
    assert squad_eval.normalize_answer("Theatre an analyst") == "theatre analyst"
    assert squad_eval.normalize_answer("the–end") == "–end"  # \b before the en dash
    assert squad_eval.f1_score("the", "a") == 0  # v1.1: nothing shared
    assert squad_eval.exact_match_score("the", "a")  # both normalize to ""
    assert squad_eval.compute_f1("the", "a") == 1  # v2.0: both empty
    assert squad_eval.compute_f1("", "cat") == 0
    assert squad_eval.compute_f1("cat dog", "dog cat") == 1.0


# ---------------------------------------------------------------------------
# Whole file, library and CLI.

def test_v1_whole_sample_matches_reference(sample, capsys):
    _, dataset = sample
    predictions = _mixed_predictions(dataset)
    result = squad_eval.evaluate(dataset, predictions)
    expected = _ref_evaluate_v1(dataset, predictions)
    assert set(result) == {"exact_match", "f1"}
    assert result == pytest.approx(expected, abs=1e-9)
    # The mixture exercises every case: not all right, not all wrong.
    assert 20 < result["exact_match"] < result["f1"] < 80
    missing = [qa["id"] for qa in _questions(dataset) if qa["id"] not in predictions]
    err = capsys.readouterr().err
    assert err.count("will receive score 0.") == len(missing) == 1057 // 7 + (1057 % 7 > 6)
    # Perfect predictions score 100.
    perfect = {qa["id"]: qa["answers"][0]["text"] for qa in _questions(dataset)}
    assert squad_eval.evaluate(dataset, perfect) == {"exact_match": 100.0, "f1": 100.0}


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "finetuning.squad_eval", *args],
                          capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_cli_prints_same_numbers(sample, tmp_path):
    path, dataset = sample
    predictions = _mixed_predictions(dataset)
    pred_file = tmp_path / "predictions.json"
    pred_file.write_text(json.dumps(predictions))
    proc = _cli(path, str(pred_file))
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert list(printed) == ["exact_match", "f1"]
    assert printed == pytest.approx(_ref_evaluate_v1(dataset, predictions), abs=1e-9)
    assert "Unanswered question" in proc.stderr
    out_file = tmp_path / "eval.json"
    proc = _cli(path, str(pred_file), "--out-file", str(out_file))
    assert proc.returncode == 0 and proc.stdout == ""
    assert json.loads(out_file.read_text()) == printed


# ---------------------------------------------------------------------------
# v2.0

V2_DATA = {"version": "v2.0", "data": [{"title": "T", "paragraphs": [
    {"context": "Paris is the capital. The blue whale is large. It was 1990.",
     "qas": [
         {"id": "q1", "question": "Capital?", "is_impossible": False,
          "answers": [{"text": "Paris", "answer_start": 0},
                      {"text": "the city of Paris", "answer_start": 0}]},
         {"id": "q2", "question": "Large?", "is_impossible": False,
          "answers": [{"text": "blue whale", "answer_start": 26}]},
         {"id": "q3", "question": "Moon?", "is_impossible": True, "answers": []},
         {"id": "q4", "question": "Sun?", "is_impossible": True, "answers": []},
         {"id": "q5", "question": "Year?", "is_impossible": False,
          "answers": [{"text": "1990", "answer_start": 55}]},
     ]}]}]}
V2_PREDICTIONS = {"q1": "Paris", "q2": "whale", "q3": "", "q4": "something", "q5": ""}
V2_NA_PROBS = {"q1": 0.1, "q2": 0.6, "q5": 0.8, "q3": 0.9, "q4": 0.95}
# Raw scores: exact q1..q5 = 1, 0, 1, 0, 0; F1 = 1, 2/3 (1 of 2 tokens), 1, 0, 0.


def test_v2_default_threshold():
    result = squad_eval.evaluate(V2_DATA, V2_PREDICTIONS)
    assert result == pytest.approx({
        "exact": 100 * 2 / 5, "f1": 100 * (1 + 2 / 3 + 1) / 5, "total": 5,
        "HasAns_exact": 100 * 1 / 3, "HasAns_f1": 100 * (1 + 2 / 3) / 3, "HasAns_total": 3,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2}, abs=1e-9)


def test_v2_na_probs_threshold_and_best():
    result = squad_eval.evaluate(V2_DATA, V2_PREDICTIONS, na_probs=V2_NA_PROBS,
                                 na_prob_thresh=0.5)
    # Above 0.5: q2, q5 (answerable -> 0), q3, q4 (unanswerable -> 1).
    # Best threshold, from "answer nothing" (2 right) in increasing probability:
    # exact: q1 +1 -> 3 (at 0.1), q2 +0, q5 +0, q3 +0, q4 -1 -> best 3/5 at 0.1;
    # F1: q1 +1 -> 3 (0.1), q2 +2/3 -> 3.667 (0.6), ... q4 -1 -> best 3.667/5 at 0.6.
    assert result == pytest.approx({
        "exact": 60.0, "f1": 60.0, "total": 5,
        "HasAns_exact": 100 / 3, "HasAns_f1": 100 / 3, "HasAns_total": 3,
        "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 2,
        "best_exact": 60.0, "best_exact_thresh": 0.1,
        "best_f1": 100 * (3 + 2 / 3) / 5, "best_f1_thresh": 0.6}, abs=1e-9)


def test_v2_threshold_is_strict():
    # At 0.6 only q5, q3, q4 count as "no answer": q2 (exactly 0.6) keeps its F1 of 2/3.
    result = squad_eval.evaluate(V2_DATA, V2_PREDICTIONS, na_probs=V2_NA_PROBS,
                                 na_prob_thresh=0.6)
    assert result["exact"] == pytest.approx(60.0)
    assert result["f1"] == pytest.approx(100 * (3 + 2 / 3) / 5)


def test_v2_cli(tmp_path):
    data, pred, na = tmp_path / "dev-v2.json", tmp_path / "pred.json", tmp_path / "na.json"
    data.write_text(json.dumps(V2_DATA))
    pred.write_text(json.dumps(V2_PREDICTIONS))
    na.write_text(json.dumps(V2_NA_PROBS))
    proc = _cli(str(data), str(pred), "--na-prob-file", str(na), "--na-prob-thresh", "0.5")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert printed == squad_eval.evaluate(V2_DATA, V2_PREDICTIONS, V2_NA_PROBS, 0.5)
    assert list(printed) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1",
                             "HasAns_total", "NoAns_exact", "NoAns_f1", "NoAns_total",
                             "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]
    proc = _cli(str(data), str(pred))
    assert json.loads(proc.stdout)["exact"] == pytest.approx(40.0)
    assert "best_exact" not in json.loads(proc.stdout)


# ---------------------------------------------------------------------------
# Bad input.

def test_bad_files_give_one_line_errors(sample, tmp_path):
    path, _ = sample
    not_json = tmp_path / "broken.json"
    not_json.write_text('{"data": [')
    no_data = tmp_path / "nodata.json"
    no_data.write_text('{"version": "1.1"}')
    pred = tmp_path / "pred.json"
    pred.write_text("{}")
    for bad, args in ((not_json, (str(not_json), str(pred))),
                      (no_data, (str(no_data), str(pred))),
                      (not_json, (path, str(not_json))),
                      (tmp_path / "absent.json", (path, str(tmp_path / "absent.json")))):
        proc = _cli(*args)
        assert proc.returncode == 1
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and str(bad) in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr
    with pytest.raises(squad_eval.SquadFileError, match="no top-level 'data' key"):
        squad_eval.load_dataset(no_data)
    with pytest.raises(squad_eval.SquadFileError, match="is a int, not a string"):
        squad_eval.evaluate({"data": []}, {"q": 3})
