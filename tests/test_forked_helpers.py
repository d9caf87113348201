"""Work in forked helpers (data_prep.processes.forked) for create_pretraining_data: the same records
for any number of processes, parts that really come from other processes, a failed helper that
costs no output, no fork beside another thread, and no helper left behind when the caller
fails or is killed.

Each case runs in a fresh interpreter: a test worker that has imported TensorFlow would
(rightly) never fork, and the cases would pass without testing anything.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The end of each case script: whether any child process is left, then the results.
_REPORT = r"""
try:
    os.waitpid(-1, os.WNOHANG)
    out["children_left"] = True
except ChildProcessError:
    out["children_left"] = False
print(json.dumps(out))
"""

_CASES = r"""
import json, logging, os, sys, threading, time
from data_prep.instances import corpus
from data_prep.processes import forked

corpus.MIN_LINES_PER_PROCESS = 1
parent = os.getpid()
lines = [f"line {i}" for i in range(10)]

class PidTokenizer:  # a line's "ids": the pid of the process that encoded it, and its number
    def encode_batch(self, lines):
        return [[os.getpid(), int(line.split()[1])] for line in lines]

class DiesInAHelper(PidTokenizer):
    def encode_batch(self, lines):
        if os.getpid() != parent:
            os._exit(3)
        return super().encode_batch(lines)

class FailsHere(PidTokenizer):
    def encode_batch(self, lines):
        if os.getpid() == parent:
            raise RuntimeError("the caller's own part failed")
        time.sleep(60)  # a helper still at work when the caller stops
        return super().encode_batch(lines)

def run(tokenizer, processes=3):
    flat, counts = corpus.encode_lines_in_processes(tokenizer, lines, processes)
    return {"pids": flat[0::2].tolist(), "lines": flat[1::2].tolist(),
            "counts": counts.tolist()}

warnings = []
logging.getLogger("absl").addHandler(type("H", (logging.Handler,), {
    "emit": lambda self, record: warnings.append(record.getMessage())})())
out = {"parent": parent, "forked": run(PidTokenizer()), "failed_helper": run(DiesInAHelper())}
out["failed_helper_warnings"] = list(warnings)
stop = threading.Event()
thread = threading.Thread(target=stop.wait)
thread.start()
out["beside_a_thread"] = run(PidTokenizer())
stop.set()
thread.join()
started = time.time()
try:
    run(FailsHere())
except RuntimeError as e:
    out["caller_error"] = str(e)
out["caller_error_seconds"] = time.time() - started
"""


def _python(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=timeout)


def test_helpers_tokenize_their_parts_in_order_and_fail_safely():
    proc = _python("-c", _CASES + _REPORT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    parent = out["parent"]

    forked = out["forked"]
    assert forked["lines"] == list(range(10))  # every line once, in order
    assert forked["counts"] == [2] * 10
    # Three contiguous parts, the first tokenized here and two by other processes.
    by_part = [forked["pids"][0:3], forked["pids"][3:6], forked["pids"][6:10]]
    assert [len(set(part)) for part in by_part] == [1, 1, 1]
    assert by_part[0][0] == parent
    assert len({part[0] for part in by_part}) == 3

    failed = out["failed_helper"]  # both helpers died: their parts were tokenized here
    assert failed["lines"] == list(range(10)) and set(failed["pids"]) == {parent}
    assert len(out["failed_helper_warnings"]) == 2
    assert all("helper process failed (exit status" in w
               for w in out["failed_helper_warnings"]), out["failed_helper_warnings"]

    assert set(out["beside_a_thread"]["pids"]) == {parent}  # no fork beside a thread
    assert out["caller_error"] == "the caller's own part failed"
    assert out["caller_error_seconds"] < 30  # the sleeping helpers were killed, not awaited
    assert out["children_left"] is False


_SERIALISE = r"""
import hashlib, json, logging, os, sys
from data_prep.instances import pretraining_data
from data_prep.instances.pretraining_data_options import PretrainingDataOptions
from data_prep.processes import forked

pretraining_data.BATCH_SIZE = 256  # several batches from a small corpus (same for every run)
parent = os.getpid()
seen = {"helpers": set(), "calls": 0}
submit = forked.ForkedWorker.submit
def recorded(self, function, *args):
    seen["helpers"].add(self.pid)
    seen["calls"] += 1
    return submit(self, function, *args)
forked.ForkedWorker.submit = recorded
serialise = pretraining_data.serialised_rows
def dies_in_the_helper_at_batch_3(features, kinds, n_out, records_before):
    if os.getpid() != parent and records_before >= 2 * 256:
        os._exit(3)
    return serialise(features, kinds, n_out, records_before)
