"""GLUE metrics against scikit-learn/SciPy, hand-computed cases, and the result files."""
import os

import numpy as np
import pytest

from finetuning import glue_metrics as gm

sklearn_metrics = pytest.importorskip("sklearn.metrics")
scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 200))
    labels = rng.integers(0, 2, n)
    predictions = np.where(rng.random(n) < 0.7, labels, 1 - labels)
    assert gm.accuracy(predictions, labels) == pytest.approx(
        sklearn_metrics.accuracy_score(labels, predictions), abs=1e-12)
    assert gm.f1_score(predictions, labels) == pytest.approx(
        sklearn_metrics.f1_score(labels, predictions), abs=1e-12)
    assert gm.matthews_corrcoef(predictions, labels) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(labels, predictions), abs=1e-12)
    # Three classes (MNLI) for accuracy and MCC.
    labels3 = rng.integers(0, 3, n)
    predictions3 = np.where(rng.random(n) < 0.5, labels3, rng.integers(0, 3, n))
    assert gm.matthews_corrcoef(predictions3, labels3) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(labels3, predictions3), abs=1e-12)
    assert gm.accuracy(predictions3, labels3) == pytest.approx(
        sklearn_metrics.accuracy_score(labels3, predictions3), abs=1e-12)


def test_classification_edge_cases():
    labels = np.array([0, 1, 1, 0, 1])
    # Constant predictions: MCC 0 (sklearn), F1 of all-negative 0, of all-positive 2tp/(2tp+fp).
    for constant in (0, 1):
        p = np.full(5, constant)
        assert gm.matthews_corrcoef(p, labels) == sklearn_metrics.matthews_corrcoef(labels, p) == 0
    assert gm.f1_score(np.zeros(5, int), labels) == 0.0
    assert gm.f1_score(np.ones(5, int), labels) == pytest.approx(6 / 8)
    assert gm.f1_score(np.zeros(3, int), np.zeros(3, int)) == 0.0  # no positives at all
    # Hand-computed: tp=2, tn=1, fp=1, fn=1 -> mcc = (2*1 - 1*1)/sqrt(3*3*2*2) = 1/6.
    p = np.array([1, 1, 0, 0, 1])
    y = np.array([1, 1, 1, 0, 0])
    assert gm.matthews_corrcoef(p, y) == pytest.approx(1 / 6, abs=1e-15)
    assert gm.f1_score(p, y) == pytest.approx(4 / 6, abs=1e-15)
    assert gm.accuracy(p, y) == pytest.approx(0.6, abs=1e-15)
    assert gm.matthews_corrcoef(y, y) == 1.0 and gm.matthews_corrcoef(1 - y, y) == -1.0
    assert np.isnan(gm.accuracy([], []))
    with pytest.raises(ValueError, match="3 predictions but 2 labels"):
        gm.accuracy([0, 1, 1], [0, 1])


def test_correlations_match_scipy_with_ties():
    rng = np.random.default_rng(7)
    for _ in range(5):
        n = int(rng.integers(3, 300))
        labels = np.round(rng.uniform(0, 5, n) * 5) / 5  # STS-B scores, many ties
        predictions = np.round(labels + rng.normal(0, 1, n), 1)
        assert gm.pearson(predictions, labels) == pytest.approx(
            scipy_stats.pearsonr(predictions, labels)[0], abs=1e-12)
        assert gm.spearman(predictions, labels) == pytest.approx(
            scipy_stats.spearmanr(predictions, labels)[0], abs=1e-12)
        np.testing.assert_array_equal(gm.rank_average(labels), scipy_stats.rankdata(labels))


