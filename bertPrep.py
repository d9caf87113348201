"""Pre-training and fine-tuning data preparation, with NVIDIA's ``bertPrep.py`` interface.

    python bertPrep.py --action download --dataset wikicorpus_en
    python bertPrep.py --action text_formatting --dataset wikicorpus_en
    python bertPrep.py --action sharding --dataset books_wiki_en_corpus
    python bertPrep.py --action create_tfrecord_files --dataset books_wiki_en_corpus \\
        --max_seq_length 128 --max_predictions_per_seq 20 --vocab_file vocab.txt

Everything is done by ``data_prep.prep_actions`` (see its docstring for the working-dir layout);
this file only defines the flags.  Bad input prints one line ``error: <file>: <problem>`` to
stderr and exits with status 1.
"""
import os
import sys

from absl import app, flags, logging

FLAGS = flags.FLAGS

flags.DEFINE_string("action", None, "download | text_formatting | sharding | "
                    "create_tfrecord_files | create_vocab")
flags.DEFINE_string("dataset", None, "wikicorpus_en | wikicorpus_zh | bookscorpus | "
                    "books_wiki_en_corpus | custom | google_pretrained_weights | squad | "
                    "CoLA | MRPC | SST-2 | STS-B | QQP | MNLI | QNLI | RTE | WNLI")
flags.DEFINE_string("working_dir", None,
                    "Root of all outputs (default: $BERT_PREP_WORKING_DIR).")
# download
flags.DEFINE_string("url", None, "Replaces the dataset's URL: http(s) URL, file:// URL or a "
                    "local path (a dump fetched by hand; required for bookscorpus).")
flags.DEFINE_string("sha256", None, "Expected sha256 of a single-file download.")
flags.DEFINE_integer("download_retries", 5, "Consecutive failed attempts before giving up.")
# text_formatting
flags.DEFINE_list("input", [], "Input file(s)/folder(s) for text_formatting (required for "
                  "--dataset custom; overrides the download folder otherwise).")
flags.DEFINE_enum("custom_document_unit", "block", ["block", "file"],
                  "custom text: a document is a blank-line-separated block, or a whole file.")
flags.DEFINE_bool("wiki_expand_templates", True,
                  "Let wikiextractor expand the templates defined in the dump.")
# sharding
flags.DEFINE_integer("n_training_shards", 256, "Number of training shards.")
flags.DEFINE_integer("n_test_shards", 256, "Number of test shards.")
flags.DEFINE_float("fraction_test_set", 0.1, "Fraction of documents in the test shards.")
flags.DEFINE_enum("sentence_splitter", "auto", ["auto", "blingfire", "rules"],
                  "Sentence segmentation (auto: blingfire when it loads, else rules).")
flags.DEFINE_integer("sharding_seed", 12345, "Seed of the train/test split.")
flags.DEFINE_integer("n_processes", os.cpu_count() or 1,
                     "Worker processes (wikiextractor, sharding, create_tfrecord_files).")
# vocabulary
flags.DEFINE_string("vocab_file", None, "WordPiece vocab (default: the one create_vocab wrote "
                    "for this dataset).")
flags.DEFINE_integer("vocab_size", 30522, "create_vocab: vocabulary size.")
# create_tfrecord_files (strings for the booleans: NVIDIA's scripts pass "--do_lower_case 1")
flags.DEFINE_string("do_lower_case", "1", "1/0 (or true/false): lower-case the text.")
flags.DEFINE_string("do_whole_word_mask", "0", "1/0 (or true/false): mask whole words.")
flags.DEFINE_integer("max_seq_length", 512, "Maximum sequence length.")
flags.DEFINE_integer("max_predictions_per_seq", 80, "Maximum masked tokens per sequence.")
flags.DEFINE_float("masked_lm_prob", 0.15, "Masked LM probability.")
flags.DEFINE_float("short_seq_prob", 0.1, "Probability of a shorter target sequence.")
flags.DEFINE_integer("random_seed", 12345, "Seed of pre-training data generation.")
flags.DEFINE_integer("dupe_factor", 5, "Passes over the data with different masks.")
flags.DEFINE_enum("masking", "static", ["static", "dynamic"],
                  "static: masked records (Google's); dynamic: unmasked records masked anew at "
                  "every read by run_pretraining.py (use --dupe_factor 1).")
flags.DEFINE_bool("pack", False, "Sequence packing: rows of up to --max_sequences_per_row "
                  "whole instances (less padding), in a `..._packed_<k>` folder.")
flags.DEFINE_integer("max_sequences_per_row", 3, "With --pack: instances per row at most.")


def _truth(flag: str, value: str) -> bool:
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "yes"):
        return True
    if lowered in ("0", "false", "no"):
        return False
    print(f"error: --{flag}: expected 1/0 or true/false, got {value!r}", file=sys.stderr)
    sys.exit(1)


def main(argv):
    if len(argv) > 1:
        print(f"error: {argv[1]}: unexpected argument", file=sys.stderr)
        return 1
    # Per-shard progress is reported by prep_actions; keep absl's INFO chatter out of it.
    logging.set_verbosity(logging.WARNING)
    from data_prep import prep_actions
    options = prep_actions.PrepOptions(
        action=FLAGS.action or "", dataset=FLAGS.dataset or "", working_dir=FLAGS.working_dir,
        url=FLAGS.url, sha256=FLAGS.sha256, input=FLAGS.input,
        custom_document_unit=FLAGS.custom_document_unit,
        wiki_expand_templates=FLAGS.wiki_expand_templates,
        n_training_shards=FLAGS.n_training_shards, n_test_shards=FLAGS.n_test_shards,
        fraction_test_set=FLAGS.fraction_test_set, sentence_splitter=FLAGS.sentence_splitter,
        sharding_seed=FLAGS.sharding_seed, n_processes=FLAGS.n_processes,
        vocab_file=FLAGS.vocab_file, vocab_size=FLAGS.vocab_size,
        do_lower_case=_truth("do_lower_case", FLAGS.do_lower_case),
        max_seq_length=FLAGS.max_seq_length,
        max_predictions_per_seq=FLAGS.max_predictions_per_seq,
        masked_lm_prob=FLAGS.masked_lm_prob, short_seq_prob=FLAGS.short_seq_prob,
        random_seed=FLAGS.random_seed, dupe_factor=FLAGS.dupe_factor,
        do_whole_word_mask=_truth("do_whole_word_mask", FLAGS.do_whole_word_mask),
        masking=FLAGS.masking,
        max_sequences_per_row=FLAGS.max_sequences_per_row if FLAGS.pack else 0,
        download_retries=FLAGS.download_retries)
    return prep_actions.run_cli(options)


if __name__ == "__main__":
    app.run(main)
