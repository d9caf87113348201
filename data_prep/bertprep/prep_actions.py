"""The actions of ``bertPrep.py``: each reads what the previous one wrote, found by name in
the working-dir layout of ``data_prep.bertprep.prep_layout`` (under ``--working_dir``).

Downloads keep their file name (the URL's, with ``--url``); archives are unpacked next to
themselves, once (a ``.<archive>.extracted`` marker records it).  ``books_wiki_en_corpus`` is
formatted as its two parts (``wikicorpus_en.txt`` and ``bookscorpus.txt``) and sharded as
their union, as in NVIDIA's recipe; any ``a+b+...`` of corpora
(``wikicorpus_en+bookscorpus+custom``) is formatted as its parts and sharded as their union
the same way (``corpus_parts``).  ``custom`` takes its text from ``--input``.

Every file appears under its final name only when complete (temporary name, then rename; the
shards of one ``sharding`` run are renamed together), so "exists" means "done": ``download``
and ``create_tfrecord_files`` skip what exists, and a rerun after an interruption redoes only
the unfinished part.  Temporaries of killed runs (``*.tmp-<pid>`` of a dead pid) are deleted
(``data_prep.processes.temporaries``), and pool workers die with ``bertPrep.py`` however it is
killed (``data_prep.processes.worker_lifetime``), as do wikiextractor and the processes it forks
(``data_prep.processes.tethered_child``).

``create_tfrecord_files`` runs ``data_prep.instances.pretraining_data.create_pretraining_tfrecords``
once per shard (in ``--n_processes`` worker processes), each shard seeded with
``derive_shard_seed(random_seed, shard file name)``: the records do not depend on the number
of processes nor on which shards were already done.  A failing shard does not stop the others;
all failures are reported at the end and the exit status is non-zero.

Errors are ``DataPrepError``; ``run_cli`` prints them as one line ``error: <file>: <problem>``.
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
from typing import Callable, List, Optional, Tuple

from data_prep.bertprep.prep_layout import SPLITS, Layout, PrepOptions, resolve_working_dir
from data_prep.errors import DataPrepError
from data_prep.processes.temporaries import remove_stale_temporaries
from reporting.progress import eta

ACTIONS = ("download", "text_formatting", "sharding", "create_tfrecord_files", "create_vocab")
CORPORA = ("wikicorpus_en", "wikicorpus_zh", "bookscorpus", "books_wiki_en_corpus", "custom")


def _download_datasets() -> Tuple[str, ...]:
    from data_prep.bertprep.download import DATASETS
    return tuple(DATASETS)


def all_datasets() -> Tuple[str, ...]:
    return tuple(dict.fromkeys(CORPORA + _download_datasets()))


# NVIDIA's bertPrep.py knows these too: PubMed (its own downloader and formatter, not ported
# here: format PubMed text yourself and use --dataset custom) and `all` (every download).
PUBMED = ("pubmed_baseline", "pubmed_daily_update", "pubmed_fulltext", "pubmed_open_access")
ALL = "all"


def canonical_dataset(name: str) -> str:
    """The dataset `name` means, in this project's spelling: names match without regard to
    case, as NVIDIA's scripts spell GLUE tasks in lower case (`mrpc` -> `MRPC`, `sst-2` ->
    `SST-2`); a union is matched part by part. An unknown name is returned as it is."""
    known = {dataset.lower(): dataset for dataset in all_datasets() + PUBMED + (ALL,)}
    parts = [known.get(part.strip().lower(), part.strip()) for part in name.split(UNION_SEPARATOR)]
    return UNION_SEPARATOR.join(parts)


def _say(message: str) -> None:
    print(message, flush=True)


# --------------------------------------------------------------------------- download

def action_download(o: PrepOptions, layout: Layout) -> int:
    from data_prep.bertprep import download, mrpc_format
    from data_prep.bertprep.archives import is_archive
    from data_prep.bertprep.fetcher import basename_of
    if o.dataset == "custom":
        raise DataPrepError("--dataset", "custom text is not downloaded: pass it with --input "
                                         "to --action text_formatting")
    parts = _parts(o.dataset)
    if len(parts) > 1:
        fetched = [part for part in parts if part != "custom"]
        raise DataPrepError("--dataset", f"a union is downloaded part by part: "
                                         f"{', '.join(fetched) or 'none of its parts'}"
                                         f"{' (bookscorpus needs --url)' if 'bookscorpus' in parts else ''}"
                                         f"{'; custom text is not downloaded' if 'custom' in parts else ''}")
    resources = list(download.DATASETS[o.dataset])
    if o.url:
        if len(resources) > 1:
            raise DataPrepError("--url", f"{o.dataset} has {len(resources)} files; --url "
                                         f"replaces the URL of single-file datasets only")
        name = basename_of(o.url)
        folder = os.path.relpath(layout.download_dir(o.dataset),
                                 os.path.join(layout.root, "download"))
        resources = [download.Resource(o.url, os.path.join(folder, name), o.sha256,
                                       extract=is_archive(name))]
    elif not resources:
        raise DataPrepError("--url", f"{o.dataset} has no official download (BookCorpus is no "
                                     f"longer distributed by its authors): pass --url with an "
                                     f"http(s) URL or a local path of your copy (a folder of "
                                     f".txt books, a .zip/.tar.gz of them, or one .txt file)")
    else:
        resources = [dataclasses.replace(r, url=download.mirrored(r.url)) for r in resources]
        if o.sha256:
            if len(resources) > 1:
                raise DataPrepError("--sha256", f"{o.dataset} has {len(resources)} files; "
                                                f"--sha256 applies to single-file datasets")
            resources = [dataclasses.replace(resources[0], sha256=o.sha256)]
    download.download_resources(resources, os.path.join(layout.root, "download"),
                                retries=o.download_retries, progress=o.progress, log=_say)
    if o.dataset == "MRPC":
        written = mrpc_format.format_mrpc(layout.download_dir("MRPC"))
        _say(f"MRPC: wrote {', '.join(os.path.basename(p) for p in written)}")
    return 0


# --------------------------------------------------------------------------- text_formatting

def _wiki_dumps(o: PrepOptions, layout: Layout, dataset: str) -> List[str]:
    from data_prep.bertprep.text_formatting import list_input_files
    if o.input:
        return [f for path in o.input for f in list_input_files(path)]
    folder = layout.download_dir(dataset)
    if not os.path.isdir(folder):
        raise DataPrepError(folder, "no download (run --action download, or pass --input)")
    return list_input_files(folder)  # every dump downloaded there (multi-part dumps too)


def _formatting_source(o: PrepOptions, layout: Layout, dataset: str) -> Tuple[str, List[str]]:
    """(source, inputs) of a corpus: ("wikipedia", its dumps), ("books" or "custom", the
    files and folders given or downloaded)."""
    if dataset in ("wikicorpus_en", "wikicorpus_zh"):
        return "wikipedia", _wiki_dumps(o, layout, dataset)
    if dataset == "bookscorpus":
        inputs = list(o.input) or [layout.download_dir(dataset)]
        if not o.input and not os.path.isdir(inputs[0]):
            raise DataPrepError(inputs[0], "no download (run --action download --url ..., "
                                           "or pass --input)")
        return "books", inputs
    if not o.input:
        raise DataPrepError("--input", "--dataset custom needs --input (a file or folder)")
    return "custom", list(o.input)


def _format_one(o: PrepOptions, layout: Layout, dataset: str) -> None:
    """One corpus formatted here, or as jobs on a Dask cluster (``formatting_jobs``; the
    same bytes) when --dask_scheduler or --hosts says so."""
    from data_prep.bertprep import text_formatting as tf
    out = layout.formatted_file(dataset)
    remove_stale_temporaries(os.path.dirname(out))
    t0 = time.perf_counter()
    source, inputs = _formatting_source(o, layout, dataset)
    cluster = cluster_options(o)
    if cluster.distributed:
        from data_prep.bertprep.formatting_jobs import format_in_jobs
        stats = format_in_jobs(source, inputs, out, cluster, unit=o.custom_document_unit,
                               processes=o.n_processes, expand_templates=o.wiki_expand_templates,
                               progress=o.progress, log=_say)
    elif source == "wikipedia":
        stats = tf.format_wikipedia(inputs, out, processes=o.n_processes,
                                    expand_templates=o.wiki_expand_templates,
                                    progress=o.progress)
    elif source == "books":
        stats = tf.format_books(inputs, out, progress=o.progress)
    else:
        stats = tf.format_custom(inputs, out, unit=o.custom_document_unit, progress=o.progress)
    dropped = f", {stats.dropped_empty} empty dropped" if stats.dropped_empty else ""
    _say(f"text_formatting: {dataset}: {stats.documents} documents{dropped} -> {out} "
         f"({time.perf_counter() - t0:.1f} s)")


UNION_SEPARATOR = "+"
# What a corpus name stands for: itself, or the corpora formatted apart and sharded together.
_UNIONS = {"books_wiki_en_corpus": ("wikicorpus_en", "bookscorpus")}


def corpus_parts(dataset: str) -> Optional[List[str]]:
    """The formatted corpora a dataset name stands for, or None when it names no corpus.

    ``books_wiki_en_corpus`` is NVIDIA's union of ``wikicorpus_en`` and ``bookscorpus``;
    ``a+b+...`` is any union of corpora (e.g. ``wikicorpus_en+custom``: Wikipedia with a
    domain's own text), each formatted on its own, then sharded, given a vocabulary and
    turned into records as one corpus under that name."""
    parts: List[str] = []
    for name in dataset.split(UNION_SEPARATOR):
        if name not in CORPORA:
            return None
        parts.extend(_UNIONS.get(name, (name,)))
    if not parts or len(set(parts)) != len(parts):
        return None
    return parts


def _parts(dataset: str) -> List[str]:
    return corpus_parts(dataset) or [dataset]


def _require_corpus(o: PrepOptions) -> None:
    if corpus_parts(o.dataset) is None:
        raise DataPrepError("--dataset", f"--action {o.action} works on a text corpus "
                                         f"({', '.join(CORPORA)}, or a union such as "
                                         f"wikicorpus_en+custom), not {o.dataset}")


def action_text_formatting(o: PrepOptions, layout: Layout) -> int:
    _require_corpus(o)
    parts = _parts(o.dataset)
    if len(parts) > 1 and o.input:
        raise DataPrepError("--input", f"give --input per part: format "
                                       f"{' and '.join(parts)} separately")
    for dataset in parts:
        _format_one(o, layout, dataset)
    return 0


def _given_inputs(o: PrepOptions) -> List[str]:
    """Formatted files given with --input/--input_files (NVIDIA's sharding takes its inputs
    so: one document a line)."""
    for path in o.input:
        if not os.path.isfile(path):
            raise DataPrepError(path, "no such formatted file (one document a line)")
    return list(o.input)


def _formatted_inputs(o: PrepOptions, layout: Layout) -> List[str]:
    files = [layout.formatted_file(d) for d in _parts(o.dataset)]
    for path in files:
        if not os.path.isfile(path):
            raise DataPrepError(path, "not found (run --action text_formatting first)")
    return files


# --------------------------------------------------------------------------- where jobs run

def cluster_options(o: PrepOptions):
    """Where the stages' jobs run: --n_processes here, or a Dask cluster (--dask_scheduler,
    --hosts): ``data_prep.processes.cluster``."""
    from data_prep.processes.cluster import ClusterOptions
    return ClusterOptions(n_processes=o.n_processes, dask_scheduler=o.dask_scheduler or "",
                          hosts=tuple(o.hosts))


# --------------------------------------------------------------------------- sharding

def action_sharding(o: PrepOptions, layout: Layout) -> int:
    from data_prep.bertprep import sharding
    _require_corpus(o)
    options = sharding.ShardingOptions(
        n_training_shards=o.n_training_shards, n_test_shards=o.n_test_shards,
        fraction_test_set=o.fraction_test_set, seed=o.sharding_seed,
        sentence_splitter=o.sentence_splitter, n_processes=o.n_processes)
    out_dir = layout.sharded_dir(o.dataset, o)
    remove_stale_temporaries(out_dir)
    inputs = _given_inputs(o) if o.input else _formatted_inputs(o, layout)
    stats = sharding.shard_corpus(inputs, out_dir, o.dataset, options,
                                  progress=o.progress, log=_say, cluster=cluster_options(o))
    if stats.shard_bytes:
        _say(f"sharding: shard sizes {min(stats.shard_bytes)}..{max(stats.shard_bytes)} bytes, "
             f"{sum(stats.shard_sentences)} sentences, "
             f"{sum(stats.seconds.values()):.1f} s")
    return 0


# --------------------------------------------------------------------------- vocab

def action_create_vocab(o: PrepOptions, layout: Layout) -> int:
    from data_prep.wordpiece import vocab
    _require_corpus(o)
    out = layout.vocab_file(o.dataset, o.do_lower_case)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    t0 = time.perf_counter()
    try:
        n = vocab.train_wordpiece_vocab(_formatted_inputs(o, layout), out,
                                        vocab_size=o.vocab_size, do_lower_case=o.do_lower_case,
                                        progress=o.progress)
    except vocab.VocabTrainingError as e:
        path, _, problem = str(e).partition(": ")
        raise DataPrepError(path, problem or str(e)) from None
    _say(f"create_vocab: {n} tokens -> {out} ({time.perf_counter() - t0:.1f} s)")
    return 0


def resolve_vocab(o: PrepOptions, layout: Layout) -> str:
    if o.vocab_file:
        return o.vocab_file
    trained = layout.vocab_file(o.dataset, o.do_lower_case)
    if os.path.isfile(trained):
        return trained
    raise DataPrepError("--vocab_file", f"not given, and {trained} does not exist (pass "
                                        f"--vocab_file or run --action create_vocab)")


# --------------------------------------------------------------------------- tfrecords

_SHARD_RE = re.compile(r"_(training|test)_(\d+)\.txt$")


def list_shards(folder: str) -> List[str]:
    """Shard files of a sharding output folder: training first, then test, by number."""
    found = []
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            m = _SHARD_RE.search(name)
            if m and ".tmp-" not in name:
                found.append((m.group(1) != "training", int(m.group(2)), name))
    return [os.path.join(folder, name) for _, _, name in sorted(found)]


_TOKENIZERS = {}


def _pool_init():
    # The workers already run in parallel; Rust-side threads in each would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def tfrecord_job(shard: str, output: str, vocab_file: str, options_fields: dict
                 ) -> Tuple[bool, str, str]:
    """One shard to one TFRecord file; returns (ok, output, message). Never raises, so one
    shard's failure cannot take down the pool nor be lost in unpickling."""
    from data_prep.instances.pretraining_data import create_pretraining_tfrecords
    from data_prep.instances.pretraining_data_options import PretrainingDataOptions
    from data_prep.instances.vocab_info import load_tokenizer
    t0 = time.perf_counter()
    try:
        options = PretrainingDataOptions(**options_fields)
        key = (vocab_file, options.do_lower_case)
        if key not in _TOKENIZERS:  # loaded once per worker process
            _TOKENIZERS[key] = load_tokenizer(vocab_file, options.do_lower_case)
        stats = create_pretraining_tfrecords([shard], [output], _TOKENIZERS[key], options,
                                             log_instances=0)
        return True, output, (f"{stats.instances} instances from {stats.documents} documents "
                              f"in {time.perf_counter() - t0:.1f} s")
    except DataPrepError as e:
        return False, output, str(e)
    except Exception as e:  # noqa: BLE001 - reported with the shard, not as a traceback
        return False, output, f"{shard}: {type(e).__name__}: {e}"


