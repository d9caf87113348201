"""Creates masked-LM / next-sentence-prediction pre-training data as TFRecord files.

Same flags, input format and output records as Google's ``create_pretraining_data.py``
(plus ``--masking=dynamic``: unmasked records for on-the-fly masking, see
``data_prep.unmasked_instances``);
the work is done by ``data_prep.pretraining_data.create_pretraining_tfrecords``.

Input: plain text, one sentence per line, a blank line between documents.
Bad input or output (missing or empty input, invalid UTF-8, missing vocab, unwritable
output) prints one line ``error: <file>: <problem>`` to stderr and exits with status 1;
no record file is left under the output name.
"""
import sys

from absl import app, flags, logging

from data_prep import pretraining_data

FLAGS = flags.FLAGS

flags.DEFINE_string("input_file", None,
                    "Input raw text file (or comma-separated list of files; globs allowed).")
flags.DEFINE_string("output_file", None,
                    "Output TF example file (or comma-separated list of files).")
flags.DEFINE_string("vocab_file", None,
                    "The vocabulary file that the BERT model was trained on.")
flags.DEFINE_bool("do_lower_case", True,
                  "Whether to lower case the input text. Should be True for uncased "
                  "models and False for cased models.")
flags.DEFINE_bool("do_whole_word_mask", False,
                  "Whether to use whole word masking rather than per-WordPiece masking.")
flags.DEFINE_integer("max_seq_length", 128, "Maximum sequence length.")
flags.DEFINE_integer("max_predictions_per_seq", 20,
                     "Maximum number of masked LM predictions per sequence.")
flags.DEFINE_integer("random_seed", 12345, "Random seed for data generation.")
flags.DEFINE_integer("dupe_factor", 10,
                     "Number of times to duplicate the input data (with different masks).")
flags.DEFINE_float("masked_lm_prob", 0.15, "Masked LM probability.")
flags.DEFINE_float("short_seq_prob", 0.1,
                   "Probability of creating sequences which are shorter than the "
                   "maximum length.")
flags.DEFINE_enum("masking", "static", ["static", "dynamic"],
                  "static: Google's records, masked here (a new choice per --dupe_factor pass). "
                  "dynamic: unmasked records, masked anew at every read by run_pretraining.py "
                  "(RoBERTa's dynamic masking; --dupe_factor 1 is then enough, and "
                  "--masked_lm_prob/--max_predictions_per_seq/--do_whole_word_mask are "
                  "run_pretraining.py's).")
flags.DEFINE_bool("pack", False,
                  "Sequence packing: write rows of up to --max_sequences_per_row whole "
                  "instances each (less padding; run_pretraining.py keeps them apart).")
flags.DEFINE_integer("max_sequences_per_row", 3, "With --pack: instances per row at most.")


def main(_):
    logging.set_verbosity(logging.INFO)
    options = pretraining_data.PretrainingOptions(
        max_seq_length=FLAGS.max_seq_length,
        max_predictions_per_seq=FLAGS.max_predictions_per_seq,
        random_seed=FLAGS.random_seed,
        dupe_factor=FLAGS.dupe_factor,
        masked_lm_prob=FLAGS.masked_lm_prob,
        short_seq_prob=FLAGS.short_seq_prob,
        do_whole_word_mask=FLAGS.do_whole_word_mask,
        do_lower_case=FLAGS.do_lower_case,
        masking=FLAGS.masking,
        max_sequences_per_row=FLAGS.max_sequences_per_row if FLAGS.pack else 0)
    try:
        pretraining_data.create_pretraining_tfrecords(
            FLAGS.input_file, FLAGS.output_file, FLAGS.vocab_file, options)
    except pretraining_data.DataPrepError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    flags.mark_flag_as_required("input_file")
    flags.mark_flag_as_required("output_file")
    flags.mark_flag_as_required("vocab_file")
    app.run(main)
