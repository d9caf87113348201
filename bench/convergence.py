"""Pre-training from scratch, ours beside HuggingFace's: held-out curves, time to the peer's
final loss, and what each pre-trained model is worth downstream. A study run by hand.

    python bench/convergence.py                          # the whole study (~5 h on 2 cores)
    python bench/convergence.py --quick                  # the same machinery, tiny (~10 min)
    python bench/convergence.py --stages report          # tables and plots from what ran
    python bench/convergence.py --corpus my_text.txt --vocab_file vocab.txt

Every stage keeps its outputs under --work_dir and is skipped when they exist, so a study that
was interrupted resumes where it stopped (a run cut short is rerun from its start: its timing
must be one process's). Stages:

1. ``data``: the corpus through ``bertPrep.py`` itself, command by command (written to
   ``<work_dir>/commands.sh``): ``text_formatting`` of the Wikipedia fragment and the two books
   in ``../shared/data`` (when present) and of the demo's corpus (the standard library's
   docstrings) or ``--corpus``; ``sharding`` of their union with a held-out test split of
   whole documents; ``create_vocab`` (or ``--vocab_file``); ``create_tfrecord_files`` for
   static records (seq 128/20 and 512/80 predictions) and for packed dynamic-masking ones.
   The held-out records are the static test records at 128 and 512, the same for every run.
   Then the unigram baseline (``pretraining.baseline``) at both lengths, and the static
   records as `.npz` for the peer.
2. ``sweep`` (not in the default stages; ``--stages sweep``): the peak learning rate of each
   of our optimizers on a short budget (``--sweep_share`` of phase 1, its own schedule).
3. ``runs``, one at a time, each to the same number of sequences (``RUNS``): ours with NVLAMB
   (``--lamb_layer_adaptation`` all, NVIDIA's, and weights) on packed dynamic-masking
   records, ours with AdamWeightDecay on the static records, and the peer
   (``bench/convergence_peer.py``: HuggingFace ``BertForPreTraining`` with torch AdamW, and
   with pytorch-optimizer's LAMB) on the same static records. Two phases as NVIDIA's recipe:
   phase 1 at 128, then phase 2 at 512 on ``--phase2_share`` of the sequences, from phase 1's
   weights with a fresh optimizer and schedule; NVIDIA's warm-up fractions (2000/7038 and
   200/1564). Ours run as ``run_pretraining.py`` command lines (in ``commands.sh``), saving a
   checkpoint at every evaluation point.
4. ``eval``: our checkpoints on the held-out records (the peer evaluates in its own loop,
   with its clock stopped).
5. ``downstream``: each run's final model and a random initialisation fine-tuned with
   ``run_classifier.py`` on SST-2 and CoLA (``../shared/data/glue``: each dev file split into
   fixed train/held-out halves), ``--seeds`` seeds each; the peer's weights are converted
   with ``python -m cli.convert_checkpoint hf2tf`` so that every model is fine-tuned the same way.
6. ``report``: ``<results_dir>/convergence.md`` (tables), ``convergence.json`` and two plots
   (held-out masked-LM loss against sequences seen and against wall-clock seconds), from
   ``bench/convergence_report.py``.

Wall-clock seconds count from each training process's start (imports, graph or model build
and data loading included); evaluation is outside them for both sides.
"""
import argparse
import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
sys.path.insert(0, REPO)  # first: bench/data_prep.py must not hide the package

from data_prep.bertprep.prep_layout import Layout, PrepOptions  # noqa: E402 (no TensorFlow)
from machine import cpu_name  # noqa: E402

STAGES = ("data", "sweep", "runs", "eval", "downstream", "report")
DEFAULT_STAGES = ("data", "runs", "eval", "downstream", "report")
# NVIDIA's warm-up fractions: 2000 of 7038 phase-1 steps, 200 of 1564 phase-2 steps.
NVIDIA_WARMUP = {1: 2000 / 7038, 2: 200 / 1564}
LENGTHS = {1: (128, 20), 2: (512, 80)}


