"""Pre-training and fine-tuning data preparation, with NVIDIA's `bertPrep.py` interface.

    bert-prep --action download --dataset wikicorpus_en          (or: python bertPrep.py ...)
    bert-prep --action text_formatting --dataset wikicorpus_en
    bert-prep --action sharding --dataset books_wiki_en_corpus
    bert-prep --action create_tfrecord_files --dataset books_wiki_en_corpus \\
        --max_seq_length 128 --max_predictions_per_seq 20 --vocab_file vocab.txt

Each action reads what the previous one wrote under the working dir (layout: the docstring
of data_prep/bertprep/prep_layout.py) and shows its progress (shards, documents, MB) with an ETA.
Bad input prints one line `error: <file>: <problem>` to stderr and exits with status 1.
The log file is <working_dir>/bertPrep.log.
"""
import os
import sys

from cli.command import Command
from cli.flag_groups import INPUT, OUTPUT, PRECISION, bind
from cli.record_flags import register_record_checks


def define_flags(flag_values):
    f = bind(flag_values, "Action")
    f.DEFINE_string("action", None, "What to do: download | text_formatting | sharding | "
                    "create_tfrecord_files | create_vocab (in this order for a corpus).")
    f.DEFINE_string("dataset", None, "wikicorpus_en | wikicorpus_zh | bookscorpus | "
                    "books_wiki_en_corpus | custom | a union such as "
                    "wikicorpus_en+bookscorpus+custom | google_pretrained_weights | "
                    "nvidia_pretrained_weights | squad | CoLA | MRPC | SST-2 | STS-B | QQP | "
                    "MNLI | QNLI | RTE | WNLI | all (download only). Case does not matter "
                    "(NVIDIA's mrpc, sst-2).")
    f = bind(flag_values, OUTPUT)
    f.DEFINE_string("working_dir", None,
                    "Root of all outputs (default: $BERT_PREP_WORKING_DIR).")
    f = bind(flag_values, INPUT)
    f.DEFINE_string("url", None, "download: replaces the dataset's URL: http(s) URL, file:// "
                    "URL or a local path (a dump fetched by hand; required for bookscorpus).")
    f.DEFINE_string("sha256", None, "download: expected sha256 of a single-file download.")
    f.DEFINE_integer("download_retries", 5,
                     "download: consecutive failed attempts before giving up.")
    f.DEFINE_list("input", [], "text_formatting: input file(s)/folder(s) (required for "
                  "--dataset custom; overrides the download folder otherwise).")
    f.DEFINE_list("input_files", [], "NVIDIA's name of --input (comma-separated, no spaces).")
    f.DEFINE_enum("custom_document_unit", "block", ["block", "file"],
                  "text_formatting of custom text: a document is a blank-line-separated "
                  "block, or a whole file.")
    f.DEFINE_bool("wiki_expand_templates", True,
                  "text_formatting: let wikiextractor expand the templates defined in the dump.")
    f = bind(flag_values, "Sharding")
    f.DEFINE_integer("n_training_shards", 1472, "Number of training shards (NVIDIA's "
                     "default).")
    f.DEFINE_integer("n_test_shards", 1472, "Number of test shards (NVIDIA's default).")
    f.DEFINE_float("fraction_test_set", 0.1, "Fraction of documents in the test shards.")
    f.DEFINE_enum("sentence_splitter", "auto", ["auto", "blingfire", "rules"],
                  "Sentence segmentation (auto: blingfire when it loads, else rules).")
    f.DEFINE_integer("sharding_seed", 12345, "Seed of the train/test split.")
    f = bind(flag_values, "Vocabulary")
    f.DEFINE_string("vocab_file", None, "WordPiece vocab for create_tfrecord_files (default: "
                    "the one create_vocab wrote for this dataset).")
    f.DEFINE_integer("vocab_size", 30522, "create_vocab: vocabulary size.")
    # Strings for the booleans: NVIDIA's scripts pass "--do_lower_case 1".
    f.DEFINE_string("do_lower_case", "1", "1/0 (or true/false): lower-case the text.")
    f = bind(flag_values, "TFRecords (create_tfrecord_files)")
    f.DEFINE_string("do_whole_word_mask", "0", "1/0 (or true/false): mask whole words.")
    f.DEFINE_integer("max_seq_length", 512, "Maximum sequence length.")
    f.DEFINE_integer("max_predictions_per_seq", 20, "Maximum masked tokens per sequence "
                     "(NVIDIA's default: 20, for --max_seq_length 128; pass 80 for 512).")
    f.DEFINE_float("masked_lm_prob", 0.15, "Masked LM probability.")
    f.DEFINE_float("short_seq_prob", 0.1, "Probability of a shorter target sequence.")
    f.DEFINE_integer("random_seed", 12345, "Seed of pre-training data generation.")
    f.DEFINE_integer("dupe_factor", 5, "Passes over the data with different masks.")
    f.DEFINE_enum("masking", "static", ["static", "dynamic"],
                  "static: masked records (Google's); dynamic: unmasked records masked anew at "
                  "every read by run_pretraining.py (use --dupe_factor 1).")
    f.DEFINE_bool("pack", False, "Sequence packing: rows of up to --max_sequences_per_row "
                  "whole instances (less padding), in a `..._packed_<k>` folder.")
    f.DEFINE_integer("max_sequences_per_row", 3, "With --pack: instances per row at most.")
    # settings whose records no run can read: refused as parsed, before the working dir's log
    register_record_checks(flag_values, action="create_tfrecord_files")
    bind(flag_values, PRECISION).DEFINE_integer(
        "n_processes", os.cpu_count() or 1,
        "Worker processes (wikiextractor, sharding, create_tfrecord_files); with --hosts, "
        "the Dask workers of each host given without ':workers'.")
    f = bind(flag_values, "Across machines (docs/data_preparation.md)")
    f.DEFINE_string("dask_scheduler", None,
                    "text_formatting, sharding and create_tfrecord_files run on the workers "
                    "of this running Dask cluster: its address (tcp://node1:8786) or its "
                    "scheduler file "
                    "(dask scheduler --scheduler-file F; scripts/prep.sub starts one under "
                    "Slurm). Same bytes as one machine.")
    f.DEFINE_list("hosts", [],
                  "host:workers,... (as horovodrun -H): start Dask workers on these hosts over "
                  "ssh for text_formatting, sharding and create_tfrecord_files, and stop them "
                  "at the end. Every host must see --working_dir at the same path.")


