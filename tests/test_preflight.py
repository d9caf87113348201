"""`bert-preflight`: the real command on this CPU machine (one run: it trains both phases,
names the CPU, reads Horovod's build, the rates and what XLA compiled, runs the loss check in
bfloat16 against float32, and exits by its verdict), and every GPU branch from faked facts
(the report is a pure function of them): NVIDIA's figure for each GPU kind and phase, the
per-GPU batch, the whole report of an 8 x A100 node, scaling, each fall-back, phase 2 out of
memory, a GPU NVIDIA publishes nothing for, and each outcome of the loss check."""
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import pytest

from modeling import named_config
from pretraining import published_speed as published
from pretraining.loss_check import LossCheck
from pretraining.preflight_report import (FAILED, FELL_BACK, PASSED, Facts, HorovodBuild, Loop,
                                          Measured, facts_from_json, nccl_version, report)
from runtime.devices import GIB, GpuInfo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVIDIA_README = os.path.join(os.environ.get(
    "NVIDIA_BERT_DIR", "/work/nv/TensorFlow/LanguageModeling/BERT"), "README.md")

A100_40 = ("NVIDIA A100-SXM4-40GB", 42505273344)
A100_80 = ("NVIDIA A100-SXM4-80GB", 85899345920)
V100_16 = ("Tesla V100-SXM2-16GB", 16945512448)
V100_32 = ("Tesla V100-SXM2-32GB", 34089730048)
H100 = ("NVIDIA H100 80GB HBM3", 85520809984)
T4 = ("Tesla T4", 15843721216)


# ---- the real command, on this machine's CPU ---------------------------------------------

LOSS_STEPS = 200


@pytest.fixture(scope="module")
def cpu_preflight(tmp_path_factory):
    """One real preflight (scripts/preflight.sh, no --allow_cpu) of a 1-layer BERT in
    bfloat16 (the CPU's stand-in for float16), 3 steps a loop, and the loss check:
    (completed process, its work folder)."""
    work = tmp_path_factory.mktemp("preflight")
    config = work / "bert_config.json"
    named_config("tiny").replace(vocab_size=512, num_hidden_layers=1).to_json_file(str(config))
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    result = subprocess.run(
        ["bash", os.path.join(REPO, "scripts", "preflight.sh"), f"--bert_config_file={config}",
         "--precision=bf16", "--train_batch_size=8", "--num_train_steps=3",
         f"--loss_steps={LOSS_STEPS}", f"--work_dir={work / 'work'}"],
        capture_output=True, text=True, timeout=900, env=env, cwd=str(work))
    return result, work / "work"


@pytest.mark.slow
def test_on_a_cpu_it_trains_names_the_cpu_and_exits_as_a_fall_back(cpu_preflight):
    result, work = cpu_preflight
    assert result.returncode == FELL_BACK, result.stdout + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = result.stdout.rstrip("\n").splitlines()
    # Only the CPU fell back: both runs gave a rate and XLA compiled in both.
    assert lines[-1] == "FELL BACK: no GPU, computed on the CPU (--allow_cpu accepts that)"
    assert lines[1] == ("devices:  CPU (TensorFlow sees no GPU, and none is expected: no "
                        "/dev/nvidia* device)")
    if importlib.util.find_spec("horovod") is not None:
        assert re.fullmatch(r"Horovod:  [\d.]+, NCCL no, Gloo yes, MPI (yes|no)",
                            lines[2]), lines[2]
        two = "horovodrun -np 2 --gloo"
    else:
        assert lines[2].startswith("Horovod:  Horovod not installed")
        two = "--num_local_devices=2"
    assert "NVIDIA publishes no figure for CPU" in lines
    assert lines[3].startswith("phase 1:  sequence length 128, 20 predictions: 3 steps of 1 "
                               "micro-batch of 8 sequences a worker (--train_batch_size)")
    assert lines[4].startswith("phase 2:  sequence length 512, 80 predictions: 3 steps of 1 "
                               "micro-batch of 2 sequences a worker (our choice for a CPU")
    # The rates are the dllog summaries' steady-state rates, the memory their peaks, XLA
    # the run's own clusters (its dllog's XLA record, from the graph it executed).
    for label, how, folder in (("phase 1, CPU, 1 worker", "run_pretraining.py", "run_phase1_1"),
                               ("phase 1, CPU, 2 workers", two, "run_phase1_2"),
                               ("phase 2, CPU, 1 worker", "run_pretraining.py", "run_phase2_1")):
        with open(work / folder / "dllog.jsonl", encoding="utf-8") as reader:
            records = [json.loads(line) for line in reader]
        summary = [record for record in records if record.get("event") == "summary"][-1]
        xla = [record for record in records if record.get("event") == "xla"][-1]
        row = next(line for line in lines if line.startswith(label + " "))
        cells = re.split(r"\s{2,}", row)
        assert cells[:5] == [label, how, f"{summary['average_sequences_per_second']:.1f}",
                             "-", "-"], row
        assert cells[5] == (f"{summary['peak_memory_bytes'] / GIB:.1f} GiB "
                            f"(process max RSS)") and summary["peak_memory_bytes"] > 0
        assert cells[6] == "compiled"
        assert xla["clusters"] > 0 and 2 * xla["matmuls_in_xla"] > xla["matmuls"] > 0, xla
        assert not [name for name in os.listdir(work / folder) if name.startswith("model.ckpt")]
    assert any(line.startswith("scaling efficiency, phase 1, CPU, 2 workers: ")
               for line in lines)


