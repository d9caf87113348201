"""`eval_results.txt` as Google's and NVIDIA's BERT scripts write it, so tooling that greps
their names reads ours: one `key = value` line per metric, keys sorted.

Names: pre-training `global_step`, `loss`, `masked_lm_accuracy`, `masked_lm_loss`,
`next_sentence_accuracy`, `next_sentence_loss` (the Estimator's evaluation); GLUE
`eval_accuracy`, `eval_loss`, `global_step`, `loss`, then the task's own (`eval_f1`, `MCC`
as NVIDIA names them, ...); SQuAD the official scorer's `exact_match` and `f1`.
Written to a temporary name and renamed: a reader never sees half a file.
"""
import os


def write_atomically(path, text):
    """`text` into `path` through `<path>.tmp-<pid>` and a rename."""
    tmp_path = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp_path, "w", encoding="utf-8", newline="\n") as writer:
            writer.write(text)
        os.replace(tmp_path, path)
    finally:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)


def write_eval_results(path, metrics):
    """Google's `eval_results.txt`: `key = value` per line, keys sorted."""
    write_atomically(path, "".join(f"{key} = {metrics[key]}\n" for key in sorted(metrics)))
