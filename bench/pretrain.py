"""Throughput of a BERT pre-training step on this machine, against its measured matmul ceiling.

Prints (markdown) three tables:

1. the matmul ceiling: GFLOP/s of one large ``tf.matmul`` (``--matmul_size``^3, default
   2048) in float32 and bfloat16, timed after warm-up, in a process set up like the training
   ones (same thread settings); the same matmul compiled by XLA is shown for information;
2. the training step for each of {fp32, bf16} x {XLA off, on}: sequences/s, achieved
   TFLOP/s (= sequences/s x ``training.flops.training_flops_per_sequence``), the share of
   the matching-precision ceiling (bf16 runs against the bf16 ceiling, fp32 against fp32),
   mean step time, the first (compiling) step, CPU cores busy, peak RSS and XLA clusters;
3. what the same FLOP arithmetic predicts per GPU (A100, H100 SXM) for BERT-base and
   BERT-large at seq 128 and 512, at an assumed model-FLOPs utilisation (``--mfu``).

The step is the one run_pretraining trains: ``pretraining.model_fn.make_model_fn`` (BERT,
masked-LM and next-sentence heads via ``pretraining_losses``, then ``train_spec`` ->
``create_train_op`` with NVLAMB, no Horovod, no loss scaling since bf16 needs none), fed
from a ``tf.data`` pipeline over a few in-memory batches of random records shaped like
create_pretraining_data's (int32 ids, mask, segments, masked positions/ids/weights, next-
sentence labels), run in a TF1 session configured like ``training.run_config`` (XLA:
``global_jit_level = ON_1``). Warm-up steps (graph optimisation, XLA's compilation, which
happens on the first runs of each cluster) are excluded; then ``--steps`` steps are timed.

TensorFlow reads ``TF_XLA_FLAGS=--tf_xla_cpu_global_jit`` once, when it is imported, so
every measurement runs in a child process of this script (``--worker ceiling|train``) that
prints one JSON line; this parent process never imports TensorFlow.

    python bench/pretrain.py [--model base] [--batch_size 8] [--seq_length 128]
        [--predictions 20] [--steps 10] [--warmup_steps 3]
        [--configs fp32,fp32+xla,bf16,bf16+xla] [--threads 0] [--mfu 0.4]
    python bench/pretrain.py --model tiny --steps 3          # a quick check (~1 min)

The machine is shared while developing: the table reports the load average around each
run and the CPU cores the run kept busy (CPU seconds / wall seconds).

With ``--records NAME=PATH,...`` (e.g. unpacked and packed records of one corpus, written by
``bench/packing.py --write_records``) the step is fed real batches instead of random ones:
each child reads ``--pool_batches`` batches of its records through run_pretraining's input
pipeline (``pretraining.input_pipeline.make_dataset``: static or dynamic, packed or not) and
cycles them from memory, so only the step is timed. The sets run alternately for
``--rounds`` rounds (a drift of the shared machine's load then hits them alike), and a
fourth table gives rows/s, sequences (instances)/s and real (non-padding) tokens/s of each,
the last two both for the batches run and at the mean of the whole records (rows/s x the
file's instances or real tokens per row: a step costs the same whatever its rows hold, and
the mean is free of the sampling of a few batches), and each set's ratio to the first.

    python bench/pretrain.py --configs fp32 --skip_ceiling --seq_length 512 \
        --predictions 80 --batch_size 4 --records unpacked=DIR1,packed=DIR2 --rounds 2
"""
import argparse
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from runtime.xla_env import XLA_CPU_FLAG  # noqa: E402 (no TF)
from training.flops import PEAK_TFLOPS, training_flops_per_sequence  # noqa: E402 (no TF)

CONFIGS = ("fp32", "fp32+xla", "bf16", "bf16+xla")
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}
# The GPU table: (model, sequence length, masked-LM predictions); 20/80 are the predictions
# of BERT's phase 1 (seq 128) and phase 2 (seq 512).
GPU_CASES = (("base", 128, 20), ("base", 512, 80), ("large", 128, 20), ("large", 512, 80))
GPUS = ("A100", "H100")


