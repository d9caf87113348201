"""Planned instances to records, batch by batch, on every core: build, mask, serialise, write.

A shard's planned (and shuffled) instances are cut into batches of ``BATCH_SIZE``. Each
batch is built (``data_prep.instances.masked_instances`` or, dynamic masking,
``data_prep.instances.unmasked_instances``), serialised for each output
(``data_prep.instances.tfrecord_writer``) and written, in order, by this process.

With more than one process (``write_batches(..., processes=n)``), batch k is built and
serialised by process k % n: this one and n - 1 forked helpers
(``data_prep.processes.forked.ForkedStream``), which share the corpus and the plan with it
from the fork and send back only the serialised bytes. The masking draws of a batch depend
on its size only (``masked_instances.masking_draws``), so each process keeps its own copy of
the masking stream where one process would have it, by drawing (and dropping) the numbers of
the batches the others build: the records are the same bytes for any number of processes.
A helper that fails costs time, not output: this process builds its batches from the
stream's state saved for each of them.

Packed rows (``--pack``) are the exception: packing draws from its own stream a number of
times that depends on the rows, so the batches are built here and each one is serialised by
one forked helper while the next is built.
"""
from __future__ import annotations

import collections
from typing import Callable, List, Sequence, Tuple

import numpy as np
from absl import logging

from data_prep.errors import DataPrepError
from data_prep.instances import packing, tfrecord_writer
from data_prep.instances.corpus import Corpus
from data_prep.instances.instance_plan import InstancePlan
from data_prep.instances.masked_instances import InstanceBatch, build_instances, masking_draws
from data_prep.instances.pretraining_data_options import PretrainingDataOptions
from data_prep.instances.unmasked_instances import build_unmasked_instances
from data_prep.instances.vocab_info import VocabInfo
from data_prep.processes import forked
from data_prep.processes.pause_point import pause_point

# Instances built, masked, serialised and written per step (fixed: the random streams are
# consumed per batch, so changing it changes the output of a given seed).
BATCH_SIZE = 4096


def serialised_rows(features: dict, kinds: dict, n_out: int, records_before: int) -> list:
    """(TFRecord bytes, record count) of a batch's rows for each of ``n_out`` outputs: record
    number records_before + j goes to output (records_before + j) % n_out."""
    out = []
    for w_index in range(n_out):
        first = (w_index - records_before) % n_out
        sub = {name: arr[first::n_out] for name, arr in features.items()}
        count = len(sub["input_ids"])
        out.append((tfrecord_writer.encode_tfrecords(sub, kinds) if count else None, count))
    return out


def _write_rows(writers, rows) -> None:
    for writer, (framed, count) in zip(writers, rows):
        if count:
            try:
                writer.write_tfrecords(framed, count)
            except OSError as e:
                raise DataPrepError(writer.path, f"cannot write output: {e.strerror or e}") \
                    from None


def log_instances(batch: InstanceBatch, vocab: VocabInfo, count: int) -> None:
    """The first ``count`` instances of a batch at INFO, as Google's script logs them."""
    id_to_token = vocab.id_to_token
    for i in range(min(count, len(batch))):
        n_real = int(batch.input_mask[i].sum())
        logging.info("*** Example ***")
        logging.info("tokens: %s", " ".join(id_to_token[t] for t in
                                            batch.input_ids[i, :n_real].tolist()))
        if hasattr(batch, "masked_lm_weights"):  # not in unmasked (dynamic) instances
            n_pred = int(batch.masked_lm_weights[i].sum())
            logging.info("masked_lm_labels: %s", " ".join(
                id_to_token[t] for t in batch.masked_lm_ids[i, :n_pred].tolist()))
        for name in batch.KINDS:
            values = getattr(batch, name)[i].tolist()
            logging.info("%s: %s", name, " ".join(str(v) for v in values))


