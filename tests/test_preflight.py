"""`bert-preflight`: the real command on this CPU machine (one run: it trains, names the CPU,
reads Horovod's build and the rates, and exits by its verdict), and every GPU branch from
faked facts (the report is a pure function of them): NVIDIA's figure for each GPU kind,
the per-GPU batch, the whole report of an 8 x A100 node, scaling, and each fall-back."""
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
from pretraining.preflight_report import (FAILED, FELL_BACK, PASSED, Facts, HorovodBuild,
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

@pytest.fixture(scope="module")
def cpu_preflight(tmp_path_factory):
    """One real preflight (scripts/preflight.sh, no --allow_cpu) of a 1-layer BERT, 3 steps:
    (completed process, its work folder)."""
    work = tmp_path_factory.mktemp("preflight")
    config = work / "bert_config.json"
    named_config("tiny").replace(vocab_size=512, num_hidden_layers=1).to_json_file(str(config))
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    result = subprocess.run(
        ["bash", os.path.join(REPO, "scripts", "preflight.sh"), f"--bert_config_file={config}",
         "--precision=fp32", "--train_batch_size=2", "--num_train_steps=3",
         f"--work_dir={work / 'work'}"],
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
    # The rates are the dllog summaries' steady-state rates, the memory their peaks.
    for label, how, folder in (("CPU, 1 worker", "run_pretraining.py", "run_1"),
                               ("CPU, 2 workers", two, "run_2")):
        with open(work / folder / "dllog.jsonl", encoding="utf-8") as reader:
            summary = [json.loads(line) for line in reader if '"summary"' in line][-1]
        row = next(line for line in lines if line.startswith(label + " "))
        cells = re.split(r"\s{2,}", row)
        assert cells[:5] == [label, how, f"{summary['average_sequences_per_second']:.1f}",
                             "-", "-"], row
        assert cells[5] == (f"{summary['peak_memory_bytes'] / GIB:.1f} GiB "
                            f"(process max RSS)") and summary["peak_memory_bytes"] > 0
        assert cells[6] == "compiled"
        with open(work / folder / "run_pretraining.log", encoding="utf-8") as reader:
            assert "Compiled cluster using XLA" in reader.read()
        assert not [name for name in os.listdir(work / folder) if name.startswith("model.ckpt")]
    assert any(line.startswith("scaling efficiency, CPU, 2 workers: ") for line in lines)


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
    from pretraining.preflight import CLS, MASK, PREDICTIONS, SEP, SEQ, write_records
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
    from pretraining.preflight import failure_line, run_training
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
    (H100, 8, None, "NVIDIA publishes no figure for NVIDIA H100 80GB HBM3"),
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

def _facts(gpu=A100_40, count=8, rates=(340.0, 2650.0), nccl=21805, xla=(True, True),
           precision="fp16", horovod=True, **changes):
    gpus = tuple(GpuInfo(i, gpu[0], (8, 0), gpu[1]) for i in range(count))
    runs = [Measured(1, "run_pretraining.py", rates[0], 30 * GIB, "GPU:0", xla[0], "3-8")]
    if count > 1:
        runs.append(Measured(count, f"horovodrun -np {count} --gloo", rates[1],
                             int(30.5 * GIB), "GPU:0", xla[1], "3-8"))
    batch, why = published.phase1_batch(gpu[0], gpu[1], precision)
    facts = Facts(gpus, "/dev/nvidia0 exists", None,
                  HorovodBuild("0.28.1", nccl, True, False) if horovod else None,
                  "BERT-large", "large", 1.0, precision, True, 128, 20, batch, why, 8, 8,
                  tuple(runs))
    return dataclasses.replace(facts, **changes)


EIGHT_A100_REPORT = """\
BERT preflight: BERT-large, phase 1 (sequence length 128, 20 predictions), fp16, XLA on
devices:  GPUs 0-7: 8 x NVIDIA A100-SXM4-40GB (compute capability 8.0, 39.6 GiB)
Horovod:  0.28.1, NCCL 2.18.5, Gloo yes, MPI no
loop:     8 steps of 8 micro-batches of 64 sequences a GPU (NVIDIA's phase-1 batch for the A100 40GB, mixed precision)

run     launched as              sequences/s  NVIDIA's  measured/NVIDIA  peak memory       XLA
1 GPU   run_pretraining.py             340.0     356.8             0.95  30.0 GiB (GPU:0)  compiled
8 GPUs  horovodrun -np 8 --gloo       2650.0    2871.9             0.92  30.5 GiB (GPU:0)  compiled
sequences/s: the steady state (steps 3-8), all devices together, warm-up left out (each run's dllog summary)
scaling efficiency, 8 GPUs: 0.97 (rate / (8 x the 1-GPU rate)); NVIDIA's: 1.01 (weak scaling 8.05 on 8 GPUs)

NVIDIA's: BERT-large pre-training on a DGX A100 (8x A100 40GB), mixed precision, sequence length 128, batch 64 a GPU
source: NVIDIA DeepLearningExamples TensorFlow/LanguageModeling/BERT/README.md, "Training performance results" > "Pre-training training performance: single-node on DGX A100 40GB" (TensorFlow 20.06-py3 NGC container)
PASS: nothing fell back"""


def test_the_report_of_an_eight_a100_node():
    result = report(_facts())
    assert (result.text, result.status) == (EIGHT_A100_REPORT, PASSED)


def test_scaling_efficiency_is_the_all_gpu_rate_over_n_one_gpu_rates():
    text = report(_facts(gpu=V100_32, rates=(150.0, 1080.0))).text
    assert ("scaling efficiency, 8 GPUs: 0.90 (rate / (8 x the 1-GPU rate)); NVIDIA's: 1.07 "
            "(weak scaling 8.56 on 8 GPUs)") in text.splitlines()


def test_a_single_gpu_node_has_no_all_gpu_run():
    result = report(_facts(gpu=V100_16, count=1, rates=(130.0,)))
    assert "one GPU: no all-GPU run, no scaling" in result.text.splitlines()
    assert result.status == PASSED


@pytest.mark.parametrize("changes, fallback", [
    (dict(nccl=0), "Horovod built without NCCL: gradients travel through the host (rebuild: "
                   "BERT_TF_FLAVOR=gpu bash scripts/install.sh)"),
    (dict(horovod=False), "Horovod not installed: the 8 GPUs ran as in-graph towers, not NCCL "
                          "ranks (bash scripts/install.sh builds Horovod)"),
    (dict(xla=(True, False)), "XLA asked for but not compiled in the 8 GPUs run (no \"Compiled "
                              "cluster using XLA\" in its log)"),
    (dict(rates=(170.0, 2650.0)), "the 1 GPU run at 0.48 of NVIDIA's figure"),
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
    two = _facts(count=2, rates=(340.0, 300.0))  # 2 GPUs: interpolated figure
    result = report(two)
    assert result.status == PASSED
    assert result.warnings == ("the 2 GPUs run at 0.42 of NVIDIA's estimate",)
    assert "~ 2 GPUs: interpolated between NVIDIA's 1- and 4-GPU figures, an estimate" in \
        result.text.splitlines()
    failed = _facts(runs=(Measured(1, "run_pretraining.py", failure="exit status 1: error: "
                                   "disk full"),))
    assert report(failed).status == FAILED
    assert report(failed).text.splitlines()[-1] == \
        "FAILED: the 1 GPU run: exit status 1: error: disk full"


def test_base_and_unknown_gpus_say_what_nvidia_publishes():
    base = report(_facts(model="BERT-base", published_model="base", flops_ratio=3.0)).text
    assert "~1070.5" in base  # 356.845 x 3.0, labelled as an estimate
    assert any(line.startswith("~ BERT-base: NVIDIA publishes no BERT-base pre-training "
                               "figure; BERT-large's x 3.00") for line in base.splitlines())
    h100 = report(_facts(gpu=H100, rates=(900.0, 7000.0)))
    assert h100.status == PASSED
    assert "NVIDIA publishes no figure for NVIDIA H100 80GB HBM3" in h100.text.splitlines()
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
