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


def _flag_name(field):
    """How messages name a query field given on the command line."""
    return f"--{field}"


def _queries(model):
    """([(where, query)], how to spell a field in messages about them).

    `where` is what an error about the query names: the file and line of --input_file, or
    the model (`model`) for a query given with flags.
    """
    if FLAGS.input_file:
        from finetuning.inference import read_query_file
        return read_query_file(FLAGS.input_file), json.dumps
    if FLAGS.question is not None or FLAGS.context is not None:
        return [(model, {"question": FLAGS.question, "context": FLAGS.context})], _flag_name
    if FLAGS.text is not None:
        return [(model, {"text": FLAGS.text, "text_b": FLAGS.text_b})], _flag_name
    raise ValueError("nothing to ask: pass --question/--context, --text or --input_file")


def _load_model():
    """(task, runner, vocab file, do_lower_case) from --saved_model or --init_checkpoint."""
    from finetuning import inference
    if FLAGS.saved_model:
        task, runner, vocab, lower = inference.load_saved_model(FLAGS.saved_model)
        return task, runner, FLAGS.vocab_file or vocab, lower
    if not (FLAGS.init_checkpoint and FLAGS.bert_config_file and FLAGS.vocab_file
            and FLAGS.task_name):
        raise ValueError("pass --saved_model, or --init_checkpoint with "
                         "--bert_config_file, --vocab_file and --task_name")
    task, runner = inference.load_checkpoint_model(
        FLAGS.init_checkpoint, FLAGS.bert_config_file, FLAGS.task_name, FLAGS.max_seq_length,
        FLAGS.do_lower_case, FLAGS.doc_stride, FLAGS.max_query_length,
        FLAGS.version_2_with_negative)
    return task, runner, FLAGS.vocab_file, FLAGS.do_lower_case


def _note(line):
    """Information for the user (not an error): stdout stays one JSON object per query."""
    print(f"note: {line}", file=sys.stderr)


def main(_):
    from data_prep.tokenization import FullTokenizer
    from finetuning import inference
    try:
        queries, spell = _queries(FLAGS.saved_model or FLAGS.init_checkpoint or "inference.py")
        task, runner, vocab, lower = _load_model()
        for where, query in queries:
            inference.check_query(task, query, where, spell)
        answers = inference.predict(task, runner, FullTokenizer(vocab, lower),
                                    [query for _, query in queries], note=_note)
    except (ValueError, OSError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for answer in answers:
        print(json.dumps(answer, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(app.run(main))