def _dllog_losses(path):
    with open(path, encoding="utf-8") as reader:
        records = [json.loads(line) for line in reader]
    return {record["step"]: record["masked_lm_loss"] for record in records
            if "event" not in record}


@pytest.mark.slow
def test_the_loss_check_trains_bf16_and_xla_against_fp32_from_the_same_weights(cpu_preflight):
    """The loss check's two runs: the same initial weights (the recipe run starts from the
    reference's step-0 checkpoint), one loss a step, bfloat16 really used (its losses differ
    from float32's), and the verdict line's numbers are the dllogs' (recomputed here)."""
    import numpy as np
    result, work = cpu_preflight
    reference = _dllog_losses(work / "loss_fp32" / "dllog.jsonl")
    recipe = _dllog_losses(work / "loss_recipe" / "dllog.jsonl")
    assert sorted(reference) == sorted(recipe) == list(range(1, LOSS_STEPS + 1))
    with open(work / "loss_recipe" / "run_pretraining.log", encoding="utf-8") as reader:
        log = reader.read()
    assert f"from {work / 'loss_fp32' / 'model.ckpt-0'}" in log
    assert "  fresh  " not in log  # every variable came from the reference's weights
    assert any(recipe[step] != reference[step] for step in recipe)
    edge = LOSS_STEPS // 10
    ref = np.array([reference[step] for step in sorted(reference)], np.float64)
    mixed = np.array([recipe[step] for step in sorted(recipe)], np.float64)
    start, ref_end, mixed_end = ref[:edge].mean(), ref[-edge:].mean(), mixed[-edge:].mean()
    assert start - ref_end > 0.05 * start  # float32 learned: the check could judge
    line = next(line for line in result.stdout.splitlines() if line.startswith("loss check"))
    assert line.startswith(f"loss check, {LOSS_STEPS} steps of 8 sequences on the CPU from "
                           "the same weights and batches: bf16, XLA against fp32, no XLA: ")
    assert (f"masked-LM loss {start:.3f} -> {ref_end:.3f} in fp32, no XLA, -> {mixed_end:.3f} "
            "in bf16, XLA") in line
    share = max((mixed_end - ref_end) / (start - ref_end), 0.0)
    assert f"trails by {share:.1%} of what float32 learned (limit 10%)" in line


