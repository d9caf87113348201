"""Creates masked-LM / next-sentence-prediction pre-training data as TFRecord files.

    bert-create-pretraining-data --input_file=shard.txt --output_file=shard.tfrecord \\
        --vocab_file=vocab.txt --max_seq_length=128 --max_predictions_per_seq=20
    (or: python create_pretraining_data.py ...)

Same flags, input format and output records as Google's `create_pretraining_data.py`;
the work is done by `data_prep.instances.pretraining_data.create_pretraining_tfrecords`. Like
Google's, it prints the first instances and the counts it read and wrote.

Input: plain text, one sentence per line, a blank line between documents.
Bad input or output (missing or empty input, invalid UTF-8, missing vocab, unwritable
output) prints one line `error: <file>: <problem>` to stderr and exits with status 1;
no record file is left under the output name. Settings whose records no run could read
(`--max_predictions_per_seq` above `--max_seq_length`) are refused as the flags are parsed.
"""
import logging
import sys

from cli.command import Command
from cli.flag_groups import INPUT, OUTPUT, PRECISION, bind
from cli.record_flags import register_record_checks
from runtime.threads import available_cpus


def define_flags(flag_values):
    f = bind(flag_values, INPUT)
    f.DEFINE_string("input_file", None,
                    "Input raw text file (or comma-separated list of files; globs allowed).")
    f.DEFINE_string("vocab_file", None,
                    "The vocabulary file that the BERT model was trained on.")
    f.DEFINE_bool("do_lower_case", True,
                  "Whether to lower case the input text. Should be True for uncased "
                  "models and False for cased models.")
    f = bind(flag_values, "Instances")
    f.DEFINE_bool("do_whole_word_mask", False,
                  "Whether to use whole word masking rather than per-WordPiece masking.")
    f.DEFINE_integer("max_seq_length", 128, "Maximum sequence length.")
    f.DEFINE_integer("max_predictions_per_seq", 20,
                     "Maximum number of masked LM predictions per sequence.")
    f.DEFINE_integer("random_seed", 12345, "Random seed for data generation.")
    f.DEFINE_integer("dupe_factor", 10,
                     "Number of times to duplicate the input data (with different masks).")
    f.DEFINE_float("masked_lm_prob", 0.15, "Masked LM probability.")
    f.DEFINE_float("short_seq_prob", 0.1,
                   "Probability of creating sequences which are shorter than the "
                   "maximum length.")
    f.DEFINE_enum("masking", "static", ["static", "dynamic"],
                  "static: Google's records, masked here (a new choice per --dupe_factor pass). "
                  "dynamic: unmasked records, masked anew at every read by run_pretraining.py "
                  "(RoBERTa's dynamic masking; --dupe_factor 1 is then enough, and "
                  "--masked_lm_prob/--max_predictions_per_seq/--do_whole_word_mask are "
                  "run_pretraining.py's).")
    f.DEFINE_bool("pack", False,
                  "Sequence packing: write rows of up to --max_sequences_per_row whole "
                  "instances each (less padding; run_pretraining.py keeps them apart).")
    f.DEFINE_integer("max_sequences_per_row", 3, "With --pack: instances per row at most.")
    bind(flag_values, PRECISION).DEFINE_integer(
        "n_processes", available_cpus(),
        "Processes that tokenize the input and build and serialise the records (the output is "
        "the same for any number); default: the CPUs this process may use (affinity, cgroup "
        "quota).")
    bind(flag_values, OUTPUT).DEFINE_string(
        "output_file", None, "Output TF example file (or comma-separated list of files).")
    register_record_checks(flag_values)  # settings no run can read: refused as parsed


def main(flags):
    from data_prep.errors import DataPrepError
    from data_prep.instances.pretraining_data import create_pretraining_tfrecords
    from data_prep.instances.pretraining_data_options import PretrainingDataOptions
    options = PretrainingDataOptions(
        max_seq_length=flags.max_seq_length,
        max_predictions_per_seq=flags.max_predictions_per_seq,
        random_seed=flags.random_seed,
        dupe_factor=flags.dupe_factor,
        masked_lm_prob=flags.masked_lm_prob,
        short_seq_prob=flags.short_seq_prob,
        do_whole_word_mask=flags.do_whole_word_mask,
        do_lower_case=flags.do_lower_case,
        masking=flags.masking,
        max_sequences_per_row=flags.max_sequences_per_row if flags.pack else 0)
    try:
        create_pretraining_tfrecords(
            flags.input_file, flags.output_file, flags.vocab_file, options,
            processes=flags.n_processes)
    except DataPrepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


COMMAND = Command("create_pretraining_data", __doc__, define_flags, main,
                  required=("input_file", "output_file", "vocab_file"),
                  console_level=logging.INFO, exit_without_teardown=True,
                  interrupted_note="no output file is left half-written (each is written to "
                                   "a temporary, renamed when whole); rerun the command")
