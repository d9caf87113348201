"""GLUE metrics (numpy, float64) and the result files of fine-tuning.

Metrics take ``(predictions, labels, weights=None)``; ``weights`` is the ``is_real_example``
mask (0 or 1): entries with weight 0 are padding examples and are left out. All metrics
here are symmetric in their two arguments. A metric of no examples is NaN, as is a
correlation with a constant side (SciPy's answer); Matthews correlation is 0 when either
side is constant (scikit-learn's answer).

Per task, ``task_metrics`` reports the GLUE set:

* CoLA: ``mcc`` (and ``accuracy``);
* SST-2, MNLI, MNLI-mm, QNLI, RTE, WNLI: ``accuracy``;
* MRPC, QQP: ``accuracy``, ``f1`` (positive class 1) and ``acc_and_f1`` (their mean);
* STS-B: ``pearson``, ``spearmanr`` (average ranks for ties) and ``corr`` (their mean).

``eval_result_names`` renames them as Google's and NVIDIA's ``eval_results.txt`` have them
(``eval_accuracy``, ``eval_f1``, ``MCC``, ...), so tools that grep those files read ours.
``no_learning`` says when the predictions score what a constant answer does (the majority
class; STS-B: the labels' mean) or are no more related to the labels than chance: the
driver then warns that the model learned nothing.

Files (each written to a temporary name and renamed):

* ``write_eval_results`` (training/eval_results.py): ``eval_results.txt``, ``key = value``
  lines, sorted keys;
* ``write_test_results``: Google's ``test_results.tsv``, the class probabilities of each
  example tab-separated on one line (STS-B: the predicted score);
* ``write_glue_submission``: the GLUE server's format, header ``index<TAB>prediction`` then
  one ``index<TAB>label`` line per example (label strings, or the STS-B score), in the file
  named by ``submission_file_name`` (``CoLA.tsv``, ``MNLI-m.tsv``, ...).
"""
import numpy as np

from finetuning.glue_data import canonical_task_name
from training.eval_results import write_atomically, write_eval_results  # noqa: F401 (API)

# Metric names reported per (canonical) task name.
TASK_METRIC_NAMES = {
    "cola": ("mcc", "accuracy"),
    "sst-2": ("accuracy",),
    "mrpc": ("accuracy", "f1", "acc_and_f1"),
    "sts-b": ("pearson", "spearmanr", "corr"),
    "qqp": ("accuracy", "f1", "acc_and_f1"),
    "mnli": ("accuracy",),
    "mnli-mm": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}

REGRESSION_TASKS = frozenset(["sts-b"])

# File names the GLUE server expects in a submission zip.
SUBMISSION_FILE_NAMES = {
    "cola": "CoLA.tsv",
    "sst-2": "SST-2.tsv",
    "mrpc": "MRPC.tsv",
    "sts-b": "STS-B.tsv",
    "qqp": "QQP.tsv",
    "mnli": "MNLI-m.tsv",
    "mnli-mm": "MNLI-mm.tsv",
    "qnli": "QNLI.tsv",
    "rte": "RTE.tsv",
    "wnli": "WNLI.tsv",
}


# ---------------------------------------------------------------------------
# Metrics

def _select(predictions, labels, weights, dtype):
    """Flattened arrays of the real (weight 1) examples; checks lengths and the mask."""
    predictions = np.asarray(predictions).reshape(-1)
    labels = np.asarray(labels).reshape(-1)
    if predictions.shape != labels.shape:
        raise ValueError(f"{predictions.size} predictions but {labels.size} labels")
    if weights is not None:
        weights = np.asarray(weights).reshape(-1)
        if weights.shape != labels.shape:
            raise ValueError(f"{weights.size} weights but {labels.size} labels")
        if not np.all((weights == 0) | (weights == 1)):
            raise ValueError("weights must be an is_real_example mask of 0s and 1s")
        keep = weights == 1
        predictions, labels = predictions[keep], labels[keep]
    if dtype is not None:
        predictions = predictions.astype(dtype)
        labels = labels.astype(dtype)
    return predictions, labels