@dataclasses.dataclass(frozen=True)
class Run:
    """One pre-training run of the study."""
    name: str
    side: str             # ours | hf
    optimizer: str        # ours: lamb | adam; hf: adamw | lamb
    records: str          # static | packed-dynamic
    adaptation: str = ""  # ours' LAMB: all | weights

    @property
    def lr_key(self):
        """Which learning rate of the recipe this run uses (the sweep picks one per key)."""
        if self.optimizer in ("adam", "adamw"):
            return "adam"
        return f"lamb-{self.adaptation or 'all'}"


RUNS = {run.name: run for run in (
    Run("ours-lamb-all", "ours", "lamb", "packed-dynamic", "all"),
    Run("ours-lamb-weights", "ours", "lamb", "packed-dynamic", "weights"),
    Run("ours-adam", "ours", "adam", "static"),
    Run("ours-adamw", "ours", "adamw", "static"),
    Run("hf-adamw", "hf", "adamw", "static"),
    Run("hf-lamb", "hf", "lamb", "static"),
)}


@dataclasses.dataclass
class Recipe:
    """Every number of the study (the command-line flags of the same names)."""
    model: str = "mini"
    vocab_size: int = 8192
    sequences: int = 30000
    phase2_share: float = 0.1
    batch_phase1: int = 32
    batch_phase2: int = 16
    evals_phase1: int = 10
    evals_phase2: int = 4
    eval_examples_128: int = 2048
    eval_examples_512: int = 512
    dupe_factor: int = 5
    pack_128: int = 3
    pack_512: int = 4
    seed: int = 12345
    # The best of `--stages sweep` (10,000-sequence phase-1 runs, bench/README.md): LAMB
    # 1e-2 (2e-2 stalled at the unigram plateau), Adam 1e-3 (5e-4..2e-3 alike at that budget).
    lr_adam: float = 1e-3
    lr_lamb_all: float = 1e-2
    lr_lamb_weights: float = 1e-2
    n_training_shards: int = 4
    n_test_shards: int = 2
    fraction_test_set: float = 0.1

    def learning_rate(self, run):
        return {"adam": self.lr_adam, "lamb-all": self.lr_lamb_all,
                "lamb-weights": self.lr_lamb_weights}[run.lr_key]

    def phase_sequences(self, phase):
        share = self.phase2_share if phase == 2 else 1.0 - self.phase2_share
        return self.sequences * share

    def batch(self, phase):
        return self.batch_phase1 if phase == 1 else self.batch_phase2


def quick_recipe():
    """The whole machinery on a tiny budget: a check that every stage runs (~10 min)."""
    return Recipe(model="tiny", vocab_size=2000, sequences=2400, evals_phase1=3,
                  evals_phase2=2, eval_examples_128=256, eval_examples_512=64, dupe_factor=2)


# ----------------------------------------------------------------------------- helpers

class Study:
    """Paths and the command log of one study."""

    def __init__(self, work_dir, results_dir, recipe, verbose=False):
        self.work = os.path.abspath(work_dir)
        self.results = os.path.abspath(results_dir)
        self.recipe = recipe
        self.verbose = verbose
        os.makedirs(self.work, exist_ok=True)
        self.commands = os.path.join(self.work, "commands.sh")

    def path(self, *parts):
        return os.path.join(self.work, *parts)

    def run(self, argv, log=None, env=None, what=None):
        """Runs a command (logged to commands.sh), its output to `log`; exits on failure."""
        with open(self.commands, "a", encoding="utf-8") as writer:
            writer.write(" ".join(_quote(a) for a in argv) + "\n")
        say(f"   $ {what or ' '.join(os.path.basename(a) if i < 2 else a for i, a in enumerate(argv[:4]))} ...")
        started = time.time()
        if log:
            os.makedirs(os.path.dirname(log), exist_ok=True)
        out = open(log, "a", encoding="utf-8") if log else subprocess.DEVNULL
        try:
            process = subprocess.run(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                     env=env or child_env())
        finally:
            if log:
                out.close()
        if process.returncode != 0:
            tail = open(log, encoding="utf-8").read()[-3000:] if log else ""
            raise SystemExit(f"convergence: {argv[1]} failed (exit {process.returncode})"
                             f"{'; log: ' + log if log else ''}\n{tail}")
        return time.time() - started

    def load(self, name, default=None):
        path = self.path(name)
        if not os.path.exists(path):
            return default
        with open(path, encoding="utf-8") as reader:
            return json.load(reader)

    def save(self, name, value):
        path = self.path(name)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as writer:
            json.dump(value, writer, indent=1, sort_keys=True)
        os.replace(tmp, path)


