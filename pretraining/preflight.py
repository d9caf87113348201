"""The preflight of a GPU node (`bert-preflight`): what this node will really do, measured
in minutes, before a pre-training run spends GPU-days on it.

It finds the GPUs TensorFlow sees (`runtime.devices`) and Horovod's build, then runs the
project's own pre-training command (`run_pretraining.py`, as a child process: what users
launch, start-up checks, hooks and all) on synthetic phase-1 records: once on one GPU, once
on all GPUs of the node (`horovodrun --gloo`, or in-graph towers where Horovod does not
import; on a machine without GPU: one process, then two CPU ranks). Each run's steady-state
rate and peak memory come from its dllog summary (`training.hooks.StepLoggingHook`, warm-up
left out); whether XLA compiled, from its log file, where TensorFlow's C++ INFO line
"Compiled cluster using XLA" lands (`reporting.native_log`; the children run with
TF_CPP_MIN_LOG_LEVEL=0). The report and the verdict are `pretraining.preflight_report`'s,
from these facts alone.

The loop: NVIDIA's phase-1 shape (sequence length 128, 20 predictions), NVIDIA's per-GPU
batch for the GPU and precision (`published_speed.phase1_batch`), GPU_STEPS optimizer steps
of GPU_ACCUMULATION micro-batches: the first 2 steps (XLA's compilation, first runs) are
warm-up, so 6 steps of 8 micro-batches are measured, and accumulating 8 keeps the once-a-step
costs (the LAMB update, the allreduce) a small share as in NVIDIA's runs (which accumulate
128 to 1024). On an A100 that is ~10 s of training a run; start-up (building BERT-large, XLA)
is most of the few minutes. On a CPU (a fall-back anyway) CPU_STEPS steps without
accumulation, enough to show the path works.
"""
import dataclasses
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

import numpy as np
from absl import logging

from data_prep.instances import record_metadata, tfrecord_writer
from data_prep.instances.masked_instances import FEATURE_KINDS
from modeling import BertConfig, ConfigError
from modeling.config import CONFIG_DIR
from pretraining import published_speed
from pretraining.preflight_report import (XLA_EVIDENCE, Facts, HorovodBuild, Measured,
                                          device_count)
from reporting.console import SHOW
from reporting.errors import UsageError
from runtime import devices
from training.flops import training_flops_per_sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ, PREDICTIONS = published_speed.PHASE1_SEQ, 20  # NVIDIA's phase 1
GPU_STEPS, GPU_ACCUMULATION = 8, 8
CPU_STEPS, CPU_ACCUMULATION = 4, 1
WARMUP_STEPS = 2                        # StepLoggingHook's default warm-up
CPU_RANKS = 2                           # "all devices" of a machine without GPU
LEARNING_RATE = 7.5e-4                  # NVIDIA's phase-1 rate per GPU
INIT_LOSS_SCALE = 2.0 ** 15             # float16 steps from the first (2^32 skips ~17)
RUN_TIMEOUT_SECONDS = 1800              # a run that hangs (a stuck rendezvous) is stopped
RECORDS_PER_BATCH = 4                   # records per file, in batches (the stream repeats)
PRECISION_FLAGS = {"fp16": ["--amp", "--amp_dtype=float16"],
                   "bf16": ["--amp", "--amp_dtype=bfloat16"],
                   "fp32": ["--noamp"], "tf32": ["--noamp"]}
CLS, SEP, MASK = 101, 102, 103         # Google's uncased vocabulary's ids
ARCHITECTURE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
KEPT = ("run_pretraining", "dllog.jsonl", "console.txt")  # a run's files kept after it


@dataclasses.dataclass(frozen=True)
class PreflightOptions:
    """The preflight's choices; None: the default for the node (module docstring)."""
    model: str = "large"
    bert_config_file: Optional[str] = None
    precision: str = "fp16"
    use_xla: bool = True
    train_batch_size: Optional[int] = None
    num_train_steps: Optional[int] = None
    num_accumulation_steps: Optional[int] = None
    work_dir: Optional[str] = None


