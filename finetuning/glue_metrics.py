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