def test_correlation_edge_cases():
    # Hand-computed: ranks of [1, 2, 2, 3] are [1, 2.5, 2.5, 4].
    np.testing.assert_array_equal(gm.rank_average([3.0, 2.0, 1.0, 2.0]), [4, 2.5, 1, 2.5])
    assert gm.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert gm.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # Centred x = [-1, 0, 1], y = [-1, 1, 0]: sum of products 1, sums of squares 2 -> 0.5.
    assert gm.pearson([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5, abs=1e-15)
    assert gm.spearman([10, 20, 30, 40], [1, 4, 9, 16]) == pytest.approx(1.0)
    # Constant side: NaN like SciPy; fewer than two examples: NaN.
    assert np.isnan(gm.pearson([0.1, 0.1, 0.1], [1.0, 2.0, 3.0]))
    assert np.isnan(gm.spearman([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]))
    assert np.isnan(gm.pearson([1.0], [2.0]))


def test_padding_is_ignored():
    labels = np.array([1, 0, 1, 1, 0, 0])
    predictions = np.array([1, 0, 0, 1, 1, 1])
    weights = np.array([1, 1, 1, 1, 0, 0], dtype=np.float32)  # last two are padding
    assert gm.accuracy(predictions, labels, weights) == 0.75
    assert gm.f1_score(predictions, labels, weights) == pytest.approx(
        sklearn_metrics.f1_score(labels[:4], predictions[:4]))
    result = gm.task_metrics("cola", predictions, labels, weights)
    assert result["mcc"] == pytest.approx(
        sklearn_metrics.matthews_corrcoef(labels[:4], predictions[:4]))
    scores = np.array([0.5, 1.0, 2.5, 4.0, 99.0])
    preds = np.array([0.4, 1.5, 2.0, 4.5, -99.0])
    stsb = gm.task_metrics("sts-b", preds, scores, [1, 1, 1, 1, 0])
    assert stsb["pearson"] == pytest.approx(scipy_stats.pearsonr(preds[:4], scores[:4])[0])
    with pytest.raises(ValueError, match="mask of 0s and 1s"):
        gm.accuracy(predictions, labels, [0.5] * 6)


def test_task_metric_sets():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 50)
    probabilities = rng.random((50, 2))
    ids = probabilities.argmax(axis=1)
    expected = {
        "cola": {"mcc", "accuracy"},
        "SST-2": {"accuracy"}, "qnli": {"accuracy"}, "rte": {"accuracy"}, "wnli": {"accuracy"},
        "mnli": {"accuracy"}, "mnli-mm": {"accuracy"},
        "mrpc": {"accuracy", "f1", "acc_and_f1"}, "QQP": {"accuracy", "f1", "acc_and_f1"},
    }
    for task, names in expected.items():
        result = gm.task_metrics(task, probabilities, labels)
        assert set(result) == names, task
        assert result == gm.task_metrics(task, ids, labels)  # probabilities -> argmax
    mrpc = gm.task_metrics("mrpc", ids, labels)
    assert mrpc["acc_and_f1"] == pytest.approx((mrpc["accuracy"] + mrpc["f1"]) / 2)
    assert mrpc["f1"] == pytest.approx(sklearn_metrics.f1_score(labels, ids))
    scores = rng.uniform(0, 5, 40)
    preds = scores + rng.normal(0, 1, 40)
    stsb = gm.task_metrics("stsb", preds[:, None], scores)
    assert set(stsb) == {"pearson", "spearmanr", "corr"}
    assert stsb["spearmanr"] == pytest.approx(scipy_stats.spearmanr(preds, scores)[0])
    assert stsb["corr"] == pytest.approx((stsb["pearson"] + stsb["spearmanr"]) / 2)
    with pytest.raises(ValueError, match="unknown GLUE task"):
        gm.task_metrics("squad", ids, labels)


# ---------------------------------------------------------------------------
# Files

def _read(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def test_write_eval_results(tmp_path):
    path = str(tmp_path / "eval_results.txt")
    gm.write_eval_results(path, {"eval_accuracy": np.float32(0.875), "mcc": 0.5,
                                 "global_step": 120, "eval_loss": 0.25})
    assert _read(path) == ("eval_accuracy = 0.875\neval_loss = 0.25\n"
                           "global_step = 120\nmcc = 0.5\n")
    assert os.listdir(tmp_path) == ["eval_results.txt"]


def test_write_test_results(tmp_path):
    path = str(tmp_path / "test_results.tsv")
    probs = np.array([[0.25, 0.5, 0.25], [0.125, 0.125, 0.75]], dtype=np.float32)
    assert gm.write_test_results(path, probs, ["contradiction", "entailment", "neutral"],
                                 "mnli") == 2
    assert _read(path) == "0.25\t0.5\t0.25\n0.125\t0.125\t0.75\n"
    with pytest.raises(ValueError, match=r"expected \(examples, 2\) probabilities"):
        gm.write_test_results(path, probs, ["0", "1"], "cola")
    gm.write_test_results(path, np.array([[3.5], [1.25]]), [], "sts-b")
    assert _read(path) == "3.5\n1.25\n"


def test_write_glue_submission(tmp_path):
    path = str(tmp_path / gm.submission_file_name("cola"))
    assert path.endswith("CoLA.tsv")
    assert gm.write_glue_submission(path, np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]),
                                    ["0", "1"], "cola") == 3
    assert _read(path) == "index\tprediction\n0\t0\n1\t1\n2\t0\n"
    path = str(tmp_path / gm.submission_file_name("mnli-mm"))
    assert path.endswith("MNLI-mm.tsv") and gm.submission_file_name("mnli") == "MNLI-m.tsv"
    gm.write_glue_submission(path, [2, 0, 1], ["contradiction", "entailment", "neutral"],
                             "mnli-mm", indices=[5, 6, 7])
    assert _read(path) == ("index\tprediction\n5\tneutral\n6\tcontradiction\n"
                           "7\tentailment\n")
    path = str(tmp_path / gm.submission_file_name("rte"))
    gm.write_glue_submission(path, [1], ["entailment", "not_entailment"], "rte")
    assert _read(path) == "index\tprediction\n0\tnot_entailment\n"
    path = str(tmp_path / gm.submission_file_name("sts-b"))
    gm.write_glue_submission(path, np.array([[4.12345], [0.5]]), [], "sts-b")
    assert _read(path) == "index\tprediction\n0\t4.123\n1\t0.500\n"
    with pytest.raises(ValueError, match="class ids"):
        gm.write_glue_submission(path, [3], ["0", "1"], "sst-2")
    assert sorted(os.listdir(tmp_path)) == ["CoLA.tsv", "MNLI-mm.tsv", "RTE.tsv", "STS-B.tsv"]
