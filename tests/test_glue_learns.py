"""GLUE fine-tuning with no optimizer flag learns, and a run that learns nothing says so.

Why: with NVIDIA's flag default (LAMB) Google's recipe flags fine-tuned a real pre-trained
model to exactly the majority-class accuracy, exit 0, and nothing said so. LAMB moves each
tensor by ~learning rate x its norm, so at 5e-5 the new classifier head hardly moves
(bench/glue_optimizers.py, docs/finetuning.md). The default is now Google's AdamWeightDecay,
and an evaluation that scores what a constant answer does prints one warning line."""
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from finetuning import glue_metrics as gm

WARNING = "the model learned nothing"


# ---------------------------------------------------------------- the metric's verdict

def test_classification_verdict_at_and_around_the_majority_class():
    labels = np.array([1] * 60 + [0] * 40)            # majority class 1: 0.60
    assert "every prediction '1'" in gm.no_learning("sst-2", np.ones(100, int), labels,
                                                    ["0", "1"])
    assert "every prediction" in gm.no_learning("mrpc", np.zeros(100, int), labels)
    # not constant, yet scoring the majority share within one example: nothing learned

    def flipped(ones, zeros):   # predictions with `ones` 1s and `zeros` 0s answered wrong
        predictions = labels.copy()
        predictions[:ones] = 0
        predictions[60:60 + zeros] = 1
        return predictions
    for ones, zeros, score in ((20, 20, 0.60), (20, 19, 0.61), (21, 20, 0.59)):
        assert gm.accuracy(flipped(ones, zeros), labels) == pytest.approx(score)
        assert gm.no_learning("sst-2", flipped(ones, zeros), labels) == (
            f"dev accuracy {score:.4f} = the majority class (0.6000)")
    # two examples above it, or a perfect score: learned
    assert gm.accuracy(flipped(19, 19), labels) == pytest.approx(0.62)
    assert gm.no_learning("sst-2", flipped(19, 19), labels) is None
    assert gm.no_learning("sst-2", labels, labels) is None
    # one example short of n: no verdict on a single example
    assert gm.no_learning("sst-2", [1], [1]) is None
    # probabilities: argmax, as task_metrics; NaN weights give NaN probabilities
    probabilities = np.stack([1 - labels, labels], axis=1).astype(float)
    assert gm.no_learning("sst-2", probabilities, labels) is None
    assert "not finite" in gm.no_learning("sst-2", np.full((100, 2), np.nan), labels)


@pytest.mark.parametrize("seed", range(6))
def test_classification_verdict_is_no_better_than_chance(seed):
    """Above the majority class by more than one example, the verdict is SciPy's chi-square
    test of independence of predictions and labels (two classes): it fires exactly when the
    correlation is not positive or the statistic is at most 4 (two standard errors)."""
    chi2_contingency = pytest.importorskip("scipy.stats").chi2_contingency
    rng = np.random.default_rng(seed)
    n = int(rng.integers(100, 400))
    labels = rng.integers(0, 2, n)
    majority = max(np.mean(labels), 1 - np.mean(labels))
    checked = 0
    for signal in (0.0, 0.05, 0.1, 0.15, 0.2, 0.5):  # share of predictions copied from labels
        predictions = np.where(rng.random(n) < signal, labels, rng.integers(0, 2, n))
        if (len(set(predictions)) == 1
                or abs(gm.accuracy(predictions, labels) - majority) <= 1 / n + 1e-12):
            continue                                  # the other two rules (above)
        confusion = np.zeros((2, 2))
        np.add.at(confusion, (labels, predictions), 1)
        statistic = chi2_contingency(confusion, correction=False)[0]
        positive = gm.matthews_corrcoef(predictions, labels) > 0
        verdict = gm.no_learning("sst-2", predictions, labels)
        assert (verdict is not None) == (not positive or statistic <= 4.0 + 1e-9), verdict
        if verdict:
            assert "no better than chance" in verdict
        checked += 1
    assert checked >= 4
    assert gm.no_learning("sst-2", labels, labels) is None


def test_a_head_still_at_its_random_start_is_caught_but_small_learned_logits_are_not():
    """Near-uniform probabilities (as LAMB at 5e-5 leaves a real model) whose argmax beats
    chance a little, as a random head on pre-trained features does: caught. The same
    small logits ranking the examples well: learned, not caught."""
    rng = np.random.default_rng(0)
    labels = np.tile([0, 1], 200)
    # a random head's ranking: right on 58% of the examples (MCC 0.16 > 2/sqrt(400) = 0.1)
    ids = labels.copy()
    ids[:168] = 1 - ids[:168]
    assert gm.matthews_corrcoef(ids, labels) == pytest.approx(0.16)

    def near_uniform(ids, margin):
        p1 = 0.5 + np.where(ids == 1, 1, -1) * rng.uniform(0.001, margin, ids.size)
        return np.stack([1 - p1, p1], axis=1)
    verdict = gm.no_learning("sst-2", near_uniform(ids, 0.03), labels)
    assert verdict and "near-uniform probabilities" in verdict and "a random head's" in verdict
    assert gm.no_learning("sst-2", near_uniform(labels, 0.03), labels) is None
    # the same ranking with confident probabilities: not near-uniform, and beats chance
    assert gm.no_learning("sst-2", near_uniform(ids, 0.49), labels) is None


