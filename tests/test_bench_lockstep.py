"""bench/lockstep.py: two benchmark processes serving the same chunks in turn, so a machine
whose speed drifts slows both sides alike. Checked with stand-in children whose "work" is a
sleep of known length and that record when they served: the order, the chunks each side
served, the seconds reported, and a child that dies named with its log."""
import importlib.util
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SPEC = importlib.util.spec_from_file_location("bench_lockstep",
                                               os.path.join(REPO, "bench", "lockstep.py"))
lockstep = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(lockstep)

# A child: work item i "takes" SECONDS[i] (slept); each served item is appended, with the
# time it started, to the journal; FAIL_AT makes it die when asked to serve that item.
CHILD = """
import json, sys, time
sys.path.insert(0, {bench!r})
from lockstep import serve_commands
side, journal, seconds = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
fail_at = int(sys.argv[4])
reply_fd = int(sys.argv[6])
def serve_items(start, stop):
    if start <= fail_at < stop:
        print("stand-in failure of", side, "at item", fail_at, flush=True)
        sys.exit(3)
    timed = []
    with open(journal, "a") as writer:
        for item in range(start, stop):
            writer.write(json.dumps([side, item, time.time()]) + "\\n")
            time.sleep(seconds[item])
            timed.append(seconds[item])
    return timed
serve_commands(reply_fd, serve_items)
"""


def _pair(tmp_path, seconds, fail=None):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(bench=os.path.join(REPO, "bench")))
    journal = tmp_path / "journal"
    commands = {side: [sys.executable, str(script), side, str(journal),
                       json.dumps(seconds[side]), str(fail[1] if fail and fail[0] == side
                                                      else -1)]
                for side in ("ours", "hf")}
    logs = {side: str(tmp_path / f"{side}.log") for side in commands}
    return lockstep.LockstepPair(commands, logs), journal


def test_chunks_cut_the_work_into_nearly_equal_runs_that_cover_it_once():
    assert lockstep.chunk_bounds(10, 4) == [(0, 2), (2, 5), (5, 8), (8, 10)]
    assert lockstep.chunk_bounds(3, 24) == [(0, 1), (1, 2), (2, 3)]
    assert lockstep.chunk_bounds(1, 1) == [(0, 1)]


def test_both_sides_serve_every_chunk_in_turn_the_first_swapped_each_chunk(tmp_path):
    seconds = {"ours": [0.01] * 6, "hf": [0.03] * 6}
    pair, journal = _pair(tmp_path, seconds)
    try:
        timed = pair.serve(lockstep.chunk_bounds(6, 3), first_side="hf")
        pair.close()
    finally:
        pair.kill()
    served = [json.loads(line) for line in journal.read_text().splitlines()]
    order = [side for side, _, _ in served]
    # chunk 0: hf then ours; chunk 1: ours then hf; chunk 2: hf then ours (ABBA)
    assert order == ["hf"] * 2 + ["ours"] * 4 + ["hf"] * 4 + ["ours"] * 2
    # never both at once: each side's chunk starts after the other's last item ended
    times = [start for _, _, start in served]
    assert times == sorted(times)
    for side in ("ours", "hf"):
        assert [item for s, item, _ in served if s == side] == list(range(6))
        assert timed[side] == pytest.approx([2 * seconds[side][0]] * 3)


def test_a_child_that_dies_is_named_with_its_log_and_the_other_is_stopped(tmp_path):
    pair, _ = _pair(tmp_path, {"ours": [0.0] * 4, "hf": [0.0] * 4}, fail=("hf", 2))
    with pytest.raises(SystemExit) as failure:
        pair.serve(lockstep.chunk_bounds(4, 2), first_side="ours")
    message = str(failure.value)
    assert message.startswith("the hf side's process failed; see ")
    assert "stand-in failure of hf at item 2" in message
    assert all(child.poll() is not None for child in pair._children.values())
