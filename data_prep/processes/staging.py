"""Staging folders whose plan lets a rerun keep the parts already finished.

Both sharding (``data_prep.bertprep.sharding``) and formatting as jobs
(``data_prep.bertprep.formatting_jobs``) write their parts into a hidden staging folder
beside a ``plan.json``: what decides the parts' bytes (the inputs with their sizes and
modification times, the options). A rerun that finds the same plan keeps the finished parts
and their counts; another plan starts afresh. These are the pieces they share: the inputs'
fingerprint, JSON written whole or not at all (``<path>.tmp-<pid>``, fsync, rename) and read
back as None when missing or damaged, and the rule of what a rerun keeps (``keep_finished``).
"""
import contextlib
import json
import os
import shutil
from typing import Callable, Dict, Iterable, List, Sequence

PLAN = "plan.json"


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


def keep_finished(folder: str, plan: dict, names: Sequence[str],
                  part_entry: Callable[[str], str],
                  done_elsewhere: Callable[[str], bool] = lambda name: False,
                  also_keep: Iterable[str] = ()) -> Dict[str, object]:
    """Makes the staging `folder` hold only the finished parts of `plan`, then writes the
    plan; returns {name: its counts} of the parts kept.

    With the same plan in the folder, part `name` is finished when its counts
    (``<name>.json``, written by its job before the part took its name) read back and its
    file, the entry ``part_entry(name)``, is there (or ``done_elsewhere(name)``: sharding's
    shards already moved out by a run that crashed while moving them); `also_keep` entries
    stay too. Everything else in the folder (another plan's parts, a lost job's temporary)
    is removed."""
    kept: Dict[str, object] = {}
    if os.path.isdir(folder):
        same = read_json(os.path.join(folder, PLAN)) == plan
        for name in names if same else ():
            counts = read_json(os.path.join(folder, f"{name}.json"))
            if counts is not None and (os.path.isfile(os.path.join(folder, part_entry(name)))
                                       or done_elsewhere(name)):
                kept[name] = counts
        keep = {PLAN} | (set(also_keep) if same else set()) \
            | {part_entry(name) for name in kept} | {f"{name}.json" for name in kept}
        for entry in os.listdir(folder):
            if entry not in keep:
                path = os.path.join(folder, entry)
                with contextlib.suppress(OSError):
                    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    os.makedirs(folder, exist_ok=True)
    write_json(os.path.join(folder, PLAN), plan)
    return kept
