"""BERT pre-training data (masked LM + next sentence prediction) as TFRecord files, fast.

Same algorithm and output format as Google's ``create_pretraining_data.py``, but built for
throughput: every line of an input shard is tokenized once, in one batch call
(``FullTokenizer.encode_batch``), into one flat id array; the ``dupe_factor`` passes reuse it;
instances are planned as (start, length) spans into that array; truncation, masking and
``tf.train.Example`` serialisation run vectorised over batches of instances with numpy; the
TFRecord framing is written directly (see ``data_prep.instances.tfrecord_writer``).  TensorFlow is
not imported.

This module drives one shard (``create_pretraining_tfrecords``, ``write_instances``); each
step has a module of its own below it: ``data_prep.instances.corpus`` reads and tokenizes the text,
``data_prep.instances.instance_plan`` plans and truncates the pairs,
``data_prep.instances.batch_writing`` builds, serialises and writes them batch by batch on
every core,
``data_prep.instances.instance_rows`` lays them out as token rows, which
``data_prep.instances.masked_instances`` masks (static) and
``data_prep.instances.unmasked_instances`` writes as they are (dynamic); the types all of them share
are in ``data_prep.instances.pretraining_data_options``, ``data_prep.instances.vocab_info`` and
``data_prep.errors``.

Algorithm (per call, i.e. per shard):

* Input: one sentence per line, a blank (or whitespace-only) line between documents.  Each
  input file also ends the current document (Google's script lets a document run on into the
  next file).  Lines that tokenize to nothing are skipped; empty documents are dropped.
* Documents are shuffled once; the same order is used in each of the ``dupe_factor`` passes.
* Per document: ``target_seq_length = max_seq_length - 3``, but with probability
  ``short_seq_prob`` a random length in ``[2, max_seq_length - 3]``.  Sentences are
  accumulated into a chunk until it reaches the target length (or the document ends); A is
  the first ``a_end`` segments (``a_end`` uniform in ``[1, len(chunk) - 1]``); with probability
  0.5, or always when the chunk has one segment, B is taken from a random *other* document
  starting at a random sentence (until it reaches ``target - len(A)`` tokens), and the unused
  segments of the chunk are put back; otherwise B is the rest of the chunk.
* The pair is truncated to ``max_seq_length - 3`` tokens by removing tokens from the longer
  side (B on ties), each removal from the front or the back with probability 0.5 (computed in
  closed form: the number of removals per side is deterministic, the number taken from the
  front is Binomial(removals, 0.5) - the same distribution as Google's loop).
* ``[CLS] A [SEP] B [SEP]``; ``num_to_predict = min(max_predictions_per_seq, max(1,
  round(len(tokens) * masked_lm_prob)))`` (round half to even, like Python's ``round``);
  candidates exclude ``[CLS]``/``[SEP]``; a uniformly random subset is chosen (with
  ``do_whole_word_mask``: words - a token plus its ``##`` continuations - taken in random
  order, skipping a word that would overshoot ``num_to_predict``, like Google's loop; a ``##``
  token right after ``[CLS]``/``[SEP]`` starts a word of its own, where Google's script would
  glue it to the word before the ``[SEP]``); each chosen token becomes ``[MASK]`` (80 %), stays
  (10 %) or becomes a uniformly random vocabulary id (10 %); positions are sorted.
* ``masking="dynamic"`` (``--masking=dynamic``) stops before the masked-LM choice and writes
  the instances unmasked, with the word starts and the vocabulary the input pipeline needs to
  mask them at every read (``data_prep.instances.unmasked_instances``); planning and truncation draw
  the same random numbers, so for one seed its instances are those of the static records.
* All instances of the call are shuffled before writing and go round-robin to the output
  files - Google shuffles all instances of all inputs; here the shuffle covers one call, so
  a driver that runs one call per input shard shuffles within the shard (memory stays bounded
  by the shard: the token array plus 5 integers per instance; records are built and written
  in batches of ``BATCH_SIZE``).

Randomness: ``numpy.random.Generator`` (PCG64) streams spawned from
``SeedSequence(random_seed)``; the output depends only on the seed, the inputs and the
options (not on the number of processes, nor on timing).  A driver that runs one call per
shard should pass ``shard_key`` (the shard's index or base name), which seeds the shard with
``derive_shard_seed(random_seed, shard_key)``.

Other differences from Google's script: the random other document is drawn among the other
documents in one draw (Google: up to 10 draws among all, rarely ending on the same one); a
corpus with a single document takes its random-next B from a random sentence of that same
document (what Google's loop ends up doing) and logs a warning; inputs are local files
(Google's ``tf.gfile`` also reads ``gs://``); the random streams differ from Python's
``random``, so outputs are statistically, not byte-for-byte, Google's.

Errors that come from the input or the environment (missing/empty input, invalid UTF-8,
missing vocabulary, unwritable output) raise ``DataPrepError``, whose message is one line
``<file>: <problem>``.  Outputs are written to ``<output>.tmp-<pid>`` and renamed on success;
on any failure the temporary files are removed, so a record file under its final name is
always complete.  A killed run cannot remove them: the next run over the same outputs does
(those of a pid no longer running, ``data_prep.processes.temporaries``), and input globs skip
them.  Invalid UTF-8 is an error (Google's script crashes with a traceback): the message names
the file and the byte offset of the first bad byte.  Each output gets its metadata in
``<output folder>.meta/`` (``data_prep.instances.record_metadata``: vocabulary, lengths,
record count, masking kind), renamed into place just before the records, so pre-training can
check every file at start-up.
"""
from __future__ import annotations

