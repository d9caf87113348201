"""NVIDIA's command lines against our commands, as their scripts write them.

The flag sets below are those of NVIDIA's DeepLearningExamples TensorFlow/LanguageModeling/BERT
scripts (commit 729963dd): `scripts/run_pretraining_lamb_phase1.sh`, `..._phase2.sh`,
`scripts/run_glue.sh` and `scripts/run_squad.sh`, in their order and spelling (`--do_train=True`,
`--horovod` without a launcher, `--noamp`, `--nouse_xla`, `--save_checkpoints_steps 1000` with a
space, `--doc_stride` to run_classifier.py, `--eval_script`), their values scaled down to a
tiny model. Each runs to completion, one after the other: phase 1, phase 2 from phase 1's last
checkpoint, GLUE and SQuAD from phase 2's.
"""
import os
import shutil
import subprocess
import sys

import pytest

from pretraining_records import write_random_records
from test_finetuning import split_squad, split_sst2, tiny_model  # noqa: F401 (fixture)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(script, *args, timeout=900):
    result = subprocess.run([sys.executable, os.path.join(REPO, script), *args],
                            capture_output=True, text=True, cwd=REPO, timeout=timeout)
    assert result.returncode == 0, (script, args, (result.stdout + result.stderr)[-4000:])
    assert "Traceback" not in result.stderr
    return result


def records(folder, seq, pred, vocab_size):
    for split, count in (("training", 64), ("test", 16)):
        (folder / split).mkdir(parents=True)
        write_random_records(folder / split / f"part-0.tfrecord", count, seq, pred, vocab_size)
    return folder


@pytest.mark.slow
def test_nvidias_flag_sets_run_to_completion(shared_data, tiny_model, tmp_path):  # noqa: F811
    config = tiny_model / "bert_config.json"
    vocab_size = sum(1 for _ in open(tiny_model / "vocab.txt", encoding="utf-8"))
    phase1_data = records(tmp_path / "seq128", 128, 20, vocab_size)
    phase2_data = records(tmp_path / "seq512", 512, 80, vocab_size)
    results = tmp_path / "results"
    precision = ["--noamp", "--nouse_xla"]                 # PREC for precision fp32, no XLA

    phase1 = run("run_pretraining.py",
                 f"--input_files_dir={phase1_data / 'training'}",
                 f"--eval_files_dir={phase1_data / 'test'}",
                 f"--output_dir={results / 'phase_1'}", f"--bert_config_file={config}",
                 "--do_train=True", "--do_eval=True", "--train_batch_size=4",
                 "--eval_batch_size=4", "--max_seq_length=128", "--max_predictions_per_seq=20",
                 "--num_train_steps=4", "--num_accumulation_steps=2", "--num_warmup_steps=1",
                 "--save_checkpoints_steps=2", "--learning_rate=1e-3", "--horovod", *precision,
                 "--allreduce_post_accumulation=True")
    assert "masked_lm_accuracy" in (results / "phase_1" / "eval_results.txt").read_text()
    assert "defaults:" not in phase1.stderr  # --noamp/--nouse_xla given: nothing turned off
    # --nouse_xla means no XLA anywhere: not the step, not the optimizer's fused update
    # (TensorFlow logs its first XLA compilation whatever TF_CPP_MIN_LOG_LEVEL says)
    log = (results / "phase_1" / "run_pretraining.log").read_text()
    assert "Compiled cluster using XLA" not in log
    assert "no XLA cluster in the step" in log

    run("run_pretraining.py", f"--input_files_dir={phase2_data / 'training'}",
        f"--init_checkpoint={results / 'phase_1' / 'model.ckpt-4'}",
        f"--eval_files_dir={phase2_data / 'test'}", f"--output_dir={results / 'phase_2'}",
        f"--bert_config_file={config}", "--do_train=True", "--do_eval=True",
        "--train_batch_size=2", "--eval_batch_size=4", "--max_seq_length=512",
        "--max_predictions_per_seq=80", "--num_train_steps=2", "--num_accumulation_steps=2",
        "--num_warmup_steps=1", "--save_checkpoints_steps=2", "--learning_rate=1e-3",
        "--horovod", *precision, "--allreduce_post_accumulation=True")
    pretrained = str(results / "phase_2" / "model.ckpt-2")

    glue = tmp_path / "glue"
    split_sst2(shared_data, str(glue / "SST-2"), train=64)
    glue_out = tmp_path / "glue_results"
    glue_run = run("run_classifier.py", "--task_name=SST-2", "--do_train=true", "--do_eval=true",
                   f"--data_dir={glue / 'SST-2'}", f"--vocab_file={tiny_model / 'vocab.txt'}",
                   f"--bert_config_file={config}", f"--init_checkpoint={pretrained}",
                   "--max_seq_length=64", "--doc_stride=64", "--train_batch_size=16",
                   "--learning_rate=3e-6", "--num_train_epochs=1.0", f"--output_dir={glue_out}",
                   "--horovod", "--noamp", "--nouse_xla", "--warmup_proportion=0.1")
    assert "eval_accuracy" in (glue_out / "eval_results.txt").read_text()
    assert "warning: --doc_stride is NVIDIA's and ignored here" in glue_run.stderr

    squad = tmp_path / "squad" / "v1.1"
    squad.mkdir(parents=True)
    paths = split_squad(shared_data, str(squad), fraction=0.2)
    os.replace(paths["train"], squad / "train-v1.1.json")
    os.replace(paths["predict"], squad / "dev-v1.1.json")
    # the official script's interface: python evaluate-v1.1.py DATASET PREDICTIONS
    shutil.copy(os.path.join(REPO, "finetuning", "squad_eval.py"), squad / "evaluate-v1.1.py")
    squad_out = tmp_path / "squad_results"
    squad_run = run("run_squad.py", f"--vocab_file={tiny_model / 'vocab.txt'}",
                    f"--bert_config_file={config}", f"--init_checkpoint={pretrained}",
                    "--do_train=True", f"--train_file={squad / 'train-v1.1.json'}",
                    "--do_predict=True", f"--predict_file={squad / 'dev-v1.1.json'}",
                    f"--eval_script={squad / 'evaluate-v1.1.py'}", "--train_batch_size=8",
                    "--learning_rate=5e-6", "--num_train_epochs=1.0", "--max_seq_length=96",
                    "--doc_stride=48", "--save_checkpoints_steps", "1000",
                    f"--output_dir={squad_out}", "--horovod", "--noamp", "--nouse_xla",
                    "--version_2_with_negative=False")
    assert "f1" in (squad_out / "eval_results.txt").read_text()
    assert "eval_script_f1 = " in squad_run.stdout