def _quote(arg):
    return arg if all(c.isalnum() or c in "-_=./,:+*" for c in arg) else repr(arg)


def say(message):
    print(message, flush=True)


def child_env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO, HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("TF_XLA_FLAGS", None)
    return env


def python(*args):
    return [sys.executable, *args]


# ----------------------------------------------------------------------------- 1. data

def stage_data(study, shared_data, corpus, vocab_file):
    """bertPrep.py from text to records; baselines; the peer's .npz. Returns the data record."""
    data = study.load("data.json")
    if data:
        return data
    recipe = study.recipe
    work = study.path("bertprep")
    prep = lambda *args: study.run(  # noqa: E731
        python("bertPrep.py", "--working_dir", work, *args), study.path("bertprep.log"),
        what="bertPrep.py " + " ".join(args[:4]))
    parts = []
    if shared_data:
        wiki = glob.glob(os.path.join(shared_data, "wiki", "enwiki-latest-*.bz2"))
        if wiki:
            prep("--action", "text_formatting", "--dataset", "wikicorpus_en", "--input",
                 wiki[0], "--n_processes", "2")
            parts.append("wikicorpus_en")
        if glob.glob(os.path.join(shared_data, "books", "*.txt")):
            prep("--action", "text_formatting", "--dataset", "bookscorpus", "--input",
                 os.path.join(shared_data, "books"))
            parts.append("bookscorpus")
    if corpus is None:
        from cli.demo import write_stdlib_corpus
        corpus = study.path("stdlib_docstrings.txt")
        # every docstring's prose: the corpus the recorded results (bench/results) were
        # measured on, before the demo kept whole sentences only
        write_stdlib_corpus(corpus, whole_sentences=False)
    prep("--action", "text_formatting", "--dataset", "custom", "--input", corpus)
    parts.append("custom")
    dataset = "+".join(parts)
    shards = ["--n_training_shards", str(recipe.n_training_shards), "--n_test_shards",
              str(recipe.n_test_shards), "--fraction_test_set", str(recipe.fraction_test_set)]
    prep("--action", "sharding", "--dataset", dataset, *shards, "--n_processes", "2")
    layout = Layout(work)
    if vocab_file is None:
        prep("--action", "create_vocab", "--dataset", dataset, "--vocab_size",
             str(recipe.vocab_size))
        vocab_file = layout.vocab_file(dataset, True)
    vocab_size = sum(1 for _ in open(vocab_file, encoding="utf-8"))
    records = {}
    for phase, (seq, pred) in LENGTHS.items():
        pack = recipe.pack_128 if phase == 1 else recipe.pack_512
        for kind, extra in (("static", []),
                            ("packed-dynamic", ["--masking", "dynamic", "--pack",
                                                "--max_sequences_per_row", str(pack)])):
            args = ["--action", "create_tfrecord_files", "--dataset", dataset, *shards,
                    "--vocab_file", vocab_file, "--max_seq_length", str(seq),
                    "--max_predictions_per_seq", str(pred), "--dupe_factor",
                    str(recipe.dupe_factor), "--random_seed", str(recipe.seed),
                    "--n_processes", "2", *extra]
            prep(*args)
            options = PrepOptions(dataset=dataset, n_training_shards=recipe.n_training_shards,
                                  n_test_shards=recipe.n_test_shards,
                                  fraction_test_set=recipe.fraction_test_set,
                                  max_seq_length=seq, max_predictions_per_seq=pred,
                                  dupe_factor=recipe.dupe_factor, random_seed=recipe.seed,
                                  masking="dynamic" if kind != "static" else "static",
                                  max_sequences_per_row=pack if kind != "static" else 0)
            folder = layout.tfrecord_dir(dataset, options)
            records[f"{kind}-{seq}"] = {
                "train": os.path.join(folder, "training"), "test": os.path.join(folder, "test")}
    config_file = study.path("bert_config.json")
    with open(os.path.join(REPO, "modeling", "configs", f"bert_{recipe.model}_config.json"),
              encoding="utf-8") as reader:  # the shipped config, read without TensorFlow
        config = dict(json.load(reader), vocab_size=vocab_size)
    with open(config_file, "w", encoding="utf-8") as writer:
        json.dump(config, writer, indent=2, sort_keys=True)
    data = {"dataset": dataset, "vocab_file": vocab_file, "vocab_size": vocab_size,
            "bert_config_file": config_file, "records": records,
            "formatted": {part: layout.formatted_file(part) for part in parts}}
    say("   baselines, record counts and the peer's arrays")
    facts = child(study, "facts", data)
    data.update(facts)
    study.save("data.json", data)
    return data


