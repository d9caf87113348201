"""The two kinds of pre-training records, told apart by their features, and the start-up
check that the input files hold one kind, matching the flags.

* static: Google's records (and ours by default), masked when written: `input_ids` with
  [MASK]s, `masked_lm_positions`, `masked_lm_ids`, `masked_lm_weights`.
* dynamic: `create_pretraining_data.py --masking=dynamic`
  (`data_prep.instances.unmasked_instances`): unmasked, with `word_starts` and `masking_vocab`; the
  input pipeline masks them at every read (`pretraining.dynamic_masking`).

Orthogonal to the kind: packed records (`create_pretraining_data.py --pack`,
`data_prep.instances.packing`) hold up to k instances a row, with `instance_ids`, `position_ids` and
k next-sentence slots; k (`sequences_per_row`) is read from the records, and every file of
a run must have the same.

The check reads the first record of every file (one small read each), so a folder that mixes
the kinds, sequence lengths or vocabularies fails at start-up, naming the file, instead of
in the middle of training. What must agree with the flags depends on the kind: static
records fix --max_predictions_per_seq and the masking, so --masked_lm_prob and
--do_whole_word_mask are refused with them; dynamic records take both from the flags, and
their vocabulary must fit the model's embedding table (config vocab_size, checked by
`training.vocab_fit` as every command checks its vocabulary).
"""
import dataclasses
from typing import Optional, Tuple

from data_prep.instances.unmasked_instances import MASKING_VOCAB, MASKING_VOCAB_FIELDS, WORD_STARTS
from pretraining.input_errors import InputError
from training.vocab_fit import vocab_fit_problem

STATIC, DYNAMIC = "static", "dynamic"
STATIC_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                   "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")
DYNAMIC_FEATURES = ("input_ids", "input_mask", "segment_ids", "next_sentence_labels",
                    WORD_STARTS, MASKING_VOCAB)
PACKED_FEATURES = ("instance_ids", "position_ids", "next_sentence_positions",
                   "next_sentence_labels", "next_sentence_weights")
# run_pretraining.py flags that only dynamic-masking records can honour.
DYNAMIC_ONLY_FLAGS = ("masked_lm_prob", "do_whole_word_mask")


def given_dynamic_flags(options):
    """The DYNAMIC_ONLY_FLAGS set on the command line (not None), as `--name=value`."""
    return [f"--{name}={getattr(options, name)}" for name in DYNAMIC_ONLY_FLAGS
            if getattr(options, name) is not None]


@dataclasses.dataclass(frozen=True)
class RecordFacts:
    """What a file's first record says about the file."""
    path: str
    kind: str
    seq_length: int
    predictions: Optional[int] = None         # static
    masking_vocab: Optional[Tuple[int, ...]] = None  # dynamic: MASKING_VOCAB_FIELDS
    sequences_per_row: int = 0                       # packed rows: k; 0 unpacked

    def describe(self):
        kind = ("static (masked) records" if self.kind == STATIC
                else "dynamic-masking (unmasked) records")
        if self.sequences_per_row:
            return f"{kind} packed {self.sequences_per_row} a row"
        return kind


def record_facts(path, example):
    """RecordFacts of `example` (a tf.train.Example) read from `path`; InputError when it
    is not a pre-training record."""
    features = example.features.feature
    kind = STATIC if "masked_lm_positions" in features or WORD_STARTS not in features \
        else DYNAMIC
    names = STATIC_FEATURES if kind == STATIC else DYNAMIC_FEATURES
    missing = [name for name in names if name not in features]
    if missing:
        raise InputError(f"{path}: not a pre-training record (no feature {missing[0]!r})")
    seq = len(features["input_ids"].int64_list.value)
    per_row = _sequences_per_row(path, features)
    if kind == STATIC:
        return RecordFacts(path, kind, seq,
                           predictions=len(features["masked_lm_positions"].int64_list.value),
                           sequences_per_row=per_row)
    vocab = tuple(features[MASKING_VOCAB].int64_list.value)
    if len(vocab) != len(MASKING_VOCAB_FIELDS):
        raise InputError(f"{path}: {MASKING_VOCAB} has {len(vocab)} values, expected "
                         f"{len(MASKING_VOCAB_FIELDS)} ({', '.join(MASKING_VOCAB_FIELDS)})")
    return RecordFacts(path, kind, seq, masking_vocab=vocab, sequences_per_row=per_row)


def _sequences_per_row(path, features):
    """k of packed records (the number of next-sentence slots), 0 for unpacked ones."""
    if "instance_ids" not in features:
        return 0
    missing = [name for name in PACKED_FEATURES if name not in features]
    if missing:
        raise InputError(f"{path}: packed record without feature {missing[0]!r}")
    return len(features["next_sentence_positions"].int64_list.value)


def check_kinds(facts, max_seq_length, max_predictions_per_seq, config=None,
                dynamic_flags=()):
    """Checks the RecordFacts of a set of files (non-empty list) against each other and the
    flags; returns the first (their kind and packing are every file's). `config`: the
    model's `BertConfig`, whose vocab_size dynamic records' vocabulary must fit
    (`training.vocab_fit`). `dynamic_flags`: the DYNAMIC_ONLY_FLAGS given on the command
    line, as `--name=value`, refused with static records."""
    first = facts[0]
    for fact in facts:
        if fact.kind != first.kind or fact.sequences_per_row != first.sequences_per_row:
            raise InputError(f"{fact.path}: {fact.describe()}, but {first.path} holds "
                             f"{first.describe()}; use one kind per run")
        if fact.seq_length != max_seq_length:
            raise InputError(f"{fact.path}: records have sequence length {fact.seq_length} "
                             f"but --max_seq_length={max_seq_length}")
        if fact.kind == STATIC and fact.predictions != max_predictions_per_seq:
            raise InputError(f"{fact.path}: records have {fact.predictions} masked-LM "
                             f"predictions but --max_predictions_per_seq="
                             f"{max_predictions_per_seq}")
        if fact.masking_vocab != first.masking_vocab:
            raise InputError(f"{fact.path}: written with another vocabulary than {first.path} "
                             f"({MASKING_VOCAB} {list(fact.masking_vocab)} vs "
                             f"{list(first.masking_vocab)})")
    if first.kind == STATIC and dynamic_flags:
        raise InputError(f"{first.path}: {first.describe()} are masked already; "
                         f"{dynamic_flags[0]} applies only to records written with "
                         "create_pretraining_data.py --masking=dynamic")
    if first.kind == DYNAMIC:
        _check_masking_vocab(first, config)
    return first


def _check_masking_vocab(fact, config):
    size, *special = fact.masking_vocab
    if not all(0 <= token < size for token in special):
        raise InputError(f"{fact.path}: {MASKING_VOCAB} {list(fact.masking_vocab)} has a "
                         f"special token id outside its vocabulary of {size}")
    problem = config and vocab_fit_problem(size, fact.path, config.vocab_size, config.source,
                                           "records made with a vocabulary of")
    if problem:
        raise InputError(problem)
