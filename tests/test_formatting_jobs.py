"""bertPrep.py --action text_formatting as jobs on a Dask cluster
(data_prep.bertprep.formatting_jobs): the formatted files are the bytes of the one-process run
(text_formatting.format_*, the reference) with 1, 2 and 4 workers, also when a worker is killed
in the middle of a part; a rerun after the coordinator was killed runs only the missing parts;
bad UTF-8 in the middle of a custom file is the one-machine run's error line. The clusters are
real: a scheduler and workers started as processes (`python -m distributed.cli.dask_scheduler`,
`dask_worker`), and the scheduler's task stream tells which jobs ran on which worker."""
import io
import os
import subprocess
import sys
import time

import pytest

from bertprep_support import BOOKS, REPO, TABLE_DUMP, WIKI_DUMP, run_bertprep

distributed = pytest.importorskip("distributed")

from dask_cluster import DaskCluster  # noqa: E402

from data_prep.bertprep import formatting_jobs as fj  # noqa: E402
from data_prep.bertprep import text_formatting as tf  # noqa: E402

RANGE_BYTES = 64 << 10  # the books (150 and 740 kB) are cut into a dozen ranges
FORMATTED = "formatted_one_article_per_line"


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    cluster = DaskCluster(tmp_path_factory.mktemp("dask"))
    yield cluster
    cluster.close()


@pytest.fixture
def cluster(tmp_path):
    (tmp_path / "dask").mkdir()
    cluster = DaskCluster(tmp_path / "dask")
    yield cluster
    cluster.close()


def corpora(shared_data):
    """{dataset: (--input paths, the one-process formatter)}: the Wikipedia fragment with the
    table dump (a two-part dump), the books, and a custom folder of books and GLUE files."""
    wiki = [os.path.join(shared_data, WIKI_DUMP), os.path.join(shared_data, TABLE_DUMP)]
    books = [os.path.join(shared_data, "books")]
    custom = [os.path.join(shared_data, "books"), os.path.join(shared_data, "glue")]
    return {
        "wikicorpus_en": (wiki, lambda out: tf.format_wikipedia(wiki, out, progress=False)),
        "bookscorpus": (books, lambda out: tf.format_books(books, out, progress=False)),
        "custom": (custom, lambda out: tf.format_custom(custom, out, progress=False)),
    }


@pytest.fixture(scope="module")
def reference(shared_data, tmp_path_factory):
    """{dataset: (bytes, stats)} of the one-process run."""
    folder = tmp_path_factory.mktemp("reference")
    result = {}
    for dataset, (_, formatter) in corpora(shared_data).items():
        out = str(folder / f"{dataset}.txt")
        stats = formatter(out)
        result[dataset] = open(out, "rb").read(), stats
    return result


def run_on_cluster(cluster, dataset, inputs, working_dir, **kwargs):
    args = ["--action", "text_formatting", "--dataset", dataset, "--working_dir",
            str(working_dir), "--dask_scheduler", cluster.scheduler_file,
            "--input", ",".join(inputs)]
    return run_bertprep(args, env={"BERT_PREP_FORMAT_RANGE_BYTES": str(RANGE_BYTES)}, **kwargs)


def wait_for(path, process, timeout=90):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.1)


def bertprep_in_background(cluster, dataset, inputs, working_dir):
    args = [sys.executable, os.path.join(REPO, "bertPrep.py"), "--action", "text_formatting",
            "--dataset", dataset, "--working_dir", str(working_dir), "--dask_scheduler",
            cluster.scheduler_file, "--input", ",".join(inputs)]
    env = dict(os.environ, PYTHONPATH=REPO, BERT_PREP_FORMAT_RANGE_BYTES=str(RANGE_BYTES))
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def pausing_worker(cluster, tmp_path, at):
    """A worker without a nanny (killed, it stays dead) that stops at the `at` pause point."""
    marker = tmp_path / "paused"
    process = cluster.add_workers(1, nanny=False, env={"BERT_PAUSE_AT": at,
                                                       "BERT_PAUSE_MARKER": str(marker)})
    return process, marker


