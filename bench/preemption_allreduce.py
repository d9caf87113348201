"""What the preemption flag's allreduce costs per micro-batch (issue 17, item 7).

training/hooks.py PreemptionHook once summed every rank's "signal received" flag in a scalar
allreduce fetched with every micro-batch. This bench measures that against the same
micro-batches without it, under Horovod at 2 and 4 ranks on this machine: each rank builds
the pre-training step of run_pretraining (tiny BERT by default, gradient accumulation, the
gradient allreduce once per window as --allreduce_post_accumulation does), then alternates
rounds of `--window` x `--accumulation` micro-batches in three variants, so a neighbour's
burst on a shared machine hits all of them: no flag ("plain"), the flag fetched with every
micro-batch ("every": the hook's old way, a fed placeholder summed over ranks in the same
session run) and with the window's last micro-batch only ("boundary": the hook's way now).
It also times the flag's allreduce alone (a session run of nothing else). Every rank runs
the same schedule (the collectives must match); rank 0 reports the medians over rounds.

    python bench/preemption_allreduce.py                  # 2 and 4 ranks, tiny BERT
    python bench/preemption_allreduce.py --ranks 2 --model base --batch 8 --rounds 4

bench/README.md has the results and the arithmetic for 32+ ranks on a real network.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def rank_main(args):
    """One rank: build, warm up, alternate the two variants, rank 0 prints RESULT {json}."""
    sys.path[:0] = [REPO, HERE]
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    import tensorflow as tf
    import pretrain as bench
    from modeling import named_config
    from pretraining.model_fn import make_model_fn
    from runtime.distributed import Workers
    from training.settings import TrainingSettings
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()

    workers = Workers(use_horovod=True)
    config = named_config(args.model)
    flag = tf1.placeholder(tf.float32, [], name="preemption_signal")
    agreed = workers.sum_over_ranks(flag)     # built before train_step_graph finalizes
    settings = TrainingSettings(
        bert_config=config, learning_rate=1e-4, num_train_steps=100000, num_warmup_steps=100,
        optimizer_type="lamb", num_accumulation_steps=args.accumulation,
        allreduce_post_accumulation=True, allreduce_fn=workers.allreduce_fn(),
        rank=workers.rank)
    records = bench.random_records(config, args.batch * 4, args.seq, args.predictions,
                                   seed=workers.rank)
    fetches, _, init = bench.train_step_graph(tf, make_model_fn(settings), records, args.batch)
    session = tf1.Session(config=workers.session_config())
    session.run(init)
    plain = {"train_op": fetches["train_op"]}
    flagged = {"train_op": fetches["train_op"], "agreed": agreed}
    feed = {flag: 0.0}
    micro_batches = args.window * args.accumulation   # whole windows: same allreduces

    def timed(variant):
        start = time.perf_counter()
        for number in range(micro_batches):
            closes = number % args.accumulation == args.accumulation - 1
            if variant == "every" or (variant == "boundary" and closes):
                session.run(flagged, feed_dict=feed)
            else:
                session.run(plain)
        return (time.perf_counter() - start) / micro_batches

    variants = ("plain", "every", "boundary")
    for variant in variants:    # warm-up: the executors built, caches filled
        timed(variant)
    seconds = {variant: [] for variant in variants}
    for round_number in range(args.rounds):
        shift = round_number % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            seconds[variant].append(timed(variant))
    alone = []
    for _ in range(args.alone):
        start = time.perf_counter()
        session.run(agreed, feed_dict=feed)
        alone.append(time.perf_counter() - start)
    if workers.rank == 0:
        plain_s, every_s, boundary_s = (statistics.median(seconds[v]) for v in variants)
        print("RESULT " + json.dumps({
            "ranks": workers.size, "model": args.model, "batch": args.batch,
            "plain_ms": plain_s * 1e3, "every_ms": every_s * 1e3,
            "boundary_ms": boundary_s * 1e3, "every_ratio": every_s / plain_s,
            "boundary_ratio": boundary_s / plain_s, "alone_ms": statistics.median(alone) * 1e3,
            "rounds": args.rounds, "micro_batches": micro_batches,
            "spread_plain_ms": (max(seconds["plain"]) - min(seconds["plain"])) * 1e3}),
            flush=True)


def launch(ranks, args):
    """Runs this file under horovodrun with `ranks` ranks on this host; returns rank 0's
    result (dict)."""
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    command = [horovodrun, "--gloo", "-np", str(ranks), "-H", f"localhost:{ranks}",
               sys.executable, os.path.abspath(__file__), "--rank",
               "--model", args.model, "--batch", str(args.batch), "--seq", str(args.seq),
               "--predictions", str(args.predictions), "--accumulation",
               str(args.accumulation), "--window", str(args.window), "--rounds",
               str(args.rounds), "--alone", str(args.alone)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    for line in result.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
    raise SystemExit(f"{ranks} ranks: no result (exit {result.returncode}): " + " | ".join(tail))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--window", type=int, default=3, help="windows per timed block")
    parser.add_argument("--rounds", type=int, default=6, help="a multiple of 3 rotates the "
                        "variants' order evenly")
    parser.add_argument("--alone", type=int, default=200,
                        help="runs of the flag's allreduce alone")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        return rank_main(args)
    print(f"{args.model} BERT, batch {args.batch} x seq {args.seq}, accumulation "
          f"{args.accumulation}; medians of {args.rounds} alternating rounds of "
          f"{args.window * args.accumulation} micro-batches; {os.cpu_count()} CPUs", flush=True)
    print(f"{'ranks':>5} {'plain ms':>9} {'every ms':>9} {'ratio':>6} {'boundary ms':>12} "
          f"{'ratio':>6} {'flag alone ms':>14} {'plain spread ms':>16}")
    for ranks in args.ranks:
        r = launch(ranks, args)
        print(f"{r['ranks']:>5} {r['plain_ms']:>9.2f} {r['every_ms']:>9.2f} "
              f"{r['every_ratio']:>6.3f} {r['boundary_ms']:>12.2f} {r['boundary_ratio']:>6.3f} "
              f"{r['alone_ms']:>14.3f} {r['spread_plain_ms']:>16.2f}", flush=True)
    print(f"(ms per micro-batch, medians; ratio: to plain; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end)")


if __name__ == "__main__":
    main()
