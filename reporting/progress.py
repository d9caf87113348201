"""Progress of long jobs with an ETA, on stderr: one line rewritten in place on a terminal,
plain lines otherwise, so the log of a batch job stays readable (no carriage returns).

`ProgressLine` shows what a caller computed (training: one line per logged step), and
`RunOfRepeats` which lines of a run of repeated events to show (training's "held" lines);
`bar(...)` counts work done (shards, documents, bytes): tqdm on a terminal, `PlainBar` (a line
every `PlainBar.INTERVAL` seconds) otherwise.
"""
import sys
import time


def format_duration(seconds):
    """`h:mm:ss`."""
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def eta(done, total, elapsed):
    """`h:mm:ss` left when `done` of `total` took `elapsed` seconds ('?' before any)."""
    if not done or total is None:
        return "?"
    return format_duration(elapsed * max(total - done, 0) / done)


def _isatty(stream):
    return bool(getattr(stream, "isatty", None) and stream.isatty())


class ProgressLine:
    """`show(text)`: rewrites the line on a terminal, else writes a line."""

    def __init__(self, stream=None):
        self._stream = stream or sys.stderr
        self._tty = _isatty(self._stream)
        self._open = False

    def show(self, text):
        if self._tty:
            self._stream.write(f"\r{text}\033[K")
            self._open = True
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def close(self):
        """Ends the terminal line, so what follows starts on a line of its own."""
        if self._open:
            self._stream.write("\n")
            self._stream.flush()
            self._open = False


class RunOfRepeats:
    """Which lines of a run of repeated events to show: the 1st, 2nd, 4th, 8th... and, when
    the run ends, its last if not shown yet. A float16 run whose loss scale comes down from
    2**32 skips ~81 steps in a row: 8 "held" lines instead of 81, the count still exact."""

    def __init__(self):
        self._count, self._shown, self._last = 0, 0, None

    def shows(self, event):
        """Counts one more `event` of the run; True when its line is to be shown."""
        self._count += 1
        self._last = event
        if self._count & (self._count - 1):  # not a power of two
            return False
        self._shown = self._count
        return True

    def end(self):
        """Ends the run: its last event when that one's line was not shown, else None."""
        last = self._last if self._count != self._shown else None
        self._count, self._shown, self._last = 0, 0, None
        return last


def _amount(value, scale, decimals=0):
    """`value` as a count (`1,234`), or with `scale` as `1.2M`."""
    if scale:
        for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if value >= factor:
                return f"{value / factor:.1f}{suffix}"
    return f"{value:,.{decimals}f}"


class PlainBar:
    """The part of tqdm's interface data preparation uses, as occasional plain lines:
    `desc: done/total unit (pct%), rate unit/s, ETA h:mm:ss`. A line at most every
    INTERVAL seconds, the first after INTERVAL (quick jobs print nothing), and a last one at
    the end if any was printed and work was done since."""

    INTERVAL = 30.0

    def __init__(self, iterable=None, total=None, desc="", unit="it", unit_scale=False,
                 initial=0, stream=None, interval=None, **_tqdm_only):
        self._iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.n = total, initial
        self._desc, self._unit, self._scale = desc, unit.strip(), unit_scale
        self._line = ProgressLine(stream)
        self._interval = self.INTERVAL if interval is None else interval
        self._start = self._last = time.monotonic()
        self._initial, self._printed_at = initial, None

    def text(self):
        elapsed = time.monotonic() - self._start
        done = self.n - self._initial
        # Scaled amounts carry the unit (12.3MB/1.0GB), counts are followed by it (3/10 shard).
        unit, space = (self._unit, "") if self._scale else ("", f" {self._unit}")
        speed = _amount(done / elapsed, True, decimals=1) if elapsed > 0 else "?"
        rate = f"{speed}{unit or space}/s"
        if self.total is None:
            return f"{self._desc}: {_amount(self.n, self._scale)}{unit}{space}, {rate}"
        percent = 100.0 * self.n / self.total if self.total else 100.0
        return (f"{self._desc}: {_amount(self.n, self._scale)}{unit}/"
                f"{_amount(self.total, self._scale)}{unit}{space} ({percent:.0f}%), {rate}, "
                f"ETA {eta(done, self.total - self._initial if self.total else None, elapsed)}")

    def update(self, n=1):
        self.n += n
        now = time.monotonic()
        if now - self._last >= self._interval:
            self._line.show(self.text())
            self._last, self._printed_at = now, self.n

    def close(self):
        if self._printed_at is not None and self._printed_at != self.n:
            self._line.show(self.text())
            self._printed_at = self.n

    def __iter__(self):
        for item in self._iterable:
            yield item
            self.update(1)
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def bar(iterable=None, enabled=None, stream=None, **kwargs):
    """A progress bar over `iterable` or `total` (tqdm's keyword arguments): tqdm on a
    terminal (or when `enabled` is True), plain lines elsewhere, nothing when `enabled` is
    False."""
    stream = stream or sys.stderr
    if enabled or (enabled is None and _isatty(stream)):
        from tqdm import tqdm
        return tqdm(iterable, file=stream, **kwargs)
    if enabled is False:
        from tqdm import tqdm
        return tqdm(iterable, disable=True, **kwargs)
    return PlainBar(iterable, stream=stream, **kwargs)
