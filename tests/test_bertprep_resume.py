"""create_tfrecord_files killed mid-way and rerun: only unfinished shards are redone and the
records are byte-identical to an uninterrupted run (with another number of processes)."""
import os
import re
import signal
import subprocess
import sys
import time

from bertprep_support import REPO, copy_working_dir, formatted_corpus, run_bertprep
from data_prep import prep_actions

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
    options = prep_actions.PrepOptions(
        action="sharding", dataset="books_wiki_en_corpus", working_dir=wd,
        n_training_shards=N_TRAIN, n_test_shards=N_TEST, fraction_test_set=0.05,
        n_processes=1, progress=False)
    assert prep_actions.run(options) == 0
    return wd


def command(wd, vocab, processes):
    return [sys.executable, os.path.join(REPO, "bertPrep.py"), "--working_dir", wd,
            "--action", "create_tfrecord_files", "--dataset", "books_wiki_en_corpus",
            "--vocab_file", vocab, "--n_processes", str(processes), *SHARD_FLAGS, *RECORD_FLAGS]


def records(wd):
    folder = os.path.join(wd, RECORDS)
    return {name: os.path.join(folder, name) for name in os.listdir(folder)
            if not name.endswith(".meta.json")}


def test_killed_run_resumes_with_only_unfinished_shards(shared_data, minilm_vocab, tmp_path):
    wd = sharded_working_dir(shared_data, str(tmp_path / "interrupted"))
    reference_wd = copy_working_dir(wd, str(tmp_path / "reference"))
    folder = os.path.join(wd, RECORDS)

    # Run with one process; kill its whole process group once the first shard is complete.
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen(command(wd, minilm_vocab, 1), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if os.path.isdir(folder) and any(n.endswith(".tfrecord") for n in os.listdir(folder)):
                break
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    complete = {n: os.stat(p).st_mtime_ns for n, p in records(wd).items()
                if n.endswith(".tfrecord")}
    assert 1 <= len(complete) < N_TRAIN + N_TEST, "the run was not interrupted mid-way"

    rerun = run_bertprep(["--working_dir", wd, "--action", "create_tfrecord_files",
                          "--dataset", "books_wiki_en_corpus", "--vocab_file", minilm_vocab,
                          "--n_processes", "1", *SHARD_FLAGS, *RECORD_FLAGS])
    assert rerun.returncode == 0, rerun.stderr
    skipped = set(re.findall(r"skip (\S+) \(complete\)", rerun.stdout))
    written = set(re.findall(r"wrote (\S+)\.tfrecord", rerun.stdout))
    assert {n + ".tfrecord" for n in skipped} == set(complete)
    assert len(skipped) + len(written) == N_TRAIN + N_TEST and not skipped & written
    final = records(wd)
    assert len(final) == N_TRAIN + N_TEST  # and no temporary file left behind
    for name, mtime in complete.items():
        assert os.stat(final[name]).st_mtime_ns == mtime

    uninterrupted = subprocess.run(command(reference_wd, minilm_vocab, 2), env=env,
                                   capture_output=True, text=True)
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    reference = records(reference_wd)
    assert sorted(reference) == sorted(final)
    for name in final:
        assert open(final[name], "rb").read() == open(reference[name], "rb").read(), name
