"""``bertPrep.py --action text_formatting`` as jobs on a Dask cluster (``--dask_scheduler``,
``--hosts``: ``data_prep.processes.cluster``), with the bytes of the one-machine run.

Why jobs of whole inputs: every source formats each input on its own (a Wikipedia dump, a
book, a custom file), so one input is one job: ``format_part`` writes its lines into a part
file and the coordinator concatenates the parts in input order. The one exception is a large
custom file with ``--custom_document_unit block``: it is cut into ranges of about
``RANGE_BYTES`` (``BERT_PREP_FORMAT_RANGE_BYTES``, 256 MB) at block starts, so that a 100 GB
file spreads too. A block (a document) belongs to the range holding its first byte; a cut is
put at the first block that starts after a whole blank line at or after the nominal offset
(``next_block_start``), so each range holds whole blocks and formats to exactly the lines the
whole file gives there. ``--custom_document_unit file`` is never cut (a file is a document).
A single Wikipedia dump is one job (wikiextractor reads it as one stream, with
``--n_processes`` extractors on its worker's host); the parts of a multi-part dump spread.

Staging, as sharding's: parts go to ``<formatted dir>/.formatting-<output name>/`` as
``part-N.txt.tmp-<pid>`` renamed ``part-N.txt`` when complete, after their counts
(``part-N.json``: documents, empty dropped, titles). The folder's ``plan.json`` (the inputs
with sizes and mtimes, the options that decide the bytes, the ranges) lets a rerun after a
crash or a lost worker run only the parts that are missing; another plan starts afresh. The
final file is written as ``<output>.tmp-<pid>`` and renamed when whole, then the staging
folder goes.

Errors: a job's ``FormattingError`` comes back from its worker; the coordinator reports the
error of the first failing part in input order (waiting for the parts before it), which is
the error the one-machine run stops at.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from typing import Dict, List, Optional, Sequence, Tuple

from data_prep.bertprep import text_formatting as tf
from data_prep.processes.pause_point import pause_point
from data_prep.processes.staging import fingerprint, keep_finished, write_json

SOURCES = ("wikipedia", "books", "custom")
RANGE_BYTES = int(os.environ.get("BERT_PREP_FORMAT_RANGE_BYTES", str(256 << 20)))
WHOLE_FILE = -1


def staging_dir(output_file: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(output_file)),
                        f".formatting-{os.path.basename(output_file)}")


# --------------------------------------------------------------------------- cutting

def _blank(line: bytes) -> bool:
    """A blank line as ``text_formatting._blocks`` sees it (invalid UTF-8: not blank)."""
    return not line.decode("utf-8", "replace").strip()


def next_block_start(f, position: int, size: int) -> int:
    """The first block start found from `position` of the open binary file `f`: a non-blank
    line after a whole blank line that starts at or after `position` (`size`: none)."""
    f.seek(position - 1)
    pos = position - 1 + len(f.readline())  # the first line start at or after `position`
    after_blank = False
    for line in iter(f.readline, b""):
        if _blank(line):
            after_blank = True
        elif after_blank:
            return pos
        pos += len(line)
    return size


def block_ranges(path: str, range_bytes: int = RANGE_BYTES) -> List[Tuple[int, int]]:
    """[start, end) byte ranges of `path` of whole blocks, cut near every `range_bytes`. Each
    search starts past the previous cut, so the file is read at most once here."""
    size = os.path.getsize(path)
    cuts = [0]
    with open(path, "rb", buffering=1 << 20) as f:
        for nominal in range(range_bytes, size, range_bytes):
            if nominal <= cuts[-1]:
                continue
            cut = next_block_start(f, nominal, size)
            if cut >= size:
                break
            cuts.append(cut)
    return list(zip(cuts, cuts[1:] + [size]))


def plan_parts(source: str, files: Sequence[str], unit: str, range_bytes: int = RANGE_BYTES
               ) -> List[Tuple[str, int, int]]:
    """(file, start, end) of every part, in output order (end WHOLE_FILE: the whole file)."""
    parts = []
    for path in files:
        try:
            if source == "custom" and unit == "block" and os.path.getsize(path) > range_bytes:
                parts.extend((path, start, end) for start, end in block_ranges(path, range_bytes))
            else:
                parts.append((path, 0, WHOLE_FILE))
        except OSError as e:
            raise tf.FormattingError(path, f"cannot read: {e.strerror or e}") from None
    return parts


# --------------------------------------------------------------------------- one job

def format_part(staging: str, name: str, source: str, path: str, start: int, end: int,
                options: dict) -> dict:
    """A job: formats one input (or range) into ``<staging>/<name>.txt``, complete or not at
    all, its counts in ``<name>.json`` (written first); returns the counts."""
    final = os.path.join(staging, f"{name}.txt")
    tmp = f"{final}.tmp-{os.getpid()}"
    stats = tf.FormattingStats(output_file=final)
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n", buffering=1 << 20) as out:
            pause_point("format_part_opened")  # tests: a worker killed with its part half-written
            if source == "wikipedia":
                tf.write_wikipedia_dump(path, out, stats, options["processes"],
                                        options["expand_templates"], scratch_dir=staging)
            elif source == "books":
                tf.write_book(path, out, stats)
            else:
                tf.write_custom(path, out, stats, options["unit"], start,
                                None if end == WHOLE_FILE else end)
        counts = {"documents": stats.documents, "dropped_empty": stats.dropped_empty,
                  "dropped_titles": stats.dropped_titles}
        write_json(os.path.join(staging, f"{name}.json"), counts)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return counts


# --------------------------------------------------------------------------- staging

def _plan(source: str, files: Sequence[str], parts, options: dict) -> dict:
    """What decides the parts' bytes: staged parts are kept only by a run of the same plan."""
    deciding = {k: v for k, v in options.items() if k != "processes"}
    return {"source": source, "options": deciding, "inputs": fingerprint(files),
            "parts": [[os.path.abspath(p), s, e] for p, s, e in parts]}


