"""Operational faults: two runs on one --output_dir (run lock), pool workers and
wikiextractor outliving a killed bertPrep.py, temporaries of killed create_pretraining_data.py
runs, and a run whose every step is skipped (divergence guard)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import types

import psutil
import pytest
import tensorflow as tf

from bertprep_support import REPO, TABLE_DUMP, WIKI_DUMP, formatted_corpus
from data_prep.instances.corpus import expand_input_files
from kill_support import file_digests, kill_parent_and_check_descendants_die, seeded_moments
from pretraining.input_pipeline import InputError, list_input_files
from pretraining_records import write_random_records
from test_bertprep_resume import RECORD_FLAGS, SHARD_FLAGS, sharded_working_dir
from test_pretraining import command_line, make_flags
from test_pretraining import data  # noqa: F401  (module fixture: tiny config and records)
from resilience import run_lock
from resilience.run_lock import LOCK_NAME, RunLockedError

pytestmark = pytest.mark.faults


def dead_pid():
    """The pid of a process that has ended (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert not psutil.pid_exists(process.pid)
    return process.pid


def write_stale_lock(folder, pid):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, LOCK_NAME), "w", encoding="utf-8") as f:
        json.dump({"host": socket.gethostname(), "pid": pid, "started": "yesterday",
                   "command": "killed run"}, f)


# --------------------------------------------------------------------------- 1. run lock

def test_second_holder_is_refused_in_one_line_naming_the_first(tmp_path):
    folder = str(tmp_path / "out")
    with run_lock.run_lock(folder):
        with pytest.raises(RunLockedError) as refused:
            run_lock.acquire(folder)  # another open file description: flock refuses it
        message = str(refused.value)
        assert "\n" not in message and f"pid {os.getpid()} on {socket.gethostname()}" in message
        assert os.listdir(folder) == [LOCK_NAME]
    assert not os.path.exists(folder)  # released; a run that wrote nothing leaves no folder
    with run_lock.run_lock(folder, is_chief=False) as lock:  # other ranks take nothing
        assert lock is None and not os.path.exists(folder)


def test_lock_is_released_when_the_run_raises(tmp_path):
    with pytest.raises(KeyError):
        with run_lock.run_lock(str(tmp_path)):
            raise KeyError("boom")
    assert not (tmp_path / LOCK_NAME).exists()
    run_lock.acquire(str(tmp_path)).release()


def test_stale_lock_of_a_dead_pid_is_replaced(tmp_path):
    write_stale_lock(str(tmp_path), dead_pid())
    lock = run_lock.acquire(str(tmp_path))
    record = json.loads((tmp_path / LOCK_NAME).read_text())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_finetuning_driver_refuses_a_held_folder_before_doing_anything(tmp_path):
    from finetuning import driver
    with run_lock.run_lock(str(tmp_path)):
        before = sorted(os.listdir(tmp_path))
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()} "):
            driver.run(None, types.SimpleNamespace(horovod=False, output_dir=str(tmp_path)))
        assert sorted(os.listdir(tmp_path)) == before


def test_pretraining_takes_over_a_stale_lock_and_releases_it(data, tmp_path):  # noqa: F811
    from pretraining.runner import run
    write_stale_lock(str(tmp_path), dead_pid())
    results = run(make_flags(data, tmp_path, num_train_steps=1))
    assert results["train"]["final_step"] == 1
    assert not (tmp_path / LOCK_NAME).exists()


