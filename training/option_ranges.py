"""The allowed range of every numeric option of every command: one table for all commands,
checked when a command line is parsed (`cli.flag_ranges` registers it with absl) and again by
the drivers for values set in-process (`out_of_range`), so a value is refused before anything
is read or written.

A value outside its range used to be taken on trust somewhere: `--learning_rate=-1` trained
backwards, `--num_train_epochs=0` ran one step, `--save_checkpoints_steps=0` trained and saved
nothing, a zero batch size ended in `ZeroDivisionError` after a step-0 checkpoint was written.
Each flag name means one thing in every command, so its range is stated once here;
`Command.run` registers a validator for every numeric flag the command defines, and a numeric
flag missing from this table is a programming error (`tests/test_flag_ranges.py` checks every
command). The table lives below the jobs, not with the flags, because the drivers check it
too. Library functions keep their own checks for callers that do not come through a
command line; this table is what the user meets first, in one line:
`error: flag --learning_rate=-1.0: must be > 0 (--help lists the flags)`.
"""
import dataclasses
import math
from typing import Optional, Tuple

from modeling.config import MAX_POSITION_EMBEDDINGS, SIZE_LIMITS


@dataclasses.dataclass(frozen=True)
class Range:
    """Numbers `low <= value <= high` (strict where `*_open`), or one of `also`; None (a flag
    left unset where its default is None) is always allowed. NaN and infinities never are."""
    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    also: Tuple[float, ...] = ()

    def allows(self, value):
        if value is None or value in self.also:
            return True
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.high is not None and (value >= self.high if self.high_open
                                      else value > self.high):
            return False
        return True

    def describe(self):
        if self.low is not None and self.high is not None:
            text = (f"in {'(' if self.low_open else '['}{_number(self.low)}, "
                    f"{_number(self.high)}{')' if self.high_open else ']'}")
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {_number(self.low)}"
        elif self.high is not None:
            text = f"{'<' if self.high_open else '<='} {_number(self.high)}"
        else:
            text = "a finite number"
        if self.also:
            return " or ".join(_number(value) for value in self.also) + f", or {text}"
        return text


def _number(value):
    return str(int(value)) if float(value).is_integer() else str(value)


POSITIVE = Range(low=0, low_open=True)
AT_LEAST_1 = Range(low=1)
NON_NEGATIVE = Range(low=0)
PROBABILITY = Range(low=0, high=1)
FINITE = Range()
SEED = Range(low=0, high=2**32 - 1)  # numpy's and TensorFlow's seeds

RANGES = {
    # sizes of sequences and batches
    # [CLS] A [SEP] B [SEP] and one token each; at most the largest position table a config
    # may hold (modeling.config): longer records fit no model, and cost gigabytes of padding
    "max_seq_length": Range(low=5, high=MAX_POSITION_EMBEDDINGS),
    "max_predictions_per_seq": AT_LEAST_1,
    "max_query_length": AT_LEAST_1,
    "max_answer_length": AT_LEAST_1,
    "doc_stride": AT_LEAST_1,
    "n_best_size": AT_LEAST_1,
    "train_batch_size": AT_LEAST_1,
    "train_batch_size_phase2": AT_LEAST_1,
    "eval_batch_size": AT_LEAST_1,
    "predict_batch_size": AT_LEAST_1,
    "batch_size": AT_LEAST_1,
    "num_accumulation_steps": AT_LEAST_1,
    # schedule and optimizer
    "learning_rate": POSITIVE,
    "weight_decay_rate": NON_NEGATIVE,
    "num_train_steps": AT_LEAST_1,
    "num_train_epochs": POSITIVE,
    "num_warmup_steps": NON_NEGATIVE,
    "warmup_proportion": Range(low=0, high=1, high_open=True),
    "init_loss_scale": Range(low=1),
    "max_consecutive_skips": AT_LEAST_1,
    "phase": Range(low=1, high=2),
    "phase1_steps": AT_LEAST_1,
    "phase2_steps": AT_LEAST_1,
    # the preflight's convergence check: 0 none, else enough steps to average its ends over
    "loss_steps": Range(low=20, also=(0,)),
    # checkpoints, evaluation, logging
    "save_checkpoints_steps": AT_LEAST_1,
    "keep_checkpoint_max": AT_LEAST_1,
    "display_loss_steps": AT_LEAST_1,
    "max_eval_steps": AT_LEAST_1,
    "num_eval_iterations": AT_LEAST_1,
    "iterations_per_loop": AT_LEAST_1,
    "null_score_diff_threshold": FINITE,
    # machines and input
    "dry_run_ranks": AT_LEAST_1,
    "num_local_devices": AT_LEAST_1,
    "peak_tflops": NON_NEGATIVE,  # 0: not known
    "shuffle_buffer": AT_LEAST_1,
    "max_bad_records": NON_NEGATIVE,
    "n_processes": AT_LEAST_1,
    "download_retries": NON_NEGATIVE,
    # data preparation
    "masked_lm_prob": Range(low=0, high=1, low_open=True),
    "short_seq_prob": PROBABILITY,
    "dupe_factor": AT_LEAST_1,
    "max_sequences_per_row": Range(low=2, also=(0,)),  # 0: no packing
    "n_training_shards": AT_LEAST_1,
    "n_test_shards": NON_NEGATIVE,
    "fraction_test_set": Range(low=0, high=1, high_open=True),
    # room for the special tokens and a few pieces; no config can hold more (int32 ids)
    "vocab_size": Range(low=10, high=SIZE_LIMITS["vocab_size"][1]),
    # serving
    "triton_model_version": AT_LEAST_1,
    "triton_max_batch_size": AT_LEAST_1,
    "triton_dyn_batching_delay": NON_NEGATIVE,
    "triton_engine_count": AT_LEAST_1,
    # seeds
    "seed": SEED,
    "random_seed": SEED,
    "sharding_seed": SEED,
}


def out_of_range(options):
    """`--name=value: must be ...` for the first numeric option of `options` (a job's options,
    `training.options.RunOptions`, or a plain namespace) whose value is outside its range, or
    None. For values set without parsing (a caller that builds them in-process, where no
    validator runs): the same table, the same words."""
    for name, value in vars(options).items():
        allowed = RANGES.get(name)
        if allowed is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not allowed.allows(value):
            return f"--{name}={value}: must be {allowed.describe()}"
    return None
