"""The options of one pre-training data run, its seed per shard, and the counts it returns.

``PretrainingDataOptions`` are Google's ``create_pretraining_data.py`` flags (same names and
defaults) plus the masking kind and sequence packing; ``derive_shard_seed`` gives each
shard of a multi-process driver its own seed; ``PretrainingStats`` is what a run reports.
Every step of ``data_prep.instances.pretraining_data`` (reading, planning, building, writing) and
``bertPrep.py``'s ``create_tfrecord_files`` take these, so they sit below all of them.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import List, Union

import numpy as np

from data_prep.errors import DataPrepError

MASKINGS = ("static", "dynamic")


def unreadable_records(max_seq_length, max_predictions_per_seq, masking="static"):
    """Why no run can read records written with these settings (one sentence naming the
    flags and what to pass), or None: the check every tool that writes records makes before
    reading or writing anything (`PretrainingDataOptions.validate`; the commands, at parse
    time: `cli.record_flags`).

    run_pretraining.py takes static records only with its --max_predictions_per_seq equal to
    theirs, and refuses a --max_predictions_per_seq above --max_seq_length (a sequence cannot
    hold more masked tokens than tokens), so such records were written in full, metadata
    included, to be refused at the first run. Dynamic-masking records hold no predictions
    (run_pretraining.py's own flag decides them there), so this does not apply to them.
    The other settings a run checks its records against are the model's (vocab_size,
    max_position_embeddings), unknown here; the ranges of single flags are
    `training.option_ranges`'.
    """
    if masking == "static" and max_predictions_per_seq > max_seq_length:
        return ("run_pretraining.py refuses records with more masked-LM predictions "
                "(--max_predictions_per_seq) than tokens (--max_seq_length): pass at most the "
                "sequence length (NVIDIA's: 20 for 128, 80 for 512)")
    return None


@dataclasses.dataclass(frozen=True)
class PretrainingDataOptions:
    """The options of Google's ``create_pretraining_data.py`` (same names and defaults)."""
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    random_seed: int = 12345
    dupe_factor: int = 10
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    do_whole_word_mask: bool = False
    do_lower_case: bool = True
    # "static": Google's masked records; "dynamic": unmasked records, masked anew by the
    # input pipeline at every read (``data_prep.instances.unmasked_instances``).
    masking: str = "static"
    # Sequence packing (``data_prep.instances.packing``): 0 writes one instance a record (Google's
    # layout); k >= 2 packs up to k whole instances into each max_seq_length row.
    max_sequences_per_row: int = 0

    def replace(self, **changes) -> "PretrainingDataOptions":
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        def bad(flag, problem):
            raise DataPrepError(f"--{flag}", problem)
        if self.max_seq_length < 5:
            bad("max_seq_length", f"must be at least 5, got {self.max_seq_length}")
        if self.max_predictions_per_seq < 1:
            bad("max_predictions_per_seq", f"must be at least 1, got {self.max_predictions_per_seq}")
        unreadable = unreadable_records(self.max_seq_length, self.max_predictions_per_seq,
                                        self.masking)
        if unreadable:
            bad(f"max_predictions_per_seq={self.max_predictions_per_seq} with "
                f"--max_seq_length={self.max_seq_length}", unreadable)
        if self.dupe_factor < 1:
            bad("dupe_factor", f"must be at least 1, got {self.dupe_factor}")
        if not 0.0 <= self.masked_lm_prob <= 1.0:
            bad("masked_lm_prob", f"must be in [0, 1], got {self.masked_lm_prob}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            bad("short_seq_prob", f"must be in [0, 1], got {self.short_seq_prob}")
        if self.random_seed < 0:
            bad("random_seed", f"must be non-negative, got {self.random_seed}")
        if self.masking not in MASKINGS:
            bad("masking", f"must be one of {', '.join(MASKINGS)}, got {self.masking!r}")
        if self.max_sequences_per_row == 1 or self.max_sequences_per_row < 0:
            bad("max_sequences_per_row", "must be 0 (no packing) or at least 2, got "
                f"{self.max_sequences_per_row}")
        if self.masking == "dynamic" and self.do_whole_word_mask:
            bad("do_whole_word_mask", "dynamic-masking records keep every word start; choose "
                "whole-word masking when training (run_pretraining.py --do_whole_word_mask)")


@dataclasses.dataclass
class PretrainingStats:
    input_files: List[str]
    output_files: List[str]
    input_bytes: int = 0
    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    instances: int = 0
    instances_per_output: List[int] = dataclasses.field(default_factory=list)  # records
    padding_share: float = 0.0        # of the token slots written
    random_next: int = 0
    seconds: dict = dataclasses.field(default_factory=dict)


def derive_shard_seed(random_seed: int, shard_key: Union[str, int]) -> int:
    """A per-shard seed from the global seed and a stable shard key (index or file name).

    Use the shard's index or base name (not an absolute path) so that the output does not
    depend on where the data lives, nor on how shards are spread over processes.
    """
    key = shard_key if isinstance(shard_key, int) else zlib.crc32(str(shard_key).encode("utf-8"))
    seq = np.random.SeedSequence([int(random_seed), int(key) & 0xFFFFFFFF,
                                  0x5EED if isinstance(shard_key, int) else 0x57A7])
    return int(seq.generate_state(1, dtype=np.uint64)[0]) >> 1
