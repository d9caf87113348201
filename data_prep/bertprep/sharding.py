"""Formatted corpora (one document per line) to training/test shards of one sentence per line.

The shards are the input of ``create_pretraining_data``: one sentence per line and a blank line
after every document.  Why shard at all: pre-training data generation holds a whole input in
memory and shuffles within it, so a corpus of tens of GB must be cut into pieces that are
processed independently (and in parallel); the pieces should be of similar size so that the
workers finish together, and a document must never be cut in two (next-sentence prediction
draws its positive pairs from inside a document).

How, with memory bounded by a document rather than by the corpus:

1. Indexing: one streaming pass over the input files records, for every non-blank line, its
   file, byte offset and byte length (20 bytes per document in the coordinating process: the
   one bound that grows with the corpus, 2 GB for 100 million documents).  The pass is cut
   into jobs of 256 MB byte ranges (``index_range``: a line belongs to the range holding its
   first byte), run where ``cluster`` says.
2. ``assign_shards``: a seeded permutation picks the test documents (``round(fraction_test_set
   * documents)`` of them, by count); each group is then balanced by size with the
   longest-processing-time rule: documents from the largest down (ties by position) each go to
   the shard with the fewest bytes so far (ties to the lowest shard number).  Deterministic for
   a given seed and input.
3. ``write_staged_shard``: each shard is a job (run where ``cluster`` says: this machine's
   processes or a Dask cluster, ``data_prep.processes.cluster``): its documents are read back by
   offset in file order, split into sentences (``data_prep.bertprep.sentence_segmentation``)
   and written into the staging folder ``<output>/.sharding-in-progress/`` (``<name>.tmp-<pid>``,
   renamed there when complete; a worker's memory is bounded by its largest document).  When
   every shard is written all move to their final names, and the staging folder's plan
   (inputs, sizes, options) goes last: a folder never holds an incomplete set of shards
   under final names without the plan saying so (``unfinished``), and a rerun of the same plan
   after a crash or a lost worker writes only the shards that are missing.  The plan of a
   finished run stays beside its shards (``.sharding-plan.json``): a rerun of the same inputs
   and flags has nothing to do.

The shards are the same bytes for any number of processes, workers or hosts.

Shard names: ``<prefix>_training_<i>.txt`` and ``<prefix>_test_<i>.txt``, ``i`` from 0.
Errors raise ``ShardingError`` (a ``DataPrepError``): one line ``<file>: <problem>``.
"""
from __future__ import annotations

import array
import contextlib
import dataclasses
import heapq
import os
import shutil
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from data_prep.bertprep import sentence_segmentation
from data_prep.errors import DataPrepError
from data_prep.processes.pause_point import pause_point
from data_prep.processes.staging import PLAN, fingerprint, keep_finished, read_json, write_json


class ShardingError(DataPrepError):
    """Unusable input, options or output; ``str()`` is ``<file>: <problem>``."""


@dataclasses.dataclass(frozen=True)
class ShardingOptions:
    n_training_shards: int = 256
    n_test_shards: int = 256
    fraction_test_set: float = 0.1
    seed: int = 12345
    sentence_splitter: str = "auto"
    n_processes: int = 1


@dataclasses.dataclass
class DocumentIndex:
    """Where every document (non-blank line) of the input files is: file, byte offset, length."""
    files: List[str]
    file_index: np.ndarray  # int32
    offset: np.ndarray      # int64
    length: np.ndarray      # int64 (bytes, without the newline)

    def __len__(self) -> int:
        return len(self.offset)


@dataclasses.dataclass
class ShardingStats:
    documents: int = 0
    training_documents: int = 0
    test_documents: int = 0
    input_bytes: int = 0
    shard_files: List[str] = dataclasses.field(default_factory=list)
    shard_bytes: List[int] = dataclasses.field(default_factory=list)
    shard_documents: List[int] = dataclasses.field(default_factory=list)
    shard_sentences: List[int] = dataclasses.field(default_factory=list)
    seconds: Dict[str, float] = dataclasses.field(default_factory=dict)


