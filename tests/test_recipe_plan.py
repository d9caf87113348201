"""The effective recipe equals NVIDIA's: the plans printed by DRY_RUN=1 (scripts and run.sub)
against NVIDIA's own arithmetic, written out here from their scripts, and a real two-rank run
whose logged learning rate is twice the per-rank flag."""
import json
import os
import subprocess
import sys

import pytest


def nvidia_plan(gpus, batch1, batch2, lr1, lr2, accum1, accum2, train_steps=7820,
                warmup1=2000, warmup2=200):
    """NVIDIA's run_pretraining_lamb_phase{1,2}.sh and run_pretraining.py, transcribed:
    expr integer arithmetic for the steps, learning_rate * hvd.size() for the rate."""
    steps1 = train_steps * 9 // 10
    gbs1, gbs2 = batch1 * accum1, batch2 * accum2          # per GPU, as their scripts
    steps2 = train_steps * 1 // 10 * gbs1 // gbs2
    return [dict(phase=1, ranks=gpus, global_batch_size=batch1 * accum1 * gpus,
                 peak_learning_rate=lr1 * gpus, train_steps=steps1, warmup_steps=warmup1,
                 max_seq_length=128, max_predictions_per_seq=20),
            dict(phase=2, ranks=gpus, global_batch_size=batch2 * accum2 * gpus,
                 peak_learning_rate=lr2 * gpus, train_steps=steps2, warmup_steps=warmup2,
                 max_seq_length=512, max_predictions_per_seq=80)]


