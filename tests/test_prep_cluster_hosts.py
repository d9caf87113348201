"""bertPrep's sharding and create_tfrecord_files with `--hosts` for real: Dask workers started
over ssh (tests/ssh_hosts.py: a private sshd on the loopback "hosts" 127.0.0.2 and 127.0.0.3,
reached with SSH_PORT, as scripts/run.sub passes the nodes' sshd port) write every shard,
record and .meta file byte for byte as a one-machine `--n_processes 1` run, whatever the
hosts and workers per host; no worker, ssh client or sshd session outlives bertPrep, even
one killed with kill -9; and a host no sshd answers on is one `error: --hosts: ...` line
naming it, in seconds, with nothing left running.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from bertprep_support import (REPO, assert_clean_error, copy_working_dir, formatted_corpus,
                              run_bertprep)
from kill_support import file_digests
from data_prep.bertprep.sharding import DONE as PLAN_OF_DONE_SHARDS  # names the inputs' paths
from ssh_hosts import ssh_hosts  # noqa: F401 (fixture)
from test_bertprep_resume import RECORD_FLAGS, SHARD_FLAGS

pytestmark = pytest.mark.slow
STAGES = ("sharding", "create_tfrecord_files")
UNREACHABLE = "127.0.0.4"   # the loopback too, where the test's sshd does not listen


def prep(wd, vocab, action, extra, env=None):
    """One bertPrep stage on the small corpus (6 + 1 shards, dupe factor 2)."""
    return run_bertprep(["--working_dir", wd, "--action", action, "--dataset",
                         "books_wiki_en_corpus", "--vocab_file", vocab, *SHARD_FLAGS,
                         *RECORD_FLAGS, *extra], env=env, timeout=300)


def outputs(wd):
    """{file: sha256} of everything in the working dir but the logs and the finished
    sharding's plan, which names this working dir's inputs (the formatted corpus, the shards,
    the records and their .meta files)."""
    digests = {path: digest for path, digest in file_digests(wd).items()
               if not path.endswith(".log") and not path.endswith(PLAN_OF_DONE_SHARDS)}
    assert any(path.endswith(".tfrecord") for path in digests), sorted(digests)
    return digests


@pytest.fixture(scope="module")
def one_machine(shared_data, minilm_vocab, tmp_path_factory):
    """The reference: both stages with --n_processes 1 on a copy of the formatted corpus;
    (formatted working dir to copy, digests of the outputs)."""
    root, _ = formatted_corpus(shared_data)
    wd = copy_working_dir(root, str(tmp_path_factory.mktemp("one-machine") / "wd"))
    for action in STAGES:
        result = prep(wd, minilm_vocab, action, ["--n_processes", "1"])
        assert result.returncode == 0, result.stderr
    return root, outputs(wd)


def _children():
    """{pid: parent pid} of every process now."""
    parents = {}
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as stat:
                parents[int(name)] = int(stat.read().rpartition(")")[2].split()[1])
        except (ValueError, OSError, IndexError):
            continue
    return parents


def _command_line(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def left_running(ssh_hosts):
    """Command lines of what a run left behind: processes below the test's sshd (its
    sessions: a `dask worker` and its worker processes) and ssh clients to its port."""
    parents = _children()
    below, frontier = set(), {ssh_hosts.process.pid}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - below
        below |= frontier
    port = f"-p {ssh_hosts.port} "
    clients = {pid for pid in parents if "/usr/bin/ssh " in _command_line(pid)
               and port in _command_line(pid)}
    return sorted(line for line in map(_command_line, below | clients) if line)


def assert_nothing_left(ssh_hosts, within=15):
    """The workers, their sshd sessions and ssh clients end with bertPrep (a few seconds
    for the sessions to close)."""
    deadline = time.monotonic() + within
    while left_running(ssh_hosts) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left_running(ssh_hosts) == []


@pytest.mark.parametrize("layout", [("2:1",), ("2:1", "3:1"), ("2:2", "3:2")],
                         ids=["1-host-1-worker", "2-hosts-1-worker-each", "2-hosts-2-workers-each"])
def test_the_shards_and_records_of_ssh_hosts_are_the_bytes_of_one_machine(
        layout, one_machine, ssh_hosts, minilm_vocab, tmp_path):
    root, reference = one_machine
    hosts = ",".join(f"127.0.0.{spec}" for spec in layout)
    workers = sum(int(spec.split(":")[1]) for spec in layout)
    wd = copy_working_dir(root, str(tmp_path / "wd"))
    env = dict(ssh_hosts.env(), SSH_PORT=str(ssh_hosts.port))
    for action in STAGES:
        result = prep(wd, minilm_vocab, action, ["--hosts", hosts], env=env)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert f"on Dask cluster {hosts}, {workers} workers" in result.stdout, result.stdout
        assert_nothing_left(ssh_hosts)
    assert outputs(wd) == reference


def test_a_host_without_sshd_is_one_error_line_and_nothing_is_left_running(
        one_machine, ssh_hosts, minilm_vocab, tmp_path):
    """127.0.0.2 starts its worker, 127.0.0.4 refuses the connection: one line naming
    --hosts and the host, in seconds (not the 120 s wait for workers), and the worker
    started on 127.0.0.2 is stopped too."""
    root, _ = one_machine
    wd = copy_working_dir(root, str(tmp_path / "wd"))
    env = dict(ssh_hosts.env(), SSH_PORT=str(ssh_hosts.port))
    started = time.monotonic()
    result = prep(wd, minilm_vocab, "sharding", ["--hosts", f"127.0.0.2:1,{UNREACHABLE}:1"],
                  env=env)
    elapsed = time.monotonic() - started
    line = assert_clean_error(result, "--hosts", UNREACHABLE)
    assert "127.0.0.2:" not in line.split("(", 1)[1], line   # only the failed host is blamed
    assert elapsed < 60, f"{elapsed:.0f} s to report {line}"
    assert_nothing_left(ssh_hosts)


def test_workers_end_soon_after_bertprep_is_killed(one_machine, ssh_hosts, minilm_vocab, tmp_path):
    """kill -9 of bertPrep while its jobs run on two hosts (its scheduler dies with it, no
    cleanup code runs): the workers, their sshd sessions and ssh clients still end, within
    the 30 s given (Dask's workers close when their scheduler is gone; --death-timeout 60
    is the last resort)."""
    root, _ = one_machine
    wd = copy_working_dir(root, str(tmp_path / "wd"))
    assert prep(wd, minilm_vocab, "sharding", ["--n_processes", "1"]).returncode == 0
    env = dict(ssh_hosts.env(), SSH_PORT=str(ssh_hosts.port), PYTHONPATH=REPO,
               TF_CPP_MIN_LOG_LEVEL="2")
    run = subprocess.Popen([sys.executable, os.path.join(REPO, "bertPrep.py"), "--working_dir",
                            wd, "--action", "create_tfrecord_files", "--dataset",
                            "books_wiki_en_corpus", "--vocab_file", minilm_vocab, *SHARD_FLAGS,
                            *RECORD_FLAGS, "--hosts", "127.0.0.2:1,127.0.0.3:1"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in run.stdout:
            if "shards on Dask cluster" in line:
                break
        assert left_running(ssh_hosts), "no worker seen while the jobs run"
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
        run.stdout.close()
    assert_nothing_left(ssh_hosts, within=30)