INDEX_RANGE_BYTES = 256 << 20  # one indexing job: lines starting in 256 MB of one file


def index_ranges(input_files: Sequence[str], range_bytes: int = INDEX_RANGE_BYTES
                 ) -> List[Tuple[int, str, int, int]]:
    """The indexing jobs: (file number, path, start, end) byte ranges covering every file."""
    jobs = []
    for i, path in enumerate(input_files):
        try:
            size = os.path.getsize(path)
        except OSError as e:
            raise ShardingError(path, f"cannot read: {e.strerror or e}") from None
        for start in range(0, max(size, 1), range_bytes):
            jobs.append((i, path, start, min(size, start + range_bytes)))
    return jobs


def index_range(file_number: int, path: str, start: int, end: int
                ) -> Tuple[int, int, np.ndarray, np.ndarray]:
    """The byte span of every non-blank line that starts in [start, end) of `path`:
    (file number, start, offsets, lengths). A line belongs to the range holding its first
    byte, so the ranges of a file together index each line exactly once."""
    offsets, lengths = array.array("q"), array.array("q")
    try:
        with open(path, "rb", buffering=1 << 20) as f:
            pos = start
            if start > 0:  # skip the end of a line that started in the previous range
                f.seek(start - 1)
                pos = start - 1 + len(f.readline())
            while pos < end:
                line = f.readline()
                if not line:
                    break
                body = line.rstrip(b"\r\n")
                if body.strip():
                    offsets.append(pos)
                    lengths.append(len(body))
                pos += len(line)
    except OSError as e:
        raise ShardingError(path, f"cannot read: {e.strerror or e}") from None
    return (file_number, start, np.frombuffer(offsets, dtype=np.int64).copy(),
            np.frombuffer(lengths, dtype=np.int64).copy())


def merge_index(input_files: Sequence[str], pieces) -> DocumentIndex:
    """The index of `input_files` from the results of `index_range` (any order)."""
    pieces = sorted(pieces, key=lambda piece: (piece[0], piece[1]))
    empty = np.zeros(0, dtype=np.int64)
    return DocumentIndex(
        list(input_files),
        np.concatenate([np.full(len(p[2]), p[0], dtype=np.int32) for p in pieces]
                       or [np.zeros(0, dtype=np.int32)]),
        np.concatenate([p[2] for p in pieces] or [empty]),
        np.concatenate([p[3] for p in pieces] or [empty]))


def index_documents(input_files: Sequence[str], progress: Optional[bool] = False) -> DocumentIndex:
    """The byte span of every non-blank line of every file, in this process."""
    from reporting.progress import bar
    jobs = index_ranges(input_files)
    with bar(total=len(jobs), desc="indexing", unit=" part", enabled=progress) as indexing:
        pieces = []
        for job in jobs:
            pieces.append(index_range(*job))
            indexing.update(1)
    return merge_index(input_files, pieces)


def balance(sizes: np.ndarray, members: np.ndarray, n_shards: int) -> List[np.ndarray]:
    """Longest-processing-time greedy: ``members`` (document ids) into ``n_shards`` lists.

    Every shard gets at least one document when there are enough (the first ``n_shards``
    documents placed go to distinct, empty shards).  Each list is sorted (file order).
    """
    order = members[np.lexsort((members, -sizes[members]))]
    heap = [(0, s) for s in range(n_shards)]
    assigned: List[List[int]] = [[] for _ in range(n_shards)]
    for doc, size in zip(order.tolist(), sizes[order].tolist()):
        load, shard = heapq.heappop(heap)
        assigned[shard].append(doc)
        heapq.heappush(heap, (load + size, shard))
    return [np.sort(np.asarray(a, dtype=np.int64)) for a in assigned]