def dry_run(repo_root, tmp_path, command, extra_env=None):
    env = dict(os.environ, DRY_RUN="1", PYTHON=sys.executable,
               RESULTS_DIR=str(tmp_path / "results"))
    env.update(extra_env or {})
    result = subprocess.run(command, capture_output=True, text=True, cwd=repo_root, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    plans = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert not (tmp_path / "results").exists(), "a dry run must not write anything"
    return plans, result


def assert_plans_match(plans, expected, results_dir):
    assert len(plans) == 2
    for plan, want in zip(plans, expected):
        for key, value in want.items():
            assert plan[key] == pytest.approx(value, rel=1e-9), (plan["phase"], key)
        assert plan["per_rank_batch_size"] * plan["accumulation_steps"] * plan["ranks"] == \
            plan["global_batch_size"]
    assert plans[0]["init_checkpoint"] is None
    # phase 2 starts from phase 1's checkpoint at its last step, as NVIDIA's script
    assert plans[1]["init_checkpoint"] == os.path.join(
        results_dir, "phase_1", f"model.ckpt-{expected[0]['train_steps']}")


def test_nvidia_defaults_on_8_gpus(repo_root, tmp_path):
    plans, _ = dry_run(repo_root, tmp_path, ["bash", "scripts/run_pretraining_lamb.sh"])
    expected = nvidia_plan(8, 64, 8, 7.5e-4, 5e-4, 128, 512)
    assert [p["global_batch_size"] for p in expected] == [65536, 32768]
    assert [p["train_steps"] for p in expected] == [7038, 1564]
    assert [p["peak_learning_rate"] for p in expected] == pytest.approx([6e-3, 4e-3])
    assert_plans_match(plans, expected, str(tmp_path / "results"))
    assert all(p["save_checkpoints_steps"] == 100 and p["precision"] == "fp16"
               and p["optimizer"] == "lamb" for p in plans)


def test_nvidia_run_sub_per_gpu_values_on_32_gpus(repo_root, tmp_path):
    args = ["16", "2", "8", "1.875e-4", "1.25e-4", "fp16", "true", "32", "2000", "200",
            "7820", "100", "128", "512", "large"]
    plans, _ = dry_run(repo_root, tmp_path, ["bash", "scripts/run_pretraining_lamb.sh"] + args)
    expected = nvidia_plan(32, 16, 2, 1.875e-4, 1.25e-4, 128, 512)
    assert [p["global_batch_size"] for p in expected] == [65536, 32768]
    assert [p["train_steps"] for p in expected] == [7038, 1564]
    assert_plans_match(plans, expected, str(tmp_path / "results"))


@pytest.fixture
def fake_slurm(tmp_path):
    """A `scontrol show hostnames` stand-in: one host per comma-separated name."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text('#!/bin/sh\nfor h in $(echo "$3" | tr , " "); do echo "$h"; done\n')
    scontrol.chmod(0o755)
    return lambda nodes: {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GPUS_PER_NODE": "8",
                          "SLURM_JOB_NODELIST": ",".join(f"node{i}" for i in range(nodes))}


@pytest.mark.parametrize("nodes", [1, 2, 4, 8])
def test_run_sub_keeps_the_global_recipe_as_nodes_are_added(repo_root, tmp_path, fake_slurm,
                                                            nodes):
    """NVIDIA's 8-GPU defaults submitted on 1-8 nodes: same global batch, peak rate and
    steps; the per-GPU accumulation (and rate) shrink instead."""
    plans, _ = dry_run(repo_root, tmp_path, ["bash", "scripts/run.sub"], fake_slurm(nodes))
    gpus = 8 * nodes
    expected = nvidia_plan(8, 64, 8, 7.5e-4, 5e-4, 128, 512)
    for want in expected:
        want["ranks"] = gpus
    assert_plans_match(plans, expected, str(tmp_path / "results"))
    assert [p["accumulation_steps"] for p in plans] == [128 * 8 // gpus, 512 * 8 // gpus]
    assert [p["per_rank_batch_size"] for p in plans] == [64, 8]


def test_run_sub_refuses_a_global_batch_it_cannot_split(repo_root, tmp_path, fake_slurm):
    env = dict(os.environ, DRY_RUN="1", PYTHON=sys.executable,
               RESULTS_DIR=str(tmp_path / "results"), **fake_slurm(3))
    result = subprocess.run(["bash", "scripts/run.sub"], capture_output=True, text=True,
                            cwd=repo_root, env=env, timeout=120)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("run.sub:")]
    assert len(errors) == 1 and "cannot be split over 24 GPUs" in errors[0]
    assert "{" not in result.stdout  # nothing planned, nothing launched


def test_run_sub_takes_nvidias_environment_interface_per_gpu_unscaled(repo_root, tmp_path,
                                                                      fake_slurm):
    """NVIDIA's README commands for its run.sub, as they are, on 4 nodes x 8 GPUs: one phase
    each, per-GPU values unscaled, NVIDIA's steps; the plan is printed before the launch."""
    expected = nvidia_plan(32, 16, 2, 1.875e-4, 1.25e-4, 128, 512)
    commands = {1: dict(BATCHSIZE="16", LEARNING_RATE="1.875e-4", NUM_ACCUMULATION_STEPS="128",
                        PHASE="1"),
                2: dict(BATCHSIZE="2", LEARNING_RATE="1.25e-4", NUM_ACCUMULATION_STEPS="512",
                        PHASE="2")}
    for phase, variables in commands.items():
        plans, result = dry_run(repo_root, tmp_path, ["bash", "scripts/run.sub"],
                                dict(fake_slurm(4), **variables))
        assert len(plans) == 1, result.stdout
        for key, value in expected[phase - 1].items():
            assert plans[0][key] == pytest.approx(value, rel=1e-9), (phase, key)
        assert plans[0]["precision"] == "fp16" and plans[0]["save_checkpoints_steps"] == 100
        said = [line for line in result.stdout.splitlines() if line.startswith(f"phase {phase}:")]
        assert said and f"global batch {expected[phase - 1]['global_batch_size']}" in said[0]
    # NVIDIA's defaults for a variable left unset: PHASE=2 alone is NVIDIA's phase 2
    plans, _ = dry_run(repo_root, tmp_path, ["bash", "scripts/run.sub"],
                       dict(fake_slurm(4), PHASE="2"))
    assert plans[0]["global_batch_size"] == 32768 and plans[0]["train_steps"] == 1564
    assert plans[0]["init_checkpoint"].endswith("phase_1/model.ckpt-7038")


@pytest.mark.parametrize("variables,args,message", [
    ({"PHASE": "2"}, ["16", "2"], "and 2 positional argument(s) given together: ambiguous"),
    ({}, ["16", "2", "8", "1.875e-4", "1.25e-4"], "without the 8th (num_gpus"),
    ({"BATCHSIZE": "16x"}, [], "BATCHSIZE=16x: must be a positive whole number"),
    ({"PHASE": "3"}, [], "PHASE=3: must be 1 or 2"),
    ({"LEARNING_RATE": "0"}, [], "LEARNING_RATE=0: must be a positive number"),
    # sbatch --gpus-per-node=0 on a node whose GPUs Slurm does not manage, GPUS_PER_NODE unset
    ({"GPUS_PER_NODE": "", "SLURM_GPUS_PER_NODE": "0"}, [],
     "GPUS_PER_NODE=0 (from GPUS_PER_NODE or --gpus-per-node): must be a positive whole number"),
])
def test_run_sub_refuses_what_it_cannot_read_one_way(repo_root, tmp_path, fake_slurm,
                                                     variables, args, message):
    """NVIDIA's run.sub values carried over as positional arguments on 4 nodes would train a
    4x smaller global batch at a 4x lower peak rate: refused, as is mixing both interfaces."""
    env = dict(os.environ, DRY_RUN="1", PYTHON=sys.executable,
               RESULTS_DIR=str(tmp_path / "results"), **fake_slurm(4))
    env.update(variables)
    for name in ("BATCHSIZE", "LEARNING_RATE", "NUM_ACCUMULATION_STEPS", "PHASE"):
        if name not in variables:
            env.pop(name, None)
    result = subprocess.run(["bash", "scripts/run.sub", *args], capture_output=True, text=True,
                            cwd=repo_root, env=env, timeout=60)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("run.sub: ") and message in errors[0], \
        result.stderr
    assert "{" not in result.stdout  # nothing planned, nothing launched


def test_two_phase_script_does_not_start_phase_2_after_an_unfinished_phase_1(repo_root,
                                                                            tmp_path):
    """A phase 1 that ends early (preempted: exit 0, checkpoint short of its last step)
    must not be followed by phase 2 from its partial weights."""
    results = tmp_path / "results"
    (results / "phase_1").mkdir(parents=True)
    (results / "phase_1" / "model.ckpt-5.index").write_text("")
    env = dict(os.environ, RESULTS_DIR=str(results), PYTHON="true")  # phase 1 "runs", exits 0
    args = ["4", "2", "4", "1e-3", "5e-4", "fp32", "false", "1", "2", "1", "10", "5", "2", "2"]
    result = subprocess.run(["bash", "scripts/run_pretraining_lamb.sh"] + args,
                            capture_output=True, text=True, cwd=repo_root, env=env, timeout=60)
    assert result.returncode == 75, result.stdout + result.stderr
    assert "phase 1 stopped before step 9" in result.stderr
    assert "== phase 2" not in result.stdout
    # the phase-2 script alone refuses too, naming the checkpoint it needs
    result = subprocess.run(["bash", "scripts/run_pretraining_lamb_phase2.sh"] + args,
                            capture_output=True, text=True, cwd=repo_root, env=env, timeout=60)
    assert result.returncode == 1
    assert "phase_1/model.ckpt-9" in result.stderr and "== phase 2" not in result.stdout


@pytest.mark.horovod
def test_two_ranks_apply_twice_the_per_rank_learning_rate(repo_root, tmp_path):
    """Under horovodrun -np 2, --learning_rate=1e-3 is applied as 2e-3 (NVIDIA's
    learning_rate * hvd.size()), and the start-up plan says so."""
    pytest.importorskip("horovod.tensorflow")
    from modeling import named_config
    from pretraining_records import write_random_records
    data = tmp_path / "data"
    data.mkdir()
    for shard in range(2):
        write_random_records(data / f"part-{shard}.tfrecord", 16, 32, 5, 101, seed=shard)
    config = tmp_path / "bert_config.json"
    named_config("tiny").replace(vocab_size=101).to_json_file(str(config))
    dllog = tmp_path / "dllog.jsonl"
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    command = [horovodrun, "-np", "2", "--gloo", "-H", "localhost:2", sys.executable,
               "run_pretraining.py", "--horovod", f"--bert_config_file={config}",
               f"--input_files_dir={data}", f"--output_dir={tmp_path / 'out'}", "--do_train",
               "--train_batch_size=2", "--max_seq_length=32", "--max_predictions_per_seq=5",
               "--learning_rate=1e-3", "--num_warmup_steps=0", "--num_train_steps=4",
               "--display_loss_steps=1", f"--dllog_path={dllog}"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=repo_root,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in dllog.read_text().splitlines()]
    plan = [r for r in records if r.get("event") == "plan"]
    assert len(plan) == 1 and plan[0]["ranks"] == 2
    # the plan names the network the ranks talk on (horovodrun chose it here)
    assert plan[0]["network"].endswith("(NCCL_SOCKET_IFNAME / HOROVOD_GLOO_IFACE)")
    assert plan[0]["peak_learning_rate"] == pytest.approx(2e-3)
    assert plan[0]["global_batch_size"] == 4
    steps = [r for r in records if "learning_rate" in r]
    # the one global norm of the step is logged with it (never the 0 between steps)
    assert len(steps) == 4 and all(r["global_norm"] > 0 for r in steps)
    rates = [r["learning_rate"] for r in steps]
    # no warm-up: LAMB's decay from the peak, lr(s) = 2e-3 * (1 - s/4) ** 0.5
    assert rates == pytest.approx([2e-3 * (1 - s / 4) ** 0.5 for s in range(4)], rel=1e-6)


def test_run_sub_outside_slurm_says_it_needs_sbatch_in_one_line(repo_root):
    """`bash scripts/run.sub` on a machine (no Slurm job): one line, not bash's "unbound
    variable" and "division by 0"."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SLURM_")}
    result = subprocess.run(["bash", "scripts/run.sub"], capture_output=True, text=True,
                            cwd=repo_root, env=env, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "run.sub: not inside a Slurm job (SLURM_JOB_NODELIST unset): submit it with sbatch "
        "(e.g. sbatch --nodes=2 scripts/run.sub ...) or run it inside salloc; on one machine "
        "use scripts/run_pretraining_lamb.sh"]