@pytest.mark.parametrize("seed", range(6))
def test_regression_verdict_is_predicting_the_mean(seed):
    """STS-B: fires exactly when the predictions do no better than the labels' mean, within
    one example's share (scikit-learn's R^2 <= 1/n; R^2 = 0 is predicting the mean), or
    their correlation is within two standard errors of none (SciPy's Pearson r <= 2/sqrt(n))."""
    r2_score = pytest.importorskip("sklearn.metrics").r2_score
    pearsonr = pytest.importorskip("scipy.stats").pearsonr
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 300))
    labels = rng.uniform(0, 5, n)
    for quality in (0.0, 0.3, 0.9, 1.0):   # 0: noise around the mean; 1: the labels
        predictions = (quality * labels + (1 - quality) * labels.mean()
                       + rng.normal(0, 0.5 * (1 - quality), n))
        verdict = gm.no_learning("sts-b", predictions, labels)
        expected = (r2_score(labels, predictions) <= 1.0 / n
                    or pearsonr(predictions, labels)[0] <= 2 / np.sqrt(n))
        assert (verdict is not None) == expected, verdict
        if r2_score(labels, predictions) <= 1.0 / n:
            assert verdict.startswith("dev mean squared error")
    assert gm.no_learning("sts-b", np.full(n, labels.mean()), labels).startswith(
        "every dev prediction is")
    assert gm.no_learning("sts-b", labels + 0.01, labels) is None


# ---------------------------------------------------------------- the real model

def split_sst2(shared_data, folder, train, evaluate):
    """SST-2's dev file (the only labelled SST-2 here) shuffled once, as
    bench/glue_optimizers.py does: `train` examples to train, the next `evaluate` to score.
    Returns the majority-class share of the evaluated ones."""
    with open(os.path.join(shared_data, "glue", "SST-2", "dev.tsv"), encoding="utf-8") as r:
        lines = [line for line in r.read().split("\n") if line.strip()]
    header, rows = lines[0], lines[1:]
    random.Random(0).shuffle(rows)
    os.makedirs(folder, exist_ok=True)
    for name, part in (("train.tsv", rows[:train]), ("dev.tsv", rows[train:train + evaluate])):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as writer:
            writer.write("\n".join([header] + part) + "\n")
    labels = [int(row.split("\t")[1]) for row in rows[train:train + evaluate]]
    return max(labels.count(0), labels.count(1)) / len(labels)


def fine_tune(repo_root, folder, data, out, *flags):
    """run_classifier.py with Google's recipe flags (5e-5, batch 32, 3 epochs unless given)
    and no optimizer flag unless given; returns (dev accuracy, the console's warnings)."""
    result = subprocess.run(
        [sys.executable, "run_classifier.py", "--task_name=SST-2", f"--data_dir={data}",
         f"--vocab_file={folder}/vocab.txt", f"--bert_config_file={folder}/bert_config.json",
         f"--init_checkpoint={folder}", f"--output_dir={out}", "--do_train", "--do_eval",
         "--max_seq_length=64", "--learning_rate=5e-5", "--num_train_epochs=3",
         "--train_batch_size=32", "--eval_batch_size=64", "--seed=1", *flags],
        capture_output=True, text=True, cwd=repo_root, timeout=1200)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    results = dict(line.split(" = ") for line in
                   (out / "eval_results.txt").read_text().splitlines())
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    return float(results["eval_accuracy"]), warnings


@pytest.fixture(scope="module")
def sst2_split(shared_data, tmp_path_factory):
    data = tmp_path_factory.mktemp("sst2_split")
    return data, split_sst2(shared_data, str(data), train=400, evaluate=200)


@pytest.mark.long
@pytest.mark.oracle
@pytest.mark.slow
def test_googles_recipe_flags_learn_with_no_optimizer_flag(minilm_checkpoint, sst2_split,
                                                           tmp_path, repo_root):
    _, _, folder = minilm_checkpoint
    data, majority = sst2_split
    accuracy, warnings = fine_tune(repo_root, folder, data, tmp_path / "default")
    print(f"SST-2 held-out accuracy with no optimizer flag: {accuracy:.4f} "
          f"(majority class {majority:.4f})")
    assert accuracy >= majority + 0.15, (accuracy, majority)
    assert not [line for line in warnings if WARNING in line], warnings


@pytest.mark.oracle
@pytest.mark.slow
def test_a_run_that_learns_nothing_warns_naming_optimizer_and_rate(minilm_checkpoint,
                                                                   sst2_split, tmp_path,
                                                                   repo_root):
    """NVIDIA's flag default (LAMB) at Google's rate: one line, with what to try. One epoch
    (the bench's three end where they started too: bench/glue_optimizers.py)."""
    _, _, folder = minilm_checkpoint
    data, majority = sst2_split
    accuracy, warnings = fine_tune(repo_root, folder, data, tmp_path / "lamb",
                                   "--optimizer_type=lamb", "--num_train_epochs=1")
    found = [line for line in warnings if WARNING in line]
    assert len(found) == 1, warnings
    assert f"{accuracy:.4f}" in found[0]
    assert "optimizer lamb at learning rate 5e-05" in found[0]
    assert "--optimizer_type=adam" in found[0]
