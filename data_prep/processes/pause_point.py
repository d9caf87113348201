"""Named points where a process can be made to stop and wait, for the fault tests only.

A test that kills a run "while it does X" must reach X deterministically: waiting for a side
effect (a file open, a descendant started) races with a run that does X quickly and ends
before the test looks (a loaded machine made such a test fail on a fresh clone). So the
code marks the moment with `pause_point(name)`, and a test starts the run with
`BERT_PAUSE_AT=name` (or `name:N`, the N-th time the point is reached) and
`BERT_PAUSE_MARKER=path`: there the process writes the marker file and sleeps until it is
killed. Without the variables a pause point costs one dictionary lookup.
"""
import os
import time

PAUSE_AT = "BERT_PAUSE_AT"
PAUSE_MARKER = "BERT_PAUSE_MARKER"
_reached = {}


def pause_point(name):
    """Waits here forever (until killed) when the environment asks to pause at `name`."""
    wanted = os.environ.get(PAUSE_AT)
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point != name:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] != int(nth or 1):
        return
    marker = os.environ.get(PAUSE_MARKER)
    if marker:
        with open(marker, "w", encoding="utf-8") as writer:
            writer.write(f"{os.getpid()}\n")
    while True:
        time.sleep(3600)
