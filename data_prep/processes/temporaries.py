"""Temporaries of killed writers: ``<final name>.tmp-<pid>`` files whose pid is not running.

Every writer here puts its output under ``<final>.tmp-<its pid>`` and renames it when
complete, so "exists under the final name" means "done". A killed writer cannot clean up, so
its temporary stays; the next run removes it at start. A live writer's file (its pid still
running) is left alone. The pid is only meaningful on the writer's host: two hosts writing
one shared folder at once must not rely on this cleanup.
"""
import os
from typing import Iterable, Optional

MARKER = ".tmp-"


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (owned by anyone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def writer_pid(name: str) -> Optional[int]:
    """The pid in a temporary's name ``<final>.tmp-<pid>``, or None for another name."""
    suffix = name.rsplit(MARKER, 1)[1] if MARKER in name else ""
    return int(suffix) if suffix.isdigit() else None


def is_temporary(path: str) -> bool:
    """Whether ``path`` names a writer's unfinished output (never an input to read)."""
    return writer_pid(os.path.basename(path)) is not None


def remove_stale_temporaries(folder: str, finals: Optional[Iterable[str]] = None) -> None:
    """Deletes the temporaries in ``folder`` left by a killed process (pid not running).

    ``finals``: only the temporaries of these final file names (base names); default: all.
    """
    if not os.path.isdir(folder):
        return
    wanted = None if finals is None else {os.path.basename(f) for f in finals}
    for name in os.listdir(folder):
        pid = writer_pid(name)
        if pid is None or (wanted is not None and name.rsplit(MARKER, 1)[0] not in wanted):
            continue
        if not pid_alive(pid):
            try:
                os.remove(os.path.join(folder, name))
            except OSError:
                pass
