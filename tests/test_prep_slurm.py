"""scripts/prep.sub under a real one-node Slurm (tests/slurm_cluster.py): the batch script
starts a Dask scheduler, `srun` starts a `dask worker` with a process per CPU of the node,
and bertPrep's sharding then create_tfrecord_files run with `--dask_scheduler FILE`:

* submitted as a user would (from a folder of its own, the path of scripts/prep.sub, its
  #SBATCH lines but --nodes=1), the shards, records and .meta files are the bytes of the
  one-machine `--n_processes 1` run, and no scheduler, worker or bertPrep process and no
  scheduler file is left when the job is over;
* `scancel --batch --signal=TERM` while the workers write records (each worker paused with
  a shard's temporaries open: data_prep.processes.pause_point) stops bertPrep, the workers
  and the scheduler by pid (exit 143, nothing left); the same sbatch again ends on the
  one-machine bytes (no temporary passes as a shard);
* what the job cannot do is refused in one line before anything starts (no Slurm needed)."""
import os
import subprocess
import sys
import time

import pytest

from bertprep_support import REPO, copy_working_dir
from kill_support import file_digests
from slurm_cluster import slurm  # noqa: F401 (the module's real Slurm: a fixture)
from test_bertprep_resume import RECORD_FLAGS, SHARD_FLAGS
from test_prep_cluster_hosts import STAGES, one_machine, outputs  # noqa: F401 (fixture)

JOB_TIMEOUT = 600


def submit(slurm, folder, wd, vocab, stages=STAGES,
           corpus=("--dataset", "books_wiki_en_corpus"), **env):
    """`sbatch --nodes=1 /path/to/scripts/prep.sub sharding create_tfrecord_files FLAGS`
    (or other `stages` of another `corpus`) from `folder`; (job id, path of its output)."""
    job_env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2",
                   **env)
    for name in ("BERT_PREP_WORKING_DIR", "WORKERS_PER_NODE", "NETWORK_INTERFACE"):
        job_env.pop(name, None)
    job_id = slurm.sbatch(["--nodes=1", os.path.join(REPO, "scripts", "prep.sub"), *stages,
                           "--working_dir", wd, *corpus,
                           "--vocab_file", vocab, *SHARD_FLAGS, *RECORD_FLAGS],
                          env=job_env, cwd=str(folder))
    return job_id, slurm.job(job_id)["StdOut"]


def output_of(path):
    try:
        with open(path, errors="replace") as log:
            return log.read()
    except FileNotFoundError:
        return ""


def finish(slurm, job_id, path):
    """(JobState, the batch script's exit code, its output) once the job is over."""
    try:
        record = slurm.wait_until_finished(job_id, JOB_TIMEOUT)
    except TimeoutError as error:
        pytest.fail(f"{error}:\n{output_of(path)[-4000:]}")
    return record["JobState"], int(record["ExitCode"].partition(":")[0]), output_of(path)


