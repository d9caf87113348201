"""bertPrep.py's sharding and create_tfrecord_files on a real Dask cluster of this machine
(Dask's own scheduler and workers, started as a user starts them): the same bytes as one
process for 1, 2 and 4 workers; a worker killed mid-shard has its shard redone; a rerun after
the coordinator is killed writes only the missing shards; bad input and a bad scheduler are
one line. (Two ssh "hosts" and Slurm: tests/test_prep_cluster_hosts.py.)"""
import operator
import os
import re
import subprocess
import sys
import time

import pytest

from bertprep_support import REPO, assert_clean_error, copy_working_dir, formatted_corpus, run_bertprep
from kill_support import file_digests, kill_tree
from data_prep.bertprep import sharding

pytest.importorskip("distributed")

from dask_cluster import DaskCluster  # noqa: E402

SHARD_FLAGS = ["--dataset", "books_wiki_en_corpus", "--n_training_shards", "4",
               "--n_test_shards", "1", "--fraction_test_set", "0.05"]
RECORD_FLAGS = ["--max_seq_length", "128", "--max_predictions_per_seq", "20", "--dupe_factor", "2"]
SHARDS = "sharded_training_shards_4_test_shards_1_fraction_0.05/books_wiki_en_corpus"
RECORDS = ("tfrecord_lower_case_1_seq_len_128_max_pred_20_masked_lm_prob_0.15"
           "_random_seed_12345_dupe_factor_2/books_wiki_en_corpus")


def bertprep(wd, action, vocab, *where, env=None):
    return run_bertprep(["--working_dir", wd, "--action", action, "--vocab_file", vocab,
                         *SHARD_FLAGS, *RECORD_FLAGS, *where], env=env, timeout=600)


def outputs(wd):
    """sha256 of every shard and record file (and .meta), by path under the working dir: all
    there is but the finished sharding's plan."""
    return {os.path.join(part, path): digest for part in (SHARDS, RECORDS)
            for path, digest in file_digests(os.path.join(wd, part)).items()
            if path != sharding.DONE}   # the plan names this working dir's inputs


def prepare(wd, vocab, *where):
    for action in ("sharding", "create_tfrecord_files"):
        proc = bertprep(wd, action, vocab, *where)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
    return outputs(wd)


@pytest.fixture(scope="module")
def formatted(shared_data, tmp_path_factory):
    root, _ = formatted_corpus(shared_data)
    return root


@pytest.fixture(scope="module")
def reference(formatted, minilm_vocab, tmp_path_factory):
    """The one-process outputs."""
    wd = copy_working_dir(formatted, str(tmp_path_factory.mktemp("one_process") / "wd"))
    digests = prepare(wd, minilm_vocab, "--n_processes", "1")
    # 5 shards; 5 record files and their 5 .meta.json; nothing else (no temporary)
    assert len(digests) == 15, sorted(digests)
    return digests


@pytest.fixture
def dask(tmp_path):
    cluster = DaskCluster(tmp_path / "dask")
    yield cluster
    cluster.close()


@pytest.mark.slow
def test_the_same_bytes_on_1_2_and_4_workers(reference, formatted, minilm_vocab, dask, tmp_path):
    for count in (1, 2, 4):
        while dask.workers < count:
            dask.add_workers(1)
        wd = copy_working_dir(formatted, str(tmp_path / f"workers_{count}"))
        proc = bertprep(wd, "sharding", minilm_vocab, "--dask_scheduler", dask.scheduler_file)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f"{count} workers" in proc.stdout, proc.stdout
        got = prepare(wd, minilm_vocab, "--dask_scheduler", dask.address)
        assert got == reference, f"{count} workers"


