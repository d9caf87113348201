"""One change at a time: our pre-training step in two or more variants, alternating rounds.

Issue 11 asks that every speed change be measured. A change is a source tree (a git
worktree of the commit before it) or an environment setting (oneDNN, threads, XLA flags);
each variant runs in its own child process, kept alive, and the parent asks each in turn
for `--steps` steps per round, so a neighbour's burst on a shared machine hits every
variant rather than one. The table gives each variant's median step time and its speed
relative to the first.

    git worktree add /tmp/before <commit>
    python bench/step_ab.py before:REPO=/tmp/before after:
    python bench/step_ab.py eigen:TF_ENABLE_ONEDNN_OPTS=0 onednn:TF_ENABLE_ONEDNN_OPTS=1
    python bench/step_ab.py --model tiny a: b:INTER=1

A variant is NAME:VAR=VALUE,VAR=VALUE. REPO picks the source tree (default: this one);
INTRA/INTER set the session's thread pools; JIT=1 turns on XLA auto-clustering (with
TF_XLA_FLAGS set accordingly); any other VAR goes to the child's environment (a ';' in a
value stands for ','). Every variant gets TF_ENABLE_ONEDNN_OPTS=1, as our entry points set,
unless it sets the variable itself (`unset`: TensorFlow's own default).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
DEFAULT_REPO = os.path.dirname(os.path.dirname(HERE))


def child(model, batch, seq, predictions):
    """Builds the step of the tree in $REPO, says "ready", then runs N steps per stdin line
    and answers with the mean step time (JSON)."""
    repo = os.environ.get("REPO") or DEFAULT_REPO
    # The model from $REPO, the bench helpers from this tree (older trees lack some). This
    # tree goes on the path after $REPO: bench/pretrain.py puts it first otherwise, and
    # every variant would then run this tree's model and optimizer.
    sys.path[:0] = [repo, os.path.dirname(HERE), DEFAULT_REPO]
    # Every variant gets what our entry points set (runtime.cpu_kernels), which older trees
    # did not: the comparison is then of the code alone. TF_ENABLE_ONEDNN_OPTS=0 overrides.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    if os.environ["TF_ENABLE_ONEDNN_OPTS"] == "unset":   # TensorFlow's own default
        del os.environ["TF_ENABLE_ONEDNN_OPTS"]
    import tensorflow as tf
    import pretrain as bench
    from modeling import named_config as shipped_config
    from pretraining.model_fn import make_model_fn
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    config = shipped_config(model)
    records = bench.random_records(config, batch * 4, seq, predictions)
    fetches, _, init = bench.train_step_graph(
        tf, make_model_fn(bench.pretraining_settings(config, "fp32")), records, batch)
    session_config = bench.session_config(tf, int(os.environ.get("INTRA", 0)),
                                          int(os.environ.get("INTER", 0)),
                                          os.environ.get("JIT") == "1")
    import optimization
    if os.path.dirname(os.path.dirname(os.path.abspath(optimization.__file__))) != \
            os.path.abspath(repo):
        raise SystemExit(f"the step was built from {optimization.__file__}, not from {repo}")
    session = tf1.Session(config=session_config)
    session.run(init)
    for _ in range(2):
        session.run(fetches)
    print("ready", flush=True)
    for line in sys.stdin:
        result = bench.timed_steps(lambda: session.run(fetches)["loss"], int(line))
        print(json.dumps({"seconds": result["wall"] / int(line),
                          "cores_busy": result["cpu"] / result["wall"]}), flush=True)


def start(spec, args):
    """Starts variant NAME:VAR=VALUE,... and waits until its step is built."""
    name, _, settings = spec.partition(":")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for item in filter(None, settings.split(",")):
        key, _, value = item.partition("=")
        env[key] = value.replace(";", ",")
    if env.get("JIT") == "1" and "--tf_xla_cpu_global_jit" not in env.get("TF_XLA_FLAGS", ""):
        env["TF_XLA_FLAGS"] = (env.get("TF_XLA_FLAGS", "") + " --tf_xla_cpu_global_jit").strip()
    process = subprocess.Popen(
        [sys.executable, HERE, "--child", args.model, str(args.batch_size),
         str(args.seq_length), str(args.predictions)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=None if args.verbose else subprocess.DEVNULL, text=True, env=env)
    while process.stdout.readline().strip() != "ready":
        if process.poll() is not None:
            raise SystemExit(f"variant {name} failed to build (run with --verbose)")
    return name, process


def main():
    if sys.argv[1:2] == ["--child"]:
        model, batch, seq, predictions = sys.argv[2:6]
        return child(model, int(batch), int(seq), int(predictions))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", help="NAME:VAR=VALUE,... (see above)")
    parser.add_argument("--model", default="base")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2, help="steps per variant per round")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    # Built one at a time: building is CPU- and memory-heavy.
    children = dict(start(spec, args) for spec in args.variants)
    seconds = {name: [] for name in children}
    load_before = os.getloadavg()[0]
    try:
        for _ in range(args.rounds):
            for name, process in children.items():
                process.stdin.write(f"{args.steps}\n")
                process.stdin.flush()
                seconds[name].append(json.loads(process.stdout.readline())["seconds"])
    finally:
        for process in children.values():
            process.kill()
    sys.path.insert(0, os.path.dirname(HERE))
    from pretrain import cpu_model
    print(f"{cpu_model()}; model {args.model}, batch {args.batch_size}, seq {args.seq_length}, "
          f"{args.rounds} rounds x {args.steps} steps; load {load_before:.2f} -> "
          f"{os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M')}\n")
    print("| variant | step s (median) | seq/s | speed vs first | step s per round |")
    print("|---|---:|---:|---:|---|")
    first = statistics.median(seconds[args.variants[0].partition(":")[0]])
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} | {args.batch_size / median:.2f} | {first / median:.3f}x | "
              f"{', '.join(f'{v:.2f}' for v in values)} |")


if __name__ == "__main__":
    main()