def processes_of(wd):
    """Command lines of the processes that name the working dir (bertPrep's --working_dir,
    the scheduler's and workers' --scheduler-file in it)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                line = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if wd in line and str(os.getpid()) != name:
            found.append(line)
    return found


def assert_nothing_left(wd):
    assert processes_of(wd) == []
    folder = os.path.join(wd, ".dask")
    assert not os.path.isdir(folder) or os.listdir(folder) == []   # scheduler file removed


@pytest.mark.slow
@pytest.mark.faults
def test_prep_sub_writes_the_bytes_of_one_machine_and_leaves_nothing_running(
        slurm, one_machine, minilm_vocab, tmp_path):
    root, reference = one_machine
    wd = copy_working_dir(root, str(tmp_path / "wd"))
    job_id, path = submit(slurm, tmp_path, wd, minilm_vocab)
    state, code, output = finish(slurm, job_id, path)
    assert (state, code) == ("COMPLETED", 0), output[-4000:]
    assert "prep.sub: stages sharding create_tfrecord_files on 1 node(s)" in output, output
    for stage in STAGES:
        assert f"{stage}: " in output and f"on Dask cluster {wd}/.dask/scheduler-{job_id}.json" \
            in output, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert outputs(wd) == reference
    assert_nothing_left(wd)


@pytest.mark.slow
@pytest.mark.faults
def test_scancel_term_stops_everything_and_the_same_sbatch_ends_on_the_same_bytes(
        slurm, one_machine, minilm_vocab, tmp_path):
    root, reference = one_machine
    wd = copy_working_dir(root, str(tmp_path / "wd"))
    marker = tmp_path / "worker-paused"
    job_id, path = submit(slurm, tmp_path, wd, minilm_vocab, BERT_PAUSE_AT="records_opened",
                          BERT_PAUSE_MARKER=str(marker))
    deadline = time.monotonic() + JOB_TIMEOUT
    while not marker.exists():
        assert slurm.job(job_id)["JobState"] in ("PENDING", "CONFIGURING", "RUNNING"), \
            output_of(path)[-4000:]
        assert time.monotonic() < deadline, output_of(path)[-4000:]
        time.sleep(0.2)
    slurm.run(["scancel", "--batch", "--signal=TERM", job_id])
    state, code, output = finish(slurm, job_id, path)
    assert (state, code) == ("FAILED", 143), output[-4000:]
    assert "prep.sub: TERM: stopping bertPrep, the Dask workers and the scheduler" in output
    assert_nothing_left(wd)
    records = [name for name in file_digests(wd) if name.endswith(".tfrecord")]
    assert len(records) < len([n for n in reference if n.endswith(".tfrecord")]), records

    job_id, path = submit(slurm, tmp_path, wd, minilm_vocab)
    state, code, output = finish(slurm, job_id, path)
    assert (state, code) == ("COMPLETED", 0), output[-4000:]
    assert outputs(wd) == reference
    assert_nothing_left(wd)


@pytest.mark.parametrize("args, refusal", [
    (["--action", "sharding", "--working_dir", "/x"], "--action: give the stages as the first"),
    (["--hosts", "a:2", "--working_dir", "/x"], "--hosts: this job starts the Dask cluster"),
    (["--working_dir", "data"], "--working_dir data: give an absolute path"),
    (["--dataset", "books_wiki_en_corpus"], "no --working_dir (nor BERT_PREP_WORKING_DIR)"),
    (["--working_dir", "{tmp}"], "not in a Slurm job: submit it with sbatch"),
], ids=["action", "hosts", "relative-working-dir", "no-working-dir", "outside-slurm"])
def test_what_prep_sub_cannot_do_is_one_line_before_anything_starts(args, refusal, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k != "BERT_PREP_WORKING_DIR"}
    result = subprocess.run(["bash", os.path.join(REPO, "scripts", "prep.sub"), "sharding",
                             *(a.format(tmp=tmp_path) for a in args)],
                            capture_output=True, text=True, env=env, timeout=30)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr
    assert result.stderr.startswith(f"prep.sub: {refusal}"), result.stderr
    assert os.listdir(tmp_path) == []   # no .dask folder, nothing started


@pytest.mark.slow
def test_prep_sub_from_raw_text_formats_shards_and_writes_records_as_one_machine(
        slurm, shared_data, minilm_vocab, tmp_path):
    """The whole path from a folder of raw text (`text_formatting sharding
    create_tfrecord_files --dataset custom --input FOLDER`: only the first stage reads
    --input) gives the bytes of the same three stages run by one process."""
    from bertprep_support import run_bertprep
    raw = ("--dataset", "custom", "--input", os.path.join(shared_data, "books"))
    stages = ("text_formatting", "sharding", "create_tfrecord_files")
    local = str(tmp_path / "local")
    for index, stage in enumerate(stages):
        args = ["--working_dir", local, "--action", stage, *raw[:2], "--vocab_file",
                minilm_vocab, *SHARD_FLAGS, *RECORD_FLAGS, "--n_processes", "1"]
        proc = run_bertprep(args + (list(raw[2:]) if index == 0 else []), timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    wd = str(tmp_path / "slurm")
    job_id, path = submit(slurm, tmp_path, wd, minilm_vocab, stages=stages, corpus=raw)
    state, code, output = finish(slurm, job_id, path)
    assert (state, code) == ("COMPLETED", 0), output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert outputs(wd) == outputs(local)
    assert any(name.startswith("formatted_one_article_per_line") for name in outputs(wd))
    assert_nothing_left(wd)