def action_create_tfrecord_files(o: PrepOptions, layout: Layout) -> int:
    from data_prep.instances.pretraining_data_options import (PretrainingDataOptions,
                                                              derive_shard_seed)
    from data_prep.instances.vocab_info import load_tokenizer
    base = PretrainingDataOptions(
        max_seq_length=o.max_seq_length, max_predictions_per_seq=o.max_predictions_per_seq,
        random_seed=o.random_seed, dupe_factor=o.dupe_factor, masked_lm_prob=o.masked_lm_prob,
        short_seq_prob=o.short_seq_prob, do_whole_word_mask=o.do_whole_word_mask,
        do_lower_case=o.do_lower_case, masking=o.masking,
        max_sequences_per_row=o.max_sequences_per_row)
    base.validate()  # settings no run can read: refused before anything is read
    _require_corpus(o)
    from data_prep.bertprep.sharding import unfinished
    shard_dir = layout.sharded_dir(o.dataset, o)
    if unfinished(shard_dir):
        raise DataPrepError(shard_dir, "its sharding did not finish (rerun --action sharding "
                                       "with the same flags: it writes only what is missing)")
    shards = list_shards(shard_dir)
    if not shards:
        raise DataPrepError(shard_dir, "no shards (run --action sharding with the same "
                                       "--n_training_shards/--n_test_shards/--fraction_test_set)")
    vocab_file = resolve_vocab(o, layout)
    load_tokenizer(vocab_file, o.do_lower_case)  # a bad vocab fails once, up front
    out_dir = layout.tfrecord_dir(o.dataset, o)
    for split in SPLITS:
        folder = layout.tfrecord_split_dir(o.dataset, o, split)
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise DataPrepError(folder, f"cannot create output folder: {e.strerror or e}") \
                from None
        remove_stale_temporaries(folder)
    jobs = []
    for shard in shards:
        name = os.path.basename(shard)[:-len(".txt")]
        split = _SHARD_RE.search(os.path.basename(shard)).group(1)
        output = os.path.join(layout.tfrecord_split_dir(o.dataset, o, split), f"{name}.tfrecord")
        if os.path.exists(output):
            _say(f"create_tfrecord_files: skip {name} (complete)")
            continue
        fields = dataclasses.asdict(base.replace(
            random_seed=derive_shard_seed(o.random_seed, os.path.basename(shard))))
        jobs.append((shard, output, vocab_file, fields))
    failures = []
    finished = []
    t0 = time.perf_counter()
    from data_prep.processes.cluster import describe, job_runner
    cluster = cluster_options(o)
    with job_runner(cluster, out_dir, initializer=_pool_init) as runner:
        if jobs:
            _say(f"create_tfrecord_files: {len(jobs)} shards on {describe(cluster, runner)}")
        names = [os.path.basename(job[1]) for job in jobs]
        for name, result, error in runner.run(tfrecord_job, jobs, names):
            ok, output, message = result if error is None else (False, name, str(error))
            finished.append(output)
            progress = (f"[{len(finished)}/{len(jobs)} shards, "
                        f"ETA {eta(len(finished), len(jobs), time.perf_counter() - t0)}]")
            if ok:
                _say(f"create_tfrecord_files: wrote {os.path.basename(output)}: {message} "
                     f"{progress}")
            else:
                failures.append(message)
                _say(f"create_tfrecord_files: FAILED {os.path.basename(output)}: {message} "
                     f"{progress}")
    if not failures:  # a lost worker's temporaries (its pid is dead here, or on its host)
        for split in SPLITS:
            remove_stale_temporaries(layout.tfrecord_split_dir(o.dataset, o, split))
    done = len(shards) - len(failures)
    _say(f"create_tfrecord_files: {done}/{len(shards)} shards complete in {out_dir} "
         f"({len(jobs) - len(failures)} written now, {time.perf_counter() - t0:.1f} s)")
    for message in failures:
        print(f"error: {message}", file=sys.stderr, flush=True)
    return 1 if failures else 0