def child(study, task, payload):
    """Runs `convergence_child.py task` (a TensorFlow process) with a JSON payload."""
    request = study.path(f"child-{task}-{os.getpid()}.json")
    with open(request, "w", encoding="utf-8") as writer:
        json.dump(dict(payload, recipe=dataclasses.asdict(study.recipe)), writer)
    answer = request + ".out"
    study.run(python(os.path.join(BENCH, "convergence_child.py"), task, request, answer),
              study.path(f"child-{task}.log"), what=f"convergence_child.py {task}")
    with open(answer, encoding="utf-8") as reader:
        result = json.load(reader)
    os.remove(request)
    os.remove(answer)
    return result


# ----------------------------------------------------------------------------- 3. runs

def phase_plan(recipe, data, run, phase):
    """Steps, warm-up, batch and evaluation steps of one phase of `run`."""
    seq, _ = LENGTHS[phase]
    per_row = data["instances_per_row"][f"{run.records}-{seq}"]
    batch = recipe.batch(phase)
    steps = max(1, round(recipe.phase_sequences(phase) / (batch * per_row)))
    evals = recipe.evals_phase1 if phase == 1 else recipe.evals_phase2
    every = max(1, round(steps / evals))  # checkpoints every `every` steps, and the last
    eval_steps = list(range(every, steps, every)) + [steps]
    return {"phase": phase, "steps": steps, "batch_size": batch, "save_every": every,
            "warmup_steps": max(1, round(steps * NVIDIA_WARMUP[phase])),
            "instances_per_row": per_row, "eval_steps": eval_steps,
            "learning_rate": recipe.learning_rate(run),
            # Phase 1's last point is also measured at 512: the loss phase 2 starts from.
            "eval_lengths": [128] if phase == 1 else [128, 512], "final_eval_lengths": [128, 512]}


def ours_command(study, data, run, plan, out, init=None):
    seq, pred = LENGTHS[plan["phase"]]
    every = plan["save_every"]
    argv = python("run_pretraining.py", f"--bert_config_file={data['bert_config_file']}",
                  f"--input_files_dir={data['records'][f'{run.records}-{seq}']['train']}",
                  f"--output_dir={out}", "--do_train", f"--train_batch_size={plan['batch_size']}",
                  f"--max_seq_length={seq}", f"--max_predictions_per_seq={pred}",
                  f"--optimizer_type={run.optimizer}",
                  f"--learning_rate={plan['learning_rate']}",
                  f"--num_train_steps={plan['steps']}",
                  f"--num_warmup_steps={plan['warmup_steps']}",
                  f"--save_checkpoints_steps={every}", "--keep_checkpoint_max=100",
                  "--display_loss_steps=1",  # a timestamp at every step
                  f"--dllog_path={out}/dllog.jsonl", f"--seed={study.recipe.seed}",
                  f"--phase={plan['phase']}")
    if run.adaptation:
        argv.append(f"--lamb_layer_adaptation={run.adaptation}")
    if init:
        argv.append(f"--init_checkpoint={init}")
    return argv


