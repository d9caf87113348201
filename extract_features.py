"""Extract per-token BERT embeddings (Google's `extract_features.py` flags and JSON output).

    python extract_features.py --input_file=in.txt --output_file=out.jsonl \
        --vocab_file=vocab.txt --bert_config_file=bert_config.json \
        --init_checkpoint=bert_model.ckpt --layers=-1,-2,-3,-4 --max_seq_length=128
"""
import sys

from absl import app, flags

flags.DEFINE_string("input_file", None, "Text, one `text_a [||| text_b]` example a line.")
flags.DEFINE_string("output_file", None, "JSON lines written here.")
flags.DEFINE_string("layers", "-1,-2,-3,-4", "Comma-separated encoder layer indexes.")
flags.DEFINE_string("bert_config_file", None, "bert_config.json of the checkpoint.")
flags.DEFINE_integer("max_seq_length", 128, "Sequences are truncated/padded to this length.")
flags.DEFINE_string("init_checkpoint", None, "Checkpoint (prefix or directory).")
flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt or SentencePiece .model.")
flags.DEFINE_bool("do_lower_case", True, "Lower-case and strip accents (uncased models).")
flags.DEFINE_integer("batch_size", 32, "Examples per forward pass.")
flags.DEFINE_enum("compute_type", "float32", ["float32", "float16", "bfloat16"],
                  "Compute precision of the encoder.")
flags.DEFINE_bool("use_one_hot_embeddings", False, "Accepted for Google compatibility.")
FLAGS = flags.FLAGS


def main(_):
    from data_prep.tokenization import FullTokenizer, VocabError
    from modeling import BertConfig, ConfigError
    from modeling.checkpoints import CheckpointError
    from modeling.feature_extraction import extract_features
    try:
        config = BertConfig.from_json_file(FLAGS.bert_config_file)
        tokenizer = FullTokenizer(FLAGS.vocab_file, FLAGS.do_lower_case)
        layers = [int(x) for x in FLAGS.layers.split(",")]
        count = extract_features(config, FLAGS.init_checkpoint, tokenizer, FLAGS.input_file,
                                 FLAGS.output_file, layers, FLAGS.max_seq_length,
                                 FLAGS.batch_size, FLAGS.compute_type)
    except (ConfigError, VocabError, CheckpointError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {count} examples to {FLAGS.output_file}")
    return 0


if __name__ == "__main__":
    flags.mark_flags_as_required(["input_file", "output_file", "bert_config_file",
                                  "init_checkpoint", "vocab_file"])
    app.run(main)