warnings = []
logging.getLogger("absl").addHandler(type("H", (logging.Handler,), {
    "emit": lambda self, record: warnings.append(record.getMessage())})())
corpus, vocab, folder = sys.argv[1:4]
out = {}
for name, processes in (("one", 1), ("two", 2), ("failing", 2)):
    if name == "failing":
        pretraining_data.serialised_rows = dies_in_the_helper_at_batch_3
    path = os.path.join(folder, f"{name}.tfrecord")
    stats = pretraining_data.create_pretraining_tfrecords(
        corpus, path, vocab,
        PretrainingDataOptions(dupe_factor=1, max_seq_length=32),
        log_instances=0, processes=processes)
    with open(path, "rb") as reader:
        out[name] = {"sha": hashlib.sha256(reader.read()).hexdigest(),
                     "instances": stats.instances, "helpers": len(seen["helpers"] - {None}),
                     "calls": seen["calls"], "warnings": list(warnings)}
    seen["helpers"].clear()
    seen["calls"] = 0
    warnings.clear()
"""


def _sentence_corpus(path):
    """The standard library's docstrings, one sentence a line (thousands of lines)."""
    from data_prep.bertprep.builtin_corpus import iter_documents
    with open(path, "w", encoding="utf-8") as writer:
        for _, text in iter_documents():
            sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
            writer.write("\n".join(sentences) + "\n\n")
    return sum(1 for line in open(path, encoding="utf-8") if line.strip())


def test_batches_are_serialised_by_a_helper_into_the_same_bytes(minilm_vocab, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(
        "\n".join(f"Sentence {s} of document {d} says a few more words." for s in range(12))
        for d in range(200)) + "\n")
    proc = _python("-c", _SERIALISE + _REPORT, str(corpus), minilm_vocab, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    batches = -(-out["two"]["instances"] // 256)
    assert batches >= 4
    assert out["one"]["calls"] == 0
    # One helper took every batch, and the bytes are those of one process.
    assert out["two"]["helpers"] == 1 and out["two"]["calls"] == batches
    assert out["two"]["sha"] == out["one"]["sha"] and not out["two"]["warnings"]
    # The helper died at the third batch: the rest was serialised here, the same bytes.
    assert out["failing"]["sha"] == out["one"]["sha"]
    assert len(out["failing"]["warnings"]) == 1
    assert "helper process failed" in out["failing"]["warnings"][0]
    assert out["children_left"] is False


def test_records_are_byte_identical_for_any_number_of_processes(minilm_vocab, tmp_path):
    corpus = str(tmp_path / "corpus.txt")
    n_lines = _sentence_corpus(corpus)
    from data_prep.instances.corpus import MIN_LINES_PER_PROCESS
    assert n_lines >= 3 * MIN_LINES_PER_PROCESS, "too few lines to use three processes"
    outputs = {}
    for processes in (1, 2, 3):
        out = str(tmp_path / f"records_{processes}.tfrecord")
        proc = _python(
            "create_pretraining_data.py", f"--input_file={corpus}", f"--output_file={out}",
            f"--vocab_file={minilm_vocab}", "--dupe_factor=1", f"--n_processes={processes}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        with open(out, "rb") as reader:
            outputs[processes] = reader.read()
    assert len(outputs[1]) > 100_000
    assert outputs[2] == outputs[1] and outputs[3] == outputs[1]


_KILLED = r"""
import os, sys, time
from data_prep.processes import forked
call = forked.ForkedWorker(time.sleep, 120)
print(call.pid, flush=True)
time.sleep(120)
"""


def _gone(pid):
    """True once `pid` has exited (a zombie that nobody reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as reader:
            return reader.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_helper_dies_with_its_killed_caller():
    caller = subprocess.Popen([sys.executable, "-c", _KILLED], stdout=subprocess.PIPE,
                              text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
    try:
        helper = int(caller.stdout.readline())
        assert not _gone(helper)
        caller.send_signal(signal.SIGKILL)
        caller.wait(timeout=30)
        deadline = time.time() + 20
        while not _gone(helper) and time.time() < deadline:
            time.sleep(0.05)
        assert _gone(helper), f"helper {helper} outlived its killed caller"
    finally:
        caller.kill()
        caller.wait()


def test_a_process_count_below_one_is_refused(minilm_vocab, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("One sentence.\nAnother one.\n")
    proc = _python(
        "create_pretraining_data.py", f"--input_file={corpus}",
        f"--output_file={tmp_path / 'o.tfrecord'}", f"--vocab_file={minilm_vocab}",
        "--n_processes=0")
    assert proc.returncode != 0
    assert "n_processes" in proc.stderr and "Traceback" not in proc.stderr
