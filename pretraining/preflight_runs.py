"""The preflight's training runs: the project's own pre-training command started as users
start it (`run_pretraining.py`, or horovodrun / in-graph towers for all devices), stopped when
it hangs, and read afterwards: its dllog (the steady-state summary, one loss a step, the XLA
record of `training.xla_evidence`) and, when it failed, why in one line (out of GPU memory
with what to do, its last `error:` line, or its exit status).
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from absl import logging

from pretraining.preflight_report import Measured
from reporting.console import SHOW

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_TIMEOUT_SECONDS = 1800              # a run that hangs (a stuck rendezvous) is stopped
CPU_RANKS = 2                           # "all devices" of a machine without GPU
KEPT = ("run_pretraining", "dllog.jsonl", "console.txt")  # a run's files kept after it
# The preflight's --precision as NVIDIA's scripts map it to the command's flags.
PRECISION_FLAGS = {"fp16": ["--amp", "--amp_dtype=float16"],
                   "bf16": ["--amp", "--amp_dtype=bfloat16"],
                   "fp32": ["--noamp"], "tf32": ["--noamp"]}


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


def dllog_records(dllog, event):
    """The records of a dllog with this "event" ("summary", "xla"), in order."""
    found = []
    try:
        with open(dllog, encoding="utf-8") as reader:
            for line in reader:
                if f'"{event}"' in line:
                    record = json.loads(line)
                    if record.get("event") == event:
                        found.append(record)
    except (OSError, ValueError):
        return []
    return found


def summary_of(dllog):
    """The last summary record of a dllog, or None."""
    found = dllog_records(dllog, "summary")
    return found[-1] if found else None


def step_losses(dllog, key="masked_lm_loss"):
    """[(step, loss)] of a dllog's step records (`--display_loss_steps=1`: one a step)."""
    steps = []
    try:
        with open(dllog, encoding="utf-8") as reader:
            for line in reader:
                record = json.loads(line)
                if "event" not in record and "step" in record and key in record:
                    steps.append((int(record["step"]), float(record[key])))
    except (OSError, ValueError):
        return []
    return steps


_RANK_PREFIX = re.compile(r"^\[\d+(?:,\d+)?\]<std(?:out|err)>:")  # horovodrun's, mpirun's
OUT_OF_MEMORY = re.compile(r"ResourceExhaustedError|OOM when allocating|out of memory",
                           re.IGNORECASE)


def failure_line(output, status, batch=None):
    """Why a run failed, in one line: out of GPU memory (with what to do), else its last
    `error: ...` line (horovodrun's rank prefix taken off), else its last line, else its
    exit status."""
    lines = [_RANK_PREFIX.sub("", line).strip() for line in output.splitlines()]
    lines = [line for line in lines if line]
    if any(OUT_OF_MEMORY.search(line) for line in lines):
        at = f" at batch {batch} a GPU" if batch else ""
        return (f"exit status {status}: out of memory{at}: halve the per-GPU batch and double "
                "the accumulation (the same global batch), or use a GPU with more memory")
    errors = [line for line in lines if line.startswith("error:")]
    last = errors[-1] if errors else (lines[-1] if lines else "")
    return f"exit status {status}" + (f": {last[:300]}" if last else "")


def xla_evidence(dllog):
    """(compiled, description) from the run's XLA record (`training.xla_evidence`), or
    (None, None) when it wrote none."""
    from training.xla_evidence import describe
    found = dllog_records(dllog, "xla")
    if not found:
        return None, None
    return bool(found[-1]["compiled"]), describe(found[-1])


def tidy(out_dir):
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


def train(launch, args, out_dir, timeout=RUN_TIMEOUT_SECONDS, env_changes=None):
    """Runs one launch (see `launches`) of the pre-training command with `args`, output in
    `out_dir` (emptied first: a checkpoint left there would be resumed). Returns (exit status
    or None when it hung and was stopped, its console output, its dllog path)."""
    _, _, prefix, extra, launch_env = launch
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir, exist_ok=True)
    dllog = os.path.join(out_dir, "dllog.jsonl")
    command = prefix + trainer() + args + [f"--output_dir={out_dir}",
                                           f"--dllog_path={dllog}"] + extra
    env = dict(os.environ, **launch_env, **(env_changes or {}))
    console = os.path.join(out_dir, "console.txt")
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
    return status, output, dllog


def run_training(launch, args, out_dir, use_xla, timeout=RUN_TIMEOUT_SECONDS, phase=1,
                 batch=None):
    """Runs one launch of the pre-training command (`train`); its Measured."""
    devices_, how = launch[0], launch[1]
    started = time.time()
    status, output, dllog = train(launch, args, out_dir, timeout)
    if status is None:
        return Measured(devices_, how, failure=f"no end after {timeout} s: stopped (its "
                                               f"output: {out_dir}/console.txt)", phase=phase)
    if status != 0:
        return Measured(devices_, how, failure=failure_line(output, status, batch), phase=phase)
    summary = summary_of(dllog) or {}
    rate = summary.get("average_sequences_per_second")
    compiled, described = xla_evidence(dllog) if use_xla else (None, None)
    measured = Measured(
        devices_, how, rate, summary.get("peak_memory_bytes"), summary.get("peak_memory_of"),
        compiled, summary.get("steady_steps"),
        None if rate else f"no steady-state rate in {dllog} (no step after warm-up)",
        phase, described)
    logging.info("preflight: phase %d, %s run done in %.0f s: %s", phase, how,
                 time.time() - started,
                 f"{rate:.1f} sequences/s" if rate else measured.failure, extra=SHOW)
    tidy(out_dir)
    return measured