import itertools
import os
import time
from typing import Optional, Sequence, Union

import numpy as np
from absl import logging

from data_prep.errors import DataPrepError
from data_prep.instances import batch_writing, record_metadata, tfrecord_writer
from data_prep.instances.corpus import Corpus, expand_input_files, read_corpus
from data_prep.instances.instance_plan import plan_instances, truncate_plan, warn_truncation
from data_prep.instances.pretraining_data_options import (PretrainingDataOptions, PretrainingStats,
                                                          derive_shard_seed)
from data_prep.instances.vocab_info import VocabInfo, load_tokenizer
from data_prep.processes.pause_point import pause_point
from data_prep.processes.temporaries import remove_stale_temporaries

# Instances logged at INFO, like Google's script.
MAX_LOGGED_INSTANCES = 20


def _folder(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


def _as_tokenizer(tokenizer_or_vocab, options: PretrainingDataOptions):
    if isinstance(tokenizer_or_vocab, (str, os.PathLike)):
        return load_tokenizer(os.fspath(tokenizer_or_vocab), options.do_lower_case)
    return tokenizer_or_vocab


def _random_streams(seed: int):
    """Generators for planning, truncation, shuffling, masking and packing. Children of one
    SeedSequence are keyed by their index, so adding the packing stream changed none of the
    others (the unpacked outputs of a seed stay the same)."""
    order, stream, trunc, shuffle, mask, pack = np.random.SeedSequence(seed).spawn(6)
    return tuple(np.random.Generator(np.random.PCG64(s))
                 for s in (order, stream, trunc, shuffle, mask, pack))


def write_instances(corpus: Corpus, output_files: Sequence[str], vocab: VocabInfo,
                    options: PretrainingDataOptions, stats: Optional[PretrainingStats] = None,
                    log_instances: int = MAX_LOGGED_INSTANCES,
                    processes: int = 1) -> PretrainingStats:
    """Plans, shuffles, builds and writes all instances of ``corpus`` (round-robin outputs).
    ``processes`` > 1 builds the batches in turn in this process and forked helpers
    (``data_prep.instances.batch_writing``; the same records for any number)."""
    options.validate()
    if stats is None:
        stats = PretrainingStats(input_files=[], output_files=list(output_files))
    if not output_files:
        raise DataPrepError("--output_file", "no output files given")
    if corpus.tokens.size and int(corpus.tokens.max()) >= vocab.size:
        raise DataPrepError("tokens", f"token id {int(corpus.tokens.max())} is outside the "
                                      f"vocabulary of {vocab.size}")
    rng_order, rng_stream, rng_trunc, rng_shuffle, rng_mask, rng_pack = \
        _random_streams(options.random_seed)
    writers = []
    try:
        for path in output_files:
            try:
                writers.append(tfrecord_writer.TFRecordFileWriter(path))
            except OSError as e:
                raise DataPrepError(path, f"cannot write output: {e.strerror or e}") from None
        pause_point("records_opened")  # tests: killed with the temporaries just created
        t0 = time.perf_counter()
        plan = plan_instances(corpus, options, rng_order, rng_stream)
        truncated = truncate_plan(plan, options.max_seq_length - 3, rng_trunc)
        warn_truncation(corpus, plan, truncated, options.max_seq_length)
        plan = truncated
        plan = plan.take(rng_shuffle.permutation(len(plan)))
        t1 = time.perf_counter()
        batches = batch_writing.Batches(corpus, plan, vocab, options, len(writers),
                                        log_instances)
        written_tokens, written_slots = batch_writing.write_batches(
            batches, writers, rng_mask, rng_pack, processes)
        vocab_hash = record_metadata.vocab_sha256(vocab.id_to_token)
        for writer in writers:
            try:  # the metadata first: a record file under its final name always has it
                record_metadata.write(writer.path, record_metadata.describe(
                    writer.records, options.max_seq_length, options.max_predictions_per_seq,
                    vocab.size, vocab_hash, options.masking, options.max_sequences_per_row))
                writer.commit()
            except OSError as e:
                raise DataPrepError(writer.path, f"cannot write output: {e.strerror or e}") \
                    from None
        t2 = time.perf_counter()
    except BaseException:
        for writer in writers:
            writer.abort()
        raise
    stats.instances = len(plan)
    stats.random_next = int(plan.is_random_next.sum())
    stats.instances_per_output = [w.records for w in writers]
    stats.padding_share = 1.0 - written_tokens / max(written_slots, 1)
    stats.seconds["plan"] = t1 - t0
    stats.seconds["build_and_write"] = t2 - t1
    return stats


def create_pretraining_tfrecords(input_files: Union[str, Sequence[str]],
                                 output_files: Union[str, Sequence[str]],
                                 tokenizer_or_vocab,
                                 options: Optional[PretrainingDataOptions] = None,
                                 log_instances: int = MAX_LOGGED_INSTANCES,
                                 shard_key: Optional[Union[str, int]] = None,
                                 processes: int = 1) -> PretrainingStats:
    """Reads text files, writes pre-training TFRecords; the entry point for one shard.

    ``input_files``: comma-separated globs or a list of paths/globs.  ``output_files``:
    comma-separated or a list; instances go round-robin to them.  ``tokenizer_or_vocab``: a
    ``FullTokenizer`` (anything with ``vocab`` and ``encode_batch``; reuse one across the
    shards of a worker to save its set-up) or a vocab file path (then
    ``options.do_lower_case`` applies).  ``shard_key`` (the shard's index or base name):
    when given, the seed used is ``derive_shard_seed(options.random_seed, shard_key)``, so a
    multiprocessing driver gets the same output whatever the number of processes.
    ``log_instances``: how many instances to log at INFO (Google logs 20).  ``processes``:
    how many processes tokenize the text (``read_corpus``; the output does not depend on it).
    Raises
    ``DataPrepError`` for bad input or output; returns counts and timings.
    """
    t0 = time.perf_counter()
    options = options or PretrainingDataOptions()
    options.validate()
    if shard_key is not None:
        options = options.replace(random_seed=derive_shard_seed(options.random_seed, shard_key))
    if isinstance(output_files, str):
        output_files = [p.strip() for p in output_files.split(",") if p.strip()]
    output_files = list(output_files)
    if not output_files:
        raise DataPrepError("--output_file", "no output files given")
    for path in output_files:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise DataPrepError(path, f"output folder {folder} does not exist")
        if os.path.isdir(path):
            raise DataPrepError(path, "output path is a directory")
    for folder, names in itertools.groupby(sorted(output_files, key=_folder), key=_folder):
        names = list(names)  # left by a killed run of these outputs (and their metadata):
        remove_stale_temporaries(folder, names + [record_metadata.legacy_metadata_path(n)
                                                  for n in names])
        remove_stale_temporaries(os.path.dirname(record_metadata.metadata_path(names[0])),
                                 [record_metadata.metadata_path(n) for n in names])
    if len(set(map(os.path.abspath, output_files))) != len(output_files):
        raise DataPrepError(",".join(output_files), "the same output file is named twice")
    files = expand_input_files(input_files)
    inputs = set(map(os.path.abspath, files))
    for path in output_files:
        if os.path.abspath(path) in inputs:
            raise DataPrepError(path, "output file is also an input file")
    tokenizer = _as_tokenizer(tokenizer_or_vocab, options)
    vocab = VocabInfo.from_tokenizer(tokenizer, source=str(
        tokenizer_or_vocab if isinstance(tokenizer_or_vocab, (str, os.PathLike)) else "tokenizer"))
    t1 = time.perf_counter()
    corpus, nbytes = read_corpus(files, tokenizer, processes)
    t2 = time.perf_counter()
    stats = PretrainingStats(input_files=files, output_files=output_files, input_bytes=nbytes,
                             documents=corpus.num_documents, sentences=corpus.num_sentences,
                             tokens=corpus.num_tokens)
    if corpus.num_documents == 0:
        raise DataPrepError(files[0] if len(files) == 1 else ",".join(files),
                            "no text: the input has no non-empty line")
    logging.info("Read %d documents, %d sentences, %d tokens from %d file(s) (%.1f MB)",
                 corpus.num_documents, corpus.num_sentences, corpus.num_tokens, len(files),
                 nbytes / 1e6)
    write_instances(corpus, output_files, vocab, options, stats, log_instances, processes)
    stats.seconds["setup"] = t1 - t0
    stats.seconds["read_tokenize"] = t2 - t1
    stats.seconds["total"] = time.perf_counter() - t0
    logging.info("Wrote %d total instances", stats.instances)
    return stats
