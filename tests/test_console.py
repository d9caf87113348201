"""What a user sees: quiet consoles with progress and an ETA, everything in the log file,
`--verbosity` bringing TensorFlow's output back, Google's eval_results.txt names, and the
console commands of `pip install .` with grouped `--help`."""
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from reporting.progress import PlainBar, ProgressLine
from pretraining_records import write_random_records

SEQ, PREDICTIONS, VOCAB, STEPS = 16, 3, 101, 6
PROGRESS = re.compile(r"^step (\d+)/6  loss [0-9.]+  [0-9.]+ seq/s  ETA \d+:\d\d:\d\d$")
GLOG_PREFIX = re.compile(r"^[IWEF]\d{4} ")
GOOGLE_PRETRAINING_NAMES = ["global_step", "loss", "masked_lm_accuracy", "masked_lm_loss",
                            "next_sentence_accuracy", "next_sentence_loss"]


def quiet_env():
    """The environment of a user who set nothing (conftest sets TF_CPP_MIN_LOG_LEVEL)."""
    env = dict(os.environ)
    for name in ("TF_CPP_MIN_LOG_LEVEL", "BERT_VERBOSE"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory, repo_root):
    """One quiet run_pretraining.py (6 steps, evaluation), then an evaluation of the same
    folder with --verbosity=0. Returns (output dir, quiet run, verbose run)."""
    root = tmp_path_factory.mktemp("console")
    (root / "train").mkdir()
    write_random_records(root / "train" / "part-0.tfrecord", 48, SEQ, PREDICTIONS, VOCAB, seed=0)
    from modeling import named_config
    named_config("tiny").replace(vocab_size=VOCAB).to_json_file(str(root / "bert_config.json"))
    out = root / "out"
    common = [sys.executable, "run_pretraining.py", f"--bert_config_file={root}/bert_config.json",
              f"--output_dir={out}", f"--eval_files_dir={root}/train", "--do_eval",
              f"--max_seq_length={SEQ}", f"--max_predictions_per_seq={PREDICTIONS}",
              "--eval_batch_size=8", "--max_eval_steps=2"]
    quiet = subprocess.run(common + [f"--input_files_dir={root}/train", "--do_train",
                                     "--train_batch_size=4", f"--num_train_steps={STEPS}",
                                     "--num_warmup_steps=1", "--display_loss_steps=2"],
                           capture_output=True, text=True, cwd=repo_root, env=quiet_env(),
                           timeout=300)
    verbose = subprocess.run(common + ["--verbosity=0"], capture_output=True, text=True,
                             cwd=repo_root, env=quiet_env(), timeout=300)
    return out, quiet, verbose


def test_quiet_console_progress_log_file_and_eval_names(pretraining):
    out, quiet, verbose = pretraining
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    lines = (quiet.stdout + quiet.stderr).splitlines()
    # only the command's own lines: plan, progress with ETA, summary, evaluation
    progress = [int(PROGRESS.match(line).group(1)) for line in lines if PROGRESS.match(line)]
    assert progress == [2, 4, 6], lines
    others = [line for line in lines if not PROGRESS.match(line)]
    # (the one line saying NVIDIA's GPU defaults --amp and --use_xla are off without a GPU)
    assert [line.split(":")[0] for line in others] == [
        "defaults", "plan", "training done", f"eval results ({out}/eval_results.txt)"], lines
    assert not any("deprecat" in line.lower() or "tensorflow" in line.lower()
                   or GLOG_PREFIX.match(line) for line in lines)
    # the log file keeps everything: TensorFlow's warnings and INFO, every logged step
    log = (out / "run_pretraining.log").read_text()
    assert "is deprecated" in log and "Saving checkpoints for 6" in log
    assert re.search(r"\] step 4: total_loss [0-9.]+, masked_lm_loss", log)
    # Google's run_pretraining.py names, in its order
    results = (out / "eval_results.txt").read_text().splitlines()
    assert [line.split(" = ")[0] for line in results] == GOOGLE_PRETRAINING_NAMES
    assert "global_step = 6" in results

    # --verbosity brings TensorFlow's Python logging back; the log file is appended to
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert "is deprecated" in verbose.stderr
    assert any(GLOG_PREFIX.match(line) and "Restoring parameters from" in line
               for line in verbose.stderr.splitlines())
    assert (out / "run_pretraining.log").read_text().count("run_pretraining started:") == 2


