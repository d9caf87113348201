"""kill -9 at three seeded moments of create_pretraining_data.py and run_classifier.py, then a
rerun: the data is byte-identical to an uninterrupted run's and no part of a file passes as
whole; the fine-tuned weights equal an uninterrupted run's, bit for bit. (run_pretraining.py:
tests/test_resume_position.py; bertPrep.py create_tfrecord_files:
tests/test_bertprep_resume.py.)"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from kill_support import (assert_same_weights, file_digests, kill_when, seeded_moments,
                          train_killed_at_checkpoints)

pytestmark = pytest.mark.faults

WORDS = [f"w{index}" for index in range(300)]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."]


def write_vocab(path):
    path.write_text("\n".join(SPECIAL + WORDS) + "\n")
    return path


def write_corpus(path, documents, seed=0):
    """Google's input format: a sentence a line, a blank line between documents."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(documents):
        for _ in range(int(rng.integers(3, 20))):
            lines.append(" ".join(rng.choice(WORDS, int(rng.integers(4, 12)))) + " .")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def test_create_pretraining_data_killed_three_times_rewrites_identical_bytes(tmp_path,
                                                                             repo_root):
    """Two output files, ~28k instances in 7 write batches; killed once its temporaries exist
    (reading, planning) or hold a seeded share of the output: only `*.tmp-<pid>` files
    remain (or, killed between the two renames, a complete file); a rerun writes the bytes
    of an uninterrupted run and no temporary."""
    corpus, vocab = write_corpus(tmp_path / "input.txt", 3000), write_vocab(tmp_path / "v.txt")

    def args(folder):
        folder.mkdir(exist_ok=True)
        return [sys.executable, "create_pretraining_data.py", f"--input_file={corpus}",
                f"--output_file={folder / 'a.tfrecord'},{folder / 'b.tfrecord'}",
                f"--vocab_file={vocab}", "--max_seq_length=32", "--max_predictions_per_seq=5",
                "--dupe_factor=2"]

    reference = tmp_path / "reference"
    subprocess.run(args(reference), cwd=repo_root, check=True, capture_output=True,
                   timeout=300)
    expected = file_digests(reference)
    total = sum((reference / name).stat().st_size for name in expected)
    out = tmp_path / "out"

    # The run waits at the chosen moment (data_prep.processes.pause_point) to be killed there: with
    # its temporaries just created, or before write batch k of 7 (k - 1 written).
    moments = ["records_opened"] + [f"records_batch:{k}" for k in range(2, 8)]
    for moment in seeded_moments("create_pretraining_data", moments):
        marker = tmp_path / f"paused-{moment.replace(':', '-')}"
        env = dict(os.environ, BERT_PAUSE_AT=moment, BERT_PAUSE_MARKER=str(marker))
        kill_when(args(out), marker.exists, tmp_path / f"killed-at-{marker.name}.log",
                  cwd=repo_root, env=env)
        temporaries = [name for name in file_digests(out) if ".tmp-" in name]
        assert temporaries, f"nothing in progress at {moment}"
        for name, digest in file_digests(out).items():
            assert re.fullmatch(r"[ab]\.tfrecord\.tmp-\d+", name) or digest == expected[name], \
                f"{name} after a kill at {moment} ({total} bytes in all)"
    rerun = subprocess.run(args(out), cwd=repo_root, capture_output=True, text=True,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert file_digests(out) == expected


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """An SST-2-style task (label: parity of the words' numbers) and a tiny BERT."""
    from modeling import named_config
    root = tmp_path_factory.mktemp("classifier")
    rng = np.random.default_rng(1)
    rows = []
    for _ in range(160):
        words = rng.choice(WORDS, int(rng.integers(4, 12)))
        rows.append(f"{' '.join(words)}\t{sum(int(w[1:]) for w in words) % 2}")
    (root / "data").mkdir()
    (root / "data" / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    write_vocab(root / "vocab.txt")
    named_config("tiny").replace(vocab_size=len(SPECIAL) + len(WORDS)).to_json_file(
        str(root / "bert_config.json"))
    return root


def test_run_classifier_killed_three_times_resumes_bit_identical(classifier, tmp_path,
                                                                 repo_root):
    """Fine-tuning (dropout, accumulation 2, 20 steps) killed at three seeded checkpoints, the
    third resume without input states (skipping records): the final weights equal an
    uninterrupted run's, bit for bit. A resume with another accumulation is refused."""
    def args(output, accumulation=2):
        return [sys.executable, "run_classifier.py", "--task_name=SST-2",
                f"--data_dir={classifier / 'data'}", f"--vocab_file={classifier / 'vocab.txt'}",
                f"--bert_config_file={classifier / 'bert_config.json'}", "--do_train",
                "--max_seq_length=16", "--train_batch_size=8", "--num_train_epochs=2",
                f"--num_accumulation_steps={accumulation}", "--save_checkpoints_steps=2",
                "--display_loss_steps=1", f"--output_dir={output}"]

    reference, run = tmp_path / "reference", tmp_path / "interrupted"
    subprocess.run(args(reference), cwd=repo_root, check=True, capture_output=True,
                   timeout=300)
    moments = seeded_moments("run_classifier", list(range(0, 17, 2)))
    train_killed_at_checkpoints(args(run), run, moments, 20, tmp_path, repo_root,
                                drop_input_states_before=2)
    assert_same_weights(reference / "model.ckpt-20", run / "model.ckpt-20")

    # Fine-tuning resumes too, so its global batch is kept as pre-training's is: without
    # accumulation (40 steps of 8) the rest of the run would train on half the batch.
    result = subprocess.run(args(run, accumulation=1), cwd=repo_root, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {run}: its checkpoint (micro_step 40) was trained with a global batch of 16 "
        "sequences (--train_batch_size=8 x --num_accumulation_steps=2 x 1 rank) and this run's "
        "would be 8 (--num_accumulation_steps=1 where it had 2); pass "
        "--num_accumulation_steps=2 to keep it, or start over (--start_over, or a new "
        "--output_dir)")
