"""Planning pre-training instances: Google's chunking into sentence pairs, and truncation.

``plan_instances`` runs Google's next-sentence logic over all documents and ``dupe_factor``
passes, and records each instance as spans (start, length) of A and B in ``Corpus.tokens``
instead of copying tokens; ``truncate_plan`` applies Google's ``truncate_seq_pair`` to those
spans in closed form (see ``data_prep.instances.pretraining_data`` for the algorithm). Both static
and dynamic masking build their rows from the same plan, so for one seed their instances agree.
"""
from __future__ import annotations

import bisect
import dataclasses

import numpy as np
from absl import logging

from data_prep.instances.corpus import Corpus
from data_prep.instances.pretraining_data_options import PretrainingDataOptions


@dataclasses.dataclass
class InstancePlan:
    """Instances as spans of ``Corpus.tokens``: A = tokens[a_start:a_start+a_len], B likewise."""
    a_start: np.ndarray
    a_len: np.ndarray
    b_start: np.ndarray
    b_len: np.ndarray
    is_random_next: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.a_start)

    def take(self, index) -> "InstancePlan":
        return InstancePlan(self.a_start[index], self.a_len[index], self.b_start[index],
                            self.b_len[index], self.is_random_next[index])


def _uniform_stream(rng: np.random.Generator, block: int = 1 << 16):
    while True:
        yield from rng.random(block).tolist()


def plan_instances(corpus: Corpus, options: PretrainingDataOptions,
                   rng_order: np.random.Generator,
                   rng_stream: np.random.Generator) -> InstancePlan:
    """Google's chunking / next-sentence logic over all documents and dupes (untruncated)."""
    off = corpus.sent_offsets.tolist()
    doc_off = corpus.doc_offsets.tolist()
    n_docs = corpus.num_documents
    order = rng_order.permutation(n_docs).tolist()
    max_num_tokens = options.max_seq_length - 3
    short_prob = options.short_seq_prob
    uniform = _uniform_stream(rng_stream).__next__
    bisect_left = bisect.bisect_left
    a_s, a_l, b_s, b_l, rnd = [], [], [], [], []
    single_doc = n_docs < 2
    if single_doc and n_docs:
        logging.warning("the input has a single document: random-next sentences are taken from "
                        "a random position of that same document")
    for _ in range(options.dupe_factor):
        for pos, d in enumerate(order):
            s0, s1 = doc_off[d], doc_off[d + 1]
            target = max_num_tokens
            if uniform() < short_prob:
                target = 2 + int(uniform() * (max_num_tokens - 1))
            c0 = s0  # first sentence of the current chunk
            i = s0
            while i < s1:
                if i == s1 - 1 or off[i + 1] - off[c0] >= target:
                    n_chunk = i - c0 + 1
                    a_end = c0 + 1
                    if n_chunk >= 2:
                        a_end += int(uniform() * (n_chunk - 1))
                    a0 = off[c0]
                    al = off[a_end] - a0
                    if n_chunk == 1 or uniform() < 0.5:
                        target_b = target - al
                        if single_doc:
                            rd = d
                        else:
                            r = int(uniform() * (n_docs - 1))
                            rd = order[r + 1 if r >= pos else r]
                        r0, r1 = doc_off[rd], doc_off[rd + 1]
                        rs = r0 + int(uniform() * (r1 - r0))
                        b0 = off[rs]
                        e = bisect_left(off, b0 + target_b, rs + 1, r1)
                        b_s.append(b0)
                        b_l.append(off[e] - b0)
                        rnd.append(True)
                        i = a_end - 1  # put the unused segments back
                    else:
                        b0 = off[a_end]
                        b_s.append(b0)
                        b_l.append(off[i + 1] - b0)
                        rnd.append(False)
                    a_s.append(a0)
                    a_l.append(al)
                    c0 = i + 1
                i += 1
    return InstancePlan(np.array(a_s, dtype=np.int64), np.array(a_l, dtype=np.int64),
                        np.array(b_s, dtype=np.int64), np.array(b_l, dtype=np.int64),
                        np.array(rnd, dtype=bool))


def truncated_lengths(a_len: np.ndarray, b_len: np.ndarray, max_num_tokens: int):
    """Lengths after Google's truncate_seq_pair (remove from the longer side, B on ties)."""
    a_len = np.asarray(a_len, dtype=np.int64)
    b_len = np.asarray(b_len, dtype=np.int64)
    m = max_num_tokens
    over = a_len + b_len > m
    a_absorbs = 2 * b_len <= m           # only A shrinks, down to m - len(B)
    b_absorbs = 2 * a_len <= m + 1       # only B shrinks, down to m - len(A)
    new_a = np.where(a_absorbs, m - b_len, np.where(b_absorbs, a_len, (m + 1) // 2))
    new_b = np.where(a_absorbs, b_len, np.where(b_absorbs, m - a_len, m // 2))
    return np.where(over, new_a, a_len), np.where(over, new_b, b_len)


def truncate_plan(plan: InstancePlan, max_num_tokens: int,
                  rng: np.random.Generator) -> InstancePlan:
    la, lb = truncated_lengths(plan.a_len, plan.b_len, max_num_tokens)
    front_a = rng.binomial(plan.a_len - la, 0.5)
    front_b = rng.binomial(plan.b_len - lb, 0.5)
    return InstancePlan(plan.a_start + front_a, la, plan.b_start + front_b, lb,
                        plan.is_random_next)


def warn_truncation(corpus: Corpus, planned: InstancePlan, truncated: InstancePlan,
                    max_seq_length: int, most: float = 0.5):
    """One warning line when documents lose most of their tokens to truncation.

    Google's chunking cuts documents at sentence ends, so a document whose "sentences" are
    longer than a sequence (a text without sentence breaks, one 30 MB line) becomes a few
    instances with almost all of its tokens thrown away, which nothing else would say."""
    if not len(planned):
        return
    doc_token_starts = corpus.sent_offsets[corpus.doc_offsets[:-1]]
    # Segment A comes from the document being chunked, B from it or a random other one.
    documents = np.searchsorted(doc_token_starts, np.concatenate(
        [planned.a_start, planned.b_start]), side="right") - 1
    before = np.bincount(documents, np.concatenate([planned.a_len, planned.b_len]),
                         minlength=corpus.num_documents)
    kept = np.bincount(documents, np.concatenate([truncated.a_len, truncated.b_len]),
                       minlength=corpus.num_documents)
    lossy = before > 0
    lossy[lossy] = (before[lossy] - kept[lossy]) > most * before[lossy]
    if lossy.any():
        dropped = 1 - kept[lossy].sum() / before[lossy].sum()
        total = 1 - kept.sum() / before.sum()
        logging.warning(
            "%d of %d documents lose most of their tokens to truncation (%.1f%% of theirs, "
            "%.1f%% of the input's): their sentences are longer than --max_seq_length=%d "
            "(text without sentence breaks?)", int(lossy.sum()), corpus.num_documents,
            100 * dropped, 100 * total, max_seq_length)