def train_ours(study, data, run, folder, phases):
    """Both phases of one of our runs, each a run_pretraining.py process. Returns timing."""
    timing, elapsed = [], 0.0
    for plan in phases:
        out = os.path.join(folder, f"phase_{plan['phase']}")
        init = os.path.join(folder, "phase_1") if plan["phase"] == 2 else None
        before = os.times()
        started = time.time()
        study.run(ours_command(study, data, run, plan, out, init),
                  os.path.join(folder, f"phase_{plan['phase']}.log"),
                  what=f"run_pretraining.py {run.name} phase {plan['phase']}: "
                       f"{plan['steps']} steps")
        seconds = time.time() - started
        after = os.times()
        timing.append({"phase": plan["phase"], "start": started, "offset": elapsed,
                       "seconds": seconds,
                       "cpu_seconds": (after.children_user + after.children_system
                                       - before.children_user - before.children_system)})
        elapsed += seconds
    return timing


def train_peer(study, data, run, folder, phases):
    """Both phases of a peer run, in one convergence_peer.py process."""
    recipe = study.recipe
    spec = {"bert_config_file": data["bert_config_file"], "optimizer": run.optimizer,
            "seed": recipe.seed, "output_dir": folder,
            "eval_npz": {"128": data["npz"]["static-128"]["test"],
                         "512": data["npz"]["static-512"]["test"]},
            "eval_examples": {"128": recipe.eval_examples_128, "512": recipe.eval_examples_512},
            "phases": [dict(plan, train_npz=data["npz"][f"static-{LENGTHS[plan['phase']][0]}"]
                            ["train"], eval_lengths=[str(n) for n in plan["eval_lengths"]],
                            final_eval_lengths=[str(n) for n in plan["final_eval_lengths"]])
                       for plan in phases]}
    spec_path = os.path.join(folder, "spec.json")
    with open(spec_path, "w", encoding="utf-8") as writer:
        json.dump(spec, writer, indent=1)
    before = os.times()
    started = time.time()
    study.run(python(os.path.join(BENCH, "convergence_peer.py"), "train", "--spec", spec_path),
              os.path.join(folder, "train.log"), what=f"convergence_peer.py {run.name}")
    after = os.times()
    return [{"phase": 0, "start": started, "offset": 0.0, "seconds": time.time() - started,
             "cpu_seconds": (after.children_user + after.children_system
                             - before.children_user - before.children_system)}]


def stage_runs(study, data, names, prefix="runs"):
    for name in names:
        run = RUNS[name]
        folder = study.path(prefix, name)
        if os.path.exists(os.path.join(folder, "done.json")):
            say(f"   {name}: done")
            continue
        shutil.rmtree(folder, ignore_errors=True)  # a cut run restarts: one process's timing
        os.makedirs(folder)
        phases = [phase_plan(study.recipe, data, run, phase) for phase in (1, 2)]
        train = train_ours if run.side == "ours" else train_peer
        timing = train(study, data, run, folder, phases)
        with open(os.path.join(folder, "done.json"), "w", encoding="utf-8") as writer:
            json.dump({"run": dataclasses.asdict(run), "phases": phases, "timing": timing,
                       "cpu": cpu_name()}, writer, indent=1)


# ----------------------------------------------------------------------------- 2. sweep

