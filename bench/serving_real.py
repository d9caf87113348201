"""Serving real requests: our exported SavedModel beside HuggingFace on PyTorch, on dev inputs.

bench/serving.py times full-length batches of random ids; users serve sentences and questions
of every length. Here the requests are real dev inputs in their order: the SST-2 dev sentences
(../shared/data/glue/SST-2/dev.tsv, 872) for the classifier, the SQuAD v1.1 sample's questions
with their paragraphs (../shared/data/squad/sample-v1.1.json, 1,057 questions, their 384-token
windows) for SQuAD. Each side serves batches of 1, 8, 32 consecutive requests in its best
ordinary practice (bench/serving_real_child.py): HuggingFace pads each batch to its longest
request (dynamic padding), in torch's inference mode; ours as `inference.py` serves them (the
SavedModel's `serving_default` at the batch's own length). Modes: `model` (token ids in,
logits out: both sides get our tokenizer's ids), `text` (classifier, sentences in, labels out:
each side's own tokenizer included). The models are bench/serving.py's (all-MiniLM-L6-v2
fine-tuned one step, exported at seq 128 for the classifier, 384 for SQuAD). Each round
starts both sides' processes afresh and keeps them up together, serving the requests in
--chunks chunks in turn, the first side swapped every chunk (bench/lockstep.py): on a shared
machine whose speed drifts by the second, both sides meet the same drift.

    python bench/serving_real.py [--work_dir DIR] [--batches 1,8,32] [--rounds 2]
        [--chunks 24] [--passes 1] [--configs classifier:model,classifier:text,squad:model]
        [--json FILE] [--precision fp32|bf16|int8] [--max_isa avx2|avx512_bf16]

Prints per configuration: requests/s of each side (all timed calls of all rounds), their
ratio, p50/p99 latency of a call in ms, the largest difference between the two sides'
outputs on the first batch (labels: how many differ), and (token ids in) how near each side
came to this machine's matmul ceiling in the precision served (`machine.matmul_ceiling`, in
the same run): the encoder's matmul FLOPs of each batch padded to its longest request
(training/flops.py's count) a second, over the ceiling. HuggingFace computes those; ours'
dense layers skip the padding (`modeling/real_rows.py`), so its share is an effective one
(the padded work served a second), which can pass 100% at batch 8 and 32. Last, the 10th and
90th percentiles of the chunks' ratios: how far the machine drifted within a run.
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "bench")
sys.path.insert(0, REPO)  # first: bench/data_prep.py must not hide the package
sys.path.insert(1, BENCH)

from machine import (add_max_isa_flag, cap_instruction_set, cpu_name,  # noqa: E402
                     matmul_ceiling, refuse_bf16_when_capped)
from lockstep import chunk_bounds, serve_in_turn  # noqa: E402
from serving import default_hf_model, encoder_gflop, prepare_models  # noqa: E402

SHARED = os.environ.get("BERT_SHARED_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))
SEQ = {"classifier": 128, "squad": 384}


def sst2_sentences():
    with open(os.path.join(SHARED, "glue", "SST-2", "dev.tsv"), encoding="utf-8") as reader:
        next(reader)
        return [line.split("\t")[0].strip() for line in reader if line.strip()]


def tokenized(task_name, vocab, do_lower_case=True):
    """[(ids, segments)] of the dev requests, by our tokenizer and the task's features."""
    from data_prep.wordpiece.tokenization import FullTokenizer
    from finetuning import glue_data, squad_data
    from finetuning.tasks import ClassifierTask, SquadTask
    tokenizer = FullTokenizer(vocab, do_lower_case)
    if task_name == "classifier":
        task = ClassifierTask("sst-2", None, SEQ["classifier"])
        examples = [glue_data.InputExample(str(i), text, None, "0")
                    for i, text in enumerate(sst2_sentences())]
        features = task.make_features(examples, tokenizer)
    else:
        task = SquadTask(max_seq_length=SEQ["squad"])
        with open(os.path.join(SHARED, "squad", "sample-v1.1.json"), encoding="utf-8") as reader:
            examples, _ = squad_data.parse_squad_examples(json.load(reader), is_training=False,
                                                          source="sample-v1.1.json")
        features = task.make_features(examples, tokenizer, is_training=False)
    requests = []
    for feature in features:
        real = int(np.count_nonzero(feature.input_mask))
        requests.append(([int(i) for i in feature.input_ids[:real]],
                         [int(s) for s in feature.segment_ids[:real]]))
    return requests


