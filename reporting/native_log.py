"""C++ log lines to the log file, everything else written to file descriptor 2 to the console.

Why: TensorFlow's own C++ logging obeys TF_CPP_MIN_LOG_LEVEL (`reporting.console.prepare` sets it to
errors only), but XLA logs through absl's C++ logging, which in TensorFlow 2.15 does not. A
quiet run that compiles anything with XLA (`--use_xla`, the fused optimizer update) printed
`WARNING: All log messages before absl::InitializeLog() is called are written to STDERR`,
`I0000 ... device_compiler.h:186] Compiled cluster using XLA! ...` and, once per step,
`E ... stream_executor_internal.h:177] SetPriority unimplemented for this stream.` between
its progress lines. Those lines belong in the log file, with the rest of the run's story.

How: C++ writes to file descriptor 2 and nothing else can catch it, so `route(log_path)` turns
fd 2 into a pipe read by a small child process (this file run as a script, standard library
only) that appends C++ log lines (absl's `I0000 00:00:... file.cc:12] ...`, TensorFlow's
`2026-01-01 00:00:00.000000: I file.cc:12] ...`) to the log file and passes every other byte
to the console unchanged. Fatal (F) and error (E) lines go to both, except errors known to be
harmless (`HARMLESS`). A child and not a thread: a process that dies abruptly (abort, kill -9,
a C++ fatal error) loses nothing still in the pipe, because the child drains it and exits at
end of file; it ignores SIGINT and SIGTERM (Ctrl-C and a cluster's notice reach the whole
process group) so that it outlives the command's own shutdown. Python's `sys.stderr` gets a
duplicate of the console's descriptor, so Python's output (the progress line, which must see
the terminal, errors, tracebacks) never passes through the pipe. That stream is
`ConsoleStream`, which writes with `os.write` and holds no buffer and no lock: a buffered
writer raises "reentrant call inside BufferedWriter" when a signal handler logs (the SIGTERM
handler's "checkpoint at the next boundary" line) while the main thread is inside a write.
"""
import io
import os
import re
import signal
import subprocess
import sys

# absl (XLA): "I0000 00:00:1795578848.454472   26181 device_compiler.h:186] text"
# TensorFlow: "2026-11-25 03:54:08.460419: E external/local_xla/.../file.h:177] text"
_CXX_LINE = re.compile(
    rb"^(?:(?P<absl>[IWEF])\d{4} [\d:.]+\s+\d+ [\w./+-]+:\d+\]"
    rb"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: (?P<tf>[IWEF]) [\w./+-]+:\d+\]"
    rb"|WARNING: All log messages before absl::InitializeLog\(\) is called)")
# Errors that are not: XLA's CPU stream asks for a priority it does not implement.
HARMLESS = (b"SetPriority unimplemented for this stream",)


def destination(line):
    """'log', 'both' or 'console' for one line (bytes) written to fd 2."""
    match = _CXX_LINE.match(line)
    if not match:
        return "console"
    level = match.group("absl") or match.group("tf") or b"W"
    if level in (b"E", b"F") and not any(text in line for text in HARMLESS):
        return "both"
    return "log"


class ConsoleStream(io.TextIOBase):
    """A text stream on a file descriptor with no buffer and no lock, so that a signal
    handler may write while the interrupted code is itself inside `write` (both lines arrive
    whole, one after the other, unless a pipe takes a write in parts)."""

    def __init__(self, fd, encoding="utf-8", errors="backslashreplace"):
        super().__init__()
        self._fd = fd
        self._encoding = encoding
        self._errors = errors

    @property
    def encoding(self):
        return self._encoding

    @property
    def errors(self):
        return self._errors

    def fileno(self):
        return self._fd

    def isatty(self):
        return os.isatty(self._fd)

    def writable(self):
        return True

    def write(self, text):
        data = memoryview(text.encode(self._encoding, self._errors))
        while data:
            try:
                data = data[os.write(self._fd, data):]
            except BlockingIOError:
                continue
        return len(text)

    def flush(self):
        """Nothing is held back."""


_CHILD = []   # the Popen object, kept: collected, it would warn that the child still runs


def route(log_path):
    """From now on, C++ log lines of this process (and of the processes it starts) go to
    `log_path`, the rest of fd 2 to the console. Returns the child's pid (None when fd 2
    could not be rerouted: nothing changed)."""
    try:
        sys.stderr.flush()
        console_fd = os.dup(2)
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), log_path],
                                 stdin=subprocess.PIPE, stdout=console_fd, stderr=console_fd,
                                 close_fds=True)
    except OSError:
        return None
    _CHILD.append(child)
    os.dup2(child.stdin.fileno(), 2)
    child.stdin.close()   # fd 2 is now the pipe's only write end in this process
    sys.stderr = ConsoleStream(console_fd)
    return child.pid


def _copy(log_path):
    """The child: fd 0 (the pipe) line by line to the console (fd 1) or the log file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    console = os.fdopen(1, "wb", buffering=0)
    log = None
    with os.fdopen(0, "rb") as pipe:
        for line in iter(pipe.readline, b""):
            where = destination(line)
            if where in ("console", "both"):
                try:
                    console.write(line)
                except OSError:
                    pass
            if where in ("log", "both"):
                if log is None:
                    try:
                        log = open(log_path, "ab", buffering=0)
                    except OSError:
                        log = False
                if log:
                    log.write(line)


if __name__ == "__main__":
    _copy(sys.argv[1])
