"""Staging folders whose plan lets a rerun keep the parts already finished.

Both sharding (``data_prep.bertprep.sharding``) and formatting as jobs
(``data_prep.bertprep.formatting_jobs``) write their parts into a hidden staging folder
beside a ``plan.json``: what decides the parts' bytes (the inputs with their sizes and
modification times, the options). A rerun that finds the same plan keeps the finished parts
and their counts; another plan starts afresh. These are the pieces they share: the inputs'
fingerprint, and JSON written whole or not at all (``<path>.tmp-<pid>``, fsync, rename) and
read back as None when missing or damaged.
"""
import json
import os
from typing import List, Sequence


def fingerprint(paths: Sequence[str]) -> List[list]:
    """[absolute path, size, mtime in ns] of each input: a changed input changes the plan."""
    found = []
    for path in paths:
        st = os.stat(path)
        found.append([os.path.abspath(path), st.st_size, st.st_mtime_ns])
    return found


def write_json(path: str, value) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str):
    """The JSON value in `path`, or None when it is missing or not JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