def _wait_for(path, process, timeout=300):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert process.poll() is None, "the run ended before the worker paused"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.faults
def test_a_worker_killed_mid_shard_has_its_work_redone(reference, formatted, minilm_vocab,
                                                       dask, tmp_path):
    """A worker stops for good (kill -9, no nanny to restart it) with a shard half-written,
    first in sharding, then in create_tfrecord_files: Dask gives its job to the other worker,
    the run ends with every shard, no temporary is left, and the bytes are one process's."""
    wd = copy_working_dir(formatted, str(tmp_path / "wd"))
    dask.add_workers(1)
    for action, point in (("sharding", "shard_opened"), ("create_tfrecord_files",
                                                         "records_opened")):
        marker = tmp_path / f"paused-{action}"
        doomed = dask.add_workers(1, nanny=False, env={"BERT_PAUSE_AT": point,
                                                       "BERT_PAUSE_MARKER": str(marker)})
        run = subprocess.Popen(
            [sys.executable, os.path.join(REPO, "bertPrep.py"), "--working_dir", wd,
             "--action", action, "--vocab_file", minilm_vocab, *SHARD_FLAGS, *RECORD_FLAGS,
             "--dask_scheduler", dask.scheduler_file],
            cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(marker, run)
            assert int(marker.read_text()) == doomed.pid
            dask.kill(doomed, lost_workers=1)
            out, err = run.communicate(timeout=600)
        finally:
            kill_tree(run)
        assert run.returncode == 0, out[-2000:] + err[-2000:]
    assert outputs(wd) == reference


@pytest.mark.faults
def test_a_rerun_after_the_coordinator_is_killed_writes_only_the_missing_shards(
        reference, formatted, minilm_vocab, tmp_path):
    """Sharding killed (kill -9) after 2 of its 5 shards: no shard under a final name, records
    refused in one line; the rerun keeps the 2 (not rewritten) and writes the 3 others. Once
    finished, the same command has nothing to do, and other flags shard anew."""
    wd = copy_working_dir(formatted, str(tmp_path / "wd"))
    marker = tmp_path / "paused"
    run = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "bertPrep.py"), "--working_dir", wd,
         "--action", "sharding", "--vocab_file", minilm_vocab, *SHARD_FLAGS, "--n_processes", "1"],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO, BERT_PAUSE_AT="shard_opened:3",
                           BERT_PAUSE_MARKER=str(marker)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(marker, run)
    finally:
        kill_tree(run)
    shards = os.path.join(wd, SHARDS)
    assert [n for n in os.listdir(shards) if not n.startswith(".")] == []
    staged = os.path.join(shards, ".sharding-in-progress")
    kept = {n: os.stat(os.path.join(staged, n)).st_mtime_ns for n in os.listdir(staged)
            if n.endswith(".txt")}
    assert len(kept) == 2, os.listdir(staged)

    refused = bertprep(wd, "create_tfrecord_files", minilm_vocab)
    assert_clean_error(refused, SHARDS, "sharding did not finish")

    rerun = bertprep(wd, "sharding", minilm_vocab, "--n_processes", "1")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "2 of 5 shards kept" in rerun.stdout
    assert re.search(r"writing 3 shards", rerun.stdout), rerun.stdout
    assert {n: os.stat(os.path.join(shards, n)).st_mtime_ns for n in kept} == kept
    records = bertprep(wd, "create_tfrecord_files", minilm_vocab, "--n_processes", "1")
    assert records.returncode == 0, records.stderr[-2000:]
    assert outputs(wd) == reference

    # Finished: the same command again has nothing to do; another seed shards anew.
    finished = {n: os.stat(os.path.join(shards, n)).st_mtime_ns for n in os.listdir(shards)}
    again = bertprep(wd, "sharding", minilm_vocab, "--n_processes", "1")
    assert "all 5 shards of these inputs and flags are complete" in again.stdout, again.stdout
    assert {n: os.stat(os.path.join(shards, n)).st_mtime_ns for n in os.listdir(shards)} \
        == finished
    reseeded = bertprep(wd, "sharding", minilm_vocab, "--n_processes", "1", "--sharding_seed", "7")
    assert "writing 5 shards" in reseeded.stdout, reseeded.stdout