def assign_shards(sizes: np.ndarray, n_training_shards: int, n_test_shards: int,
                  fraction_test_set: float, seed: int, source: str = "input"
                  ) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    """Document ids of every training shard and every test shard (see the module docstring)."""
    n = len(sizes)
    if n_training_shards < 1:
        raise ShardingError("--n_training_shards", f"must be at least 1, got {n_training_shards}")
    if n_test_shards < 0:
        raise ShardingError("--n_test_shards", f"must be at least 0, got {n_test_shards}")
    if not 0.0 <= fraction_test_set < 1.0:
        raise ShardingError("--fraction_test_set", f"must be in [0, 1), got {fraction_test_set}")
    n_test = int(round(fraction_test_set * n)) if n_test_shards else 0
    if n_test_shards and n_test < n_test_shards:
        raise ShardingError(source, f"{n} documents with --fraction_test_set={fraction_test_set} "
                                    f"give {n_test} test documents, fewer than "
                                    f"--n_test_shards={n_test_shards}")
    if n - n_test < n_training_shards:
        raise ShardingError(source, f"{n - n_test} training documents are fewer than "
                                    f"--n_training_shards={n_training_shards}")
    perm = np.random.default_rng(seed).permutation(n)
    test_ids, train_ids = perm[:n_test], perm[n_test:]
    return balance(sizes, train_ids, n_training_shards), balance(sizes, test_ids, n_test_shards)


# --------------------------------------------------------------------------- writing

_SPLITTERS: Dict[str, object] = {}


def _splitter(name: str):
    if name not in _SPLITTERS:  # built once per process (blingfire loads a native library)
        try:
            _SPLITTERS[name] = sentence_segmentation.get_splitter(name)
        except ValueError as e:
            raise ShardingError("--sentence_splitter", str(e)) from None
    return _SPLITTERS[name]


def write_shard(output_file: str, files: Sequence[str], file_index: np.ndarray,
                offset: np.ndarray, length: np.ndarray, splitter: str = "auto"
                ) -> Tuple[str, int, int, int]:
    """Writes one shard to ``output_file`` (the caller renames it); returns (output_file,
    bytes, documents, sentences)."""
    split = _splitter(splitter)
    handles: Dict[int, object] = {}
    sentences = 0
    try:
        out = open(output_file, "w", encoding="utf-8", newline="\n", buffering=1 << 20)
    except OSError as e:
        raise ShardingError(output_file, f"cannot write shard: {e.strerror or e}") from None
    pause_point("shard_opened")  # tests: a worker killed with its shard half-written
    with out, contextlib.ExitStack() as stack:
        for fi, off, ln in zip(file_index.tolist(), offset.tolist(), length.tolist()):
            if fi not in handles:
                try:
                    handles[fi] = stack.enter_context(open(files[fi], "rb"))
                except OSError as e:
                    raise ShardingError(files[fi], f"cannot read: {e.strerror or e}") from None
            f = handles[fi]
            f.seek(off)
            raw = f.read(ln)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ShardingError(files[fi], f"invalid UTF-8 at byte offset {off + e.start} "
                                               f"(byte 0x{raw[e.start]:02x})") from None
            sents = split(text)
            if not sents:
                continue
            sentences += len(sents)
            out.write("\n".join(sents))
            out.write("\n\n")
    return output_file, os.path.getsize(output_file), len(offset), sentences


def write_staged_shard(staging_dir: str, name: str, files: Sequence[str],
                       file_index: np.ndarray, offset: np.ndarray, length: np.ndarray,
                       splitter: str = "auto") -> Tuple[str, int, int, int]:
    """A sharding job: writes shard `name` into the staging folder, complete or not at all
    (``<name>.tmp-<pid>``, renamed when written, after its counts in ``<name>.json``, which a
    rerun keeping the shard reports without reading it); returns write_shard's tuple for
    `name`."""
    final = os.path.join(staging_dir, name)
    tmp = f"{final}.tmp-{os.getpid()}"
    try:
        _, nbytes, documents, sentences = write_shard(tmp, files, file_index, offset, length,
                                                      splitter)
        write_json(f"{final}.json", [nbytes, documents, sentences])
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return name, nbytes, documents, sentences


