"""How much memory this process can have: the machine's RAM, or less where a container or a
Slurm job's cgroup limits it.

A model too large for the machine used to be found out by allocating it: a config with
`vocab_size` 10**9 ran 37 s and took 4.5 GB before a traceback (or the OOM killer, which
says nothing). The jobs compare what a model needs (`modeling.config`) with this figure
before building anything (`training.model_memory`). The total, not what is free now: the
question is whether the machine can hold the model at all; what other processes hold today
may be gone tomorrow.
"""
import os
from typing import Optional

# cgroup v2 (the process's own group), then v1; "max" or a huge number means no limit
CGROUP_LIMIT_FILES = ("/sys/fs/cgroup/memory.max",
                      "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def physical_memory_bytes() -> Optional[int]:
    """The machine's RAM, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def cgroup_limit_bytes(limit_files=CGROUP_LIMIT_FILES) -> Optional[int]:
    """The memory limit of this process's cgroup (a container, a Slurm job), or None."""
    for path in limit_files:
        try:
            with open(path, "r", encoding="ascii") as reader:
                text = reader.read().strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit() and int(text) < 2**60:  # v1 writes ~2**63 for "no limit"
            return int(text)
    return None


def usable_memory_bytes(physical=None, limit=None) -> Optional[int]:
    """RAM this process may use: the smaller of the machine's and its cgroup's limit (either
    may be passed, for tests), or None when neither is known."""
    physical = physical_memory_bytes() if physical is None else physical
    limit = cgroup_limit_bytes() if limit is None else limit
    known = [value for value in (physical, limit) if value]
    return min(known) if known else None