def horovod_build():
    """Horovod's HorovodBuild, or None when `horovod.tensorflow` does not import."""
    try:
        import horovod
        import horovod.tensorflow as hvd
        return HorovodBuild(getattr(horovod, "__version__", "?"), int(hvd.nccl_built()),
                            bool(hvd.gloo_built()), bool(hvd.mpi_built()))
    except Exception:  # noqa: BLE001 - not installed, or built against another TensorFlow
        return None


def model_facts(model, bert_config_file):
    """(config path, BertConfig, label, published model "large"/"base"/None, FLOP ratio of
    BERT-large to it). A config of BERT-large's or BERT-base's shape counts as that model."""
    path = os.path.abspath(bert_config_file or os.path.join(CONFIG_DIR,
                                                            f"bert_{model}_config.json"))
    try:
        config = BertConfig.from_json_file(path)
    except (ConfigError, OSError, ValueError) as err:
        raise UsageError(f"--bert_config_file={path}: {err}") from None
    large = BertConfig.from_json_file(os.path.join(CONFIG_DIR, "bert_large_config.json"))
    known = None
    for name in ("large", "base"):
        named = BertConfig.from_json_file(os.path.join(CONFIG_DIR, f"bert_{name}_config.json"))
        if all(getattr(config, field) == getattr(named, field) for field in ARCHITECTURE):
            known = name
    label = f"BERT-{known}" if known else f"the model of {path}"
    if bert_config_file and known:
        label += f" ({path})"
    ratio = (training_flops_per_sequence(large, SEQ, PREDICTIONS)
             / training_flops_per_sequence(config, SEQ, PREDICTIONS))
    return path, config, label, known, ratio


def write_records(folder, files, records, vocab_size, seed=12345):
    """`files` record files of `records` random phase-1 records each in Google's format (as
    data preparation writes them, with their metadata): [CLS] A [SEP] B [SEP] filling all
    SEQ tokens, PREDICTIONS masked positions a row. Ids 0-999 are kept for special tokens,
    as in Google's vocabularies. Returns the paths."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    first_id = min(1000, vocab_size // 2)
    paths = []
    for index in range(files):
        ids = rng.integers(first_id, vocab_size, (records, SEQ))
        split = rng.integers(SEQ // 4, 3 * SEQ // 4, records)
        ids[:, 0] = CLS % vocab_size
        ids[:, -1] = ids[np.arange(records), split] = SEP % vocab_size
        segments = (np.arange(SEQ)[None, :] > split[:, None]).astype(np.int64)
        order = rng.random((records, SEQ - 2))  # positions 1..SEQ-2, the middle [SEP] last
        order[np.arange(records), split - 1] = 2.0
        candidates = np.argsort(order, axis=1)[:, :PREDICTIONS] + 1
        positions = np.sort(candidates, axis=1)
        features = {
            "input_ids": ids, "input_mask": np.ones((records, SEQ), np.int64),
            "segment_ids": segments, "masked_lm_positions": positions,
            "masked_lm_ids": np.take_along_axis(ids, positions, axis=1),
            "masked_lm_weights": np.ones((records, PREDICTIONS), np.float32),
            "next_sentence_labels": rng.integers(0, 2, (records, 1)),
        }
        np.put_along_axis(features["input_ids"], positions, MASK % vocab_size, axis=1)
        path = os.path.join(folder, f"part-{index:05d}.tfrecord")
        with tfrecord_writer.TFRecordFileWriter(path) as writer:
            writer.write_tfrecords(tfrecord_writer.encode_tfrecords(features, FEATURE_KINDS),
                                   records)
        record_metadata.write(path, record_metadata.describe(
            records, SEQ, PREDICTIONS, vocab_size, "synthetic: random ids"))
        paths.append(path)
    return paths


def trainer():
    """How to start the pre-training command: run_pretraining.py beside the packages, else
    the console script installed beside this Python."""
    script = os.path.join(ROOT, "run_pretraining.py")
    if os.path.isfile(script):
        return [sys.executable, script]
    return [os.path.join(os.path.dirname(sys.executable), "bert-pretrain")]


def _horovodrun():
    beside = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return beside if os.access(beside, os.X_OK) else shutil.which("horovodrun")


def launches(gpus, horovod):
    """[(devices, how, command prefix, extra flags, environment changes)]: the one-device run
    and, unless the node has a single GPU, the all-device run."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    runs = [(1, "run_pretraining.py", [], [], {"CUDA_VISIBLE_DEVICES": first} if gpus else {})]
    count = len(gpus) if gpus else CPU_RANKS
    if gpus and count == 1:
        return runs
    horovodrun = _horovodrun()
    if horovod is not None and horovod.gloo and horovodrun:
        runs.append((count, f"horovodrun -np {count} --gloo",
                     [horovodrun, "-np", str(count), "--gloo", "-H", f"localhost:{count}"],
                     ["--horovod"], {}))
    else:
        runs.append((count, f"--num_local_devices={count}", [],
                     [f"--num_local_devices={count}"], {}))
    return runs