def shard_paths(output_dir: str, prefix: str, n_training: int, n_test: int
                ) -> Tuple[List[str], List[str]]:
    train = [os.path.join(output_dir, f"{prefix}_training_{i}.txt") for i in range(n_training)]
    test = [os.path.join(output_dir, f"{prefix}_test_{i}.txt") for i in range(n_test)]
    return train, test


STAGING = ".sharding-in-progress"   # under the output folder; hidden from list_shards
MOVING = "moving"                   # written before the first shard moves to its final name
DONE = ".sharding-plan.json"        # the plan of the complete shards in the output folder


def staging_dir(output_dir: str) -> str:
    return os.path.join(output_dir, STAGING)


def unfinished(output_dir: str) -> bool:
    """Whether a sharding into `output_dir` started and did not finish (its shards are not
    a whole set, whatever the folder holds under final names)."""
    return os.path.isfile(os.path.join(staging_dir(output_dir), PLAN))


def _plan(input_files: Sequence[str], prefix: str, options: ShardingOptions) -> dict:
    """What decides the shards' bytes: a staged shard is kept only by a run of the same plan."""
    return {"inputs": fingerprint(input_files), "prefix": prefix,
            "n_training_shards": options.n_training_shards,
            "n_test_shards": options.n_test_shards,
            "fraction_test_set": options.fraction_test_set, "seed": options.seed,
            "sentence_splitter": options.sentence_splitter}


def _prepare_staging(folder: str, output_dir: str, plan: dict, names: Sequence[str], log
                     ) -> Dict[str, Tuple[str, int, int, int]]:
    """Makes the staging folder hold only shards of `plan`; returns write_shard's tuple of
    each shard already done (staged, or moved to its final name by a run that crashed while
    moving), from the counts its job wrote."""
    moving = os.path.exists(os.path.join(folder, MOVING))  # counts only with the same plan
    counts = keep_finished(
        folder, plan, names, part_entry=lambda name: name,
        done_elsewhere=lambda name: moving and os.path.isfile(os.path.join(output_dir, name)),
        also_keep=[MOVING])
    if counts:
        log(f"sharding: {len(counts)} of {len(names)} shards kept from an unfinished run "
            f"of the same inputs and options")
    return {name: (name, *values) for name, values in counts.items()}


def _complete(output_dir: str, plan: dict, prefix: str, options: ShardingOptions) -> bool:
    """Whether the output folder holds every shard of `plan` (a finished run of the same
    inputs and flags): a rerun then has nothing to do."""
    if read_json(os.path.join(output_dir, DONE)) != plan:
        return False
    train, test = shard_paths(output_dir, prefix, options.n_training_shards,
                              options.n_test_shards)
    return not unfinished(output_dir) and all(os.path.isfile(p) for p in train + test)


def _publish(folder: str, output_dir: str, names: Sequence[str]) -> None:
    """Moves every staged shard to its final name, then the plan beside them (last: while it
    is staged, ``unfinished`` says so and a rerun completes the move)."""
    with open(os.path.join(folder, MOVING), "w", encoding="ascii") as f:
        os.fsync(f.fileno())
    for name in names:
        staged = os.path.join(folder, name)
        if os.path.exists(staged):
            os.replace(staged, os.path.join(output_dir, name))
    os.replace(os.path.join(folder, PLAN), os.path.join(output_dir, DONE))
    # The rest: the counts, the moving mark, a lost worker's half-written shard.
    shutil.rmtree(folder, ignore_errors=True)


