"""The downstream stage of `bench/convergence.py`: is each pre-trained model worth more than a
random initialisation, and ours as much as the peer's?

Tasks: SST-2 (accuracy) and CoLA (Matthews correlation), from the GLUE dev files in
``../shared/data/glue`` (the training sets do not ship): each dev file's examples are split
once, by a seeded shuffle, into a training half and a held-out half (``split_halves``),
written in the task's original layout so ``run_classifier.py`` reads them as GLUE files.

Models: the final (phase 2) weights of every run, and a random initialisation (no
``--init_checkpoint``). The peer's HuggingFace weights are converted to a Google-format
checkpoint with ``python -m cli.convert_checkpoint hf2tf``, so every model is fine-tuned by the same
command with the same recipe (``FINETUNE``: one recipe for all, chosen for a 4-layer model on
~450 examples, not tuned per model), ``--seeds`` seeds each. The pre-training heads are not
used: the classifier reads the pooled [CLS] output, as GLUE fine-tuning does.
"""
import os
import random
import shutil
import sys

TASKS = {"SST-2": ("sst-2", "eval_accuracy", True), "CoLA": ("cola", "MCC", False)}
FINETUNE = {"max_seq_length": 64, "train_batch_size": 16, "learning_rate": 1e-4,
            "num_train_epochs": 5, "warmup_proportion": 0.1, "optimizer_type": "adam",
            "eval_batch_size": 64}
SPLIT_SEED = 0


def split_halves(dev_tsv, folder, has_header):
    """Writes `folder/train.tsv` and `folder/dev.tsv`: the examples of `dev_tsv` shuffled
    with SPLIT_SEED, the first half to train, the rest held out (header kept on both)."""
    with open(dev_tsv, encoding="utf-8") as reader:
        lines = [line for line in reader.read().split("\n") if line.strip()]
    header, rows = (lines[:1], lines[1:]) if has_header else ([], lines)
    random.Random(SPLIT_SEED).shuffle(rows)
    half = len(rows) // 2
    os.makedirs(folder, exist_ok=True)
    for name, part in (("train.tsv", rows[:half]), ("dev.tsv", rows[half:])):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as writer:
            writer.write("\n".join(header + part) + "\n")
    return half, len(rows) - half


def _read_results(path):
    values = {}
    with open(path, encoding="utf-8") as reader:
        for line in reader:
            key, _, value = line.partition(" = ")
            if value:
                values[key.strip()] = float(value)
    return values


def _initial_checkpoints(study, data, names):
    """{model name: checkpoint to start from (None: random initialisation)}."""
    models = {"random init": None}
    for name in names:
        folder = study.path("runs", name)
        if not os.path.exists(os.path.join(folder, "done.json")):
            continue
        if name.startswith("hf-"):
            hf_dir = os.path.join(folder, "phase_2")
            shutil.copy(data["vocab_file"], os.path.join(hf_dir, "vocab.txt"))
            converted = study.path("downstream", "models", name)
            if not os.path.exists(os.path.join(converted, "bert_config.json")):
                study.run(_python("-m", "cli.convert_checkpoint", "hf2tf", "--hf_dir", hf_dir,
                                       "--output_dir", converted),
                          study.path("downstream", "convert.log"),
                          what=f"cli.convert_checkpoint hf2tf {name}")
            models[name] = converted
        else:
            models[name] = os.path.join(folder, "phase_2")
    return models


def _python(*args):
    return [sys.executable, *args]


def stage_downstream(study, data, names, shared_data, seeds):
    results = study.load("downstream.json", {})
    task_dirs = {}
    for task, (_, _, header) in TASKS.items():
        folder = study.path("downstream", "data", task)
        split_halves(os.path.join(shared_data, "glue", task, "dev.tsv"), folder, header)
        task_dirs[task] = folder
    for model, checkpoint in _initial_checkpoints(study, data, names).items():
        for task, (task_name, metric, _) in TASKS.items():
            scores = results.setdefault(model, {}).setdefault(task, {})
            for seed in range(1, seeds + 1):
                if str(seed) in scores:
                    continue
                out = study.path("downstream", "runs", model.replace(" ", "_"), task,
                                 f"seed{seed}")
                shutil.rmtree(out, ignore_errors=True)
                argv = _python(
                    "run_classifier.py", f"--task_name={task_name}",
                    f"--data_dir={task_dirs[task]}", f"--vocab_file={data['vocab_file']}",
                    f"--bert_config_file={data['bert_config_file']}", f"--output_dir={out}",
                    "--do_train", "--do_eval", f"--seed={seed}",
                    "--save_checkpoints_steps=100000",
                    *[f"--{key}={value}" for key, value in FINETUNE.items()])
                if checkpoint:
                    argv.append(f"--init_checkpoint={checkpoint}")
                study.run(argv, out + ".log", what=f"run_classifier.py {model} {task} seed {seed}")
                scores[str(seed)] = _read_results(os.path.join(out, "eval_results.txt"))[metric]
                study.save("downstream.json", results)
    return results


def metric_name(task):
    return {"SST-2": "accuracy", "CoLA": "MCC"}[task]