def accuracy(predictions, labels, weights=None):
    """Fraction of equal entries."""
    predictions, labels = _select(predictions, labels, weights, None)
    if labels.size == 0:
        return float("nan")
    return float(np.mean(predictions == labels, dtype=np.float64))


def f1_score(predictions, labels, weights=None, positive=1):
    """Binary F1 of the class ``positive``: 2tp / (2tp + fp + fn); 0 when that is 0/0."""
    predictions, labels = _select(predictions, labels, weights, None)
    if labels.size == 0:
        return float("nan")
    pred_pos = predictions == positive
    true_pos = labels == positive
    tp = np.float64(np.count_nonzero(pred_pos & true_pos))
    fp = np.float64(np.count_nonzero(pred_pos & ~true_pos))
    fn = np.float64(np.count_nonzero(~pred_pos & true_pos))
    denominator = 2.0 * tp + fp + fn
    return float(2.0 * tp / denominator) if denominator else 0.0


def matthews_corrcoef(predictions, labels, weights=None):
    """Matthews correlation (multi-class R_K form); 0 when either side is constant."""
    predictions, labels = _select(predictions, labels, weights, None)
    if labels.size == 0:
        return float("nan")
    classes, codes = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    k = len(classes)
    true_codes, pred_codes = codes[:labels.size], codes[labels.size:]
    confusion = np.bincount(true_codes * k + pred_codes, minlength=k * k).reshape(k, k)
    confusion = confusion.astype(np.float64)
    true_totals = confusion.sum(axis=1)
    pred_totals = confusion.sum(axis=0)
    n = confusion.sum()
    correct = np.trace(confusion)
    covariance = correct * n - np.dot(true_totals, pred_totals)
    pred_variance = n * n - np.dot(pred_totals, pred_totals)
    true_variance = n * n - np.dot(true_totals, true_totals)
    if pred_variance == 0 or true_variance == 0:
        return 0.0
    return float(covariance / np.sqrt(pred_variance * true_variance))


def pearson(predictions, labels, weights=None):
    """Pearson correlation in float64; NaN with fewer than 2 examples or a constant side."""
    x, y = _select(predictions, labels, weights, np.float64)
    return _pearson(x, y)


def _pearson(x, y):
    if x.size < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    dx = x - x.mean()
    dy = y - y.mean()
    # Normalising first keeps the products in range for large values.
    dx /= np.linalg.norm(dx)
    dy /= np.linalg.norm(dy)
    return float(np.clip(np.dot(dx, dy), -1.0, 1.0))


def rank_average(values):
    """1-based ranks, tied values sharing the mean of their ranks (SciPy's ``rankdata``)."""
    values = np.asarray(values).reshape(-1)
    n = values.size
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    run_starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if n else \
        np.zeros(0, dtype=np.int64)
    run_ends = np.r_[run_starts[1:], n]
    run_of = np.repeat(np.arange(len(run_starts)), run_ends - run_starts)
    mean_rank = (run_starts + run_ends + 1) / 2.0  # mean of start+1 .. end
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = mean_rank[run_of]
    return ranks


def spearman(predictions, labels, weights=None):
    """Spearman correlation: Pearson of the average ranks."""
    x, y = _select(predictions, labels, weights, np.float64)
    return _pearson(rank_average(x), rank_average(y))


def _class_ids(predictions):
    """Class ids from ids or from (n, num_labels) scores/probabilities (argmax)."""
    predictions = np.asarray(predictions)
    if predictions.ndim == 2 and predictions.shape[1] > 1:
        return np.argmax(predictions, axis=1)
    return predictions.reshape(-1)


def task_metrics(task_name, predictions, labels, weights=None):
    """The GLUE metrics of ``task_name`` as ``{name: float}``.

    ``predictions``: class ids or ``(n, num_labels)`` probabilities/logits (argmax is
    taken); STS-B: predicted scores. ``weights``: ``is_real_example`` (padding is ignored).
    """
    task = canonical_task_name(task_name)
    if task in REGRESSION_TASKS:
        p = pearson(np.asarray(predictions).reshape(-1), labels, weights)
        s = spearman(np.asarray(predictions).reshape(-1), labels, weights)
        return {"pearson": p, "spearmanr": s, "corr": (p + s) / 2.0}
    ids = _class_ids(predictions)
    result = {"accuracy": accuracy(ids, labels, weights)}
    names = TASK_METRIC_NAMES[task]
    if "mcc" in names:
        result["mcc"] = matthews_corrcoef(ids, labels, weights)
    if "f1" in names:
        result["f1"] = f1_score(ids, labels, weights)
        result["acc_and_f1"] = (result["accuracy"] + result["f1"]) / 2.0
    return result