def _truth(flag: str, value: str) -> bool:
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "yes"):
        return True
    if lowered in ("0", "false", "no"):
        return False
    print(f"error: --{flag}: expected 1/0 or true/false, got {value!r}", file=sys.stderr)
    sys.exit(1)


def _inputs(flags):
    """--input and NVIDIA's --input_files, one list (both may be given)."""
    return tuple(flags.input) + tuple(flags.input_files)


def main(flags):
    from data_prep.bertprep import prep_actions
    from data_prep.bertprep.prep_layout import PrepOptions
    options = PrepOptions(
        action=flags.action or "", dataset=flags.dataset or "", working_dir=flags.working_dir,
        url=flags.url, sha256=flags.sha256, input=_inputs(flags),
        custom_document_unit=flags.custom_document_unit,
        wiki_expand_templates=flags.wiki_expand_templates,
        n_training_shards=flags.n_training_shards, n_test_shards=flags.n_test_shards,
        fraction_test_set=flags.fraction_test_set, sentence_splitter=flags.sentence_splitter,
        sharding_seed=flags.sharding_seed, n_processes=flags.n_processes,
        dask_scheduler=flags.dask_scheduler or "", hosts=tuple(flags.hosts),
        vocab_file=flags.vocab_file, vocab_size=flags.vocab_size,
        do_lower_case=_truth("do_lower_case", flags.do_lower_case),
        max_seq_length=flags.max_seq_length,
        max_predictions_per_seq=flags.max_predictions_per_seq,
        masked_lm_prob=flags.masked_lm_prob, short_seq_prob=flags.short_seq_prob,
        random_seed=flags.random_seed, dupe_factor=flags.dupe_factor,
        do_whole_word_mask=_truth("do_whole_word_mask", flags.do_whole_word_mask),
        masking=flags.masking,
        max_sequences_per_row=flags.max_sequences_per_row if flags.pack else 0,
        download_retries=flags.download_retries)
    return prep_actions.run_cli(options)


def _log_folder(flags):
    from data_prep.bertprep.prep_layout import WORKING_DIR_ENV
    return flags.working_dir or os.environ.get(WORKING_DIR_ENV)


COMMAND = Command("bertPrep", __doc__, define_flags, main, log_folder=_log_folder)