def stage_sweep(study, data, share, grids):
    """Short phase-1 runs of ours per learning rate; the best per optimizer into the recipe."""
    results = study.load("sweep.json", {})
    for key, rates in grids.items():
        run = {"adam": RUNS["ours-adam"], "lamb-all": RUNS["ours-lamb-all"],
               "lamb-weights": RUNS["ours-lamb-weights"]}[key]
        for rate in rates:
            plan = phase_plan(study.recipe, data, run, 1)
            plan.update(learning_rate=rate, steps=max(1, round(plan["steps"] * share)))
            label = f"{key}@{rate:g}/{plan['steps']}"
            if label in results or (share == 0.25 and f"{key}@{rate:g}" in results):
                continue
            plan.update(warmup_steps=max(1, round(plan["steps"] * NVIDIA_WARMUP[1])),
                        eval_steps=[plan["steps"]], save_every=plan["steps"])
            folder = study.path("sweep", label)
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
            study.run(ours_command(study, data, run, plan, os.path.join(folder, "phase_1")),
                      os.path.join(folder, "phase_1.log"),
                      what=f"sweep {label}: {plan['steps']} steps")
            rows = child(study, "eval", {"data": data, "folder": folder, "phases": [plan]})
            results[label] = {**rows[-1], "optimizer": key, "learning_rate": rate,
                              "steps": plan["steps"]}
            study.save("sweep.json", results)
    return results


def best_rates(sweep):
    """{optimizer: learning rate of the lowest held-out loss}, among each optimizer's longest
    sweep runs (a short budget may leave every rate at the unigram plateau)."""
    longest = {}
    for row in sweep.values():
        longest[row["optimizer"]] = max(longest.get(row["optimizer"], 0), row["steps"])
    best = {}
    for row in sweep.values():
        key = row["optimizer"]
        if row["steps"] != longest[key]:
            continue
        if key not in best or row["masked_lm_loss_128"] < best[key]["masked_lm_loss_128"]:
            best[key] = row
    return {key: row["learning_rate"] for key, row in best.items()}


# ----------------------------------------------------------------------------- 4. eval

def stage_eval(study, data, names):
    for name in names:
        run = RUNS[name]
        folder = study.path("runs", name)
        done = os.path.join(folder, "done.json")
        curve = os.path.join(folder, "curve.jsonl")
        if run.side != "ours" or not os.path.exists(done) or os.path.exists(curve):
            continue
        with open(done, encoding="utf-8") as reader:
            phases = json.load(reader)["phases"]
        say(f"   evaluating {name}'s checkpoints")
        rows = child(study, "eval", {"data": data, "folder": folder, "phases": phases})
        with open(curve + ".tmp", "w", encoding="utf-8") as writer:
            writer.writelines(json.dumps(row) + "\n" for row in rows)
        os.replace(curve + ".tmp", curve)


# ----------------------------------------------------------------------------- main

