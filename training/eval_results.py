"""`eval_results.txt` as Google's and NVIDIA's BERT scripts write it, so tooling that greps
their names reads ours: one `key = value` line per metric, keys sorted.

Names: pre-training `global_step`, `loss`, `masked_lm_accuracy`, `masked_lm_loss`,
`next_sentence_accuracy`, `next_sentence_loss` (the Estimator's evaluation); GLUE
`eval_accuracy`, `eval_loss`, `global_step`, `loss`, then the task's own (`eval_f1`, `MCC`
as NVIDIA names them, ...); SQuAD the official scorer's `exact_match` and `f1`.
Written to a temporary name and renamed (`resilience.atomic_files`): a reader never sees
half a file.
"""
from resilience.atomic_files import write_text_atomically as write_atomically  # noqa: F401


def write_eval_results(path, metrics):
    """Google's `eval_results.txt`: `key = value` per line, keys sorted."""
    write_atomically(path, "".join(f"{key} = {metrics[key]}\n" for key in sorted(metrics)))