def test_xla_compiler_lines_go_to_the_log_file_not_the_console(pretraining, repo_root):
    """XLA logs through absl's C++ logging, which ignores TF_CPP_MIN_LOG_LEVEL: with the fused
    optimizer update (XLA-compiled) a quiet run printed its compiler lines between the
    progress lines. They belong in the log file."""
    out, _, _ = pretraining
    run = subprocess.run(
        [sys.executable, "run_pretraining.py", f"--bert_config_file={out.parent}/bert_config.json",
         f"--output_dir={out.parent / 'fused'}", f"--input_files_dir={out.parent}/train",
         "--do_train", f"--max_seq_length={SEQ}", f"--max_predictions_per_seq={PREDICTIONS}",
         "--train_batch_size=4", "--num_train_steps=2", "--num_warmup_steps=1",
         "--display_loss_steps=1"],
        capture_output=True, text=True, cwd=repo_root, env=dict(quiet_env(),
                                                                BERT_FUSED_OPTIMIZER="1"),
        timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = (run.stdout + run.stderr).splitlines()
    assert [line.split(":")[0] for line in lines if not PROGRESS.match(line)
            and not line.startswith("step ")] == ["defaults", "plan", "training done"], lines
    log = (out.parent / "fused" / "run_pretraining.log").read_text()
    assert "Compiled cluster using XLA" in log


def test_native_lines_survive_an_abrupt_death(tmp_path, repo_root):
    """fd 2 rerouted (reporting.native_log.route), then the process aborts: the C++ log line is
    in the log file, the error line and the plain line on the console, nothing lost in the
    pipe."""
    log = tmp_path / "x.log"
    script = ("import os, sys; sys.path.insert(0, '.'); from reporting.native_log import route; "
              f"route({str(log)!r}); "
              "os.write(2, b'I0000 00:00:1.5   42 device_compiler.h:186] Compiled cluster\\n'"
              " b'2026-01-01 00:00:00.000001: F core/thing.cc:12] Check failed: x\\n'"
              " b'plain text from a child\\n'); print('python', file=sys.stderr); os.abort()")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=repo_root, timeout=60)
    assert run.returncode != 0
    assert "Compiled cluster" not in run.stderr
    assert "F core/thing.cc:12] Check failed: x" in run.stderr
    assert "plain text from a child" in run.stderr and "python" in run.stderr
    kept = log.read_text()
    assert "Compiled cluster" in kept and "Check failed: x" in kept
    assert "plain text" not in kept


_SIGNAL_WRITER = """
import os, signal, sys
sys.path.insert(0, '.')
from reporting.native_log import ConsoleStream
stream = ConsoleStream(os.dup(2))
signal.signal(signal.SIGUSR1, lambda signum, frame: stream.write('handler line\\n'))
stream.write('x' * 1000000 + '\\n')   # far more than a pipe holds: blocks until read
stream.write('done\\n')
"""


def test_console_stream_takes_a_signal_handlers_line_mid_write(repo_root):
    """The rerouted sys.stderr is written by a signal handler (SIGTERM's "checkpoint at the
    next boundary") while the main thread is inside a write. A buffered writer raised
    "reentrant call inside BufferedWriter" there. The moment is reached on purpose: nobody
    reads the child's pipe until the kernel shows it blocked in a pipe write, then the
    signal comes; every line must arrive."""
    child = subprocess.Popen([sys.executable, "-c", _SIGNAL_WRITER], stderr=subprocess.PIPE,
                             cwd=repo_root)
    try:
        deadline = time.time() + 60
        while "pipe_write" not in open(f"/proc/{child.pid}/wchan").read():
            assert time.time() < deadline and child.poll() is None, "never blocked in write"
            time.sleep(0.01)
        child.send_signal(signal.SIGUSR1)
        received = child.stderr.read()
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, received[-2000:]
    assert received.count(b"handler line\n") == 1, received[-2000:]
    assert received.count(b"x") == 1000000 and received.endswith(b"done\n"), received[-2000:]


