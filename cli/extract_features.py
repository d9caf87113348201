"""Extract per-token BERT embeddings (Google's `extract_features.py` flags and JSON output).

    bert-extract-features --input_file=in.txt --output_file=out.jsonl \\
        --vocab_file=vocab.txt --bert_config_file=bert_config.json \\
        --init_checkpoint=bert_model.ckpt --layers=-1,-2,-3,-4 --max_seq_length=128
    (or: python extract_features.py ...)
"""
import sys

from cli.command import Command
from cli.flag_groups import INPUT, MODEL, OUTPUT, PRECISION, binders


def define_flags(flag_values):
    inp, model, speed, out = binders(flag_values, INPUT, MODEL, PRECISION, OUTPUT)
    inp.DEFINE_string("input_file", None, "Text, one `text_a [||| text_b]` example a line.")
    inp.DEFINE_string("vocab_file", None, "WordPiece vocab.txt or SentencePiece .model.")
    inp.DEFINE_bool("do_lower_case", True, "Lower-case and strip accents (uncased models).")
    inp.DEFINE_integer("max_seq_length", 128, "Sequences are truncated/padded to this length.")
    model.DEFINE_string("bert_config_file", None, "bert_config.json of the checkpoint.")
    model.DEFINE_string("init_checkpoint", None, "Checkpoint (prefix or directory).")
    model.DEFINE_string("layers", "-1,-2,-3,-4",
                        "Comma-separated encoder layer indexes to write (-1: the last).")
    speed.DEFINE_integer("batch_size", 32, "Examples per forward pass.")
    speed.DEFINE_enum("compute_type", "float32", ["float32", "float16", "bfloat16"],
                      "Compute precision of the encoder.")
    speed.DEFINE_bool("use_one_hot_embeddings", False,
                      "Accepted for Google compatibility (no effect).")
    out.DEFINE_string("output_file", None, "JSON lines written here (Google's format).")


def main(flags):
    from data_prep.wordpiece.tokenization import (FullTokenizer, VocabError,
                                                  validate_case_matches_checkpoint)
    from modeling import BertConfig, ConfigError
    from modeling.checkpoints import CheckpointError
    from modeling.feature_extraction import extract_features
    from training.model_memory import check_model_fits
    from training.vocab_fit import check_vocab_fits
    try:
        config = BertConfig.from_json_file(flags.bert_config_file)
        check_model_fits(config, flags.bert_config_file, training=False)
        tokenizer = FullTokenizer(flags.vocab_file, flags.do_lower_case)
        # before the model is built or a line written
        check_vocab_fits(tokenizer, config.vocab_size, flags.bert_config_file)
        validate_case_matches_checkpoint(flags.do_lower_case, flags.init_checkpoint)
        layers = [int(x) for x in flags.layers.split(",")]
        count = extract_features(config, flags.init_checkpoint, tokenizer, flags.input_file,
                                 flags.output_file, layers, flags.max_seq_length,
                                 flags.batch_size, flags.compute_type)
    except (ConfigError, VocabError, CheckpointError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {count} examples to {flags.output_file}")
    return 0


COMMAND = Command("extract_features", __doc__, define_flags, main,
                  required=("input_file", "output_file", "bert_config_file", "init_checkpoint",
                            "vocab_file"))
