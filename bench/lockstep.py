"""Two benchmark processes in lockstep: each side serves a chunk of the same work in turn.

Why: on a shared machine (a cloud VM) the CPU's speed drifts while a benchmark runs. On the
2-core Intel Xeon VM of 2026-11-28 one oneDNN dense block (160 x 384 -> 1,536 -> 384, bfloat16)
took 0.84-0.99 ms in some 2-second windows and 1.39-2.06 ms in others, in one process, with
nothing else running; a round of fresh processes a side (minutes each) then measures the machine's
mood as much as the code: one round's SQuAD batch-1 ratio was 0.84x in one stretch of
requests and 1.23x in another. Here both sides' processes stay up, and the work is cut into
chunks served alternately (the first side swapped every chunk, ABBA), so each chunk's two
timings are seconds apart and drift falls on both. The chunk ratios' spread says how much the
machine drifted.

The parent (`LockstepPair`) starts both children, each with a pipe of its own for replies
(its stdout and stderr go to its log: libraries print there); commands go in on stdin. The
child (`serve_commands`) answers "ready" once loaded and warmed up, then `serve START STOP`
with the latencies of work items START..STOP-1 it timed, and `end` by leaving. While one side
serves, the other waits on its stdin; a short pause between turns lets the waiting side's
spinning worker threads (OpenMP, Eigen) go to sleep before the other side is timed.
"""
import json
import os
import subprocess
import sys
import time

READY = "ready"
PAUSE_SECONDS = 0.02


def chunk_bounds(items, chunks):
    """[(start, stop)] cutting `items` work items into `chunks` nearly equal runs (fewer when
    there are fewer items)."""
    chunks = max(1, min(chunks, items))
    edges = [round(index * items / chunks) for index in range(chunks + 1)]
    return list(zip(edges[:-1], edges[1:]))


class LockstepPair:
    """Both sides' child processes, `commands` {side: argv}, logs in `logs` {side: path}."""

    def __init__(self, commands, logs, cwd=None):
        self.sides = list(commands)
        self._children, self._replies, self._logs = {}, {}, logs
        for side, argv in commands.items():
            read_end, write_end = os.pipe()
            with open(logs[side], "w", encoding="utf-8") as log:
                child = subprocess.Popen(
                    argv + ["--reply_fd", str(write_end)], stdin=subprocess.PIPE,
                    stdout=log, stderr=subprocess.STDOUT, cwd=cwd, pass_fds=(write_end,),
                    text=True)
            os.close(write_end)
            self._children[side] = child
            self._replies[side] = os.fdopen(read_end, encoding="utf-8")
        for side in self.sides:
            self._reply(side)  # "ready": loaded and warmed up

    def serve(self, bounds, first_side=None):
        """{side: [seconds of each chunk]}: the chunks `bounds` served in turn, the side that
        goes first swapped every chunk (starting with `first_side`)."""
        order = list(self.sides)
        if first_side is not None and order[0] != first_side:
            order.reverse()
        seconds = {side: [] for side in self.sides}
        for index, (start, stop) in enumerate(bounds):
            for side in (order if index % 2 == 0 else order[::-1]):
                time.sleep(PAUSE_SECONDS)
                self._send(side, f"serve {start} {stop}")
                seconds[side].append(sum(self._reply(side)["latencies"]))
        return seconds

    def close(self):
        """Ends both children; raises SystemExit naming the side whose child failed."""
        for side in self.sides:
            self._send(side, "end")
        for side in self.sides:
            if self._children[side].wait() != 0:
                self._fail(side)
            self._replies[side].close()

    def kill(self):
        for child in self._children.values():
            if child.poll() is None:
                child.kill()
                child.wait()

    def _send(self, side, line):
        try:
            self._children[side].stdin.write(line + "\n")
            self._children[side].stdin.flush()
        except BrokenPipeError:
            self._fail(side)

    def _reply(self, side):
        line = self._replies[side].readline()
        if not line:
            self._children[side].wait()
            self._fail(side)
        return json.loads(line)

    def _fail(self, side):
        with open(self._logs[side], encoding="utf-8") as reader:
            tail = reader.read()[-2000:]
        self.kill()
        raise SystemExit(f"the {side} side's process failed; see {self._logs[side]}:\n{tail}")


def serve_in_turn(commands, outs, serve, cwd=None):
    """Starts both sides' children (`commands` {side: argv}; each writes its results to `outs`
    {side: JSON path}, its log beside it), lets `serve(pair)` make them serve, and ends them,
    killed whatever happens: ({side: the child's results}, what `serve` returned)."""
    pair = LockstepPair(commands, {side: out + ".log" for side, out in outs.items()}, cwd=cwd)
    try:
        served = serve(pair)
        pair.close()
    finally:
        pair.kill()
    results = {}
    for side, out in outs.items():
        with open(out, encoding="utf-8") as reader:
            results[side] = json.load(reader)
    return results, served


def serve_commands(reply_fd, serve_items):
    """The child's side: says ready, then serves what the parent asks. `serve_items(start,
    stop)` serves work items start..stop-1 and returns their latencies (seconds)."""
    with os.fdopen(reply_fd, "w", encoding="utf-8") as replies:
        def reply(message):
            replies.write(json.dumps(message) + "\n")
            replies.flush()
        reply({READY: True})
        for line in sys.stdin:
            words = line.split()
            if not words or words[0] == "end":
                return
            if words[0] == "serve":
                reply({"latencies": serve_items(int(words[1]), int(words[2]))})
