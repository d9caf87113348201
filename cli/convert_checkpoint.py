"""`bert-convert-checkpoint`: HuggingFace BERT folders <-> Google-format TF checkpoints.

    bert-convert-checkpoint hf2tf --hf_dir DIR --output_dir OUT
    bert-convert-checkpoint tf2hf --tf_checkpoint CKPT --bert_config_file CFG \\
        --vocab_file VOCAB --output_dir OUT
    (or: python -m cli.convert_checkpoint ...)

The conversion is modeling/convert.py's; this module is its command line (argparse, as the
two directions take different flags), kept free of TensorFlow so `--help` is instant.
"""
import argparse
import sys


def parser():
    top = argparse.ArgumentParser(
        prog="bert-convert-checkpoint", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog="BERT_VERBOSE=1 shows TensorFlow's log lines.")
    sub = top.add_subparsers(dest="direction", required=True, metavar="{hf2tf,tf2hf}")
    hf2tf = sub.add_parser("hf2tf", help="HuggingFace folder -> Google TF checkpoint",
                           description="HuggingFace folder -> Google TF checkpoint")
    group = hf2tf.add_argument_group("Input")
    group.add_argument("--hf_dir", required=True,
                       help="Folder with config.json, vocab.txt and model.safetensors "
                            "(or pytorch_model.bin).")
    group = hf2tf.add_argument_group("Output")
    group.add_argument("--output_dir", required=True,
                       help="Gets bert_model.ckpt.{index,data-*}, bert_config.json and "
                            "vocab.txt (written under a temporary name, then renamed).")
    tf2hf = sub.add_parser("tf2hf", help="Google TF checkpoint -> HuggingFace folder",
                           description="Google TF checkpoint -> HuggingFace folder")
    group = tf2hf.add_argument_group("Input")
    group.add_argument("--tf_checkpoint", required=True,
                       help="Checkpoint prefix (e.g. out/bert_model.ckpt) or folder.")
    group.add_argument("--bert_config_file", required=True, help="bert_config.json of it.")
    group.add_argument("--vocab_file", required=True, help="Its vocab.txt.")
    group = tf2hf.add_argument_group("Output")
    group.add_argument("--output_dir", required=True,
                       help="Gets model.safetensors, config.json and vocab.txt, loadable by "
                            "transformers.BertModel / BertForPreTraining.")
    return top


def check_vocab(args):
    """The vocabulary against the config's vocab_size (`training.vocab_fit`), before anything
    is converted: a folder whose vocab.txt has more tokens than the model has embeddings
    would tokenize to ids its model cannot look up (HuggingFace's as well as ours)."""
    import os

    from data_prep.wordpiece.tokenization import FullTokenizer
    from modeling import convert
    from modeling.config import BertConfig
    from training.vocab_fit import check_vocab_fits
    if args.direction == "hf2tf":
        vocab, config_file = (os.path.join(args.hf_dir, "vocab.txt"),
                              os.path.join(args.hf_dir, "config.json"))
        if not os.path.isfile(vocab):
            return  # hf_to_tf says so
        config = convert.config_from_hf(config_file)
    else:
        vocab, config_file = args.vocab_file, args.bert_config_file
        config = BertConfig.from_json_file(config_file)
    check_vocab_fits(FullTokenizer(vocab), config.vocab_size, config_file)


def main(argv=None):
    from cli.command import prepare_process
    from reporting import console
    args = parser().parse_args(argv)
    prepare_process()
    console.start("convert_checkpoint")
    from data_prep.wordpiece.tokenization import VocabError
    from modeling import convert
    from modeling.checkpoints import CheckpointError
    from modeling.config import ConfigError
    try:
        check_vocab(args)
        if args.direction == "hf2tf":
            out = convert.hf_to_tf(args.hf_dir, args.output_dir)
        else:
            out = convert.tf_to_hf(args.tf_checkpoint, args.bert_config_file, args.vocab_file,
                                   args.output_dir)
    except (convert.ConversionError, CheckpointError, ConfigError, VocabError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