@pytest.mark.slow
def test_the_saved_facts_give_the_same_report_and_allow_cpu_passes(cpu_preflight):
    """The report is a function of preflight.json; with --allow_cpu the same node passes."""
    result, work = cpu_preflight
    with open(work / "preflight.json", encoding="utf-8") as reader:
        facts = facts_from_json(reader.read())
    assert report(facts).text == result.stdout.rstrip("\n")
    again = subprocess.run([sys.executable, "-m", "cli.preflight", "--allow_cpu",
                            f"--from_json={work / 'preflight.json'}"],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
    assert again.returncode == PASSED, again.stderr
    assert again.stdout.splitlines()[-1] == "PASS: on the CPU, accepted by --allow_cpu"
    assert again.stdout.splitlines()[:-1] == result.stdout.splitlines()[:-1]


def test_the_synthetic_records_are_googles_format_and_pass_the_start_up_checks(tmp_path):
    import numpy as np
    import tensorflow as tf
    from pretraining.preflight_records import CLS, MASK, PREDICTIONS, SEP, SEQ, write_records
    from pretraining.record_checks import check_input_files
    files = write_records(str(tmp_path / "records"), 2, 16, 512)
    kind, counts = check_input_files(files, SEQ, PREDICTIONS, named_config("tiny").replace(
        vocab_size=512))
    assert kind.kind == "static" and counts == [16, 16]
    for record in tf.compat.v1.io.tf_record_iterator(files[0]):
        feature = tf.train.Example.FromString(record).features.feature
        ids, positions, labels = (np.array(feature[name].int64_list.value) for name in (
            "input_ids", "masked_lm_positions", "masked_lm_ids"))
        assert ids[0] == CLS and ids[-1] == SEP and (ids == SEP).sum() == 2
        assert len(set(positions)) == PREDICTIONS and (ids[positions] == MASK).all()
        assert not np.isin(labels, (CLS, SEP, MASK)).any() and labels.min() >= 256


def test_a_run_that_fails_or_hangs_says_why_in_one_line(tmp_path):
    from pretraining.preflight_runs import failure_line, run_training
    output = ("[0]<stderr>:step 1/8  loss 11\n[1]<stderr>:error: part-1.tfrecord: records "
              "have sequence length 64 but --max_seq_length=128\n[0]<stderr>:Exiting\n")
    assert failure_line(output, 1) == ("exit status 1: error: part-1.tfrecord: records have "
                                       "sequence length 64 but --max_seq_length=128")
    assert failure_line("", -9) == "exit status -9"
    hung = (2, "a launcher that hangs", [sys.executable, "-c", "import time; time.sleep(600)"],
            [], {})
    started = time.time()
    measured = run_training(hung, [], str(tmp_path / "run"), True, timeout=3)
    assert measured.failure.startswith("no end after 3 s: stopped")
    assert time.time() - started < 60


def test_bad_input_is_one_line(tmp_path):
    from pretraining.preflight import PreflightOptions, run
    from reporting.errors import UsageError
    with pytest.raises(UsageError, match=r"^--bert_config_file=/nonexistent.json: "):
        run(PreflightOptions(bert_config_file="/nonexistent.json", work_dir=str(tmp_path)))
    result = subprocess.run([sys.executable, "-m", "cli.preflight", "--num_train_steps=2",
                             f"--work_dir={tmp_path}"],
                            capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == FAILED
    assert result.stderr.strip().splitlines() == [
        "error: --num_train_steps=2: the first 2 steps are warm-up, left out of the rate; "
        "give at least 3"], result.stderr
    assert not (tmp_path / "records").exists()


# ---- NVIDIA's figures and batches ----------------------------------------------------------

@pytest.mark.parametrize("gpu, gpus, system, note", [
    (A100_40, 8, "DGX A100 (8x A100 40GB)", None),
    (A100_80, 8, "DGX A100 (8x A100 40GB)", "NVIDIA published A100 figures for the A100 40GB "
     "only (DGX A100): this NVIDIA A100-SXM4-80GB is compared with them"),
    (V100_16, 8, "DGX-1 (8x V100 16GB)", None),
    (V100_32, 8, "DGX-1 (8x V100 32GB)", None),
    (V100_32, 16, "DGX-2 (16x V100 32GB)", None),
    (H100, 8, None, "NVIDIA publishes no figure for NVIDIA H100 80GB HBM3 (NVIDIA's "
     "TensorFlow BERT README stops at the A100, and so do its PyTorch and TensorFlow 2 BERT "
     "READMEs; MLPerf Training publishes its own BERT benchmark's time to train, from a "
     "checkpoint to a target accuracy on packed sequences of 512, not a rate of this recipe)"),
    (T4, 4, None, "NVIDIA publishes no figure for Tesla T4"),
    ((None, None), 1, None, "NVIDIA publishes no figure for CPU"),
])
def test_a_gpu_finds_its_table(gpu, gpus, system, note):
    table, said = published.table_for(gpu[0], gpu[1], gpus)
    assert (table.system if table else None, said) == (system, note)


def test_figures_are_the_tables_rows_and_interpolate_between_them():
    table = published.DGX_A100_40GB
    eight = published.figure(table, 128, 8, published.MIXED)
    assert (eight.rate, eight.weak_scaling, eight.published) == (2871.89, 8.05, True)
    assert published.figure(table, 128, 1, published.FULL).rate == 238.10
    two = published.figure(table, 128, 2, published.MIXED)
    one, four = table.row(128, 1).rate[0], table.row(128, 4).rate[0]
    assert two.rate == pytest.approx(one + (four - one) / 3)
    assert two.how == "interpolated between NVIDIA's 1- and 4-GPU figures"
    sixteen = published.figure(table, 128, 16, published.MIXED)
    assert sixteen.rate == pytest.approx(2 * 2871.89) and "scaled linearly" in sixteen.how


@pytest.mark.parametrize("gpu, precision, batch", [
    (A100_40, "fp16", 64), (A100_40, "tf32", 64), (A100_80, "bf16", 64),
    (V100_16, "fp16", 16), (V100_16, "fp32", 8), (V100_32, "fp16", 64), (V100_32, "fp32", 32),
    (H100, "fp16", 64), (T4, "fp16", 16), (T4, "fp32", 8),
    (("NVIDIA GeForce RTX 3060", 12 * 10 ** 9), "fp16", 8), ((None, None), "fp16", 8),
])
def test_the_per_gpu_batch_is_nvidias_phase_1_batch(gpu, precision, batch):
    assert published.phase1_batch(gpu[0], gpu[1], precision)[0] == batch


def test_nccl_version_codes():
    assert nccl_version(21805) == "2.18.5" and nccl_version(2708) == "2.7.8"


def _readme_tables(text):
    """{subsection: [(gpus, seq, rate mixed, rate full, weak mixed, weak full)]} of the
    README's single-node pre-training tables."""
    tables, current = {}, None
    for line in text.splitlines():
        heading = re.match(r"#+ (Pre-training training performance: single-node on .*)", line)
        if heading:
            current = tables.setdefault(heading.group(1).strip(), [])
        elif line.startswith("#"):
            current = None
        elif current is not None and re.match(r"\|\s*\d", line):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            current.append((int(cells[0]), int(cells[1]), float(cells[5]), float(cells[6]),
                            float(cells[8]), float(cells[9])))
    return tables


def test_the_tables_are_nvidias_readme():
    if not os.path.isfile(NVIDIA_README):
        pytest.skip(f"NVIDIA's BERT README not here ({NVIDIA_README}; NVIDIA_BERT_DIR)")
    with open(NVIDIA_README, encoding="utf-8") as reader:
        theirs = _readme_tables(reader.read())
    assert len(theirs) == len(published.TABLES)
    for table in published.TABLES:
        ours = [(row.gpus, row.seq) + row.rate + row.weak_scaling for row in table.rows]
        assert ours == theirs[table.subsection], table.system


# ---- the report, from faked facts ----------------------------------------------------------

def _facts(gpu=A100_40, count=8, rates=(340.0, 2650.0, 540.0), nccl=21805,
           xla=(True, True, True), precision="fp16", horovod=True, memory=(30, 30.5, 35),
           **changes):
    """An A100 node's facts: phase 1 on 1 and on `count` GPUs, phase 2 on `count` (on one GPU,
    phase 1 once and phase 2 on that GPU)."""
    gpus = tuple(GpuInfo(i, gpu[0], (8, 0), gpu[1]) for i in range(count))
    how = f"horovodrun -np {count} --gloo" if count > 1 else "run_pretraining.py"
    plan = [(1, 1, "run_pretraining.py")] + ([(1, count, how)] if count > 1 else [])
    plan.append((2, count, how))
    runs = tuple(Measured(devices, launched, rate, int(gib * GIB), "GPU:0", compiled, "3-8",
                          phase=phase, xla="XLA compiled the step: 40 clusters, 580 of 584 "
                          "matmuls inside them" if compiled else "no XLA cluster in the step "
                          "(its 584 matmuls run on TensorFlow's kernels)")
                 for (phase, devices, launched), rate, gib, compiled
                 in zip(plan, rates, memory, xla))
    loops = []
    for phase, seq, predictions in ((1, 128, 20), (2, 512, 80)):
        batch, why = published.phase_batch(gpu[0], gpu[1], precision, seq)
        loops.append(Loop(phase, seq, predictions, batch, why, 8, 8))
    facts = Facts(gpus, "/dev/nvidia0 exists", None,
                  HorovodBuild("0.28.1", nccl, True, False) if horovod else None,
                  "BERT-large", "large", 1.0, precision, True, tuple(loops), runs)
    return dataclasses.replace(facts, **changes)


EIGHT_A100_REPORT = """\
BERT preflight: BERT-large, fp16, XLA on
devices:  GPUs 0-7: 8 x NVIDIA A100-SXM4-40GB (compute capability 8.0, 39.6 GiB)
Horovod:  0.28.1, NCCL 2.18.5, Gloo yes, MPI no
phase 1:  sequence length 128, 20 predictions: 8 steps of 8 micro-batches of 64 sequences a GPU (NVIDIA's phase-1 batch for the A100 40GB, mixed precision)
phase 2:  sequence length 512, 80 predictions: 8 steps of 8 micro-batches of 16 sequences a GPU (NVIDIA's phase-2 batch for the A100 40GB, mixed precision)

run              launched as              sequences/s  NVIDIA's  measured/NVIDIA  peak memory               XLA
phase 1, 1 GPU   run_pretraining.py             340.0     356.8             0.95  30.0 of 39.6 GiB (GPU:0)  compiled
phase 1, 8 GPUs  horovodrun -np 8 --gloo       2650.0    2871.9             0.92  30.5 of 39.6 GiB (GPU:0)  compiled
phase 2, 8 GPUs  horovodrun -np 8 --gloo        540.0     572.1             0.94  35.0 of 39.6 GiB (GPU:0)  compiled
sequences/s: the steady state (steps 3-8), all devices together, warm-up left out (each run's dllog summary)
scaling efficiency, phase 1, 8 GPUs: 0.97 (rate / (8 x the 1-GPU rate)); NVIDIA's: 1.01 (weak scaling 8.05 on 8 GPUs)

NVIDIA's: BERT-large pre-training on a DGX A100 (8x A100 40GB), mixed precision, batch a GPU 64 at sequence length 128, 16 at sequence length 512
source: NVIDIA DeepLearningExamples TensorFlow/LanguageModeling/BERT/README.md, "Training performance results" > "Pre-training training performance: single-node on DGX A100 40GB" (TensorFlow 20.06-py3 NGC container)
PASS: nothing fell back"""


def test_the_report_of_an_eight_a100_node():
    result = report(_facts())
    assert (result.text, result.status) == (EIGHT_A100_REPORT, PASSED)


def test_scaling_efficiency_is_the_all_gpu_rate_over_n_one_gpu_rates():
    text = report(_facts(gpu=V100_32, rates=(150.0, 1080.0, 240.0), memory=(20, 20, 25))).text
    assert ("scaling efficiency, phase 1, 8 GPUs: 0.90 (rate / (8 x the 1-GPU rate)); NVIDIA's: 1.07 "
            "(weak scaling 8.56 on 8 GPUs)") in text.splitlines()


def test_a_single_gpu_node_has_no_all_gpu_run():
    result = report(_facts(gpu=V100_16, count=1, rates=(130.0, 27.0), memory=(10, 12)))
    assert "one GPU: no all-GPU run, no scaling" in result.text.splitlines()
    assert [line.split("  ")[0] for line in result.text.splitlines()
            if line.startswith(("phase 1, ", "phase 2, "))] == ["phase 1, 1 GPU",
                                                                "phase 2, 1 GPU"]
    assert result.status == PASSED


@pytest.mark.parametrize("changes, fallback", [
    (dict(nccl=0), "Horovod built without NCCL: gradients travel through the host (rebuild: "
                   "BERT_TF_FLAVOR=gpu bash scripts/install.sh)"),
    (dict(horovod=False), "Horovod not installed: the 8 GPUs ran as in-graph towers, not NCCL "
                          "ranks (bash scripts/install.sh builds Horovod)"),
    (dict(xla=(True, False, True)), "XLA asked for but not compiled in the phase 1, 8 GPUs run "
                                    "(no XLA cluster in the step (its 584 matmuls run on "
                                    "TensorFlow's kernels))"),
    (dict(rates=(170.0, 2650.0, 540.0)), "the phase 1, 1 GPU run at 0.48 of NVIDIA's figure"),
    (dict(rates=(340.0, 2650.0, 270.0)), "the phase 2, 8 GPUs run at 0.47 of NVIDIA's figure"),
])
def test_each_fall_back_is_named_and_exits_2(changes, fallback):
    result = report(_facts(**changes))
    assert result.status == FELL_BACK
    assert result.fallbacks == (fallback,)
    assert result.text.splitlines()[-1] == f"FELL BACK: {fallback}"


def test_the_cpu_is_a_fall_back_unless_allowed_and_says_why_a_gpu_is_missing():
    facts = _facts(count=0, rates=(30.0, 40.0), gpus=(), no_gpu_cause="this TensorFlow "
                   "(tensorflow-cpu 2.15.1) is a CPU-only build",
                   runs=(Measured(1, "run_pretraining.py", 30.0, GIB, "process max RSS", True),
                         Measured(2, "horovodrun -np 2 --gloo", 40.0, GIB, "process max RSS",
                                  True)))
    refused, allowed = report(facts), report(facts, allow_cpu=True)
    assert (refused.status, allowed.status) == (FELL_BACK, PASSED)
    assert refused.text.splitlines()[1] == (
        "devices:  CPU: a GPU was expected (/dev/nvidia0 exists) but TensorFlow sees none: "
        "this TensorFlow (tensorflow-cpu 2.15.1) is a CPU-only build")
    assert "NVIDIA publishes no figure for CPU" in allowed.text.splitlines()


def test_an_estimate_only_warns_and_a_failed_run_fails():
    two = _facts(count=2, rates=(340.0, 300.0, 140.0))  # 2 GPUs: interpolated figure
    result = report(two)
    assert result.status == PASSED
    assert result.warnings == ("the phase 1, 2 GPUs run at 0.42 of NVIDIA's estimate",)
    assert "~ phase 1, 2 GPUs: interpolated between NVIDIA's 1- and 4-GPU figures, an " \
           "estimate" in result.text.splitlines()
    failed = _facts(runs=(Measured(1, "run_pretraining.py", failure="exit status 1: error: "
                                   "disk full"),))
    assert report(failed).status == FAILED
    assert report(failed).text.splitlines()[-1] == \
        "FAILED: the phase 1, 1 GPU run: exit status 1: error: disk full"


def test_base_and_unknown_gpus_say_what_nvidia_publishes():
    base = report(_facts(model="BERT-base", published_model="base", flops_ratio=3.0)).text
    assert "~1070.5" in base  # 356.845 x 3.0, labelled as an estimate
    assert any(line.startswith("~ BERT-base: NVIDIA publishes no BERT-base pre-training "
                               "figure; BERT-large's x 3.00") for line in base.splitlines())
    h100 = report(_facts(gpu=H100, rates=(900.0, 7000.0, 1400.0)))
    assert h100.status == PASSED
    said = h100.text.splitlines()
    assert "NVIDIA publishes no figure for NVIDIA H100 80GB HBM3 (NVIDIA's TensorFlow BERT " \
           "README stops at the A100" in said[-2]
    # no figure is not a silent pass: the verdict says the rates were not compared
    assert said[-1] == ("PASS: nothing fell back; rates not compared: NVIDIA publishes no "
                        "figure for NVIDIA H100 80GB HBM3")
    # phase 2's batch follows the memory the driver reports (80 GB: the A100's batch)
    assert h100.text.count("16 sequences a GPU (NVIDIA's phase-2 batch for the A100 40GB") == 1
    custom = report(_facts(model="the model of x.json", published_model=None)).text
    assert "NVIDIA publishes pre-training figures for BERT-large only: none for the model of " \
           "x.json" in custom.splitlines()


def test_the_commands_numeric_flags_have_ranges():
    from absl import flags
    from cli.flag_ranges import numeric_flags, register_ranges
    from cli.preflight import COMMAND
    values = flags.FlagValues()
    COMMAND.define_flags(values)
    assert numeric_flags(values)
    register_ranges(values)


# ---- phase 2, memory, and the loss check, from faked facts --------------------------------

def test_phase_2_out_of_memory_fails_in_one_line_with_what_to_do():
    from pretraining.preflight_runs import failure_line
    output = ("[0]<stderr>:step 1/8\n[0]<stderr>:tensorflow.python.framework.errors_impl."
              "ResourceExhaustedError: OOM when allocating tensor with shape[16,16,512,512]\n"
              "[0]<stderr>:Traceback (most recent call last):\n")
    line = failure_line(output, 1, batch=16)
    assert line == ("exit status 1: out of memory at batch 16 a GPU: halve the per-GPU batch "
                    "and double the accumulation (the same global batch), or use a GPU with "
                    "more memory")
    facts = _facts()
    oom = dataclasses.replace(facts, runs=facts.runs[:2] + (dataclasses.replace(
        facts.runs[2], sequences_per_second=None, failure=line),))
    result = report(oom)
    assert result.status == FAILED
    assert result.text.splitlines()[-1] == f"FAILED: the phase 2, 8 GPUs run: {line}"


def test_a_peak_near_the_cards_memory_warns():
    result = report(_facts(memory=(30, 30.5, 38.5)))  # of 39.6 GiB
    assert result.status == PASSED
    assert result.warnings == (
        "the phase 2, 8 GPUs run peaked at 97% of the GPU's memory: no headroom for a longer "
        "run's fragmentation (a smaller batch with more accumulation keeps the global batch)",)


def _check(recipe, reference, **changes):
    return LossCheck(steps=len(reference), batch=64, devices="1 GPU", recipe="fp16, XLA",
                     reference="fp32 (TF32 off), no XLA", recipe_losses=tuple(recipe),
                     reference_losses=tuple(reference), **changes)


def _curve(start, end, steps=100):
    return [start + (end - start) * step / (steps - 1) for step in range(steps)]


@pytest.mark.parametrize("recipe, outcome, status", [
    (_curve(10.0, 3.9), "passed", PASSED),         # ahead of float32: passes
    (_curve(10.0, 4.5), "passed", PASSED),         # trails by 8.3% of what fp32 learned
    (_curve(10.0, 5.0), "failed", FAILED),         # trails by 16.7%
    (_curve(10.0, 10.0), "failed", FAILED),        # learned nothing (a stuck loss scale)
    (_curve(10.0, 4.5)[:-1] + [float("nan")], "failed", FAILED),
])
def test_the_loss_check_passes_within_a_tenth_of_what_fp32_learned(recipe, outcome, status):
    from pretraining.loss_check import judge
    reference = _curve(10.0, 4.0)
    verdict = judge(_check(recipe, reference))
    assert verdict.outcome == outcome
    # the ends are the means of the first and last tenth of the steps, recomputed here
    start, ref_end = sum(reference[:10]) / 10, sum(reference[-10:]) / 10
    if all(value == value for value in recipe):  # no NaN: the ends were computed
        assert verdict.start == pytest.approx(start)
        assert verdict.reference_end == pytest.approx(ref_end)
    result = report(_facts(loss=_check(recipe, reference)))
    assert result.status == status
    assert verdict.line in result.text.splitlines()
    if status == FAILED:
        assert result.text.splitlines()[-1] == ("FAILED: the loss check: the recipe does not "
                                                "learn as float32 does (the loss check line "
                                                "above)")


def test_a_loss_check_that_learned_too_little_or_failed_says_so():
    from pretraining.loss_check import judge
    flat = judge(_check(_curve(10.0, 9.9), _curve(10.0, 9.8)))
    assert flat.outcome == "inconclusive" and flat.line.endswith("give more --loss_steps")
    assert report(_facts(loss=_check(_curve(10.0, 9.9), _curve(10.0, 9.8)))).warnings == (
        "the loss check was inconclusive (the loss check line above)",)
    broken = _check((), _curve(10.0, 4.0), failure="the fp16, XLA run: exit status 1: error: x")
    assert judge(broken).line.endswith(": the fp16, XLA run: exit status 1: error: x")
    assert report(_facts(loss=broken)).status == FAILED


def test_facts_with_both_phases_and_the_loss_check_survive_json():
    facts = _facts(loss=_check(_curve(10.0, 4.5), _curve(10.0, 4.0), recipe_skipped=3))
    again = facts_from_json(json.dumps(dataclasses.asdict(facts)))
    assert again == facts and report(again).text == report(facts).text
    assert "; 3 steps skipped by the loss scale:" in report(facts).text


def test_the_learnable_records_follow_their_chain():
    """The loss check's records: every token after the first of a segment is one of its
    predecessor's SUCCESSORS (so a model can learn them), among at most CHAIN_TOKENS tokens."""
    import numpy as np
    from pretraining.preflight_records import CHAIN_TOKENS, SUCCESSORS, _markov_ids
    ids = _markov_ids(np.random.default_rng(0), 64, 128, 1000, 30522)
    assert len(np.unique(ids)) <= CHAIN_TOKENS and ids.min() >= 1000
    followers = {}
    for row in ids:
        for before, after in zip(row[:-1], row[1:]):
            followers.setdefault(before, set()).add(after)
    assert max(len(next_ids) for next_ids in followers.values()) <= SUCCESSORS


@pytest.mark.slow
def test_the_loss_checks_fp16_branch_scales_the_loss_and_is_judged(tmp_path):
    """The float16 branch of the check, for real on the CPU: the recipe run is AMP float16
    with dynamic loss scaling (its dllog logs the scale), from the reference's weights, and the
    verdict is the judge's on the two curves the runs logged."""
    from pretraining.loss_check import judge
    from pretraining.preflight import PreflightOptions, loop_args, model_facts, phase_loops
    from pretraining.preflight_loss import check_loss
    from pretraining.preflight_runs import launches
    config_path = tmp_path / "bert_config.json"
    named_config("tiny").replace(vocab_size=512, num_hidden_layers=1).to_json_file(
        str(config_path))
    options = PreflightOptions(bert_config_file=str(config_path), precision="fp16",
                               train_batch_size=8, loss_steps=40)
    path, config, *_ = model_facts(None, options.bert_config_file)
    first = phase_loops(options, [])[0]
    check = check_loss(40, first.batch, "fp16", True,
                       loop_args(first, path, "", options) + ["--allow_cpu"], config.vocab_size,
                       False, launches([], None)[0], str(tmp_path))
    assert check.failure is None and len(check.recipe_losses) == 40
    with open(tmp_path / "loss_recipe" / "dllog.jsonl", encoding="utf-8") as reader:
        steps = [json.loads(line) for line in reader if '"step"' in line]
    assert steps and all("loss_scale" in step for step in steps if "event" not in step)
    verdict = judge(check)
    assert verdict.outcome in ("passed", "inconclusive"), verdict.line
    assert verdict.line.startswith("loss check, 40 steps of 8 sequences on the CPU from the "
                                   "same weights and batches: fp16, XLA against fp32, no XLA")