class Batches:
    """The batches of one shard's plan: each one built, or its masking draws skipped."""

    def __init__(self, corpus: Corpus, plan: InstancePlan, vocab: VocabInfo,
                 options: PretrainingDataOptions, n_out: int, logged: int):
        self.corpus, self.plan, self.vocab, self.options = corpus, plan, vocab, options
        self.n_out, self.logged = n_out, logged
        self.starts = range(0, len(plan), BATCH_SIZE)
        dynamic = options.masking == "dynamic"
        self._build: Callable = build_unmasked_instances if dynamic else build_instances
        self._draws = None if dynamic else masking_draws

    def features(self, start: int, rng: np.random.Generator) -> Tuple[dict, dict]:
        """(features, their kinds) of batch ``start``, masked with ``rng``."""
        batch = self._build(self.corpus, self.plan.take(slice(start, start + BATCH_SIZE)),
                            self.vocab, self.options, rng)
        if start == 0 and self.logged:
            log_instances(batch, self.vocab, self.logged)
        return batch.features(), batch.KINDS

    def records(self, start: int, rng: np.random.Generator) -> Tuple[list, int, int]:
        """Batch ``start`` serialised: (``serialised_rows``, real tokens, token slots)."""
        features, kinds = self.features(start, rng)
        mask = features["input_mask"]
        return serialised_rows(features, kinds, self.n_out, start), int(mask.sum()), mask.size

    def skip(self, start: int, rng: np.random.Generator) -> None:
        """Moves ``rng`` past the draws of batch ``start`` without building it."""
        if self._draws is not None:
            self._draws(rng, min(BATCH_SIZE, len(self.plan) - start), self.options,
                        self.vocab.size)


def write_batches(batches: Batches, writers: Sequence, rng_mask: np.random.Generator,
                  rng_pack: np.random.Generator, processes: int) -> Tuple[int, int]:
    """Writes every batch in order; returns (real tokens, token slots) written."""
    share = min(processes, len(batches.starts)) if forked.fork_is_safe() else 1
    if batches.options.max_sequences_per_row:
        return _write_packed(batches, writers, rng_mask, rng_pack, share > 1)
    return _write_in_turn(batches, writers, rng_mask, share)


def _write_in_turn(batches: Batches, writers: Sequence, rng_mask: np.random.Generator,
                   share: int) -> Tuple[int, int]:
    """Batch k built and serialised by process k % share (0: this one; see the docstring)."""

    def helper_batches(index):
        for k, start in enumerate(batches.starts):
            if k % share == index:
                yield batches.records(start, rng_mask)
            else:
                batches.skip(start, rng_mask)

    helpers: List[forked.ForkedStream] = []
    tokens = slots = 0
    try:
        helpers.extend(forked.ForkedStream(helper_batches, index) for index in range(1, share))
        for k, start in enumerate(batches.starts):
            pause_point("records_batch")  # tests: killed after start / BATCH_SIZE batches
            if k % share == 0:
                built = batches.records(start, rng_mask)
            else:
                state = rng_mask.bit_generator.state
                batches.skip(start, rng_mask)
                built = helpers[k % share - 1].next()
                if built is forked.FAILED:  # build it here after all
                    rng = np.random.Generator(np.random.PCG64())
                    rng.bit_generator.state = state
                    built = batches.records(start, rng)
            rows, batch_tokens, batch_slots = built
            _write_rows(writers, rows)
            tokens += batch_tokens
            slots += batch_slots
    except BaseException:
        for helper in helpers:
            helper.close(kill=True)
        raise
    for helper in helpers:
        helper.close()
    return tokens, slots


class _CallHere:
    """A call done at once, with the interface of a ``forked.ForkedWorker`` call."""

    def __init__(self, function, *args):
        self.value = function(*args)

    def result(self):
        return self.value


def _write_packed(batches: Batches, writers: Sequence, rng_mask: np.random.Generator,
                  rng_pack: np.random.Generator, in_helper: bool) -> Tuple[int, int]:
    """Batches built and packed here; each serialised (``in_helper``: by a forked helper,
    while the next is built) and written in order."""
    serialiser = forked.ForkedWorker() if in_helper else None
    submit = serialiser.submit if serialiser is not None else _CallHere
    pending = collections.deque()  # serialised batches not yet written
    tokens = slots = records_before = 0
    try:
        for start in batches.starts:
            pause_point("records_batch")  # tests: killed after start / BATCH_SIZE batches
            features, kinds = batches.features(start, rng_mask)
            features = packing.pack_instances(
                features, batches.options.max_sequences_per_row, rng_pack)
            if pending:  # first: the helper takes the next batch only when this one is back
                _write_rows(writers, pending.popleft().result())
            pending.append(submit(serialised_rows, features, packing.packed_kinds(kinds),
                                  batches.n_out, records_before))
            mask = features["input_mask"]
            records_before += len(mask)
            tokens += int(mask.sum())
            slots += mask.size
        while pending:
            _write_rows(writers, pending.popleft().result())
    except BaseException:
        if serialiser is not None:
            serialiser.close(kill=True)
        raise
    if serialiser is not None:
        serialiser.close()
    return tokens, slots