def write_requests(work, task, mode, vocab):
    path = os.path.join(work, f"requests_{task}_{mode}.json")
    if not os.path.isfile(path):
        data = sst2_sentences() if mode == "text" else tokenized(task, vocab)
        with open(path, "w", encoding="utf-8") as writer:
            json.dump(data, writer)
    return path


def serve_pair(models, task, mode, batch, passes, requests, work, chunks, first_side):
    """Both sides serving the same requests in lockstep (bench/lockstep.py): {side: the
    child's results}, and each chunk's ratio (HuggingFace's seconds over ours)."""
    name = f"{task}_{mode}_{batch}_{os.environ.get('BENCH_PRECISION', 'fp32')}"
    outs = {side: os.path.join(work, f"real_{side}_{name}.json") for side in ("ours", "hf")}
    commands = {side: [sys.executable, os.path.join(BENCH, "serving_real_child.py"), side,
                       models[side], task, mode, str(batch), str(passes), requests, outs[side]]
                for side in ("ours", "hf")}
    with open(requests, encoding="utf-8") as reader:
        items = -(-len(json.load(reader)) // batch) * passes
    results, seconds = serve_in_turn(
        commands, outs, lambda pair: pair.serve(chunk_bounds(items, chunks), first_side), REPO)
    return results, [hf / ours for hf, ours in zip(seconds["hf"], seconds["ours"])]


def gflop_per_pass(requests_file, batch, config_file):
    """The encoder's matmul GFLOP of one pass over the requests in batches of `batch`, each
    batch computed at its longest request (both sides pad so)."""
    with open(requests_file, encoding="utf-8") as reader:
        requests = json.load(reader)
    total = 0.0
    for start in range(0, len(requests), batch):
        chosen = requests[start:start + batch]
        total += len(chosen) * encoder_gflop(config_file, max(len(ids) for ids, _ in chosen))
    return total, -(-len(requests) // batch)


def summary(results, gflop=None):
    """Requests/s, latency; with `gflop` (GFLOP of a pass, calls in a pass): GFLOP/s."""
    latencies = np.array([t for r in results for t in r["latencies"]])
    served = sum(s for r in results for s in r["sizes"])
    rate = {} if gflop is None else {
        "gflops": gflop[0] * len(latencies) / gflop[1] / latencies.sum()}
    return {**rate, "requests_per_s": served / latencies.sum(),
            "p50_ms": 1000 * np.percentile(latencies, 50),
            "p99_ms": 1000 * np.percentile(latencies, 99), "calls": len(latencies)}


def disagreement(ours, theirs):
    """The largest |difference| of the first batch's outputs (labels: the count differing)."""
    if "labels" in ours:
        return float(sum(a != b for a, b in zip(ours["labels"], theirs["labels"])))
    worst = 0.0
    for key, rows in ours.items():
        for a, b in zip(rows, theirs[key]):
            worst = max(worst, float(np.max(np.abs(np.array(a) - np.array(b)))))
    return worst


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work_dir", help="models and results (default: temporary)")
    parser.add_argument("--hf_model", help="a HuggingFace BERT folder (default: all-MiniLM-L6-v2)")
    parser.add_argument("--configs", default="classifier:model,classifier:text,squad:model")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--passes", type=int, default=1,
                        help="passes over all the dev requests a serving process makes")
    parser.add_argument("--chunks", type=int, default=24,
                        help="chunks a round's work is cut into, the sides serving them in turn")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "int8"),
                        help="both sides' serving precision (bench/serving_real_child.py)")
    add_max_isa_flag(parser)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    refuse_bf16_when_capped(parser, args.max_isa, [args.precision], "--precision")
    cap_instruction_set(args.max_isa)
    os.environ["BENCH_PRECISION"] = args.precision
    ceilings = [matmul_ceiling()]
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_serving_real_")
    os.makedirs(work, exist_ok=True)
    configs = [tuple(c.split(":")) for c in args.configs.split(",")]
    tasks = sorted({task for task, _ in configs})
    models = {}
    for task in tasks:
        models.update(prepare_models(work, args.hf_model or default_hf_model(), [task],
                                     [SEQ[task]]))
    vocab = os.path.join(work, "base", "vocab.txt")
    batches = [int(b) for b in args.batches.split(",")]
    points = [(task, mode, batch) for task, mode in configs for batch in batches]
    runs = {(p, side): [] for p in points for side in ("ours", "hf")}
    chunk_ratios = {p: [] for p in points}
    for round_index in range(args.rounds):
        first_side = "ours" if round_index % 2 == 0 else "hf"
        for task, mode, batch in points:
            saved_model, hf_dir = models[task, SEQ[task]]
            requests = write_requests(work, task, mode, vocab)
            results, ratios = serve_pair({"ours": saved_model, "hf": hf_dir}, task, mode, batch,
                                         args.passes, requests, work, args.chunks, first_side)
            for side, result in results.items():
                runs[(task, mode, batch), side].append(result)
            chunk_ratios[task, mode, batch] += ratios
            print(f"   round {round_index + 1}: {task} {mode} batch {batch} done", flush=True)
    ceilings.append(matmul_ceiling())
    report(points, runs, chunk_ratios, args, ceilings, work)


