"""Ask a fine-tuned BERT: SQuAD answers or GLUE labels, from a SavedModel or a checkpoint.

    bert-inference --saved_model=export/1700000000 \
        --question="Who wrote it?" --context="It was written by Jane Austen."
    bert-inference --saved_model=export/1700000000 --text="a gripping film"
    bert-inference --saved_model=... --input_file=queries.jsonl   # one JSON object a line
    bert-inference --init_checkpoint=out --bert_config_file=bert_config.json \
        --vocab_file=vocab.txt --task_name=sst-2 --max_seq_length=128 --text="..."
    (or: python inference.py ...)
Prints one JSON object per query on stdout (notes and errors go to stderr).
"""
import json
import sys

from cli.command import Command
from cli.flag_groups import INPUT, MODEL, binders


def define_flags(flag_values):
    model, checkpoint, query = binders(flag_values, MODEL, "Model from a checkpoint", INPUT)
    model.DEFINE_string("saved_model", None,
                        "A SavedModel exported by bert-squad/bert-glue (--export_dir).")
    model.DEFINE_enum("precision", "auto", ["auto", "fp32", "bf16", "int8"],
                      "With --saved_model: serve in fp32, bf16 (oneDNN's automatic mixed "
                      "precision, for CPUs with native bfloat16; the dense layers on our AMX "
                      "or AVX512_BF16 kernel), or int8 (the encoder's dense layers in int8 on "
                      "our AMX, AVX-512 VNNI or AVX2 kernel, else oneDNN's int8 matmul; CPU "
                      "only; check the model's accuracy in it: bench/serving_precision.py); "
                      "auto: bf16 where the CPU has AVX512_BF16 or AMX and no GPU serves, fp32 "
                      "elsewhere.")
    model.DEFINE_string("vocab_file", None,
                        "WordPiece vocab (a SavedModel carries its own; needed with "
                        "--init_checkpoint).")
    checkpoint.DEFINE_string("init_checkpoint", None,
                             "Or: a fine-tuned checkpoint (prefix or folder).")
    checkpoint.DEFINE_string("bert_config_file", None, "With --init_checkpoint: bert_config.json.")
    checkpoint.DEFINE_bool("do_lower_case", True, "With --init_checkpoint: lower-case input.")
    checkpoint.DEFINE_string("task_name", None, "With --init_checkpoint: squad, or a GLUE task.")
    checkpoint.DEFINE_integer("max_seq_length", 384, "With --init_checkpoint: sequence length.")
    checkpoint.DEFINE_integer("doc_stride", 128,
                              "With --init_checkpoint and squad: stride of the window over "
                              "long contexts.")
    checkpoint.DEFINE_integer("max_query_length", 64,
                              "With --init_checkpoint and squad: question tokens kept.")
    checkpoint.DEFINE_bool("version_2_with_negative", False,
                           "With --init_checkpoint and squad: questions may have no answer.")
    query.DEFINE_string("question", None, "A question (SQuAD models).")
    query.DEFINE_string("context", None, "The passage that answers --question.")
    query.DEFINE_string("text", None, "Text to classify (GLUE models).")
    query.DEFINE_string("text_b", None, "Second text of a pair.")
    query.DEFINE_string("input_file", None,
                        "JSON lines: {question, context} or {text, text_b}, one query a line.")


def _flag_name(field):
    """How messages name a query field given on the command line."""
    return f"--{field}"


def _queries(flags, model):
    """([(where, query)], how to spell a field in messages about them).

    `where` is what an error about the query names: the file and line of --input_file, or
    the model (`model`) for a query given with flags.
    """
    if flags.input_file:
        from finetuning.inference import read_query_file
        return read_query_file(flags.input_file), json.dumps
    if flags.question is not None or flags.context is not None:
        return [(model, {"question": flags.question, "context": flags.context})], _flag_name
    if flags.text is not None:
        return [(model, {"text": flags.text, "text_b": flags.text_b})], _flag_name
    raise ValueError("nothing to ask: pass --question/--context, --text or --input_file")


def _load_model(flags):
    """(task, runner, tokenizer) from --saved_model or --init_checkpoint. The tokenizer comes
    first: its vocabulary is checked against the model's vocab_size (`training.vocab_fit`),
    and the casing against a Google checkpoint's name, before the model is loaded."""
    from data_prep.wordpiece.tokenization import FullTokenizer, validate_case_matches_checkpoint
    from finetuning import inference
    from finetuning.export import read_export_metadata
    if flags.saved_model:
        metadata, vocab = read_export_metadata(flags.saved_model)
        if not (flags.vocab_file or vocab):
            raise ValueError(f"{flags.saved_model}: carries no vocabulary (assets.extra/"
                             "vocab.txt): pass the model's --vocab_file")
        tokenizer = FullTokenizer(flags.vocab_file or vocab, metadata["do_lower_case"])
        precision = inference.serving_precision(flags.precision)
        task, runner, _, _ = inference.load_saved_model(flags.saved_model, tokenizer, precision)
        if precision == "bf16" and flags.precision == "auto":
            _note("serving in bf16: this CPU multiplies bfloat16 natively (--precision=fp32 "
                  "for float32 throughout)")
        return task, runner, tokenizer
    if not (flags.init_checkpoint and flags.bert_config_file and flags.vocab_file
            and flags.task_name):
        raise ValueError("pass --saved_model, or --init_checkpoint with "
                         "--bert_config_file, --vocab_file and --task_name")
    tokenizer = FullTokenizer(flags.vocab_file, flags.do_lower_case)
    validate_case_matches_checkpoint(flags.do_lower_case, flags.init_checkpoint)
    task, runner = inference.load_checkpoint_model(
        flags.init_checkpoint, flags.bert_config_file, flags.task_name, flags.max_seq_length,
        flags.do_lower_case, flags.doc_stride, flags.max_query_length,
        flags.version_2_with_negative, tokenizer)
    return task, runner, tokenizer


def _note(line):
    """Information for the user (not an error): stdout stays one JSON object per query."""
    print(f"note: {line}", file=sys.stderr)


def main(flags):
    from finetuning import inference
    try:
        queries, spell = _queries(flags, flags.saved_model or flags.init_checkpoint
                                  or "inference.py")
        task, runner, tokenizer = _load_model(flags)
        for where, query in queries:
            inference.check_query(task, query, where, spell)
        answers = inference.predict(task, runner, tokenizer,
                                    [query for _, query in queries], note=_note)
        lines = [_json_line(answer, where) for answer, (where, _) in zip(answers, queries)]
    except inference.NonFiniteOutputError as err:
        print(f"error: {queries[err.query_index][0]}: {err}", file=sys.stderr)
        return 1
    except (ValueError, OSError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


def _json_line(answer, where):
    """`answer` as one line of strict JSON: a NaN or an infinity (which `json.dumps` writes as
    `NaN`, not JSON) raises ValueError naming the query (`where`) instead of reaching stdout."""
    try:
        return json.dumps(answer, ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise ValueError(f"{where}: the answer holds a NaN or an infinity: not printed") from None


COMMAND = Command("inference", __doc__, define_flags, main)