def _summary(dllog):
    """The last summary record of a dllog, or None."""
    found = None
    try:
        with open(dllog, encoding="utf-8") as reader:
            for line in reader:
                if '"summary"' in line:
                    record = json.loads(line)
                    found = record if record.get("event") == "summary" else found
    except (OSError, ValueError):
        return None
    return found


_RANK_PREFIX = re.compile(r"^\[\d+(?:,\d+)?\]<std(?:out|err)>:")  # horovodrun's, mpirun's


def failure_line(output, status):
    """Why a run failed, in one line: its last `error: ...` line (horovodrun's rank prefix
    taken off), else its last line, else its exit status."""
    lines = [_RANK_PREFIX.sub("", line).strip() for line in output.splitlines()]
    lines = [line for line in lines if line]
    errors = [line for line in lines if line.startswith("error:")]
    last = errors[-1] if errors else (lines[-1] if lines else "")
    return f"exit status {status}" + (f": {last[:300]}" if last else "")


def xla_compiled(out_dir, output):
    """Whether rank 0's log file (or, verbose, the console) has XLA's compile line."""
    for path in (os.path.join(out_dir, "run_pretraining.log"),):
        try:
            with open(path, encoding="utf-8", errors="replace") as reader:
                if any(XLA_EVIDENCE in line for line in reader):
                    return True
        except OSError:
            pass
    return XLA_EVIDENCE in output


