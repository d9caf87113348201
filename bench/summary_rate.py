"""Does a short run's summary tell the steady-state rate? run_pretraining.py, short and long.

Users compare the summary's `average_sequences_per_second` with NVIDIA's tables and other
tools, often after a short trial run. This runs `run_pretraining.py` (BERT-base by default,
fp32, batch 8, seq 128, 20 predictions, NVIDIA's defaults otherwise) in a fresh process for
`--short` steps and for `--long` steps, on the same random records, alternating for
`--rounds`, and reads each run's summary from its dllog. The reference is the long runs'
per-step rate after step 10 (median of the logged per-step rates, one a step): the short
run's `average_sequences_per_second` should match it, while its
`average_sequences_per_second_with_overhead` (first step to last, as NVIDIA's "with
overhead") shows what the start costs.

    python bench/summary_rate.py [--model base] [--short 10] [--long 30] [--rounds 2]
                                 [--batch 8] [--work_dir DIR]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before modeling loads TensorFlow
BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, REPO)

from machine import cpu_name  # noqa: E402

SEQ, PREDICTIONS = 128, 20


def write_records(path, config, count):
    """`count` random records in the layout the input pipeline reads (bench/pretrain.py's)."""
    from data_prep.instances import tfrecord_writer
    from data_prep.instances.masked_instances import FEATURE_KINDS
    from pretrain import random_records
    features = random_records(config, count, SEQ, PREDICTIONS)
    with tfrecord_writer.TFRecordFileWriter(path) as writer:
        writer.write_tfrecords(tfrecord_writer.encode_tfrecords(features, FEATURE_KINDS), count)


def run_once(work, name, steps, batch, config_file):
    """One run_pretraining.py process; returns (its summary, per-step rates by step)."""
    out = os.path.join(work, name)
    shutil.rmtree(out, ignore_errors=True)
    dllog = os.path.join(work, f"{name}.dllog.json")
    if os.path.exists(dllog):
        os.remove(dllog)
    command = [sys.executable, os.path.join(REPO, "run_pretraining.py"), "--do_train",
               f"--bert_config_file={config_file}", f"--input_files_dir={work}/records",
               f"--output_dir={out}", f"--train_batch_size={batch}",
               f"--max_seq_length={SEQ}", f"--max_predictions_per_seq={PREDICTIONS}",
               f"--num_train_steps={steps}", "--num_warmup_steps=2", "--learning_rate=1e-4",
               "--display_loss_steps=1", "--save_checkpoints_steps=100000",
               f"--dllog_path={dllog}"]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"run_pretraining.py failed ({name})")
    summary, per_step = None, {}
    with open(dllog, encoding="utf-8") as reader:
        for line in reader:
            record = json.loads(line)
            if record.get("event") == "summary":
                summary = record
            elif "sequences_per_second" in record and "step" in record:
                per_step[int(record["step"])] = record["sequences_per_second"]
    return summary, per_step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="base", help="a named config (modeling.named_config)")
    parser.add_argument("--short", type=int, default=10)
    parser.add_argument("--long", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--work_dir", help="records and runs (default: temporary)")
    args = parser.parse_args()
    from modeling import named_config
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_summary_rate_")
    try:
        os.makedirs(os.path.join(work, "records"), exist_ok=True)
        config = named_config(args.model)
        config_file = os.path.join(work, "bert_config.json")
        config.to_json_file(config_file)
        write_records(os.path.join(work, "records", "part-0.tfrecord"), config,
                      args.batch * (args.long + 5))
        runs = {"short": [], "long": []}
        for _ in range(args.rounds):
            for name, steps in (("short", args.short), ("long", args.long)):
                runs[name].append(run_once(work, name, steps, args.batch, config_file))
                print(f"   {name} run of {steps} steps done", file=sys.stderr, flush=True)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    steady = statistics.median(rate for _, per_step in runs["long"]
                               for step, rate in per_step.items() if step > 10)
    print(f"{cpu_name()}; {os.cpu_count()} cores; BERT-{args.model}, fp32, batch {args.batch}, "
          f"seq {SEQ}; {args.rounds} rounds; load average now {os.getloadavg()[0]:.2f}")
    print(f"steady state (median per-step rate after step 10 of the {args.long}-step runs): "
          f"{steady:.3f} sequences/s")
    header = (f"{'run':<16}{'summary avg':>12}{'/ steady':>9}{'steps':>8}{'with overhead':>14}"
              f"{'/ steady':>9}{'start s':>9}{'warm-up s':>10}")
    print(header)
    print("-" * len(header))
    for name in ("short", "long"):
        for index, (summary, _) in enumerate(runs[name]):
            average = summary["average_sequences_per_second"]
            overhead = summary["average_sequences_per_second_with_overhead"]
            label = f"{name} {args.short if name == 'short' else args.long} #{index + 1}"
            print(f"{label:<16}{average:>12.3f}{average / steady:>9.3f}"
                  f"{summary['steady_steps']:>8}{overhead:>14.3f}{overhead / steady:>9.3f}"
                  f"{summary.get('startup_seconds', 0):>9.1f}"
                  f"{summary.get('warmup_seconds', 0):>10.1f}")


if __name__ == "__main__":
    main()
