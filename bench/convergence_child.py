"""The TensorFlow work of `bench/convergence.py`, in a child process of its own so the study's
driver stays free of TensorFlow's thread pools while it times the runs.

    python bench/convergence_child.py TASK REQUEST.json ANSWER.json

Tasks:
* ``facts``: the unigram baselines at 128 and 512 (``pretraining.baseline`` over the same
  held-out examples the evaluations read), the instances per row of each record set (1 for
  unpacked records; packed rows hold more, and runs are compared at equal instances), and
  the static records as `.npz` for the peer (``convergence_peer.convert``).
* ``eval``: our checkpoints at each evaluation step of a run's phases, on the held-out static
  records, through the project's own evaluation (``pretraining.model_fn``'s EVAL metrics,
  what ``run_pretraining.py --do_eval`` reports), with the step's learning rate and
  timestamp from the run's dllog.
"""
import glob
import json
import os
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
sys.path.insert(0, REPO)  # first: bench/data_prep.py must not hide the package

from runtime.cpu_kernels import enable_onednn  # noqa: E402  (before TensorFlow)

enable_onednn()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from convergence_peer import convert  # noqa: E402
from modeling import BertConfig  # noqa: E402
from pretraining.baseline import unigram_baseline  # noqa: E402
from pretraining.input_pipeline import list_input_files, make_input_fn  # noqa: E402
from pretraining.model_fn import make_model_fn  # noqa: E402
from training.settings import TrainingSettings  # noqa: E402

LENGTHS = {"128": 20, "512": 80}
EVAL_BATCH = 32


def instances_per_row(files):
    """Mean instances a row: 1 for unpacked records, sum of next-sentence weights / rows for
    packed ones."""
    files = list_input_files(files)
    first = next(iter(tf.data.TFRecordDataset(files[:1])))
    example = tf.train.Example.FromString(first.numpy())
    if "next_sentence_weights" not in example.features.feature:
        return 1.0
    slots = len(example.features.feature["next_sentence_weights"].float_list.value)
    spec = {"next_sentence_weights": tf.io.FixedLenFeature([slots], tf.float32)}
    rows = instances = 0.0
    dataset = tf.data.TFRecordDataset(files).map(
        lambda record: tf.io.parse_single_example(record, spec)).batch(4096)
    for batch in dataset:
        weights = batch["next_sentence_weights"].numpy()
        rows += len(weights)
        instances += float(weights.sum())
    return instances / rows


def facts(request):
    data, recipe = request, request["recipe"]
    config = BertConfig.from_json_file(data["bert_config_file"])
    examples = {"128": recipe["eval_examples_128"], "512": recipe["eval_examples_512"]}
    baseline, per_row, npz = {}, {}, {}
    for name, files in data["records"].items():
        per_row[name] = instances_per_row(files["train"])
    for seq, pred in LENGTHS.items():
        records = data["records"][f"static-{seq}"]
        baseline[seq] = unigram_baseline(records["train"], records["test"], config, int(seq),
                                         pred, max_eval_examples=examples[seq],
                                         eval_batch_size=EVAL_BATCH)
        npz[f"static-{seq}"] = {}
        for split in ("train", "test"):
            out = os.path.join(os.path.dirname(request["bert_config_file"]),
                               f"peer_static_{seq}_{split}.npz")
            if not os.path.exists(out):
                convert(list_input_files(records[split]), out, int(seq), pred)
            npz[f"static-{seq}"][split] = out
    return {"baseline": baseline, "instances_per_row": per_row, "npz": npz}


def _dllog_steps(path):
    """{step: dllog record} of a run_pretraining.py dllog."""
    steps = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as reader:
            for line in reader:
                record = json.loads(line)
                if "step" in record and "event" not in record:
                    steps[record["step"]] = record
    return steps


def evaluate(request):
    data, recipe = request["data"], request["recipe"]
    folder = request["folder"]
    config = BertConfig.from_json_file(data["bert_config_file"])
    estimator = tf.estimator.Estimator(make_model_fn(TrainingSettings(bert_config=config)))
    examples = {"128": recipe["eval_examples_128"], "512": recipe["eval_examples_512"]}
    test = {seq: list_input_files(data["records"][f"static-{seq}"]["test"]) for seq in LENGTHS}
    timing = {}
    done = os.path.join(folder, "done.json")
    if os.path.exists(done):
        with open(done, encoding="utf-8") as reader:
            timing = {t["phase"]: t for t in json.load(reader)["timing"]}
    rows, sequences = [], 0.0
    for plan in request["phases"]:
        phase = plan["phase"]
        run_dir = os.path.join(folder, f"phase_{phase}")
        dllog = _dllog_steps(os.path.join(run_dir, "dllog.jsonl"))
        per_step = plan["batch_size"] * plan["instances_per_row"]
        for step in plan["eval_steps"]:
            checkpoint = os.path.join(run_dir, f"model.ckpt-{step}")
            if not glob.glob(checkpoint + ".index"):
                raise SystemExit(f"convergence_child: {checkpoint} missing")
            row = {"phase": phase, "step": step, "sequences": sequences + step * per_step}
            logged = dllog.get(step, {})
            if "learning_rate" in logged:
                row["learning_rate"] = logged["learning_rate"]
            if phase in timing and "timestamp" in logged:
                row["wall_seconds"] = (timing[phase]["offset"] + logged["timestamp"]
                                       - timing[phase]["start"])
            lengths = plan["final_eval_lengths" if step == plan["steps"] else "eval_lengths"]
            for seq in map(str, lengths):
                metrics = estimator.evaluate(
                    make_input_fn(test[seq], EVAL_BATCH, int(seq), LENGTHS[seq], False),
                    steps=examples[seq] // EVAL_BATCH, checkpoint_path=checkpoint)
                for key in ("masked_lm_loss", "masked_lm_accuracy", "next_sentence_accuracy"):
                    row[f"{key}_{seq}"] = float(metrics[key])
            print(json.dumps(row), flush=True)
            rows.append(row)
        sequences += plan["steps"] * per_step
    return rows


def main():
    task, request_path, answer_path = sys.argv[1:4]
    tf.get_logger().setLevel("ERROR")
    with open(request_path, encoding="utf-8") as reader:
        request = json.load(reader)
    result = {"facts": facts, "eval": evaluate}[task](request)
    with open(answer_path, "w", encoding="utf-8") as writer:
        json.dump(result, writer)


if __name__ == "__main__":
    main()