def _tidy(out_dir):
    """Removes a finished run's checkpoints (GBs for BERT-large), keeping logs and dllog."""
    for path in glob.glob(os.path.join(out_dir, "*")):
        if not os.path.basename(path).startswith(KEPT):
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def _stop(process, grace_seconds=60):
    """Stops a run that hangs: SIGTERM to its process group (horovodrun passes it on to its
    ranks), SIGKILL to the group after `grace_seconds`."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(grace_seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:  # ended meanwhile
        process.wait()


def run_training(launch, args, out_dir, use_xla, timeout=RUN_TIMEOUT_SECONDS):
    """Runs one launch (see `launches`) of the pre-training command with `args`, output in
    `out_dir` (emptied first: a checkpoint left there would be resumed); its Measured."""
    devices_, how, prefix, extra, env_changes = launch
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir, exist_ok=True)
    dllog = os.path.join(out_dir, "dllog.jsonl")
    command = prefix + trainer() + args + [f"--output_dir={out_dir}",
                                           f"--dllog_path={dllog}"] + extra
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", **env_changes)
    console = os.path.join(out_dir, "console.txt")
    started = time.time()
    with open(console, "w", encoding="utf-8") as writer:
        process = subprocess.Popen(command, stdout=writer, stderr=subprocess.STDOUT, env=env,
                                   cwd=ROOT, start_new_session=True)
        try:
            status = process.wait(timeout)
        except subprocess.TimeoutExpired:
            _stop(process)
            status = None
    with open(console, encoding="utf-8", errors="replace") as reader:
        output = reader.read()
    if status is None:
        return Measured(devices_, how, failure=f"no end after {timeout} s: stopped (its "
                                               f"output: {console})")
    if status != 0:
        return Measured(devices_, how, failure=failure_line(output, status))
    summary = _summary(dllog) or {}
    rate = summary.get("average_sequences_per_second")
    measured = Measured(
        devices_, how, rate, summary.get("peak_memory_bytes"), summary.get("peak_memory_of"),
        xla_compiled(out_dir, output) if use_xla else None, summary.get("steady_steps"),
        None if rate else f"no steady-state rate in {dllog} (no step after warm-up)")
    logging.info("preflight: %s run done in %.0f s: %s", how, time.time() - started,
                 f"{rate:.1f} sequences/s" if rate else measured.failure, extra=SHOW)
    _tidy(out_dir)
    return measured


def _loop(options, gpus):
    """(batch, why, accumulation, steps) for this node."""
    name = gpus[0].name if gpus else None
    batch, why = published_speed.phase1_batch(name, gpus[0].memory_bytes if gpus else None,
                                              options.precision)
    if options.train_batch_size:
        batch, why = options.train_batch_size, "--train_batch_size"
    steps = options.num_train_steps or (GPU_STEPS if gpus else CPU_STEPS)
    accumulation = options.num_accumulation_steps or (GPU_ACCUMULATION if gpus
                                                      else CPU_ACCUMULATION)
    if steps <= WARMUP_STEPS:
        raise UsageError(f"--num_train_steps={steps}: the first {WARMUP_STEPS} steps are "
                         f"warm-up, left out of the rate; give at least {WARMUP_STEPS + 1}")
    return batch, why, accumulation, steps


def run(options, gpus=None):
    """Finds the node's facts, runs the two training runs, returns Facts. `gpus`: the
    visible GpuInfo list (default: `runtime.devices.visible_gpus()`)."""
    path, config, label, known, ratio = model_facts(options.model, options.bert_config_file)
    gpus = devices.visible_gpus() if gpus is None else gpus
    batch, why, accumulation, steps = _loop(options, gpus)
    expected = devices.gpu_expected()
    cause = devices.no_gpu_cause() if expected and not gpus else None
    horovod = horovod_build()
    plan = launches(gpus, horovod)
    work = os.path.abspath(options.work_dir or tempfile.mkdtemp(prefix="bert_preflight_"))
    records = os.path.join(work, "records")
    for folder in (records, records + record_metadata.FOLDER_SUFFIX):
        shutil.rmtree(folder, ignore_errors=True)  # an earlier preflight's
    try:
        write_records(records, plan[-1][0], batch * RECORDS_PER_BATCH, config.vocab_size)
    except OSError as err:
        raise UsageError(f"--work_dir={work}: cannot write the records: {err}") from None
    args = [f"--bert_config_file={path}", f"--input_files_dir={records}", "--do_train",
            "--optimizer_type=lamb", f"--max_seq_length={SEQ}",
            f"--max_predictions_per_seq={PREDICTIONS}", f"--train_batch_size={batch}",
            f"--learning_rate={LEARNING_RATE}", f"--num_warmup_steps={steps}",
            f"--num_train_steps={steps}", f"--num_accumulation_steps={accumulation}",
            "--allreduce_post_accumulation", f"--save_checkpoints_steps={steps}",
            "--display_loss_steps=1", f"--init_loss_scale={INIT_LOSS_SCALE:g}",
            "--use_xla" if options.use_xla else "--nouse_xla"] + PRECISION_FLAGS[options.precision]
    if not gpus:
        args.append("--allow_cpu")  # the report says it; the runs measure the CPU
    runs = []
    for launch in plan:
        logging.info("preflight: training on %s (%s), a few minutes...",
                     device_count(launch[0], gpus), launch[1], extra=SHOW)
        runs.append(run_training(launch, args, os.path.join(work, f"run_{launch[0]}"),
                                 options.use_xla))
    facts = Facts(tuple(gpus), expected, cause, horovod, label, known, ratio, options.precision,
                  options.use_xla, SEQ, PREDICTIONS, batch, why, accumulation, steps,
                  tuple(runs))
    with open(os.path.join(work, "preflight.json"), "w", encoding="utf-8") as writer:
        json.dump(dataclasses.asdict(facts), writer, indent=1)
    if options.work_dir is None and not any(run.failure for run in runs):
        shutil.rmtree(work, ignore_errors=True)
    elif options.work_dir is None:
        logging.warning("preflight: a run failed; its logs are kept in %s", work)
    return facts