def test_flags_that_mean_nothing_here_warn_and_unknown_flags_fail(tmp_path):
    dry = [f"--bert_config_file={os.path.join(REPO, 'modeling/configs/bert_tiny_config.json')}",
           f"--output_dir={tmp_path}", "--dry_run"]
    result = run("run_pretraining.py", *dry, "--iterations_per_loop=100", "--noreport_loss")
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2 and "--iterations_per_loop is NVIDIA's" in warnings[0]
    assert "--report_loss is NVIDIA's" in warnings[1]
    assert '"max_seq_length": 512' in result.stdout and '"precision": "fp16"' in result.stdout
    unknown = subprocess.run([sys.executable, os.path.join(REPO, "run_pretraining.py"), *dry,
                              "--no_such_flag=1"], capture_output=True, text=True, cwd=REPO,
                             timeout=120)
    assert unknown.returncode == 1 and unknown.stderr.strip().splitlines() == [
        "error: Unknown command line flag 'no_such_flag' (--help lists the flags)"]


# Every flag NVIDIA's TF1 scripts define (DEFINE_* in run_pretraining.py, run_squad.py and
# run_classifier.py at commit 729963dd), read from their sources.
NVIDIA_FLAGS = {
    "pretrain": (
        "allreduce_post_accumulation amp bert_config_file display_loss_steps dllog_path do_eval "
        "do_train eval_batch_size eval_files_dir horovod init_checkpoint init_loss_scale "
        "input_files_dir iterations_per_loop learning_rate manual_fp16 max_eval_steps "
        "max_predictions_per_seq max_seq_length num_accumulation_steps num_train_steps "
        "num_warmup_steps optimizer_type output_dir report_loss save_checkpoints_steps "
        "train_batch_size use_xla verbose_logging"),
    "squad": (
        "amp bert_config_file display_loss_steps dllog_path do_lower_case do_predict do_train "
        "doc_stride eval_script export_triton horovod init_checkpoint iterations_per_loop "
        "learning_rate max_answer_length max_query_length max_seq_length n_best_size "
        "null_score_diff_threshold num_accumulation_steps num_eval_iterations num_train_epochs "
        "output_dir predict_batch_size predict_file save_checkpoints_steps train_batch_size "
        "train_file triton_dyn_batching_delay triton_engine_count triton_max_batch_size "
        "triton_model_name triton_model_overwrite triton_model_version triton_server_url "
        "use_trt use_xla verbose_logging version_2_with_negative vocab_file warmup_proportion"),
    "classifier": (
        "amp bert_config_file data_dir display_loss_steps dllog_path do_eval do_lower_case "
        "do_predict do_train eval_batch_size horovod init_checkpoint iterations_per_loop "
        "learning_rate max_seq_length num_accumulation_steps num_train_epochs optimizer_type "
        "output_dir predict_batch_size save_checkpoints_steps task_name train_batch_size "
        "use_trt use_xla verbose_logging vocab_file warmup_proportion"),
}


@pytest.mark.parametrize("command", sorted(NVIDIA_FLAGS))
def test_every_flag_nvidias_scripts_define_is_defined(command):
    from absl import flags

    from cli.finetune import GLUE, SQUAD
    from cli.pretrain import COMMAND as PRETRAIN
    define = {"pretrain": PRETRAIN, "squad": SQUAD, "classifier": GLUE}[command]
    values = flags.FlagValues()
    define.define_flags(values)
    missing = [name for name in NVIDIA_FLAGS[command].split() if name not in values]
    assert not missing