def test_bad_utf8_in_the_middle_is_one_line_naming_file_and_offset_from_a_worker(dask,
                                                                                 tmp_path):
    dask.add_workers(1)
    corpus = tmp_path / "corpus.txt"
    good = "First sentence here. Second one follows.\n"
    corpus.write_bytes((good * 30).encode() + b"Bad \xff byte.\n" + good.encode() * 5)
    args = ["--working_dir", str(tmp_path / "wd"), "--action", "sharding", "--dataset",
            "custom", "--input", str(corpus), "--n_training_shards", "2", "--n_test_shards",
            "0", "--fraction_test_set", "0"]
    local = run_bertprep(args + ["--n_processes", "1"])
    line = assert_clean_error(local, str(corpus), f"byte offset {len(good) * 30 + 4}")
    remote = run_bertprep(args + ["--dask_scheduler", dask.scheduler_file])
    assert assert_clean_error(remote) == line


def test_jobs_sharing_a_scheduler_do_not_break_each_others_handshake(dask, tmp_path):
    """distributed's scheduler tells every client of each cancel, and a client whose handshake
    reply shares a batch with one fails with a bare AssertionError (CI met it once: three
    bertPrep runs on one scheduler, one finishing as another connected). A run that finishes
    cancels nothing; one that connects as
    another client cancels tries again, and one line says when every try failed."""
    from data_prep.processes.cluster import HANDSHAKE_ATTEMPTS, ClusterOptions, DaskRunner
    dask.add_workers(1)
    options = ClusterOptions(dask_scheduler=dask.scheduler_file)
    with DaskRunner(options, str(tmp_path)) as runner:
        results = sorted((name, value) for name, value, error in
                         runner.run(operator.add, [(1, 2), (3, 4)], ["a", "b"]))
        ours = runner.client.id
    assert results == [("a", 3), ("b", 7)]
    actions = dask.client.run_on_scheduler(
        lambda dask_scheduler: [event.get("action") for _, event in
                                dask_scheduler.get_events(ours)])
    assert "cancel" not in actions and actions, actions

    spoiled = dask.spoil_handshakes(2)
    with DaskRunner(options, str(tmp_path)) as runner:   # the third try
        assert runner.workers == 1
    assert spoiled() == 2
    dask.spoil_handshakes(HANDSHAKE_ATTEMPTS)   # a scheduler busy past reason: one line
    (tmp_path / "corpus.txt").write_text("One document. Two sentences.\n" * 4)
    proc = run_bertprep(["--working_dir", str(tmp_path / "wd"), "--action", "sharding",
                         "--dataset", "custom", "--input", str(tmp_path / "corpus.txt"),
                         "--dask_scheduler", dask.scheduler_file])
    assert_clean_error(proc, "--dask_scheduler", dask.scheduler_file,
                       f"answered {HANDSHAKE_ATTEMPTS} handshakes out of turn")


def test_a_bad_scheduler_or_both_flags_are_one_line(tmp_path):
    common = ["--working_dir", str(tmp_path / "wd"), "--action", "sharding", "--dataset",
              "custom", "--input", str(tmp_path / "corpus.txt")]
    (tmp_path / "corpus.txt").write_text("One document. Two sentences.\n" * 4)
    started = time.monotonic()
    nobody = run_bertprep(common + ["--dask_scheduler", "tcp://127.0.0.1:9"],
                          env={"BERT_PREP_CONNECT_TIMEOUT": "5"}, timeout=120)
    assert_clean_error(nobody, "--dask_scheduler", "no Dask scheduler answers",
                       "tcp://127.0.0.1:9")
    assert time.monotonic() - started < 90
    missing = run_bertprep(common + ["--dask_scheduler", str(tmp_path / "no.json")])
    assert_clean_error(missing, "--dask_scheduler", "no such scheduler file")
    both = run_bertprep(common + ["--dask_scheduler", "tcp://127.0.0.1:9", "--hosts", "a"])
    assert_clean_error(both, "--hosts", "not both")


