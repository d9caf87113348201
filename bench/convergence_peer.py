"""The peer of `bench/convergence.py`: HuggingFace `BertForPreTraining` pre-trained the way a
HuggingFace user would, on the same records, batch, steps and schedule as ours.

Two sub-commands, each run in its own process by the study:

* ``convert RECORDS... --out FILE.npz --seq S --pred P``: reads static pre-training records
  with TensorFlow (Google's feature spec) into one `.npz`. It runs before the peer's
  timing starts and in another process, so that the peer's process never loads TensorFlow
  (two frameworks' thread pools in one process slow both: seen here as 2/3 of the CPU in
  the kernel).
* ``train --spec FILE.json``: one two-phase pre-training run (phase 1 at seq 128, phase 2
  at 512 from phase 1's weights with a fresh optimizer and schedule, as NVIDIA's recipe and
  ours do). The spec names the `.npz` files, the model config, batch, steps, warm-up,
  learning rate, optimizer, seed, the steps to evaluate at and the output folder.

The loop is HuggingFace's usual one (their `run_mlm.py`/`Trainer` defaults where the spec
says nothing): `torch.optim.AdamW` (betas 0.9/0.999, eps 1e-8) with weight decay 0.01 on
everything but biases and LayerNorm, gradients clipped to norm 1.0,
`get_linear_schedule_with_warmup`; or, with ``optimizer: lamb``, the LAMB of PyPI's
`pytorch-optimizer` (kozistr/pytorch_optimizer, the maintained torch package that has one;
torch-optimizer's last release is from 2021 and apex's FusedLAMB needs CUDA) with NVIDIA's
LAMB schedule (linear warm-up, then decay with power 0.5 from step 0, as ours). Labels are
the records' masked-LM targets (-100 elsewhere) and next-sentence labels (1 = random, the
same convention as Google's records). The records are shuffled with a seeded permutation
each epoch.

Timing: ``train_seconds`` (wall) and ``cpu_seconds`` (this process) count from the process
start (imports, model build and data loading included, as ours count from the command's
start) and stop while evaluating. Each evaluation point writes one JSON line to
``<out>/curve.jsonl``: phase, step, sequences seen, seconds, learning rate, the held-out
masked-LM loss and accuracy and next-sentence accuracy at seq 128 (and at 512 where the
spec asks). The final weights go to ``<out>/phase_<n>/`` with `save_pretrained`.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

PROCESS_START = time.time()
FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
            "masked_lm_weights", "next_sentence_labels")


def convert(files, out, seq, pred):
    """Static pre-training records -> one .npz of their features (TensorFlow imported here
    only)."""
    import tensorflow as tf
    spec = {name: tf.io.FixedLenFeature([seq], tf.int64)
            for name in ("input_ids", "input_mask", "segment_ids")}
    spec.update({name: tf.io.FixedLenFeature([pred], tf.int64)
                 for name in ("masked_lm_positions", "masked_lm_ids")})
    spec["masked_lm_weights"] = tf.io.FixedLenFeature([pred], tf.float32)
    spec["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)
    dataset = tf.data.TFRecordDataset(sorted(files)).map(
        lambda record: tf.io.parse_single_example(record, spec)).batch(4096)
    columns = {name: [] for name in FEATURES}
    for batch in dataset:
        for name in FEATURES:
            columns[name].append(batch[name].numpy())
    arrays = {name: np.concatenate(parts) for name, parts in columns.items()}
    tmp = f"{out}.tmp-{os.getpid()}.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, out)


class Records:
    """Static records in memory, as torch batches with HuggingFace's labels."""

    def __init__(self, path):
        with np.load(path) as data:
            self.arrays = {name: data[name] for name in FEATURES}
        self.size = len(self.arrays["input_ids"])

    def batch(self, index):
        import torch
        take = {name: values[index] for name, values in self.arrays.items()}
        ids = torch.from_numpy(take["input_ids"].astype(np.int64))
        labels = torch.full(ids.shape, -100, dtype=torch.long)
        rows, slots = np.nonzero(take["masked_lm_weights"] > 0)
        labels[rows, take["masked_lm_positions"][rows, slots]] = torch.from_numpy(
            take["masked_lm_ids"][rows, slots].astype(np.int64))
        return {"input_ids": ids,
                "attention_mask": torch.from_numpy(take["input_mask"].astype(np.int64)),
                "token_type_ids": torch.from_numpy(take["segment_ids"].astype(np.int64)),
                "labels": labels,
                "next_sentence_label": torch.from_numpy(
                    take["next_sentence_labels"][:, 0].astype(np.int64))}