def config_module():
    """``modeling/config.py`` loaded on its own, without the ``modeling`` package, whose
    ``__init__`` imports TensorFlow (a parent must not: the workers set XLA's flag before
    theirs, and a torch worker must not start TensorFlow's threads). The file itself only
    uses json/os/copy."""
    spec = importlib.util.spec_from_file_location(
        "_bench_bert_config", os.path.join(REPO, "modeling", "config.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def named_config(name):
    """``modeling.config.named_config`` without importing TensorFlow (see config_module)."""
    return config_module().named_config(name)


# ----------------------------------------------------------------------------- workers

def session_config(tf, threads, inter_threads, xla):
    """The ConfigProto of ``training.run_config`` (single worker), with optional threads."""
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    if threads:
        config.intra_op_parallelism_threads = threads
    if inter_threads:
        config.inter_op_parallelism_threads = inter_threads
    if xla:
        config.graph_options.optimizer_options.global_jit_level = \
            tf.compat.v1.OptimizerOptions.ON_1
    return config


def count_xla_clusters(tf, session, fetches):
    """Runs `fetches` once with partition graphs returned; counts the XLA launches in them
    (auto-clustering rewrites each cluster into an _XlaCompile/_XlaRun pair)."""
    options = tf.compat.v1.RunOptions(output_partition_graphs=True)
    metadata = tf.compat.v1.RunMetadata()
    start = time.perf_counter()
    session.run(fetches, options=options, run_metadata=metadata)
    seconds = time.perf_counter() - start
    clusters = sum(1 for graph in metadata.partition_graphs for node in graph.node
                   if node.op in ("_XlaRun", "XlaLaunch"))
    return clusters, seconds


def worker_ceiling(args):
    """GFLOP/s of an n x n x n matmul per dtype, plain TensorFlow (oneDNN) and XLA-compiled."""
    import tensorflow as tf
    from modeling.core import onednn_capped_below_bfloat16
    # oneDNN capped below bf16 (ONEDNN_MAX_CPU_ISA=AVX2, machine.cap_instruction_set) has no
    # bf16 matmul: TensorFlow would abort the process asking for one
    precisions = [p for p in PRECISIONS if p != "bf16" or not onednn_capped_below_bfloat16()]
    results = matmul_rates(tf, args.matmul_size, args.matmul_seconds,
                           session_config(tf, args.threads, args.inter_threads, False),
                           precisions)
    return {"kind": "ceiling", "n": args.matmul_size, "results": results,
            "tf_version": tf.__version__}


def matmul_rates(tf, n, seconds, config, precisions=tuple(PRECISIONS)):
    """{variant: rates} of an n x n x n matmul in `precisions`, with TensorFlow's kernel
    (oneDNN) and XLA-compiled, each run twice untimed and then for at least `seconds`.
    Separate from the worker so that other benches' TensorFlow workers can measure the
    ceiling in their own process, with their own session settings."""
    import numpy as np
    tf1 = tf.compat.v1
    flops = 2.0 * n ** 3
    results = {}
    with tf.Graph().as_default():
        rng = np.random.default_rng(0)
        ops = {}
        xla_matmul = tf.function(tf.linalg.matmul, jit_compile=True)
        for name in precisions:
            dtype = tf.as_dtype(PRECISIONS[name])
            # Variables, not constants: grappler would fold a matmul of constants.
            a = tf1.Variable(tf.cast(rng.standard_normal((n, n), np.float32), dtype))
            b = tf1.Variable(tf.cast(rng.standard_normal((n, n), np.float32), dtype))
            ops[name] = tf.linalg.matmul(a, b).op
            ops[name + "+xla"] = xla_matmul(a, b).op
        with tf1.Session(config=config) as session:
            session.run(tf1.global_variables_initializer())
            for key, op in ops.items():
                for _ in range(2):
                    session.run(op)
                times = []
                start, cpu0 = time.perf_counter(), time.process_time()
                while len(times) < 3 or time.perf_counter() - start < seconds:
                    t0 = time.perf_counter()
                    session.run(op)
                    times.append(time.perf_counter() - t0)
                cores = (time.process_time() - cpu0) / (time.perf_counter() - start)
                results[key] = {"gflops": flops * len(times) / sum(times) / 1e9,
                                "best_gflops": flops / min(times) / 1e9, "runs": len(times),
                                "cpu_cores_busy": cores}
    return results


def random_records(config, count, seq, predictions, seed=0):
    """`count` random pre-training records (numpy), shaped and typed as the input pipeline
    delivers them: each sequence is [CLS] A [SEP] B [SEP] + padding with 3/4 to all of `seq`
    real tokens, masked positions distinct and inside the real tokens."""
    import numpy as np
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, (count, seq), dtype=np.int32)
    mask = np.zeros((count, seq), np.int32)
    segments = np.zeros((count, seq), np.int32)
    positions = np.zeros((count, predictions), np.int32)
    for row in range(count):
        length = int(rng.integers(max(predictions + 3, (3 * seq) // 4), seq + 1))
        mask[row, :length] = 1
        segments[row, int(rng.integers(2, length - 1)):length] = 1
        positions[row] = np.sort(rng.choice(np.arange(1, length - 1), predictions,
                                            replace=False))
    ids = ids * mask
    return {
        "input_ids": ids,
        "input_mask": mask,
        "segment_ids": segments,
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.integers(0, config.vocab_size, (count, predictions),
                                      dtype=np.int32),
        "masked_lm_weights": np.ones((count, predictions), np.float32),
        "next_sentence_labels": rng.integers(0, 2, (count, 1), dtype=np.int32),
    }


def real_records(args, config):
    """`--pool_batches` batches of the records at `--records_path` (numpy, as the input
    pipeline hands them to the model_fn) and the facts of the whole records: rows,
    instances and real tokens per row."""
    import numpy as np
    import tensorflow as tf
    from pretraining.dynamic_masking import DynamicMasking
    from pretraining.input_pipeline import list_input_files, make_dataset
    from pretraining.record_checks import check_input_files
    from pretraining.record_kinds import DYNAMIC
    files = list_input_files(args.records_path)
    kind, _ = check_input_files(files, args.seq_length, args.predictions, config)
    masking = DynamicMasking(args.predictions) if kind.kind == DYNAMIC else None
    dataset = make_dataset(files, args.batch_size, args.seq_length, args.predictions, True,
                           masking=masking, sequences_per_row=kind.sequences_per_row,
                           seed=12345, shuffle_buffer=1000)
    batches = [{name: value.numpy() for name, value in batch.items()}
               for batch in dataset.take(args.pool_batches)]
    pool = {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]}
    rows = tokens = instances = 0
    for batch in make_dataset(files, 1024, args.seq_length, args.predictions, False,
                              masking=masking, sequences_per_row=kind.sequences_per_row,
                              drop_remainder=False):
        rows += len(batch["input_mask"])
        tokens += int(tf.reduce_sum(batch["input_mask"]))
        weights = batch.get("next_sentence_weights")
        instances += int(tf.reduce_sum(weights)) if weights is not None \
            else len(batch["input_mask"])
    return pool, {"records": rows, "instances_per_row": instances / rows,
                  "real_tokens_per_row": tokens / rows}


def batch_contents(pool, batch_size, steps, skip):
    """(instances, real tokens) of `steps` batches cycled from `pool` after `skip` batches."""
    import numpy as np
    batches = len(pool["input_mask"]) // batch_size
    instances = tokens = 0
    for number in range(skip, skip + steps):
        rows = slice((number % batches) * batch_size, (number % batches + 1) * batch_size)
        tokens += int(np.sum(pool["input_mask"][rows]))
        weights = pool.get("next_sentence_weights")
        instances += int(np.sum(weights[rows])) if weights is not None else batch_size
    return instances, tokens


def pretraining_settings(config, precision):
    """The TrainingSettings run_pretraining uses for `precision` (fp32/bf16): NVLAMB, no
    Horovod, no loss scaling (bf16 needs none). Shared so every bench times the same step."""
    from training.settings import TrainingSettings, precision_settings
    compute_type, loss_scale = precision_settings(precision == "bf16", PRECISIONS[precision])
    return TrainingSettings(
        bert_config=config, learning_rate=1e-4, num_train_steps=100000,
        num_warmup_steps=100, optimizer_type="lamb", compute_type=compute_type,
        loss_scale=loss_scale)


def train_step_graph(tf, model_fn, records, batch_size):
    """Builds `model_fn`'s TRAIN step in the default graph, fed by a tf.data pipeline that
    cycles the in-memory `records`; returns ({train_op, loss}, parameters, init op). The
    graph is finalized, so a bench cannot add ops to the step by accident."""
    import numpy as np
    tf1 = tf.compat.v1
    tf1.set_random_seed(12345)
    dataset = (tf.data.Dataset.from_tensor_slices(records).repeat()
               .batch(batch_size, drop_remainder=True).prefetch(2))
    features = tf1.data.make_one_shot_iterator(dataset).get_next()
    spec = model_fn(features, None, tf.estimator.ModeKeys.TRAIN)
    fetches = {"train_op": spec.train_op, "loss": spec.loss}
    parameters = sum(int(np.prod(v.shape)) for v in tf1.trainable_variables())
    init = tf1.global_variables_initializer()
    tf1.get_default_graph().finalize()
    return fetches, parameters, init


def timed_steps(run_step, steps):
    """Runs `run_step()` (which returns the loss) `steps` times; returns the per-step wall
    times, the losses, and the wall and process-CPU seconds of the whole run (CPU / wall is
    how many cores the step kept busy, the check on a shared machine)."""
    times, losses = [], []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        losses.append(float(run_step()))
        times.append(time.perf_counter() - t0)
    return {"step_seconds": times, "losses": losses, "wall": time.perf_counter() - wall0,
            "cpu": time.process_time() - cpu0}


def worker_train(args):
    """Builds run_pretraining's training step and times it; returns a dict (one JSON line)."""
    import numpy as np
    import tensorflow as tf
    from modeling import named_config as shipped_config
    from pretraining.model_fn import make_model_fn
    tf1 = tf.compat.v1

    config = shipped_config(args.model)
    settings = pretraining_settings(config, args.precision)
    if args.records_path:
        records, facts = real_records(args, config)
    else:
        records, facts = random_records(config, args.batch_size * args.pool_batches,
                                        args.seq_length, args.predictions), None

    build_start = time.perf_counter()
    with tf.Graph().as_default():
        fetches, parameters, init = train_step_graph(tf, make_model_fn(settings), records,
                                                     args.batch_size)
        with tf1.Session(config=session_config(tf, args.threads, args.inter_threads,
                                               args.xla)) as session:
            session.run(init)
            build_seconds = time.perf_counter() - build_start
            warmup_times = []
            clusters = None
            for step in range(args.warmup_steps):
                if step == args.warmup_steps - 1:
                    clusters, seconds = count_xla_clusters(tf, session, fetches)
                else:
                    t0 = time.perf_counter()
                    session.run(fetches)
                    seconds = time.perf_counter() - t0
                warmup_times.append(seconds)
            timed = timed_steps(lambda: session.run(fetches)["loss"], args.steps)

    wall, losses = timed["wall"], timed["losses"]
    flops = training_flops_per_sequence(config, args.seq_length, args.predictions)
    sequences_per_second = args.batch_size * args.steps / wall
    contents = {}
    if facts:
        instances, tokens = batch_contents(records, args.batch_size, args.steps,
                                           args.warmup_steps)
        rows = sequences_per_second  # a row of packed records holds several sequences
        contents = dict(facts, records_path=args.records_path, rows_per_second=rows,
                        batch_sequences_per_second=instances / wall,
                        batch_real_tokens_per_second=tokens / wall,
                        sequences_per_second_at_mean=rows * facts["instances_per_row"],
                        real_tokens_per_second_at_mean=rows * facts["real_tokens_per_row"])
    return dict(contents, **{
        "kind": "train", "config": args.precision + ("+xla" if args.xla else ""),
        "model": args.model, "batch_size": args.batch_size, "seq_length": args.seq_length,
        "predictions": args.predictions, "parameters": parameters,
        "steps": args.steps, "step_seconds": timed["step_seconds"],
        "warmup_seconds": warmup_times,
        "build_seconds": build_seconds, "mean_step_seconds": wall / args.steps,
        "sequences_per_second": sequences_per_second,
        "flops_per_sequence": flops, "tflops": sequences_per_second * flops / 1e12,
        "cpu_cores_busy": timed["cpu"] / wall, "xla_clusters": clusters,
        "losses_finite": bool(np.all(np.isfinite(losses))), "last_loss": losses[-1],
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20,
        "tf_xla_flags": os.environ.get("TF_XLA_FLAGS", ""), "tf_version": tf.__version__,
    })


def run_worker(args):
    if args.xla:
        from runtime.xla_env import enable_cpu_xla
        if not enable_cpu_xla():
            raise SystemExit("TensorFlow was imported before XLA's CPU flag was set")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from runtime.cpu_kernels import enable_onednn
    enable_onednn()   # as run_pretraining.py does (TF_ENABLE_ONEDNN_OPTS=0 in the shell keeps Eigen)
    result = worker_ceiling(args) if args.worker == "ceiling" else worker_train(args)
    print(json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- parent

def worker_env():
    """This process's environment without XLA's CPU flag: each worker decides on the flag
    itself, none inherits it from the caller's shell."""
    env = dict(os.environ)
    env["TF_XLA_FLAGS"] = " ".join(f for f in env.get("TF_XLA_FLAGS", "").split()
                                   if f != XLA_CPU_FLAG)
    return env


def spawn(args, worker, precision="fp32", xla=False, records_path=None):
    """Runs one worker in a fresh interpreter; returns its JSON dict or {'error': ...}.
    `records_path`: feed the step from these records instead of random ones."""
    command = [sys.executable, os.path.abspath(__file__), "--worker", worker,
               "--precision", precision, "--model", args.model,
               "--batch_size", str(args.batch_size), "--seq_length", str(args.seq_length),
               "--predictions", str(args.predictions), "--steps", str(args.steps),
               "--warmup_steps", str(args.warmup_steps), "--threads", str(args.threads),
               "--inter_threads", str(args.inter_threads),
               "--pool_batches", str(args.pool_batches),
               "--matmul_size", str(args.matmul_size),
               "--matmul_seconds", str(args.matmul_seconds)]
    env = worker_env()
    if xla:
        command.append("--xla")
    if records_path:
        command += ["--records_path", records_path]
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    seconds = time.perf_counter() - start
    if args.verbose and proc.stderr:
        sys.stderr.write(proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[:200]}"}
    result = json.loads(lines[-1])
    result["process_seconds"] = seconds
    result["load_before"], result["load_after"] = load_before, os.getloadavg()[0]
    return result


def ceilings_by_precision(ceiling):
    """The machine's matmul ceiling per precision: the faster of TF's and XLA's matmul."""
    results = ceiling.get("results", {})
    return {p: max((results[k]["gflops"] for k in (p, p + "+xla") if k in results),
                   default=None) for p in PRECISIONS}


def print_ceiling(ceiling, threads):
    n = ceiling.get("n")
    print(f"### Matmul ceiling ({n}x{n}x{n}, tf.matmul in a TF1 session, "
          f"intra-op threads {threads or 'default'})\n")
    if "error" in ceiling:
        print(f"ceiling worker failed: {ceiling['error']}\n")
        return
    print("| matmul | GFLOP/s (mean) | GFLOP/s (best run) | runs | CPU cores busy |")
    print("|---|---:|---:|---:|---:|")
    labels = {"fp32": "float32", "bf16": "bfloat16", "fp32+xla": "float32, XLA-compiled",
              "bf16+xla": "bfloat16, XLA-compiled"}
    for key, label in labels.items():
        r = ceiling["results"].get(key)
        if r:
            print(f"| {label} | {r['gflops']:.0f} | {r['best_gflops']:.0f} | {r['runs']} | "
                  f"{r['cpu_cores_busy']:.2f} |")
    print(f"\nload average (1 min) before/after: {ceiling['load_before']:.2f} / "
          f"{ceiling['load_after']:.2f}\n")


def print_training(rows, ceilings, args):
    config = named_config(args.model)
    flops = training_flops_per_sequence(config, args.seq_length, args.predictions)
    print(f"### BERT-{args.model} pre-training step (LAMB), batch {args.batch_size}, "
          f"seq {args.seq_length}, {args.predictions} predictions: {flops / 1e9:.1f} GFLOP "
          f"per sequence; {args.steps} timed steps after {args.warmup_steps} warm-up\n")
    print("| config | seq/s | TFLOP/s | % of matmul ceiling | step s (mean) | step s (min-max) "
          "| first step s | build s | CPU cores busy | peak RSS GB | XLA clusters | load before/after |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows:
        if "error" in r:
            print(f"| {name} | failed: {r['error']} |" + " |" * 11)
            continue
        ceiling = ceilings.get(name.split("+")[0])
        share = f"{100 * r['tflops'] * 1e3 / ceiling:.1f}" if ceiling else "n/a"
        steps = r["step_seconds"]
        finite = "" if r["losses_finite"] else " (loss not finite!)"
        print(f"| {name}{finite} | {r['sequences_per_second']:.2f} | {r['tflops']:.3f} | "
              f"{share} | {r['mean_step_seconds']:.3f} | {min(steps):.3f}-{max(steps):.3f} | "
              f"{r['warmup_seconds'][0]:.1f} | {r['build_seconds']:.1f} | "
              f"{r['cpu_cores_busy']:.2f} | {r['peak_rss_gb']:.1f} | "
              f"{r['xla_clusters']} | {r['load_before']:.2f} / {r['load_after']:.2f} |")
    print("\nTFLOP/s = seq/s x training FLOPs per sequence (matmuls only, 3x forward: "
          "training/flops.py); % = TFLOP/s / the same precision's matmul ceiling above.\n")


def print_gpu_estimates(mfu):
    print(f"### Expected per-GPU throughput from FLOP arithmetic, at {100 * mfu:.0f}% MFU "
          "(dense bf16/fp16 peak)\n")
    header = " | ".join(f"{gpu} ({PEAK_TFLOPS[gpu]:.0f} TFLOP/s) seq/s" for gpu in GPUS)
    print(f"| model | seq | predictions | GFLOP/sequence (training) | {header} |")
    print("|---|---:|---:|---:|" + "---:|" * len(GPUS))
    configs = {}
    for model, seq, predictions in GPU_CASES:
        config = configs.setdefault(model, named_config(model))
        flops = training_flops_per_sequence(config, seq, predictions)
        rates = " | ".join(f"{mfu * PEAK_TFLOPS[gpu] * 1e12 / flops:,.0f}" for gpu in GPUS)
        print(f"| BERT-{model} | {seq} | {predictions} | {flops / 1e9:.1f} | {rates} |")
    print(f"\nseq/s per GPU = MFU x peak / training FLOPs per sequence. {100 * mfu:.0f}% is "
          "an assumption (--mfu): NVIDIA's published single-GPU BERT-large phase-1 numbers "
          "correspond to ~32% (PyTorch, 2020) to ~53% (PaddlePaddle with fused attention, "
          "2022) on A100, and H100 is harder to keep busy (peak FLOPs grew ~3.2x, memory "
          "bandwidth ~1.7x); see bench/README.md.\n")


def parse_records(value):
    """`NAME=PATH,...` -> [(name, path)]."""
    pairs = [part.split("=", 1) for part in value.split(",") if part.strip()]
    if not pairs or any(len(pair) != 2 or not all(pair) for pair in pairs):
        raise SystemExit(f"--records wants NAME=PATH,NAME=PATH..., got {value!r}")
    return [(name.strip(), path.strip()) for name, path in pairs]


def print_records(rows, args, sets):
    """Real-data rows: per round and set, then the mean per set and its ratio to the first
    set named (`sets`: the names, in --records order)."""
    print(f"### BERT-{args.model} step on real records, batch {args.batch_size} rows, seq "
          f"{args.seq_length}, {args.predictions} predictions; {args.steps} timed steps after "
          f"{args.warmup_steps} warm-up, sets alternating over {args.rounds} rounds\n")
    print("| round | records | config | rows/s | sequences/s (batches run) | real tokens/s "
          "(batches run) | padding (records) | instances/row (records) | sequences/s at "
          "records' mean | real tokens/s at records' mean | step s | CPU cores busy | "
          "load before/after |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    means = {}
    for number, name, config, r in rows:
        if "error" in r:
            print(f"| {number} | {name} | {config} | failed: {r['error']} |" + " |" * 9)
            continue
        means.setdefault((name, config), []).append(r)
        padding = 1 - r["real_tokens_per_row"] / args.seq_length
        print(f"| {number} | {name} | {config} | {r['rows_per_second']:.3f} | "
              f"{r['batch_sequences_per_second']:.3f} | {r['batch_real_tokens_per_second']:,.0f} | "
              f"{padding:.1%} | {r['instances_per_row']:.3f} | "
              f"{r['sequences_per_second_at_mean']:.3f} | "
              f"{r['real_tokens_per_second_at_mean']:,.0f} | {r['mean_step_seconds']:.2f} | "
              f"{r['cpu_cores_busy']:.2f} | {r['load_before']:.2f} / {r['load_after']:.2f} |")
    if not means:
        return
    print("\n| records | config | runs | rows/s | rows per CPU s | real tokens/s | ratio | "
          "real tokens/s, fastest step | ratio | real tokens per CPU s | ratio | "
          "sequences/s | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    keys = ("rows_per_second", "rows_per_cpu_second", "real_tokens_per_second_at_mean",
            "real_tokens_per_second_fastest", "real_tokens_per_cpu_second",
            "sequences_per_second_at_mean")
    first = {config: means.get((sets[0], config)) for _, _, config, _ in rows}
    for (name, config), results in means.items():
        mean = {key: sum(_derived(r, args)[key] for r in results) / len(results)
                for key in keys}
        base = first[config] and {key: sum(_derived(r, args)[key] for r in first[config])
                                  / len(first[config]) for key in keys}
        ratio = {key: f"{mean[key] / base[key]:.2f}x" if base else "n/a" for key in keys}
        print(f"| {name} | {config} | {len(results)} | {mean['rows_per_second']:.3f} | "
              f"{mean['rows_per_cpu_second']:.3f} | "
              + " | ".join(f"{mean[key]:,.0f} | {ratio[key]}" for key in keys[2:5])
              + f" | {mean['sequences_per_second_at_mean']:.3f} | "
              f"{ratio['sequences_per_second_at_mean']} |")
    print(f"\nratio: to {sets[0]}. Real tokens and sequences are the records' mean per row "
          "over the whole files times rows/s (a dense step costs the same whatever its rows "
          "hold); fastest step: the batch over the shortest timed step; per CPU s: over the "
          "CPU seconds of the timed steps (wall s x CPU cores busy), steadier than wall time "
          "when other jobs share the cores.\n")


def _derived(r, args):
    """One run's rates at the records' mean real tokens and instances per row."""
    cpu_seconds_per_row = r["cpu_cores_busy"] / r["rows_per_second"]
    return {"rows_per_second": r["rows_per_second"],
            "rows_per_cpu_second": 1 / cpu_seconds_per_row,
            "real_tokens_per_second_at_mean": r["real_tokens_per_second_at_mean"],
            "real_tokens_per_second_fastest":
                args.batch_size / min(r["step_seconds"]) * r["real_tokens_per_row"],
            "real_tokens_per_cpu_second": r["real_tokens_per_row"] / cpu_seconds_per_row,
            "sequences_per_second_at_mean": r["sequences_per_second_at_mean"]}


def run_records(args, configs):
    """The --records mode: each set, alternating, for --rounds rounds."""
    sets = parse_records(args.records)
    rows = []
    for number in range(1, args.rounds + 1):
        for name in configs:
            precision, xla = name.split("+")[0], name.endswith("+xla")
            for label, path in sets:
                print(f"round {number}: {label} {name} ...", file=sys.stderr, flush=True)
                rows.append((number, label, name, spawn(args, "train", precision, xla, path)))
    print_records(rows, args, [label for label, _ in sets])
    return rows


def run_parent(args):
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown --configs {unknown}; choose from {', '.join(CONFIGS)}")
    try:
        config = named_config(args.model)
    except ValueError as err:  # modeling.config.ConfigError
        raise SystemExit(f"--model: {err}") from None
    if not 0 < args.seq_length <= config.max_position_embeddings:
        raise SystemExit(f"--seq_length must be in 1..{config.max_position_embeddings}")
    if not 0 < args.predictions <= args.seq_length - 3:
        raise SystemExit("--predictions must be in 1..seq_length-3")
    if args.batch_size < 1 or args.steps < 1 or args.warmup_steps < 1:
        raise SystemExit("--batch_size, --steps and --warmup_steps must be at least 1")
    print(f"# bench/pretrain.py: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, {cpu_model()}; {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    ceiling = {"n": args.matmul_size}
    if not args.skip_ceiling:
        ceiling = spawn(args, "ceiling")
        ceiling.setdefault("n", args.matmul_size)
        print_ceiling(ceiling, args.threads)
        sys.stdout.flush()
    ceilings = ceilings_by_precision(ceiling) if "results" in ceiling else {}
    if args.records:
        rows = run_records(args, configs)
        raw = [dict(r, round=number, records=label, config=name)
               for number, label, name, r in rows]
    else:
        rows = []
        for name in configs:
            precision, xla = name.split("+")[0], name.endswith("+xla")
            print(f"running {name} ...", file=sys.stderr, flush=True)
            rows.append((name, spawn(args, "train", precision, xla)))
        print_training(rows, ceilings, args)
        print_gpu_estimates(args.mfu)
        raw = dict(rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "ceiling": ceiling, "train": raw}, f, indent=1)


def cpu_model():
    """The CPU's model name and the vector/matrix extensions oneDNN and PyTorch pick kernels
    by, so a table says which hardware it was measured on."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = f.read()
    except OSError:
        return "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                 if line.startswith("model name")), "unknown CPU")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines()
                  if line.startswith("flags")), [])
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    return f"{name} ({', '.join(isa) or 'no AVX2'})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="base", help="shipped config: base, large, tiny")
    parser.add_argument("--batch_size", type=int, default=8,
                        help="sequences per step (8: a base fp32 step takes a few seconds "
                             "on 2 cores and ~4 GB)")
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20,
                        help="masked-LM predictions per sequence")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup_steps", type=int, default=3,
                        help="untimed steps first (XLA compiles a cluster on its first "
                             "runs; the last warm-up step also counts the XLA clusters)")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"comma-separated subset of {', '.join(CONFIGS)}")
    parser.add_argument("--threads", type=int, default=0,
                        help="intra-op threads (0: TensorFlow's default, all cores)")
    parser.add_argument("--inter_threads", type=int, default=0,
                        help="inter-op threads (0: TensorFlow's default)")
    parser.add_argument("--pool_batches", type=int, default=4,
                        help="distinct random batches cycled by the input pipeline")
    parser.add_argument("--matmul_size", type=int, default=2048)
    parser.add_argument("--matmul_seconds", type=float, default=3.0,
                        help="time each ceiling matmul at least this long")
    parser.add_argument("--skip_ceiling", action="store_true")
    parser.add_argument("--mfu", type=float, default=0.40,
                        help="model FLOPs utilisation assumed for the GPU estimates")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per worker")
    parser.add_argument("--json", help="also write all raw results to this file")
    parser.add_argument("--verbose", action="store_true", help="show the workers' stderr")
    parser.add_argument("--records", default="",
                        help="NAME=PATH,...: time the step on batches of these records "
                             "(folders or globs of pre-training records) instead of random "
                             "ones, alternating, and compare their real tokens/s")
    parser.add_argument("--rounds", type=int, default=1, help="with --records: rounds")
    # Internal: one measurement in this process (TensorFlow is imported here).
    parser.add_argument("--worker", choices=("ceiling", "train"), help=argparse.SUPPRESS)
    parser.add_argument("--precision", choices=tuple(PRECISIONS), default="fp32",
                        help=argparse.SUPPRESS)
    parser.add_argument("--xla", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--records_path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args)
    else:
        run_parent(args)


if __name__ == "__main__":
    main()