def listed(inputs, suffixes=None):
    return [f for path in inputs for f in tf.list_input_files(path, suffixes)]


def stats_line(dataset, stats):
    dropped = f", {stats.dropped_empty} empty dropped" if stats.dropped_empty else ""
    return f"text_formatting: {dataset}: {stats.documents} documents{dropped} -> "


# --------------------------------------------------------------------------- cutting

def tricky_text():
    """Blocks separated by blank lines that are not empty (spaces, a tab, U+3000, CRLF, the
    separator U+001C), lines of a BOM alone (not blank: they join blocks), runs of blank
    lines, a last line without a newline."""
    pieces = []
    for i in range(300):
        lines = [f"Block {i} line {j} " + "word " * (i % 7) for j in range(1 + i % 4)]
        blank = ["", "   ", "\t", "\u3000", "\r", "\x1c", "\ufeff"][i % 7]  # BOM: not blank
        pieces.append("\n".join(lines) + "\n" + (blank + "\n") * (1 + i % 3))
    return ("\ufeff" + "".join(pieces) + "tail without newline").encode("utf-8")


@pytest.mark.parametrize("range_bytes", [1, 37, 500, 4096])
def test_ranges_hold_whole_blocks_and_format_to_the_whole_files_lines(
        shared_data, tmp_path, range_bytes):
    tricky = tmp_path / "tricky.txt"
    tricky.write_bytes(tricky_text())
    for path in (str(tricky), os.path.join(shared_data, BOOKS[0])):
        whole = tmp_path / "whole.txt"
        tf.format_custom([path], str(whole), progress=False)
        ranges = fj.block_ranges(path, range_bytes)
        assert ranges[0][0] == 0 and ranges[-1][1] == os.path.getsize(path)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert len(ranges) > 3
        pieces = io.StringIO()
        stats = tf.FormattingStats(output_file="-")
        for start, end in ranges:
            tf.write_custom(path, pieces, stats, "block", start, end)
        assert pieces.getvalue().encode("utf-8") == whole.read_bytes()


# --------------------------------------------------------------------------- the cluster

@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_cluster_writes_the_one_process_bytes(shared_data, reference, shared_cluster, tmp_path,
                                              workers):
    """The three corpora formatted at once on `workers` workers, each by its own bertPrep.py."""
    shared_cluster.add_workers(workers - shared_cluster.workers)
    cursor = shared_cluster.task_cursor()
    runs = {dataset: bertprep_in_background(shared_cluster, dataset, inputs, tmp_path / dataset)
            for dataset, (inputs, _) in corpora(shared_data).items()}
    total_parts = 0
    for dataset, run in runs.items():
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-3000:]
        expected, stats = reference[dataset]
        assert (tmp_path / dataset / FORMATTED / f"{dataset}.txt").read_bytes() == expected
        assert stats_line(dataset, stats) in out
        assert os.listdir(tmp_path / dataset / FORMATTED) == [f"{dataset}.txt"]  # no staging
        inputs = corpora(shared_data)[dataset][0]
        parts = len(listed(inputs, (".txt",) if dataset == "bookscorpus" else None))
        if dataset == "custom":  # the books are cut into ranges
            parts = len(fj.plan_parts("custom", listed(inputs), "block", RANGE_BYTES))
            assert parts > 10
        assert f"{parts} parts on Dask cluster" in out
        total_parts += parts
    tasks = shared_cluster.format_tasks_since(cursor)
    assert len(tasks) == total_parts  # every part ran on the cluster, once
    assert len({worker for _, worker in tasks}) == workers  # on every worker