# A classifier whose probabilities' mean entropy is at least NEAR_UNIFORM of a uniform
# guess's (ln k) and whose Matthews correlation is at most RANDOM_HEAD_MCC predicts what
# its random initial head does. Measured with all-MiniLM-L6-v2 on SST-2: 2000 random heads
# (normal, stddev 0.02, cut at 2 sigma) on its 872 dev examples give entropy shares >= 0.997
# and |MCC| <= 0.14 (median 0.03); after LAMB at 5e-5 (56 steps) or 3e-6 (112) the heads
# are still there on 272 held-out examples (>= 0.9997, MCC -0.07 to 0.20). The MCC bound is what keeps
# a model whose logits are still small but whose ranking was learned: AdamWeightDecay at
# 3e-6 (entropy >= 0.9995, MCC 0.32-0.38, accuracy 0.66-0.69); at 5e-5 it leaves the
# uniform far behind (0.31, MCC 0.62). bench/glue_optimizers.py has the runs.
NEAR_UNIFORM = 0.99
RANDOM_HEAD_MCC = 0.25


def no_learning(task_name, predictions, labels, label_list=None):
    """What shows that these predictions learned nothing, as a phrase, or None.

    Why: a fine-tuning whose optimizer hardly moved the new head (LAMB at fine-tuning
    rates) scores what its random head scores, writes its eval_results.txt and exits 0;
    nothing else tells the user. Classification: every prediction is the same class; the
    accuracy is within one example of the majority class's share (what always answering
    that class scores); the class probabilities are near-uniform (mean entropy at least
    NEAR_UNIFORM of ln k) with a Matthews correlation a random head reaches (at most
    RANDOM_HEAD_MCC): what a head that hardly left its random initialisation gives, which
    on a pre-trained model's features can still beat chance a little, so the last rule
    alone misses it; or the predictions are no more related to the labels than chance:
    their Matthews correlation is under two standard errors of independence, 2 / sqrt(n)
    (for two classes sqrt(n) x MCC is the square root of the chi-square statistic, ~N(0, 1)
    when predictions and labels are independent). Regression (STS-B): every prediction is
    the same; the mean squared error is within one example's share of the labels' variance
    (what predicting their mean scores) or above it; or the Pearson correlation is under
    2 / sqrt(n). Pass the real examples only (no padding)."""
    labels = np.asarray(labels).reshape(-1)
    n = labels.size
    if n < 2:
        return None
    if not np.all(np.isfinite(np.asarray(predictions, np.float64))):
        return "dev predictions are not finite (NaN or inf weights?)"
    chance = 2.0 / np.sqrt(n)
    if canonical_task_name(task_name) in REGRESSION_TASKS:
        values = np.asarray(predictions, np.float64).reshape(-1)
        labels = labels.astype(np.float64)
        mse = float(np.mean((values - labels) ** 2))
        variance = float(np.var(labels))
        if np.all(values == values[0]):
            return f"every dev prediction is {values[0]:.4g} (mean squared error {mse:.4f})"
        if mse >= variance * (1.0 - 1.0 / n):
            return (f"dev mean squared error {mse:.4f} = predicting the mean "
                    f"({variance:.4f})")
        correlation = pearson(values, labels)
        if not correlation > chance:   # NaN (constant labels) included
            return (f"dev Pearson correlation {correlation:.4f}, no better than chance "
                    f"(under {chance:.4f})")
        return None
    ids = _class_ids(predictions)
    score = accuracy(ids, labels)
    majority = float(np.max(np.unique(labels, return_counts=True)[1])) / n
    if np.all(ids == ids[0]):
        name = label_list[int(ids[0])] if label_list is not None else int(ids[0])
        return (f"dev accuracy {score:.4f} with every prediction {name!r} (majority class "
                f"{majority:.4f})")
    if abs(score - majority) <= 1.0 / n + 1e-12:
        return f"dev accuracy {score:.4f} = the majority class ({majority:.4f})"
    mcc = matthews_corrcoef(ids, labels)
    probabilities = np.asarray(predictions, np.float64)
    if probabilities.ndim == 2 and probabilities.shape[1] > 1 and mcc <= RANDOM_HEAD_MCC:
        entropy = -np.sum(probabilities * np.log(np.maximum(probabilities, 1e-30)), axis=1)
        uniform = float(np.mean(entropy) / np.log(probabilities.shape[1]))
        if uniform >= NEAR_UNIFORM:
            return (f"dev accuracy {score:.4f} with near-uniform probabilities (entropy "
                    f"{uniform:.2%} of a uniform guess's) and Matthews correlation {mcc:.4f}: "
                    "a random head's")
    if mcc <= chance:
        return (f"dev accuracy {score:.4f}, no better than chance (Matthews correlation "
                f"{mcc:.4f}, under {chance:.4f}; majority class {majority:.4f})")
    return None