def test_second_run_pretraining_on_one_folder_exits_nonzero_naming_the_first(
        data, tmp_path, repo_root):  # noqa: F811
    output = tmp_path / "run"
    first = subprocess.Popen(
        command_line(data, output, num_train_steps=100000, save_checkpoints_steps=100000),
        cwd=repo_root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, log = time.time() + 240, ""
        while "step 2/" not in log:  # training (its progress line), its files written
            line = first.stderr.readline()
            assert line or first.poll() is None, "first run ended early: " + log[-2000:]
            log += line
            assert time.time() < deadline
        before = sorted(os.listdir(output))
        try:
            second = subprocess.run(command_line(data, output, num_train_steps=100000),
                                    cwd=repo_root, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the second run did not refuse: it is training in the same folder")
        assert second.returncode == 1
        errors = [l for l in second.stderr.splitlines() if l.startswith("error: ")]
        assert len(errors) == 1 and f"pid {first.pid} on {socket.gethostname()}" in errors[0], \
            second.stderr[-2000:]
        assert "run_pretraining.py" in errors[0] and "Traceback" not in second.stderr
        assert sorted(os.listdir(output)) == before  # the second created nothing
        first.send_signal(signal.SIGTERM)  # preemption: the lock goes with the run
        _, rest = first.communicate(timeout=120)
        assert first.returncode == 128 + signal.SIGTERM, rest[-2000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert not (output / LOCK_NAME).exists()
    step = max(int(p.name.split("-")[1].split(".")[0]) for p in output.glob("model.ckpt-*.index"))
    third = subprocess.run(command_line(data, output, num_train_steps=step + 1), cwd=repo_root,
                           capture_output=True, text=True, timeout=240)
    assert third.returncode == 0, third.stderr[-2000:]
    assert (output / f"model.ckpt-{step + 1}.index").exists()


# --------------------------------------------------------------------------- 2. pool workers

def test_create_tfrecord_files_workers_die_with_a_killed_bertprep(shared_data, minilm_vocab,
                                                                  tmp_path):
    wd = sharded_working_dir(shared_data, str(tmp_path / "wd"))
    args = [sys.executable, os.path.join(REPO, "bertPrep.py"), "--working_dir", wd,
            "--action", "create_tfrecord_files", "--dataset", "books_wiki_en_corpus",
            "--vocab_file", minilm_vocab, "--n_processes", "2", *SHARD_FLAGS, *RECORD_FLAGS]
    kill_parent_and_check_descendants_die(args, env=dict(os.environ, PYTHONPATH=REPO))


def test_sharding_workers_die_with_a_killed_parent(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"Document {i} has one sentence.\n" for i in range(4)))
    # Shards that take minutes (a big corpus): the parent is killed while workers write.
    code = ("import sys, time\nfrom data_prep.bertprep import sharding\n"
            "sharding.write_shard = lambda *job: time.sleep(120)\n"
            "sharding.shard_corpus([sys.argv[1]], sys.argv[2], 'c', sharding.ShardingOptions("
            "n_training_shards=2, n_test_shards=0, fraction_test_set=0.0, n_processes=2), "
            "progress=False)\n")
    kill_parent_and_check_descendants_die(
        [sys.executable, "-c", code, str(corpus), str(tmp_path / "shards")], cwd=REPO)


def _has_open(wanted):
    """A `ready` for kill_parent_and_check_descendants_die: a descendant has a file open
    whose path satisfies `wanted(path)`."""
    def ready(descendants):
        for process in descendants:
            try:
                if any(wanted(f.path) for f in process.open_files()):
                    return True
            except psutil.Error:  # ended meanwhile
                pass
        return False
    return ready


def test_wikiextractor_and_its_forks_die_with_a_killed_bertprep(shared_data, tmp_path):
    """bertPrep.py text_formatting killed with SIGKILL while wikiextractor reads the dump's
    templates (alone, nothing written yet: it used to go on for the whole dump), then once
    wikiextractor forked a seeded number of processes: none of them survives, and a rerun
    writes the bytes of an uninterrupted run and leaves no temporary."""
    dump = os.path.realpath(os.path.join(shared_data, WIKI_DUMP))
    wd = tmp_path / "wd"
    args = [sys.executable, os.path.join(REPO, "bertPrep.py"), "--working_dir", str(wd),
            "--action", "text_formatting", "--dataset", "wikicorpus_en", "--input", dump,
            "--n_processes", "2"]
    env = dict(os.environ, PYTHONPATH=REPO)
    forked = seeded_moments("wikiextractor forks", [1, 2, 3], count=1)[0]
    for ready in (_has_open(dump.__eq__), lambda descendants: len(descendants) >= 2 + forked):
        kill_parent_and_check_descendants_die(args, ready, env=env)
    rerun = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    root, _ = formatted_corpus(shared_data)  # formatted once, uninterrupted, one process
    folder = "formatted_one_article_per_line"
    assert file_digests(wd / folder) == {
        "wikicorpus_en.txt": file_digests(os.path.join(root, folder))["wikicorpus_en.txt"]}


def test_worker_whose_parent_died_before_the_request_exits():
    code = ("from data_prep.processes.worker_lifetime import die_with_parent\n"
            "die_with_parent(-1)\nprint('alive')\n")  # -1: not the parent it has now
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1 and "alive" not in result.stdout


# --------------------------------------------------------------------------- 3. temporaries

def test_next_create_pretraining_data_removes_a_killed_runs_temporaries(tmp_path, repo_root):
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + words)
                     + "\n")
    text = tmp_path / "input.txt"
    documents = [" ".join(words[i:] + words[:i]) + " ." for i in range(len(words))]
    text.write_text("\n\n".join("\n".join(documents[i:i + 3]) for i in range(0, 9, 3)) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    dead, alive = dead_pid(), os.getpid()
    stale = out / f"train.tfrecord.tmp-{dead}"
    live = out / f"train.tfrecord.tmp-{alive}"  # a writer still running: left alone
    unrelated = out / f"other.tfrecord.tmp-{dead}"  # not this run's output: left alone
    for path in (stale, live, unrelated):
        path.write_bytes(b"partial")
    result = subprocess.run(
        [sys.executable, "create_pretraining_data.py", f"--input_file={text}",
         f"--output_file={out / 'train.tfrecord'}", f"--vocab_file={vocab}",
         "--max_seq_length=16", "--max_predictions_per_seq=3", "--dupe_factor=1"],
        cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(os.listdir(out)) == sorted(["train.tfrecord", live.name, unrelated.name])
    assert os.listdir(f"{out}.meta") == ["train.tfrecord.meta.json"]  # beside the folder


def test_next_text_formatting_removes_a_killed_runs_scratch_copy(shared_data, tmp_path):
    """A dump without <siteinfo> is read through an uncompressed copy beside the output;
    bertPrep.py killed while wikiextractor reads it leaves the copy, the next run removes it."""
    wd = tmp_path / "wd"
    args = [sys.executable, os.path.join(REPO, "bertPrep.py"), "--working_dir", str(wd),
            "--action", "text_formatting", "--dataset", "wikicorpus_en",
            "--input", os.path.join(shared_data, TABLE_DUMP), "--n_processes", "1"]
    marker = tmp_path / "paused"
    # The run waits at the moment to be killed (data_prep.processes.pause_point): a small dump would
    # otherwise be formatted and done before a watcher saw its copy (a race a loaded
    # machine lost).
    env = dict(os.environ, PYTHONPATH=REPO, BERT_PAUSE_AT="wiki_scratch_copy",
               BERT_PAUSE_MARKER=str(marker))
    folder = wd / "formatted_one_article_per_line"
    kill_parent_and_check_descendants_die(args, lambda descendants: marker.exists(), env=env)
    assert [name for name in os.listdir(folder) if name.startswith(".wiki-")]
    env = dict(os.environ, PYTHONPATH=REPO)
    rerun = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert os.listdir(folder) == ["wikicorpus_en.txt"]


def test_every_way_of_naming_inputs_skips_temporaries(tmp_path):
    for name in ("part-0.tfrecord", "part-1.tfrecord"):
        write_random_records(tmp_path / name, 2)
    temporary = tmp_path / f"part-2.tfrecord.tmp-{os.getpid()}"
    temporary.write_bytes(b"partial")
    complete = [str(tmp_path / "part-0.tfrecord"), str(tmp_path / "part-1.tfrecord")]
    assert list_input_files(str(tmp_path)) == complete
    assert list_input_files(str(tmp_path / "part-*")) == complete
    assert list_input_files(",".join(complete + [str(temporary)])) == complete
    with pytest.raises(InputError, match=r"no input files \(1 hidden or temporary ignored\)"):
        list_input_files(str(tmp_path / "part-2*"))
    assert expand_input_files(str(tmp_path / "part-*")) == complete
    (tmp_path / "part-0.tfrecord.meta.json").write_text("{}")  # records' metadata: not input
    assert list_input_files(str(tmp_path)) == complete == list_input_files(str(tmp_path / "p*"))


# --------------------------------------------------------------------------- 4. divergence

def test_a_run_whose_every_step_is_skipped_stops_with_an_error(data, tmp_path):  # noqa: F811
    """float16 gradients overflow at any loss scale near 2**100: every step is skipped, so the
    guard stops the run after --max_consecutive_skips instead of spinning at step 0."""
    from pretraining.runner import run
    from resilience.divergence import DivergenceError
    with pytest.raises(DivergenceError, match=r"^3 optimizer steps in a row were skipped for "
                                              r"non-finite gradients: the run is not training"):
        run(make_flags(data, tmp_path, amp=True, amp_dtype="float16",
                       init_loss_scale=2.0 ** 100, max_consecutive_skips=3,
                       num_train_steps=50))
    assert not (tmp_path / LOCK_NAME).exists()
    latest = tf.train.latest_checkpoint(str(tmp_path))
    assert latest is None or tf.train.load_checkpoint(latest).get_tensor("global_step") == 0