def missing_packages(names, stages):
    """What the requested runs and stages import that this Python lacks, as one line (or "").

    Checked before the data stage: a study stopped hours in by a missing package (the peer's
    LAMB is imported only when its run starts) loses the machine's quiet hours."""
    import importlib.util
    needed = {}
    if "runs" in stages and any(RUNS[name].side == "hf" for name in names):
        needed.update(torch="torch", transformers="transformers")
        if "hf-lamb" in names:
            needed["pytorch_optimizer"] = "pytorch-optimizer"
    if "report" in stages:
        needed["matplotlib"] = "matplotlib"
    absent = [package for module, package in needed.items()
              if importlib.util.find_spec(module) is None]
    if not absent:
        return ""
    return (f"convergence: {', '.join(absent)} not installed in {sys.executable}: "
            f"pip install -e '{REPO}[bench]' (or leave the runs that need them out with --runs)")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stages", default=",".join(DEFAULT_STAGES),
                        help=f"comma-separated, from {', '.join(STAGES)}")
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated run names")
    parser.add_argument("--work_dir", default=os.path.join(REPO, "bench_out", "convergence"))
    parser.add_argument("--results_dir", default=os.path.join(BENCH, "results"))
    parser.add_argument("--shared_data", default=os.path.join(os.path.dirname(REPO), "shared",
                                                              "data"))
    parser.add_argument("--corpus", default=None,
                        help="your own text (blank-line-separated documents) instead of the "
                             "standard library's docstrings")
    parser.add_argument("--vocab_file", default=None, help="a given vocab.txt instead of one "
                        "trained on the corpus by bertPrep.py --action create_vocab")
    parser.add_argument("--quick", action="store_true",
                        help="tiny model and budget: checks the machinery (~10 min)")
    parser.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds per task")
    parser.add_argument("--sweep_share", type=float, default=0.25)
    parser.add_argument("--sweep_adam", default="5e-4,1e-3,2e-3")
    parser.add_argument("--sweep_lamb", default="2.5e-3,5e-3,1e-2")
    parser.add_argument("--sweep_optimizers", default="adam,lamb-all,lamb-weights",
                        help="which of our optimizers to sweep")
    defaults = Recipe()
    for field in dataclasses.fields(Recipe):
        parser.add_argument(f"--{field.name}", type=type(getattr(defaults, field.name)),
                            default=None)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    recipe = quick_recipe() if args.quick else Recipe()
    overrides = {field.name: getattr(args, field.name) for field in dataclasses.fields(Recipe)
                 if getattr(args, field.name) is not None}
    recipe = dataclasses.replace(recipe, **overrides)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise SystemExit(f"convergence: --stages: unknown {unknown[0]!r} (from {STAGES})")
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    for name in names:
        if name not in RUNS:
            raise SystemExit(f"convergence: --runs: unknown {name!r} (from {', '.join(RUNS)})")
    missing = missing_packages(names, stages)
    if missing:
        raise SystemExit(missing)
    work_dir = args.work_dir + ("-quick" if args.quick and args.work_dir ==
                                parse_args([]).work_dir else "")
    results_dir = args.results_dir
    if args.quick and results_dir == parse_args([]).results_dir:  # keep the study's results
        results_dir = os.path.join(work_dir, "results")
    study = Study(work_dir, results_dir, recipe)
    shared = args.shared_data if os.path.isdir(args.shared_data) else None
    if shared is None:
        say(f"note: {args.shared_data} absent: the corpus is the standard library's docstrings "
            "(or --corpus) alone, and the downstream stage is skipped")
    started = time.time()
    say(f"== data ({study.work})")
    data = stage_data(study, shared, args.corpus, args.vocab_file)
    say(f"   {data['dataset']}: vocab {data['vocab_size']}, unigram baseline at 128: "
        f"loss {data['baseline']['128']['masked_lm_loss']:.3f}")
    if "sweep" in stages:
        say("== sweep")
        grids = {"adam": [float(x) for x in args.sweep_adam.split(",")],
                 "lamb-all": [float(x) for x in args.sweep_lamb.split(",")],
                 "lamb-weights": [float(x) for x in args.sweep_lamb.split(",")]}
        stage_sweep(study, data, args.sweep_share,
                    {key: grids[key] for key in args.sweep_optimizers.split(",")})
    sweep = study.load("sweep.json")
    if sweep:  # the swept rates, unless given on the command line
        rates = {f"lr_{key.replace('-', '_')}": rate for key, rate in best_rates(sweep).items()}
        study.recipe = recipe = dataclasses.replace(
            recipe, **{name: rate for name, rate in rates.items() if name not in overrides})
        say(f"   learning rates (best of the sweep unless given): adam {recipe.lr_adam:g}, "
            f"lamb-all {recipe.lr_lamb_all:g}, lamb-weights {recipe.lr_lamb_weights:g}")
    if "runs" in stages:
        study.save("recipe.json", dataclasses.asdict(recipe))
        say("== runs")
        stage_runs(study, data, names)
    if "eval" in stages:
        say("== eval")
        stage_eval(study, data, names)
    if "downstream" in stages:
        if shared is None:
            say("== downstream: skipped (no GLUE data)")
        else:
            from convergence_downstream import stage_downstream
            say("== downstream")
            stage_downstream(study, data, names, shared, args.seeds)
    if "report" in stages:
        from convergence_report import write_report
        say("== report")
        for path in write_report(study, data, names):
            say(f"   {path}")
    say(f"convergence: {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