@pytest.mark.faults
def test_a_worker_killed_in_the_middle_of_a_part_is_replaced(shared_data, reference, cluster,
                                                            tmp_path):
    inputs = corpora(shared_data)["custom"][0]
    doomed, marker = pausing_worker(cluster, tmp_path, "format_part_opened:2")
    run = bertprep_in_background(cluster, "custom", inputs, tmp_path / "wd")
    try:
        wait_for(marker, run)
        staging = fj.staging_dir(str(tmp_path / "wd" / FORMATTED / "custom.txt"))
        assert [n for n in os.listdir(staging) if n.endswith(f".txt.tmp-{doomed.pid}")]
        cluster.add_workers(1)
        cluster.kill(doomed, 1)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err[-3000:]
    assert (tmp_path / "wd" / FORMATTED / "custom.txt").read_bytes() == reference["custom"][0]
    assert stats_line("custom", reference["custom"][1]) in out
    assert os.listdir(tmp_path / "wd" / FORMATTED) == ["custom.txt"]


@pytest.mark.faults
def test_a_rerun_after_the_coordinator_was_killed_runs_only_the_missing_parts(
        shared_data, reference, cluster, tmp_path):
    inputs = corpora(shared_data)["custom"][0]
    doomed, marker = pausing_worker(cluster, tmp_path, "format_part_opened:3")
    run = bertprep_in_background(cluster, "custom", inputs, tmp_path / "wd")
    try:
        wait_for(marker, run)  # two parts written, the third half-written
    finally:
        run.kill()
        run.wait()
    cluster.kill(doomed, 1)
    staging = fj.staging_dir(str(tmp_path / "wd" / FORMATTED / "custom.txt"))
    written = sorted(n for n in os.listdir(staging) if n.startswith("part-") and
                     n.endswith(".txt"))
    assert len(written) == 2
    assert not os.path.exists(tmp_path / "wd" / FORMATTED / "custom.txt")
    cluster.add_workers(2)
    cursor = cluster.task_cursor()
    proc = run_on_cluster(cluster, "custom", inputs, tmp_path / "wd")
    assert proc.returncode == 0, proc.stderr[-3000:]
    parts = len(fj.plan_parts("custom", listed(inputs), "block", RANGE_BYTES))
    assert f"2 of {parts} parts kept from an unfinished run" in proc.stdout
    assert len(cluster.format_tasks_since(cursor)) == parts - 2
    assert (tmp_path / "wd" / FORMATTED / "custom.txt").read_bytes() == reference["custom"][0]
    assert stats_line("custom", reference["custom"][1]) in proc.stdout
    assert os.listdir(tmp_path / "wd" / FORMATTED) == ["custom.txt"]


def test_bad_utf8_in_the_middle_of_a_custom_file_is_the_one_machine_error(
        shared_data, shared_cluster, tmp_path):
    """Two bad bytes in different ranges: the first in the file is reported, as locally, in
    the one line the local run prints, though it came back from a worker."""
    text = open(os.path.join(shared_data, BOOKS[1]), "rb").read()
    third = len(text) // 3
    bad = text[:third] + b"\xff" + text[third:2 * third] + b"\xfe" + text[2 * third:]
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "bad.txt").write_bytes(bad)
    inputs = [str(tmp_path / "corpus")]
    local = run_bertprep(["--action", "text_formatting", "--dataset", "custom", "--working_dir",
                          str(tmp_path / "local"), "--n_processes", "1",
                          "--input", ",".join(inputs)])
    if shared_cluster.workers == 0:
        shared_cluster.add_workers(2)
    cursor = shared_cluster.task_cursor()
    remote = run_on_cluster(shared_cluster, "custom", inputs, tmp_path / "wd")
    errors = [[line for line in proc.stderr.splitlines() if line.startswith("error: ")]
              for proc in (local, remote)]
    assert local.returncode != 0 and remote.returncode != 0
    assert "Traceback" not in remote.stderr, remote.stderr
    assert errors[0] == errors[1] == [f"error: {tmp_path / 'corpus' / 'bad.txt'}: invalid "
                                      f"UTF-8 at byte offset {third} (byte 0xff)"]
    assert len(shared_cluster.format_tasks_since(cursor)) > 1  # the ranges ran on the cluster
    assert not os.path.exists(tmp_path / "wd" / FORMATTED / "custom.txt")
