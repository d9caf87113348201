"""The unigram baseline of masked-LM evaluation: the line a pre-trained model must beat.

A model that ignores the context and always predicts the training records' token
frequencies reaches a held-out masked-LM loss of H(eval targets; training frequencies) and
an accuracy equal to the share of the most frequent token. A model that ends there has
learned nothing but those frequencies, and that happens easily: too few steps, a learning
rate too low or too high, a trust ratio that freezes the biases. `ln(vocab_size)` is no
yardstick, since every model leaves it in its first few dozen steps.

Both sides are read through the pre-training input pipeline, so every kind of records
works the same way (static or dynamic masking, packed or not): the training records'
masked-LM targets (for dynamic records, those of the evaluation masks) give the
frequencies, add-one smoothed so that a token never seen in training costs a finite loss;
the evaluation records' targets, read exactly as `run_pretraining.py --do_eval` reads them
(first `max_eval_examples`), give the loss and accuracy. The next-sentence baseline is the
majority label's share.
"""
import numpy as np
import tensorflow as tf

from modeling import BertConfig
from pretraining.dynamic_masking import DynamicMasking
from pretraining.input_pipeline import list_input_files, make_dataset
from pretraining.record_checks import check_input_files
from pretraining.record_kinds import DYNAMIC


def _masked_targets(files, config, max_seq_length, max_predictions_per_seq, max_examples,
                    batch_size):
    """(masked-LM target ids, next-sentence labels) of the first `max_examples` examples of
    `files` (all when None), as the evaluation pipeline masks and batches them."""
    facts, _ = check_input_files(files, max_seq_length, max_predictions_per_seq, config)
    masking = DynamicMasking(max_predictions_per_seq) if facts.kind == DYNAMIC else None
    dataset = make_dataset(files, batch_size, max_seq_length, max_predictions_per_seq, False,
                           masking=masking, sequences_per_row=facts.sequences_per_row,
                           drop_remainder=False)
    targets, labels, seen = [], [], 0
    for batch in dataset:
        ids = batch["masked_lm_ids"].numpy()
        weights = batch["masked_lm_weights"].numpy()
        nsp = batch["next_sentence_labels"].numpy()
        nsp_weights = batch.get("next_sentence_weights")
        if max_examples is not None:
            keep = max_examples - seen
            ids, weights, nsp = ids[:keep], weights[:keep], nsp[:keep]
            nsp_weights = None if nsp_weights is None else nsp_weights[:keep]
        targets.append(ids[weights > 0])
        labels.append(nsp.reshape(-1) if nsp_weights is None
                      else nsp.reshape(-1)[nsp_weights.numpy().reshape(-1) > 0])
        seen += len(ids)
        if max_examples is not None and seen >= max_examples:
            break
    return np.concatenate(targets), np.concatenate(labels)


def unigram_baseline(train_files, eval_files, bert_config, max_seq_length,
                     max_predictions_per_seq, max_eval_examples=None,
                     max_train_examples=None, eval_batch_size=256):
    """The held-out metrics of always predicting the training records' token frequencies.

    train_files, eval_files: record files or the forms `run_pretraining.py` takes (a folder,
      a glob, a comma-separated list). bert_config: a `BertConfig` or its JSON file (for
      `vocab_size`). max_eval_examples: as `--max_eval_steps * --eval_batch_size`, so the
      baseline covers the same examples as the evaluation. max_train_examples: a sample of
      the training records is enough for the frequencies of a large corpus (None: all).
      eval_batch_size: as `--eval_batch_size`, for dynamic-masking evaluation records, whose
      masks are drawn per batch.
    Returns {"masked_lm_loss", "masked_lm_accuracy", "next_sentence_accuracy",
      "train_targets", "eval_targets"} (the last two: how many masked tokens each side had).
    """
    config = (bert_config if isinstance(bert_config, BertConfig)
              else BertConfig.from_json_file(bert_config))
    read = lambda files, limit, batch_size=256: _masked_targets(  # noqa: E731
        list_input_files(files) if isinstance(files, str) else list(files), config,
        max_seq_length, max_predictions_per_seq, limit, batch_size)
    train_targets, train_labels = read(train_files, max_train_examples)
    eval_targets, eval_labels = read(eval_files, max_eval_examples, eval_batch_size)
    counts = np.bincount(train_targets, minlength=config.vocab_size).astype(np.float64) + 1.0
    log_probs = np.log(counts) - np.log(counts.sum())
    majority = int(np.bincount(train_labels, minlength=2).argmax())
    return {
        "masked_lm_loss": float(-log_probs[eval_targets].mean()),
        "masked_lm_accuracy": float(np.mean(eval_targets == int(counts.argmax()))),
        "next_sentence_accuracy": float(np.mean(eval_labels == majority)),
        "train_targets": int(len(train_targets)),
        "eval_targets": int(len(eval_targets)),
    }
