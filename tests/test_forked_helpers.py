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


_BUILD = r"""
import hashlib, json, logging, os, sys
from data_prep.instances import batch_writing, pretraining_data
from data_prep.instances.pretraining_data_options import PretrainingDataOptions

batch_writing.BATCH_SIZE = 256  # several batches from a small corpus (same for every run)
parent = os.getpid()
corpus, vocab, folder = sys.argv[1:4]
calls = os.path.join(folder, "calls.txt")
serialise = batch_writing.serialised_rows
def recorded(features, kinds, n_out, records_before):  # which process serialised which batch
    with open(calls, "a") as log:
        log.write(f"{os.getpid()} {records_before}\n")
    if FAIL and os.getpid() != parent and records_before >= 3 * 256:
        os._exit(3)  # a helper dies at its second batch
    return serialise(features, kinds, n_out, records_before)
batch_writing.serialised_rows = recorded
warnings = []
logging.getLogger("absl").addHandler(type("H", (logging.Handler,), {
    "emit": lambda self, record: warnings.append(record.getMessage())})())
VARIANTS = {"static": {}, "whole_word": {"do_whole_word_mask": True},
            "dynamic": {"masking": "dynamic"}, "packed": {"max_sequences_per_row": 3}}
out = {}
for variant, options in VARIANTS.items():
    for name, processes, FAIL in (("one", 1, False), ("two", 2, False), ("three", 3, False),
                                  ("failing", 2, True)):
        if variant != "static" and name == "failing":
            continue
        path = os.path.join(folder, f"{variant}_{name}.tfrecord")
        if os.path.exists(calls):
            os.remove(calls)
        stats = pretraining_data.create_pretraining_tfrecords(
            corpus, path, vocab,
            PretrainingDataOptions(dupe_factor=1, max_seq_length=32, **options),
            log_instances=0, processes=processes)
        with open(path, "rb") as reader, open(calls) as log:
            out[f"{variant}_{name}"] = {
                "sha": hashlib.sha256(reader.read()).hexdigest(),
                "instances": stats.instances, "warnings": list(warnings),
                "calls": [[int(pid) == parent, int(first)] for pid, first in map(str.split, log)]}
        warnings.clear()
"""


def test_batches_are_built_by_helpers_into_the_same_bytes(minilm_vocab, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(
        "\n".join(f"Sentence {s} of document {d} says a few more words." for s in range(12))
        for d in range(200)) + "\n")
    proc = _python("-c", _BUILD + _REPORT, str(corpus), minilm_vocab, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    for variant in ("static", "whole_word", "dynamic", "packed"):
        one = out[f"{variant}_one"]
        assert -(-one["instances"] // 256) >= 4, variant
        for name in ("two", "three"):
            assert out[f"{variant}_{name}"]["sha"] == one["sha"], (variant, name)
            assert not out[f"{variant}_{name}"]["warnings"]
        assert all(here for here, _ in one["calls"])
    batches = -(-out["static_one"]["instances"] // 256)
    for name, share in (("two", 2), ("three", 3)):
        # Batch k is serialised by process k % share: this one, then helpers, in turn.
        calls = sorted(out[f"static_{name}"]["calls"], key=lambda call: call[1])
        assert [first for _, first in calls] == [256 * k for k in range(batches)]
        assert [here for here, _ in calls] == [k % share == 0 for k in range(batches)]
    # Packed rows are only known once built: built here, each batch serialised by a helper.
    packed_calls = out["packed_two"]["calls"]
    assert len(packed_calls) == -(-out["packed_one"]["instances"] // 256)
    assert not any(here for here, _ in packed_calls)
    # The helper died at its second batch (batch 3): the rest was built here, the same bytes.
    failing = out["static_failing"]
    assert failing["sha"] == out["static_one"]["sha"]
    assert len(failing["warnings"]) == 1 and "helper process failed" in failing["warnings"][0]
    assert sum(not here for here, _ in failing["calls"]) == 2  # batch 1, and 3 (it died)
    assert out["children_left"] is False


def _sentence_corpus(path):
    """The standard library's docstrings, one sentence a line (thousands of lines)."""
    from data_prep.bertprep.builtin_corpus import iter_documents
    with open(path, "w", encoding="utf-8") as writer:
        for _, text in iter_documents():
            sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
            writer.write("\n".join(sentences) + "\n\n")
    return sum(1 for line in open(path, encoding="utf-8") if line.strip())


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
