"""What every command meets in `cli.command.Command.run`, once for all: Ctrl-C outside training
is one line and exit status 130 (no KeyboardInterrupt traceback, nothing half-written under an
output's name), and a flag value that is not UTF-8 (a folder named with bytes b'out\\xff') is
one line naming the flag, before anything is created."""
import os
import signal
import subprocess
import sys
import time

import pytest

from test_kill_resume import write_corpus, write_vocab

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CONFIG = os.path.join(REPO, "modeling", "configs", "bert_tiny_config.json")


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as in a terminal, whatever runs the tests


@pytest.mark.faults
def test_ctrl_c_on_create_pretraining_data_is_one_line_and_leaves_no_partial_output(tmp_path):
    corpus, vocab = write_corpus(tmp_path / "input.txt", 50), write_vocab(tmp_path / "v.txt")
    out, marker = tmp_path / "out", tmp_path / "paused"
    out.mkdir()
    # Ctrl-C while the records are being written (their temporaries exist): the process
    # waits there (data_prep.processes.pause_point) until the signal comes
    env = dict(os.environ, PYTHONPATH=REPO, BERT_PAUSE_AT="records_opened",
               BERT_PAUSE_MARKER=str(marker))
    child = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "create_pretraining_data.py"),
         f"--input_file={corpus}", f"--output_file={out / 'a.tfrecord'},{out / 'b.tfrecord'}",
         f"--vocab_file={vocab}", "--max_seq_length=32", "--max_predictions_per_seq=5"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_default_sigint)
    try:
        deadline = time.time() + 120
        while not marker.exists():
            assert child.poll() is None and time.time() < deadline, child.communicate()
            time.sleep(0.1)
        assert sorted(p.name.split(".tmp-")[0] for p in out.iterdir()) == ["a.tfrecord",
                                                                          "b.tfrecord"]
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error")]
    assert errors == [f"error: create_pretraining_data: interrupted (Ctrl-C): no output file "
                      "is left half-written (each is written to a temporary, renamed when "
                      "whole); rerun the command"], stderr[-3000:]
    assert sorted(os.listdir(out)) == []  # no record file, no temporary


NOT_UTF8 = os.fsencode("out") + b"\xff"


@pytest.mark.parametrize("script, args, flag", [
    ("run_pretraining.py", [b"--bert_config_file=" + os.fsencode(TINY_CONFIG),
                            b"--input_files_dir=in", b"--output_dir=" + NOT_UTF8], "output_dir"),
    ("run_classifier.py", [b"--task_name=SST-2", b"--do_train", b"--data_dir=in",
                           b"--vocab_file=v.txt", b"--bert_config_file=c.json",
                           b"--output_dir=" + NOT_UTF8], "output_dir"),
    ("create_pretraining_data.py", [b"--input_file=in.txt", b"--vocab_file=v.txt",
                                    b"--output_file=" + NOT_UTF8], "output_file"),
])
def test_a_flag_value_that_is_not_utf8_is_one_line_naming_the_flag_before_anything_is_made(
        tmp_path, script, args, flag):
    result = subprocess.run([os.fsencode(sys.executable),
                             os.fsencode(os.path.join(REPO, script)), *args],
                            capture_output=True, cwd=tmp_path, timeout=120,
                            env=dict(os.environ, PYTHONPATH=REPO))
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 1, stderr[-3000:]
    assert stderr.strip().splitlines() == [
        f"error: flag --{flag}: b'out\\xff' is not UTF-8 (byte 0xff at character 4): "
        "TensorFlow's files and the log take UTF-8 names and text only"], stderr[-3000:]
    assert os.listdir(tmp_path) == []  # no folder, no log file