# Names in eval_results.txt: Google's run_classifier.py writes eval_accuracy (and eval_loss),
# NVIDIA's adds eval_f1 (MRPC) and MCC (CoLA); the others follow the eval_ pattern.
_EVAL_RESULT_NAMES = {"accuracy": "eval_accuracy", "f1": "eval_f1", "mcc": "MCC"}


def eval_result_names(metrics):
    """``task_metrics`` keys renamed as in Google's/NVIDIA's ``eval_results.txt``."""
    return {_EVAL_RESULT_NAMES.get(key, f"eval_{key}"): value for key, value in metrics.items()}


# ---------------------------------------------------------------------------
# Result files

def _is_regression(task_name):
    return canonical_task_name(task_name) in REGRESSION_TASKS


def write_test_results(path, probabilities_or_values, label_list, task_name):
    """Google's ``test_results.tsv``: each example's class probabilities, tab-separated.

    STS-B: one predicted score a line. Pass only the real examples (no padding rows).
    Returns the number of lines written.
    """
    values = np.asarray(probabilities_or_values)
    if _is_regression(task_name):
        rows = [str(v) for v in values.reshape(-1)]
    else:
        num_labels = len(label_list)
        if values.ndim != 2 or values.shape[1] != num_labels:
            raise ValueError(f"{path}: expected (examples, {num_labels}) probabilities, "
                             f"got shape {values.shape}")
        rows = ["\t".join(str(p) for p in row) for row in values]
    write_atomically(path, "".join(row + "\n" for row in rows))
    return len(rows)


def submission_file_name(task_name):
    """The GLUE server's file name for the task (``CoLA.tsv``, ``MNLI-mm.tsv``, ...)."""
    return SUBMISSION_FILE_NAMES[canonical_task_name(task_name)]


def write_glue_submission(path, predictions, label_list, task_name, indices=None):
    """The GLUE server's ``index<TAB>prediction`` file.

    ``predictions``: class ids or ``(n, num_labels)`` probabilities (argmax), written as the
    label strings of ``label_list``; STS-B: scores, written with 3 decimals. ``indices``
    default to 0..n-1, the test files' ``index`` column. Pass only the real examples.
    Returns the number of examples written.
    """
    if _is_regression(task_name):
        cells = [f"{float(v):.3f}" for v in np.asarray(predictions, np.float64).reshape(-1)]
    else:
        ids = _class_ids(predictions)
        if ids.size and (not np.issubdtype(ids.dtype, np.integer)
                         or ids.min() < 0 or ids.max() >= len(label_list)):
            raise ValueError(f"{path}: predictions must be class ids in "
                             f"[0, {len(label_list)}) or probabilities")
        cells = [str(label_list[i]) for i in ids.tolist()]
    if indices is None:
        indices = range(len(cells))
    indices = list(indices)
    if len(indices) != len(cells):
        raise ValueError(f"{path}: {len(indices)} indices for {len(cells)} predictions")
    lines = ["index\tprediction\n"]
    lines += [f"{index}\t{cell}\n" for index, cell in zip(indices, cells)]
    write_atomically(path, "".join(lines))
    return len(cells)
