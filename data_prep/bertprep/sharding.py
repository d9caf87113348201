"""Formatted corpora (one document per line) to training/test shards of one sentence per line.

The shards are the input of ``create_pretraining_data``: one sentence per line and a blank line
after every document.  Why shard at all: pre-training data generation holds a whole input in
memory and shuffles within it, so a corpus of tens of GB must be cut into pieces that are
processed independently (and in parallel); the pieces should be of similar size so that the
workers finish together, and a document must never be cut in two (next-sentence prediction
draws its positive pairs from inside a document).

How, with memory bounded by a document rather than by the corpus:

1. ``index_documents``: one streaming pass over the input files records, for every non-blank
   line, its file, byte offset and byte length (three integers per document).
2. ``assign_shards``: a seeded permutation picks the test documents (``round(fraction_test_set
   * documents)`` of them, by count); each group is then balanced by size with the
   longest-processing-time rule: documents from the largest down (ties by position) each go to
   the shard with the fewest bytes so far (ties to the lowest shard number).  Deterministic for
   a given seed and input.
3. ``write_shard``: each shard is written on its own (in parallel with ``n_processes``):
   its documents are read back by offset in file order, split into sentences
   (``data_prep.bertprep.sentence_segmentation``) and written to ``<name>.tmp-<pid>``; when every
   shard is complete all are renamed to their final names (a failed run leaves none).

Shard names: ``<prefix>_training_<i>.txt`` and ``<prefix>_test_<i>.txt``, ``i`` from 0.
Errors raise ``ShardingError`` (a ``DataPrepError``): one line ``<file>: <problem>``.
"""
from __future__ import annotations

import array
import contextlib
import dataclasses
import heapq
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from data_prep.bertprep import sentence_segmentation
from data_prep.errors import DataPrepError
from data_prep.processes.worker_lifetime import die_with_parent, pool_context


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


def index_documents(input_files: Sequence[str], progress: Optional[bool] = False) -> DocumentIndex:
    """One streaming pass: the byte span of every non-blank line of every file."""
    from reporting.progress import bar
    file_index, offsets, lengths = array.array("i"), array.array("q"), array.array("q")
    total = 0
    for path in input_files:
        try:
            total += os.path.getsize(path)
        except OSError as e:
            raise ShardingError(path, f"cannot read: {e.strerror or e}") from None
    with bar(total=total, desc="indexing", unit="B", unit_scale=True,
             enabled=progress) as indexing:
        for i, path in enumerate(input_files):
            pos = 0
            try:
                with open(path, "rb", buffering=1 << 20) as f:
                    for line in f:
                        n = len(line)
                        body = line.rstrip(b"\r\n")
                        if body.strip():
                            file_index.append(i)
                            offsets.append(pos)
                            lengths.append(len(body))
                        pos += n
                        indexing.update(n)
            except OSError as e:
                raise ShardingError(path, f"cannot read: {e.strerror or e}") from None
    return DocumentIndex(list(input_files), np.frombuffer(file_index, dtype=np.int32).copy(),
                         np.frombuffer(offsets, dtype=np.int64).copy(),
                         np.frombuffer(lengths, dtype=np.int64).copy())


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


def _write_shard_job(job):
    return write_shard(*job)


def shard_paths(output_dir: str, prefix: str, n_training: int, n_test: int
                ) -> Tuple[List[str], List[str]]:
    train = [os.path.join(output_dir, f"{prefix}_training_{i}.txt") for i in range(n_training)]
    test = [os.path.join(output_dir, f"{prefix}_test_{i}.txt") for i in range(n_test)]
    return train, test


def shard_corpus(input_files: Sequence[str], output_dir: str, prefix: str,
                 options: ShardingOptions = ShardingOptions(),
                 progress: Optional[bool] = None, log=print) -> ShardingStats:
    """Indexes, assigns and writes all shards of ``input_files`` into ``output_dir``."""
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
    stats = ShardingStats()
    t0 = time.perf_counter()
    index = index_documents(input_files, progress)
    stats.documents = len(index)
    stats.input_bytes = int(index.length.sum())
    t1 = time.perf_counter()
    source = input_files[0] if len(input_files) == 1 else ",".join(input_files)
    if len(index) == 0:
        raise ShardingError(source, "no documents (only blank lines)")
    train, test = assign_shards(index.length, options.n_training_shards, options.n_test_shards,
                                options.fraction_test_set, options.seed, source)
    stats.training_documents = int(sum(len(s) for s in train))
    stats.test_documents = int(sum(len(s) for s in test))
    train_paths, test_paths = shard_paths(output_dir, prefix, len(train), len(test))
    # Every shard is written under a temporary name and all are renamed together at the end:
    # the folder never holds an incomplete set of shards under final names.
    final_paths = train_paths + test_paths
    tmp_paths = [f"{path}.tmp-{os.getpid()}" for path in final_paths]
    jobs = [(tmp, index.files, index.file_index[ids], index.offset[ids], index.length[ids],
             options.sentence_splitter)
            for tmp, ids in zip(tmp_paths, train + test)]
    _splitter(options.sentence_splitter)  # fail early (and once) on an unusable splitter
    t2 = time.perf_counter()
    results = {}
    shards = bar(total=len(jobs), desc="shards", unit=" shard", enabled=progress)
    try:
        with shards:
            if options.n_processes <= 1 or len(jobs) == 1:
                for job in jobs:
                    res = write_shard(*job)
                    results[res[0]] = res
                    shards.update(1)
            else:
                with pool_context().Pool(min(options.n_processes, len(jobs)),
                                          initializer=die_with_parent,
                                          initargs=(os.getpid(),)) as pool:
                    for res in pool.imap_unordered(_write_shard_job, jobs):
                        results[res[0]] = res
                        shards.update(1)
        for tmp, path in zip(tmp_paths, final_paths):
            os.replace(tmp, path)
    except BaseException:
        for tmp in tmp_paths:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        raise
    results = {path: results[tmp] for tmp, path in zip(tmp_paths, final_paths)}
    for path in train_paths + test_paths:
        _, nbytes, ndocs, nsents = results[path]
        stats.shard_files.append(path)
        stats.shard_bytes.append(nbytes)
        stats.shard_documents.append(ndocs)
        stats.shard_sentences.append(nsents)
    stats.seconds.update(index=t1 - t0, assign=t2 - t1, write=time.perf_counter() - t2)
    log(f"sharding: {stats.documents} documents ({stats.input_bytes / 1e6:.1f} MB) -> "
        f"{len(train_paths)} training shards ({stats.training_documents} documents), "
        f"{len(test_paths)} test shards ({stats.test_documents} documents) in {output_dir}")
    return stats
