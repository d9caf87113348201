"""What a lost rank costs a Slurm job, with and without the last completed step saved by the
rank that survives (issue 41, item 3; training/last_window.py).

A real one-node Slurm (tests/slurm_cluster.py: slurmctld, slurmd and munged on the loopback)
runs `scripts/run.sub` with 2 tasks (srun's ranks, Horovod over Gloo), a tiny BERT, phase 1
of 9 optimizer steps of 8 micro-batches, a checkpoint every `--every` steps. Once rank 0 has
logged step `--kill_after`, task 1 is SIGKILLed (as a crashed GPU or an out-of-memory kill).
Two variants alternate, round after round:

* `save` (the default): the survivor reaches its window's end, where the allreduce fails,
  and saves the last completed step before srun ends it;
* `no save` (BERT_PEER_LOSS_SAVE=0): it does not, as before this issue.

Either way run.sub relaunches on 1 rank. Measured: the step the relaunch goes on from, the
steps done again, and the seconds from the kill until rank 0 of the relaunch logs the step
that was in progress when the peer died ("back where it was"). Each micro-batch is held `--hold` s more
(training.pauses_for_tests), so a step lasts about as long as the relaunch's start-up:
without it a tiny step takes milliseconds and no cadence would matter.

    python bench/peer_loss.py                        # 2 rounds, a checkpoint every 1000 steps
    python bench/peer_loss.py --every 2 --rounds 1 --json bench/results/peer_loss.json
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(REPO, "tests"), HERE]

import machine  # noqa: E402
from kill_support import trainer_pid  # noqa: E402
from pretraining_records import with_both_phases, write_both_phases  # noqa: E402
from slurm_cluster import SlurmCluster  # noqa: E402

TRAIN_STEPS = 10   # phase 1: 9 steps
ACCUMULATION = 4   # x 2 ranks: 8 micro-batches a step on 1 rank


def job_env(data, results, hold, variant):
    env = with_both_phases(dict(os.environ, BERT_CONFIG=str(data / "bert_config.json"),
                                RESULTS_DIR=str(results), PYTHON=sys.executable,
                                DISPLAY_LOSS_STEPS="1", GPUS_PER_NODE="2",
                                BERT_TEST_MICRO_BATCH_SECONDS=str(hold)), data)
    for name in ("NETWORK_INTERFACE", "BERT_LAUNCHER", "HOROVOD_LAUNCH_FLAGS"):
        env.pop(name, None)
    if variant == "no save":
        env["BERT_PEER_LOSS_SAVE"] = "0"
    return env


def read(path):
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def wait_for(cluster, job_id, path, pattern, timeout=600, after=0):
    """The first match of `pattern` in the job's output past character `after`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = re.compile(pattern, re.MULTILINE).search(read(path), after)
        if found:
            return found
        if cluster.job(job_id).get("JobState") not in ("PENDING", "CONFIGURING", "RUNNING"):
            break
        time.sleep(0.1)
    raise SystemExit(f"job {job_id}: no /{pattern}/ in its output:\n{read(path)[-3000:]}")


def one_run(cluster, data, folder, variant, args):
    results = folder / "results"
    positional = ["32", "8", "4", "1e-3", "5e-4", "fp32", "false", "2", "2", "1",
                  str(TRAIN_STEPS), str(args.every), str(ACCUMULATION), str(ACCUMULATION),
                  "base"]
    job_id = cluster.sbatch(["--nodes=1", "--gpus-per-node=0",
                             os.path.join(REPO, "scripts", "run.sub")] + positional,
                            env=job_env(data, results, args.hold, variant), cwd=folder)
    path = cluster.job(job_id)["StdOut"]
    try:
        steps = []
        for step in range(1, args.kill_after + 1):
            wait_for(cluster, job_id, path, rf"^0: .*step {step}/")
            steps.append(time.time())
        killed = time.time()
        os.kill(trainer_pid(1, results), 9)
        failed = wait_for(cluster, job_id, path, r"^run\.sub: attempt 1 failed: .*$")
        resumed = re.search(r"checkpoint of step (\d+)", failed.group(0))
        # The step in progress at the kill, done by the relaunch (one rank left: its lines
        # carry no srun label).
        wait_for(cluster, job_id, path, rf"^(0: )?.*step {args.kill_after + 1}/",
                 after=failed.end())
        back_at = time.time()
        saved = re.search(r"saved its last completed step, \d+ \(micro_step \d+\), to \S+ in "
                          r"([\d.]+) s", read(path))
        from_step = int(resumed.group(1)) if resumed else 0
        return {"variant": variant, "resumed_from": from_step,
                "steps_done_again": args.kill_after - from_step,
                "seconds_back": back_at - killed,
                "step_seconds": statistics.median(b - a for a, b in zip(steps, steps[1:])),
                "save_seconds": float(saved.group(1)) if saved else None,
                "line": failed.group(0)}
    finally:
        cluster.run(["scancel", str(job_id)], check=False)
        cluster.wait_until_finished(job_id, 120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--every", type=int, default=1000,
                        help="save_checkpoints_steps (NVIDIA's 100 is never reached in 9 steps)")
    parser.add_argument("--kill_after", type=int, default=5)
    parser.add_argument("--hold", type=float, default=0.5,
                        help="seconds added to each micro-batch (8 a step on 1 rank)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    root = pathlib.Path(tempfile.mkdtemp(prefix="peer-loss-"))
    data = write_both_phases(root / "data")
    cluster = SlurmCluster(cpus=2)
    cluster.start()
    rows = []
    try:
        for round_index in range(args.rounds):
            for variant in ("save", "no save"):
                folder = root / f"{round_index}-{variant.replace(' ', '-')}"
                folder.mkdir()
                rows.append(one_run(cluster, data, folder, variant, args))
                print(f"round {round_index + 1} {variant}: {rows[-1]['line']}", flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nCPU: {machine.cpu_name()}; checkpoint every {args.every} steps, task 1 killed "
          f"after step {args.kill_after}; medians over {args.rounds} round(s)\n")
    print("| variant | resumed from step | steps done again | s from the kill to step "
          f"{args.kill_after + 1} done | s a step (2 ranks) | s to save |")
    print("|---|---:|---:|---:|---:|---:|")
    for variant in ("save", "no save"):
        mine = [row for row in rows if row["variant"] == variant]
        saves = [row["save_seconds"] for row in mine if row["save_seconds"] is not None]
        print(f"| {variant} | {statistics.median(r['resumed_from'] for r in mine):g} | "
              f"{statistics.median(r['steps_done_again'] for r in mine):g} | "
              f"{statistics.median(r['seconds_back'] for r in mine):.1f} | "
              f"{statistics.median(r['step_seconds'] for r in mine):.2f} | "
              f"{statistics.median(saves) if saves else float('nan'):.2f} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"cpu": machine.cpu_name(), "every": args.every,
                       "kill_after": args.kill_after, "hold": args.hold, "rows": rows},
                      handle, indent=1)


if __name__ == "__main__":
    main()