def shard_corpus(input_files: Sequence[str], output_dir: str, prefix: str,
                 options: ShardingOptions = ShardingOptions(),
                 progress: Optional[bool] = None, log=print, cluster=None) -> ShardingStats:
    """Indexes, assigns and writes all shards of ``input_files`` into ``output_dir``.

    ``cluster``: a ``data_prep.processes.cluster.ClusterOptions`` saying where the indexing
    and writing jobs run (default: ``options.n_processes`` processes here). The shards are the
    same bytes wherever they are written. Shards are written into ``<output_dir>/`` +
    ``STAGING`` and moved to their final names when all are written; a rerun with the same
    inputs and options after a crash writes only the shards that are missing."""
    from data_prep.processes.cluster import ClusterOptions, describe, job_runner
    from reporting.progress import bar
    if not input_files:
        raise ShardingError("--input", "no formatted input files")
    for path in input_files:
        if not os.path.isfile(path):
            raise ShardingError(path, "formatted input not found (run --action text_formatting)")
        if os.path.getsize(path) == 0:
            raise ShardingError(path, "empty file")
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise ShardingError(output_dir, f"cannot create output folder: {e.strerror or e}") \
            from None
    _splitter(options.sentence_splitter)  # fail early (and once) on an unusable splitter
    stats = ShardingStats()
    plan = _plan(input_files, prefix, options)
    if _complete(output_dir, plan, prefix, options):
        train_paths, test_paths = shard_paths(output_dir, prefix, options.n_training_shards,
                                              options.n_test_shards)
        stats.shard_files = train_paths + test_paths
        stats.shard_bytes = [os.path.getsize(path) for path in stats.shard_files]
        log(f"sharding: all {len(stats.shard_files)} shards of these inputs and flags are "
            f"complete in {output_dir}: nothing to do")
        return stats
    cluster = cluster or ClusterOptions(n_processes=options.n_processes)
    with job_runner(cluster, output_dir) as runner:
        t0 = time.perf_counter()
        jobs = index_ranges(input_files)
        pieces = []
        with bar(total=len(jobs), desc="indexing", unit=" part", enabled=progress) as indexing:
            for name, piece, error in runner.run(index_range, jobs,
                                                 [f"{j[1]}@{j[2]}" for j in jobs]):
                if error is not None:
                    raise error
                pieces.append(piece)
                indexing.update(1)
        index = merge_index(input_files, pieces)
        del pieces
        stats.documents = len(index)
        stats.input_bytes = int(index.length.sum())
        t1 = time.perf_counter()
        source = input_files[0] if len(input_files) == 1 else ",".join(input_files)
        if len(index) == 0:
            raise ShardingError(source, "no documents (only blank lines)")
        train, test = assign_shards(index.length, options.n_training_shards,
                                    options.n_test_shards, options.fraction_test_set,
                                    options.seed, source)
        stats.training_documents = int(sum(len(s) for s in train))
        stats.test_documents = int(sum(len(s) for s in test))
        train_paths, test_paths = shard_paths(output_dir, prefix, len(train), len(test))
        final_paths = train_paths + test_paths
        names = [os.path.basename(path) for path in final_paths]
        folder = staging_dir(output_dir)
        results = _prepare_staging(folder, output_dir, plan, names, log)
        t2 = time.perf_counter()
        jobs = [(folder, name, index.files, index.file_index[ids], index.offset[ids],
                 index.length[ids], options.sentence_splitter)
                for name, ids in zip(names, train + test) if name not in results]
        log(f"sharding: writing {len(jobs)} shards on {describe(cluster, runner)}")
        with bar(total=len(jobs), desc="shards", unit=" shard", enabled=progress) as shards:
            for name, result, error in runner.run(write_staged_shard, jobs,
                                                  [job[1] for job in jobs]):
                if error is not None:
                    raise error
                results[name] = result
                shards.update(1)
    _publish(folder, output_dir, names)
    for name in names:
        _, nbytes, ndocs, nsents = results[name]
        stats.shard_files.append(os.path.join(output_dir, name))
        stats.shard_bytes.append(nbytes)
        stats.shard_documents.append(ndocs)
        stats.shard_sentences.append(nsents)
    stats.seconds.update(index=t1 - t0, assign=t2 - t1, write=time.perf_counter() - t2)
    log(f"sharding: {stats.documents} documents ({stats.input_bytes / 1e6:.1f} MB) -> "
        f"{len(train_paths)} training shards ({stats.training_documents} documents), "
        f"{len(test_paths)} test shards ({stats.test_documents} documents) in {output_dir}")
    return stats