def report(points, runs, chunk_ratios, args, ceilings, work):
    # int8 has no ceiling measured (machine.matmul_ceiling times float GEMMs): its shares
    # are against the fp32 ceiling, which says how far below int8's the float path runs
    basis = "fp32" if args.precision == "int8" else args.precision
    measured = [c[basis] for c in ceilings]
    ceiling = float(np.mean(measured))
    config_file = os.path.join(work, "base", "bert_config.json")
    print(f"\n{cpu_name()}; {os.cpu_count()} cores; all-MiniLM-L6-v2 (or --hf_model), "
          f"{args.precision}, real "
          f"dev requests; {args.rounds} rounds of {args.passes} pass(es) over them, each round "
          f"both sides' fresh processes serving {args.chunks} chunks in turn (bench/lockstep.py); "
          f"load average now {os.getloadavg()[0]:.2f}; {basis} matmul ceiling "
          f"{ceiling:.0f} GFLOP/s (before and after: "
          f"{', '.join(f'{value:.0f}' for value in measured)})")
    header = (f"{'model':<11}{'input':<7}{'batch':>6}{'ours req/s':>12}{'HF req/s':>10}"
              f"{'ours/HF':>9}{'ours p50':>10}{'p99':>8}{'HF p50':>9}{'p99':>8}{'diff':>10}"
              f"{'ceil ours':>10}{'HF':>5}{'chunks p10-p90':>16}")
    print(header)
    print("-" * len(header))
    table = []
    for point in points:
        task, mode, batch = point
        gflop = (gflop_per_pass(os.path.join(work, f"requests_{task}_{mode}.json"), batch,
                                config_file) if mode == "model" else None)
        ours, theirs = summary(runs[point, "ours"], gflop), summary(runs[point, "hf"], gflop)
        share = ({side: 100 * r["gflops"] / ceiling for side, r in (("ours", ours),
                                                                    ("hf", theirs))}
                 if gflop else None)
        shares = (f"{share['ours']:>9.1f}%{share['hf']:>4.0f}%" if share
                  else f"{'-':>10}{'-':>5}")
        ratio = ours["requests_per_s"] / theirs["requests_per_s"]
        spread = np.percentile(chunk_ratios[point], [10, 90])
        diff = disagreement(runs[point, "ours"][0]["outputs"], runs[point, "hf"][0]["outputs"])
        print(f"{task:<11}{mode:<7}{batch:>6}{ours['requests_per_s']:>12.1f}"
              f"{theirs['requests_per_s']:>10.1f}{ratio:>8.2f}x{ours['p50_ms']:>10.2f}"
              f"{ours['p99_ms']:>8.2f}{theirs['p50_ms']:>9.2f}{theirs['p99_ms']:>8.2f}"
              f"{diff:>10.1e}{shares}{spread[0]:>10.2f}-{spread[1]:.2f}")
        table.append({"task": task, "mode": mode, "batch": batch, "ours": ours, "hf": theirs,
                      "ratio": ratio, "chunk_ratios": chunk_ratios[point],
                      "max_abs_diff": diff, "ceiling_share_percent": share})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as writer:
            json.dump({"cpu": cpu_name(), "precision": args.precision,
                       "ceiling_gflops": measured, "points": table}, writer, indent=1)


if __name__ == "__main__":
    main()