# --------------------------------------------------------------------------- dispatch

_HANDLERS: dict = {
    "download": action_download,
    "text_formatting": action_text_formatting,
    "sharding": action_sharding,
    "create_tfrecord_files": action_create_tfrecord_files,
    "create_vocab": action_create_vocab,
}


def action_download_all(o: PrepOptions, layout: Layout) -> int:
    """NVIDIA's `--dataset all`: every dataset of the table that can be fetched without a
    --url, one after the other (BookCorpus and PubMed are named and skipped)."""
    if o.url or o.sha256:
        raise DataPrepError("--url" if o.url else "--sha256", "applies to one dataset, not all")
    _say("download all: bookscorpus needs --url and PubMed is not supported: skipped")
    for dataset in _download_datasets():
        if dataset != "bookscorpus":
            action_download(dataclasses.replace(o, dataset=dataset), layout)
    return 0


def run(o: PrepOptions) -> int:
    """Validates the action and dataset, then runs the action; raises ``DataPrepError``."""
    if o.action not in ACTIONS:
        raise DataPrepError("--action", f"unknown action {o.action!r} "
                                        f"(choose from {', '.join(ACTIONS)})")
    o = dataclasses.replace(o, dataset=canonical_dataset(o.dataset))
    if o.dataset in PUBMED:
        raise DataPrepError("--dataset", f"{o.dataset}: PubMed is not supported here (NVIDIA's "
                                         f"bertPrep.py downloads and parses its XML); format "
                                         f"its text as --dataset custom --input FILES")
    if o.dataset == ALL:
        if o.action != "download":
            raise DataPrepError("--dataset", "all: only --action download takes all datasets")
        return action_download_all(o, Layout(resolve_working_dir(o.working_dir)))
    datasets = all_datasets()
    if o.dataset not in datasets and corpus_parts(o.dataset) is None:
        raise DataPrepError("--dataset", f"unknown dataset {o.dataset!r} "
                                         f"(choose from {', '.join(datasets)}, or a union of "
                                         f"corpora such as wikicorpus_en+custom)")
    if o.action != "download" and corpus_parts(o.dataset) is None:
        raise DataPrepError("--dataset", f"{o.dataset} is only downloaded; --action {o.action} "
                                         f"works on {', '.join(CORPORA)}")
    layout = Layout(resolve_working_dir(o.working_dir))
    return _HANDLERS[o.action](o, layout)


def run_cli(o: PrepOptions, err: Callable[[str], None] = None) -> int:
    """``run`` with errors printed as one line ``error: <file>: <problem>``; returns the status."""
    def emit(message):
        print(f"error: {message}", file=sys.stderr, flush=True)
    err = err or emit
    try:
        return run(o)
    except DataPrepError as e:
        err(str(e))
    except OSError as e:  # disk full, permissions changed under us...
        err(f"{e.filename or o.working_dir or '-'}: {e.strerror or e}")
    except KeyboardInterrupt:
        err("interrupted (rerun the same command to resume)")
        return 130
    return 1