def test_native_line_destinations():
    from reporting.native_log import destination
    assert destination(b"I0000 00:00:1795578848.454472   26181 device_compiler.h:186] "
                       b"Compiled cluster using XLA!\n") == "log"
    assert destination(b"WARNING: All log messages before absl::InitializeLog() is called "
                       b"are written to STDERR\n") == "log"
    assert destination(b"2026-11-25 03:54:08.460419: E external/local_xla/xla/stream_executor/"
                       b"stream_executor_internal.h:177] SetPriority unimplemented for this "
                       b"stream.\n") == "log"
    assert destination(b"2026-11-25 03:54:08.460419: E tensorflow/core/x.cc:7] OOM\n") == "both"
    assert destination(b"error: --learning_rate=-1: must be > 0\n") == "console"
    assert destination(b"Traceback (most recent call last):\n") == "console"


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_updates_in_place_on_a_terminal_and_prints_lines_elsewhere():
    terminal = FakeTerminal()
    line = ProgressLine(terminal)
    line.show("step 1/4")
    line.show("step 2/4")
    line.close()
    assert terminal.getvalue() == "\rstep 1/4\033[K\rstep 2/4\033[K\n"
    log = io.StringIO()
    shards = PlainBar(total=4, desc="shards", unit=" shard", stream=log, interval=0)
    with shards:
        for _ in range(2):
            shards.update(1)
    printed = log.getvalue().splitlines()
    assert len(printed) == 2 and "\r" not in log.getvalue()  # nothing new at close
    assert re.fullmatch(r"shards: 1/4 shard \(25%\), [0-9.]+[kMG]? shard/s, ETA \d:\d\d:\d\d",
                        printed[0]), printed
    assert printed[1].startswith("shards: 2/4 shard (50%)")


def test_bertprep_shows_shard_progress_with_eta_and_keeps_a_log(tmp_path, repo_root):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"Document {d} says this. It has a second sentence {d}.\n\n"
                              for d in range(12)))
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "document",
                                "says", "this", "it", "has", "a", "second", "sentence", "."]
                               + [str(d) for d in range(12)]) + "\n")
    wd = tmp_path / "wd"
    outputs = []
    for action in (["--action", "text_formatting", "--input", str(corpus)],
                   ["--action", "sharding", "--n_training_shards", "2", "--n_test_shards", "1",
                    "--fraction_test_set", "0.2"],
                   ["--action", "create_tfrecord_files", "--n_training_shards", "2",
                    "--n_test_shards", "1", "--fraction_test_set", "0.2", "--vocab_file",
                    str(vocab), "--max_seq_length", "32", "--max_predictions_per_seq", "4",
                    "--dupe_factor", "1", "--n_processes", "1"]):
        proc = subprocess.run([sys.executable, "bertPrep.py", "--dataset", "custom",
                               "--working_dir", str(wd), *action], capture_output=True,
                              text=True, cwd=repo_root, env=quiet_env(), timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outputs.append(proc.stdout)
    shards = re.findall(r"^create_tfrecord_files: wrote \S+: .* \[(\d)/3 shards, "
                        r"ETA \d+:\d\d:\d\d\]$", outputs[2], re.M)
    assert shards == ["1", "2", "3"], outputs[2]
    log = (wd / "bertPrep.log").read_text()
    assert log.count("bertPrep started:") == 3 and "Wrote" in log  # workers' INFO lines


COMMANDS = {  # console script -> a group heading its --help must have
    "bert-prep": "Sharding:", "bert-create-pretraining-data": "Instances:",
    "bert-pretrain": "Precision & speed:", "bert-glue": "Distributed:",
    "bert-squad": "Input:", "bert-inference": "Model from a checkpoint:",
    "bert-extract-features": "Output:", "bert-convert-checkpoint": "Input:",
    "bert-demo": "Training:", "bert-preflight": "Precision & speed:"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory, repo_root):
    """`pip install --no-deps --target` of a copy of the project (pip builds in the source
    folder); returns (target, environment that finds it and not the repository)."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    shutil.copytree(repo_root, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", "demo_out", "tests", "bench", "build", "*.egg-info", "__pycache__",
        "data", "out", "results"))
    target = root / "target"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-compile", "--target", str(target),
                    str(source)], check=True, capture_output=True, timeout=300)
    env = dict(quiet_env(), PYTHONPATH=str(target))
    return target, env


def test_pip_install_gives_a_command_per_entry_point_with_grouped_help(installed, tmp_path):
    target, env = installed
    assert sorted(os.listdir(target / "bin")) == sorted(COMMANDS)
    for command, group in COMMANDS.items():
        args = [str(target / "bin" / command)]
        args += ["hf2tf", "--help"] if command == "bert-convert-checkpoint" else ["--help"]
        proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env,
                              timeout=120)
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
        assert group in proc.stdout and "--" in proc.stdout, (command, proc.stdout)
        if command != "bert-convert-checkpoint":
            assert "Console:" in proc.stdout and "--verbosity" in proc.stdout
    # the installed packages run, not only their help (no TensorFlow needed for a plan)
    plan = subprocess.run([str(target / "bin" / "bert-pretrain"), "--dry_run",
                           "--bert_config_file=x.json", "--output_dir=out",
                           "--dry_run_ranks=8", "--learning_rate=7.5e-4"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert plan.returncode == 0 and '"peak_learning_rate": 0.006' in plan.stdout, plan.stderr