def evaluate(model, records, examples, batch_size=64):
    """Held-out masked-LM loss (mean over masked tokens), accuracy, next-sentence accuracy
    over the first `examples` records."""
    import torch
    model.eval()
    loss_sum = correct = tokens = nsp_correct = 0.0
    count = min(examples, records.size)
    with torch.no_grad():
        for start in range(0, count, batch_size):
            batch = records.batch(np.arange(start, min(start + batch_size, count)))
            labels = batch.pop("labels")
            nsp = batch.pop("next_sentence_label")
            out = model(**batch)
            real = labels != -100
            log_probs = torch.log_softmax(out.prediction_logits[real].float(), dim=-1)
            targets = labels[real]
            loss_sum += -log_probs.gather(1, targets[:, None]).sum().item()
            correct += (log_probs.argmax(-1) == targets).sum().item()
            tokens += real.sum().item()
            nsp_correct += (out.seq_relationship_logits.argmax(-1) == nsp).sum().item()
    model.train()
    return {"masked_lm_loss": loss_sum / tokens, "masked_lm_accuracy": correct / tokens,
            "next_sentence_accuracy": nsp_correct / count}


def make_optimizer(model, kind, learning_rate, steps, warmup):
    """(optimizer, scheduler): HuggingFace's AdamW recipe or pytorch-optimizer's LAMB."""
    import torch
    from transformers import get_linear_schedule_with_warmup
    no_decay = ("bias", "LayerNorm.weight", "LayerNorm.bias")
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(x in n for x in no_decay)],
         "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(x in n for x in no_decay)],
         "weight_decay": 0.0}]
    if kind == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=learning_rate)
        return optimizer, get_linear_schedule_with_warmup(optimizer, warmup, steps)
    if kind == "lamb":
        from pytorch_optimizer import Lamb
        optimizer = Lamb(groups, lr=learning_rate)

        def nvidia_lamb(step):  # ours' LAMB schedule (optimization/learning_rate.py)
            if step < warmup:
                return step / warmup
            return max(0.0, 1.0 - step / steps) ** 0.5
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, nvidia_lamb)
    raise ValueError(f"unknown optimizer {kind!r}")


class Clock:
    """Wall and CPU seconds since the process started, excluding paused intervals."""

    def __init__(self):
        self.paused_wall = self.paused_cpu = 0.0

    def now(self):
        return (time.time() - PROCESS_START - self.paused_wall,
                time.process_time() - self.paused_cpu)

    def pause(self):
        return time.time(), time.process_time()

    def resume(self, mark):
        self.paused_wall += time.time() - mark[0]
        self.paused_cpu += time.process_time() - mark[1]


def train(spec):
    import torch
    from transformers import BertConfig, BertForPreTraining
    torch.manual_seed(spec["seed"])
    torch.set_num_threads(spec.get("threads") or torch.get_num_threads())
    with open(spec["bert_config_file"], encoding="utf-8") as reader:
        model = BertForPreTraining(BertConfig(**json.load(reader)))
    model.train()
    clock = Clock()
    eval_sets = {length: Records(path) for length, path in spec["eval_npz"].items()}
    out_dir = spec["output_dir"]
    os.makedirs(out_dir, exist_ok=True)
    curve = open(os.path.join(out_dir, "curve.jsonl"), "a", encoding="utf-8")
    sequences = 0
    for phase in spec["phases"]:
        records = Records(phase["train_npz"])
        optimizer, scheduler = make_optimizer(model, spec["optimizer"], phase["learning_rate"],
                                              phase["steps"], phase["warmup_steps"])
        rng = np.random.RandomState(spec["seed"] + phase["phase"])
        order, cursor = rng.permutation(records.size), 0
        eval_at = set(phase["eval_steps"])
        for step in range(1, phase["steps"] + 1):
            if cursor + phase["batch_size"] > records.size:
                order, cursor = rng.permutation(records.size), 0
            batch = records.batch(order[cursor:cursor + phase["batch_size"]])
            cursor += phase["batch_size"]
            learning_rate = scheduler.get_last_lr()[0]
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            sequences += phase["batch_size"]
            if not math.isfinite(loss.item()):
                raise SystemExit(f"peer: non-finite loss at phase {phase['phase']} step {step}")
            if step in eval_at:
                wall, cpu = clock.now()
                mark = clock.pause()
                row = {"phase": phase["phase"], "step": step, "sequences": sequences,
                       "wall_seconds": wall, "cpu_seconds": cpu,
                       "learning_rate": learning_rate, "train_loss": loss.item()}
                lengths = phase["final_eval_lengths" if step == phase["steps"] else "eval_lengths"]
                for length in lengths:
                    metrics = evaluate(model, eval_sets[length], spec["eval_examples"][length])
                    row.update({f"{key}_{length}": value for key, value in metrics.items()})
                curve.write(json.dumps(row) + "\n")
                curve.flush()
                print(json.dumps(row), flush=True)
                clock.resume(mark)
        model.save_pretrained(os.path.join(out_dir, f"phase_{phase['phase']}"))
    curve.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    conv = sub.add_parser("convert")
    conv.add_argument("files", nargs="+")
    conv.add_argument("--out", required=True)
    conv.add_argument("--seq", type=int, required=True)
    conv.add_argument("--pred", type=int, required=True)
    run = sub.add_parser("train")
    run.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    if args.command == "convert":
        convert(args.files, args.out, args.seq, args.pred)
    else:
        with open(args.spec, encoding="utf-8") as reader:
            train(json.load(reader))


if __name__ == "__main__":
    sys.exit(main())