def test_a_scheduler_file_that_is_not_one_is_one_line_naming_it(tmp_path):
    """Garbage, or an "address" that is no string, in the file --dask_scheduler names: one line
    naming the file and what is wrong (distributed's Client raised an AssertionError or a
    TypeError ~60 lines down). The other shapes of a wrong file, read in this process."""
    common = ["--working_dir", str(tmp_path / "wd"), "--action", "sharding", "--dataset",
              "custom", "--input", str(tmp_path / "corpus.txt")]
    (tmp_path / "corpus.txt").write_text("One document. Two sentences.\n" * 4)
    garbage = tmp_path / "garbage.json"
    garbage.write_text("garbage{\n")
    proc = run_bertprep(common + ["--dask_scheduler", str(garbage)])
    line = assert_clean_error(proc, "--dask_scheduler", str(garbage),
                              "is not a Dask scheduler file (not JSON", "--scheduler-file")
    assert proc.stderr.strip() == line
    number = tmp_path / "number.json"
    number.write_text('{"type": "Scheduler", "address": 8786}')
    proc = run_bertprep(common + ["--dask_scheduler", str(number)])
    assert_clean_error(proc, str(number), 'its "address" is 8786, not a string')
    assert not os.path.exists(tmp_path / "wd" / "sharded_training_shards_256_test_shards_256"
                                              "_fraction_0.1")

    from data_prep.errors import DataPrepError
    from data_prep.processes.cluster import read_scheduler_file

    def problem(text):
        path = tmp_path / "file.json"
        path.write_bytes(text)
        with pytest.raises(DataPrepError) as caught:
            read_scheduler_file(str(path), attempts=2, wait_s=0.01)
        return caught.value.problem

    assert "(empty)" in problem(b"")
    assert "(not text)" in problem(b"\xff\xfe\x00")
    assert "(holds a list, not an object" in problem(b'["tcp://127.0.0.1:8786"]')
    assert '(has no "address")' in problem(b'{"id": "Scheduler-1"}')
    assert '(its "address" is null' in problem(b'{"address": null}')
    assert '(its "address" is ""' in problem(b'{"address": ""}')
    good = tmp_path / "good.json"
    good.write_text('{"type": "Scheduler", "address": "tcp://127.0.0.1:8786"}')
    assert read_scheduler_file(str(good)) == "tcp://127.0.0.1:8786"


@pytest.mark.faults
def test_a_scheduler_that_dies_mid_run_is_one_line_and_a_rerun_resumes(reference, formatted,
                                                                       minilm_vocab, dask,
                                                                       tmp_path):
    """The scheduler is killed (kill -9) while its only worker writes the 2nd of 5 shards: one
    line naming the scheduler's address, saying it stopped answering, how many jobs had
    finished and that a rerun resumes (before: 48 lines, one per job, blaming "a Dask worker",
    and Dask's reconnection tracebacks). The rerun, on this machine's processes, keeps the
    finished shard and ends with one process's bytes."""
    wd = copy_working_dir(formatted, str(tmp_path / "wd"))
    marker = tmp_path / "paused"
    paused = dask.add_workers(1, nanny=False, env={"BERT_PAUSE_AT": "shard_opened:2",
                                                   "BERT_PAUSE_MARKER": str(marker)})
    address = dask.address
    run = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "bertPrep.py"), "--working_dir", wd,
         "--action", "sharding", "--vocab_file", minilm_vocab, *SHARD_FLAGS,
         "--dask_scheduler", dask.scheduler_file],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(marker, run)
        dask.kill_scheduler()
        out, err = run.communicate(timeout=300)
    finally:
        kill_tree(run)
        dask.kill(paused, lost_workers=1)  # paused for good: it would not end on SIGTERM
    proc = subprocess.CompletedProcess(run.args, run.returncode, out, err)
    line = assert_clean_error(proc, "--dask_scheduler", f"the Dask scheduler at {address} "
                              "stopped answering (1 of 5 jobs of this step", "rerun the same "
                              "command", "already written are kept")
    assert err.strip() == line, err
    assert not [n for n in os.listdir(os.path.join(wd, SHARDS)) if not n.startswith(".")]

    rerun = bertprep(wd, "sharding", minilm_vocab, "--n_processes", "1")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "1 of 5 shards kept" in rerun.stdout, rerun.stdout
    assert {path: digest for path, digest in outputs(wd).items() if path.startswith(SHARDS)} \
        == {path: digest for path, digest in reference.items() if path.startswith(SHARDS)}
