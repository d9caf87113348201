"""create_tfrecord_files killed (kill -9) at three seeded moments and rerun: only unfinished
shards are redone and the records are byte-identical to an uninterrupted run (with another
number of processes)."""
import os
import re
import subprocess
import sys

import pytest

from bertprep_support import REPO, copy_working_dir, formatted_corpus, run_bertprep
from data_prep.bertprep import prep_actions
from data_prep.bertprep.prep_layout import PrepOptions
from kill_support import file_digests, kill_when, seeded_moments

N_TRAIN, N_TEST = 6, 1
SHARD_FLAGS = ["--n_training_shards", str(N_TRAIN), "--n_test_shards", str(N_TEST),
               "--fraction_test_set", "0.05"]
RECORD_FLAGS = ["--max_seq_length", "128", "--max_predictions_per_seq", "20",
                "--dupe_factor", "2"]
RECORDS = ("tfrecord_lower_case_1_seq_len_128_max_pred_20_masked_lm_prob_0.15"
           "_random_seed_12345_dupe_factor_2/books_wiki_en_corpus")


def sharded_working_dir(shared_data, dest):
    root, _ = formatted_corpus(shared_data)
    wd = copy_working_dir(root, dest)
    options = PrepOptions(
        action="sharding", dataset="books_wiki_en_corpus", working_dir=wd,
        n_training_shards=N_TRAIN, n_test_shards=N_TEST, fraction_test_set=0.05,
        n_processes=1, progress=False)
    assert prep_actions.run(options) == 0
    return wd


def command(wd, vocab, processes):
    return [sys.executable, os.path.join(REPO, "bertPrep.py"), "--working_dir", wd,
            "--action", "create_tfrecord_files", "--dataset", "books_wiki_en_corpus",
            "--vocab_file", vocab, "--n_processes", str(processes), *SHARD_FLAGS, *RECORD_FLAGS]


def _names(folder):
    """{name: path} of every file in `folder`'s training/ and test/ record folders."""
    found = {}
    for split in ("training", "test"):
        path = os.path.join(folder, split)
        if os.path.isdir(path):
            found.update((n, os.path.join(path, n)) for n in os.listdir(path))
    return found


def _complete(folder):
    """{name: mtime} of the record files complete in `folder` (training/ and test/)."""
    return {n: os.stat(path).st_mtime_ns for n, path in _names(folder).items()
            if n.endswith(".tfrecord")}


@pytest.mark.faults
def test_three_kills_resume_with_only_unfinished_shards(shared_data, minilm_vocab, tmp_path):
    """kill -9 at three seeded moments, each while a shard is being written after a given
    number of complete ones: every rerun skips exactly the complete shards (never rewritten),
    and the records end byte-identical to an uninterrupted run with 2 processes."""
    wd = sharded_working_dir(shared_data, str(tmp_path / "interrupted"))
    reference_wd = copy_working_dir(wd, str(tmp_path / "reference"))
    folder = os.path.join(wd, RECORDS)
    env = dict(os.environ, PYTHONPATH=REPO)
    total = N_TRAIN + N_TEST

    kept = {}
    for count in seeded_moments("create_tfrecord_files", list(range(total - 1))):
        # One process writes the shards in turn (skipping the complete ones) and waits
        # (data_prep.processes.pause_point) with a shard's temporaries just created and `count`
        # shards complete: killed there.
        marker = tmp_path / f"paused-after-{count}"
        paused = dict(env, BERT_PAUSE_AT=f"records_opened:{count + 1 - len(kept)}",
                      BERT_PAUSE_MARKER=str(marker))
        log = kill_when(command(wd, minilm_vocab, 1), marker.exists,
                        tmp_path / f"killed-after-{count}.log", env=paused)
        assert set(re.findall(r"skip (\S+) \(complete\)", log)) == {
            n[:-len(".tfrecord")] for n in kept}, log
        kept = _complete(folder)
        assert count <= len(kept) < total, "the run was not interrupted mid-way"

    rerun = run_bertprep(["--working_dir", wd, "--action", "create_tfrecord_files",
                          "--dataset", "books_wiki_en_corpus", "--vocab_file", minilm_vocab,
                          "--n_processes", "1", *SHARD_FLAGS, *RECORD_FLAGS])
    assert rerun.returncode == 0, rerun.stderr
    skipped = set(re.findall(r"skip (\S+) \(complete\)", rerun.stdout))
    written = set(re.findall(r"wrote (\S+)\.tfrecord", rerun.stdout))
    assert {n + ".tfrecord" for n in skipped} == set(kept)
    assert len(skipped) + len(written) == total and not skipped & written
    final = _complete(folder)
    assert {n: final[n] for n in kept} == kept  # complete shards were never rewritten

    uninterrupted = subprocess.run(command(reference_wd, minilm_vocab, 2), env=env,
                                   capture_output=True, text=True)
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    # every file byte-identical, and no temporary left behind
    assert file_digests(folder) == file_digests(os.path.join(reference_wd, RECORDS))
