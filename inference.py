"""Ask a fine-tuned BERT: SQuAD answers or GLUE labels, from a SavedModel or a checkpoint.

    python inference.py --saved_model=export/1700000000 \
        --question="Who wrote it?" --context="It was written by Jane Austen."
    python inference.py --saved_model=export/1700000000 --text="a gripping film"
    python inference.py --saved_model=... --input_file=queries.jsonl   # one JSON object a line
    python inference.py --init_checkpoint=out --bert_config_file=bert_config.json \
        --vocab_file=vocab.txt --task_name=sst-2 --max_seq_length=128 --text="..."
Prints one JSON object per query.
"""
import json
import sys

from absl import app, flags

flags.DEFINE_string("saved_model", None, "A SavedModel exported by run_squad/run_classifier.")
flags.DEFINE_string("init_checkpoint", None, "Or: a fine-tuned checkpoint (prefix or folder).")
flags.DEFINE_string("bert_config_file", None, "With --init_checkpoint: bert_config.json.")
flags.DEFINE_string("vocab_file", None, "With --init_checkpoint (a SavedModel carries its own).")
flags.DEFINE_bool("do_lower_case", True, "With --init_checkpoint: lower-case input.")
flags.DEFINE_string("task_name", None, "With --init_checkpoint: squad, or a GLUE task.")
flags.DEFINE_integer("max_seq_length", 384, "With --init_checkpoint: sequence length.")
flags.DEFINE_integer("doc_stride", 128, "With --init_checkpoint and squad.")
flags.DEFINE_integer("max_query_length", 64, "With --init_checkpoint and squad.")
flags.DEFINE_bool("version_2_with_negative", False, "With --init_checkpoint and squad.")
flags.DEFINE_string("question", None, "A question (SQuAD models).")
flags.DEFINE_string("context", None, "The passage that answers --question.")
flags.DEFINE_string("text", None, "Text to classify (GLUE models).")
flags.DEFINE_string("text_b", None, "Second text of a pair.")
flags.DEFINE_string("input_file", None, "JSON lines: {question, context} or {text, text_b}.")
FLAGS = flags.FLAGS


def _items():
    if FLAGS.input_file:
        with open(FLAGS.input_file, encoding="utf-8") as reader:
            return [json.loads(line) for line in reader if line.strip()]
    if FLAGS.question is not None:
        return [{"question": FLAGS.question, "context": FLAGS.context or ""}]
    if FLAGS.text is not None:
        return [{"text": FLAGS.text, "text_b": FLAGS.text_b}]
    raise ValueError("nothing to ask: pass --question/--context, --text or --input_file")


def main(_):
    from data_prep.tokenization import FullTokenizer
    from finetuning import inference
    try:
        items = _items()
        if FLAGS.saved_model:
            task, runner, vocab, lower = inference.load_saved_model(FLAGS.saved_model)
            vocab = FLAGS.vocab_file or vocab
        else:
            if not (FLAGS.init_checkpoint and FLAGS.bert_config_file and FLAGS.vocab_file
                    and FLAGS.task_name):
                raise ValueError("pass --saved_model, or --init_checkpoint with "
                                 "--bert_config_file, --vocab_file and --task_name")
            from modeling import BertConfig
            metadata = {"task": FLAGS.task_name.lower(), "max_seq_length": FLAGS.max_seq_length,
                        "do_lower_case": FLAGS.do_lower_case, "doc_stride": FLAGS.doc_stride,
                        "max_query_length": FLAGS.max_query_length, "n_best_size": 20,
                        "max_answer_length": 30,
                        "version_2_with_negative": FLAGS.version_2_with_negative,
                        "null_score_diff_threshold": 0.0}
            task = inference.task_from_metadata(metadata)
            config = BertConfig.from_json_file(FLAGS.bert_config_file)
            runner = inference.CheckpointRunner(task, config, FLAGS.init_checkpoint,
                                                FLAGS.max_seq_length)
            vocab, lower = FLAGS.vocab_file, FLAGS.do_lower_case
        answers = inference.predict(task, runner, FullTokenizer(vocab, lower), items)
    except (ValueError, OSError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for answer in answers:
        print(json.dumps(answer, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(app.run(main))