def _concatenate(folder: str, names: Sequence[str], output_file: str) -> None:
    """The parts in order into `output_file`, which appears only when whole."""
    tmp = f"{output_file}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as out:
            for name in names:
                with open(os.path.join(folder, f"{name}.txt"), "rb") as part:
                    shutil.copyfileobj(part, out, 1 << 22)
        os.replace(tmp, output_file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


# --------------------------------------------------------------------------- coordinator

def _files(source: str, inputs: Sequence[str], unit: str) -> List[str]:
    if source == "wikipedia":
        return list(inputs)
    if source == "books":
        return tf.input_files(inputs, (".txt",))
    tf.check_custom_unit(unit)
    return tf.input_files(inputs)


def _no_documents(source: str, files: Sequence[str], inputs: Sequence[str]):
    if source == "wikipedia":
        return tf.no_articles(files)
    if source == "books":
        return tf.no_book_text(files, inputs)
    return tf.no_custom_text(files, inputs)


def _run_jobs(runner, jobs, labels, done=lambda: None) -> Dict[str, dict]:
    """{part name: counts}; raises the error of the first failing part in input order as
    soon as every part before it is done."""
    order = {job[1]: i for i, job in enumerate(jobs)}
    pending = set(order.values())
    first_error: Optional[Tuple[int, BaseException]] = None
    results: Dict[str, dict] = {}
    label_to_name = dict(zip(labels, (job[1] for job in jobs)))
    with contextlib.closing(iter(runner.run(format_part, jobs, labels))) as finished:
        for label, counts, error in finished:
            name = label_to_name[label]
            pending.discard(order[name])
            if error is not None:
                if first_error is None or order[name] < first_error[0]:
                    first_error = (order[name], error)
            else:
                results[name] = counts
                done()
            if first_error and not any(i < first_error[0] for i in pending):
                raise first_error[1]
    return results


def format_in_jobs(source: str, inputs: Sequence[str], output_file: str, cluster,
                   unit: str = "block", processes: int = 1, expand_templates: bool = True,
                   progress: Optional[bool] = None, log=print) -> tf.FormattingStats:
    """``format_wikipedia`` (inputs: the dumps), ``format_books`` or ``format_custom`` as jobs
    where `cluster` (a ``ClusterOptions``) says; the same bytes and counts."""
    from data_prep.processes.cluster import describe, job_runner
    from reporting.progress import bar
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}")
    files = _files(source, inputs, unit)
    parts = plan_parts(source, files, unit)
    names = [f"part-{i:06d}" for i in range(len(parts))]
    folder = staging_dir(output_file)
    options = {"unit": unit if source == "custom" else "",
               "expand_templates": expand_templates if source == "wikipedia" else None,
               "processes": max(1, processes) if len(files) == 1 else 1}
    try:
        kept = keep_finished(folder, _plan(source, files, parts, options), names,
                             part_entry=lambda name: f"{name}.txt")
    except OSError as e:
        raise tf.FormattingError(folder, f"cannot write: {e.strerror or e}") from None
    if kept:
        log(f"text_formatting: {len(kept)} of {len(parts)} parts kept from an unfinished run "
            f"of the same inputs and options")
    jobs = [(folder, name, source, path, start, end, options)
            for name, (path, start, end) in zip(names, parts) if name not in kept]
    labels = [path if end == WHOLE_FILE else f"{path}@{start}" for _, _, _, path, start, end, _
              in jobs]
    with job_runner(cluster, os.path.dirname(os.path.abspath(output_file))) as runner:
        log(f"text_formatting: {len(jobs)} parts on {describe(cluster, runner)}")
        with bar(total=len(jobs), desc="parts", unit=" part", enabled=progress) as parts_bar:
            kept.update(_run_jobs(runner, jobs, labels, lambda: parts_bar.update(1)))
    stats = tf.FormattingStats(output_file=output_file, input_files=list(files))
    for name in names:
        stats.documents += kept[name]["documents"]
        stats.dropped_empty += kept[name]["dropped_empty"]
        stats.dropped_titles.extend(kept[name]["dropped_titles"])
    del stats.dropped_titles[tf.MAX_REMEMBERED_TITLES:]
    if stats.documents == 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise _no_documents(source, files, inputs)
    _concatenate(folder, names, output_file)
    shutil.rmtree(folder, ignore_errors=True)
    return stats
