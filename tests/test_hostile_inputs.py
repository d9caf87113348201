"""Hostile values at the fine-tuned model's boundaries (issue 31, items 3 to 6): non-finite
weights at export and inference, SQuAD data of the other version, NVIDIA flags called ignored
that are used, and queries inference cannot take as they are (a pre-training checkpoint, a
byte that is not UTF-8, a question longer than max_query_length).

Each case is one `error: ...` line (or one warning line) naming the file, flag or question,
never a traceback nor an invalid output. Tiny models only: a hand-written vocabulary, the
`tiny` config, checkpoints saved from freshly initialised graphs (no training) and copies of
them with one variable changed."""
import copy
import json
import os
import re

import numpy as np
import pytest
from absl import flags

from bertprep_support import assert_clean_error
from test_messages import run_python

SEQ, STRIDE, QUERY = 32, 16, 8
WORDS = ("who wrote the novel it was written by jane austen pride and prejudice is a in "
         "1813 . ? , word gripping film").split()
QUERY_LAYER = "bert/encoder/layer_0/attention/self/query/kernel"


def _save(path, build):
    import tensorflow as tf
    tf1 = tf.compat.v1
    with tf.Graph().as_default():
        build()
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            return tf1.train.Saver().save(session, str(path))


def altered_copy(source, target, changes):
    """Copies checkpoint `source` to prefix `target` with `changes` ({name: f(array) ->
    array}) applied: the same names, shapes and dtypes, other values."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    reader = tf1.train.load_checkpoint(str(source))
    with tf.Graph().as_default():
        variables = []
        for name in reader.get_variable_to_dtype_map():
            value = reader.get_tensor(name)
            if name in changes:
                value = changes[name](value.copy())
            variables.append(tf1.Variable(value, name=name))
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            return tf1.train.Saver(variables).save(session, str(target))


def with_nan(value):
    value.flat[len(value.flat) // 2] = np.nan
    return value


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """vocab, config; checkpoints: pre-trained (encoder only), SQuAD and SST-2 "fine-tuned"
    (encoder, head, global step), SST-2 with one NaN weight, SST-2 whose weights are finite
    but whose logits overflow float32."""
    import tensorflow as tf
    from finetuning.model_fn import make_model_fn
    from finetuning.tasks import ClassifierTask, SquadTask
    from modeling import BertModel, named_config
    from training.settings import TrainingSettings
    tf1 = tf.compat.v1
    root = tmp_path_factory.mktemp("hostile")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS))
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = named_config("tiny").replace(vocab_size=len(vocab))
    config.to_json_file(str(root / "bert_config.json"))

    def tuned(task):
        def build():
            tf1.train.get_or_create_global_step()
            features = {name: tf1.placeholder(tf.int32, [None, SEQ], name)
                        for name in ("input_ids", "input_mask", "segment_ids")}
            for name in task.extra_serving_inputs:
                features[name] = tf1.placeholder(tf.int32, [None], name)
            make_model_fn(task, TrainingSettings(bert_config=config))(
                features, None, tf.estimator.ModeKeys.PREDICT)
        return build

    paths = {"root": root,
             "pretrained": _save(root / "pretrained" / "bert_model.ckpt",
                                 lambda: BertModel(config, False, tf.zeros([1, 4], tf.int32))),
             "squad": _save(root / "squad" / "model.ckpt", tuned(SquadTask(max_seq_length=SEQ))),
             "sst2": _save(root / "sst2" / "model.ckpt",
                           tuned(ClassifierTask("sst-2", None, SEQ)))}
    paths["sst2_nan"] = altered_copy(paths["sst2"], root / "sst2_nan" / "model.ckpt",
                                     {QUERY_LAYER: with_nan})
    # pooled output tanh(10) ~ 1 in every dimension, times 3e38 in each: every partial sum
    # of the logits' dot product is above float32's 3.4e38 whatever the summation order
    paths["sst2_overflow"] = altered_copy(
        paths["sst2"], root / "sst2_overflow" / "model.ckpt",
        {"bert/pooler/dense/kernel": np.zeros_like,
         "bert/pooler/dense/bias": lambda v: np.full_like(v, 10.0),
         "output_weights": lambda v: np.full_like(v, 3e38)})
    return paths


def model_flags(models, checkpoint):
    root = models["root"]
    return [f"--vocab_file={root / 'vocab.txt'}", f"--bert_config_file={root / 'bert_config.json'}",
            f"--max_seq_length={SEQ}", f"--init_checkpoint={checkpoint}"]


def classifier_flags(models, checkpoint):
    return model_flags(models, checkpoint) + ["--task_name=sst-2"]


def squad_flags(models, checkpoint, command="run_squad"):
    """run_squad.py's flags, or inference.py's (`command="inference"`) for a SQuAD model."""
    task = ["--task_name=squad"] if command == "inference" else []
    return model_flags(models, checkpoint) + task + [
        f"--doc_stride={STRIDE}", f"--max_query_length={QUERY}"]


def ask(*args):
    return run_python("inference.py", *args)


def export(models, checkpoint, export_dir):
    return run_python("run_classifier.py", *classifier_flags(models, checkpoint),
                      f"--output_dir={export_dir}.out", f"--export_dir={export_dir}")


# ------------------------------------------------------------------ non-finite weights

@pytest.mark.slow  # a minute or more: its file starts early (conftest.py)
def test_a_nan_weight_is_neither_exported_nor_answered_with(models, tmp_path):
    export_dir = tmp_path / "export"
    proc = export(models, models["sst2_nan"], export_dir)
    assert_clean_error(proc, models["sst2_nan"], QUERY_LAYER, "a NaN or an infinity")
    assert not export_dir.exists()  # nothing written, not even an empty folder

    proc = ask(*classifier_flags(models, models["sst2_nan"]), "--text=a gripping film")
    assert_clean_error(proc, models["sst2_nan"], QUERY_LAYER, "a NaN or an infinity")
    assert proc.stdout == ""


def test_a_saved_model_holding_a_nan_is_refused(models, tmp_path):
    """A SavedModel written before exports were checked (or altered since)."""
    proc = export(models, models["sst2"], tmp_path / "export")
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved_model = proc.stdout.split("SavedModel: ")[1].split()[0]
    variables = os.path.join(saved_model, "variables", "variables")
    altered_copy(variables, variables, {QUERY_LAYER: with_nan})
    proc = ask(f"--saved_model={saved_model}", "--text=a gripping film")
    assert_clean_error(proc, saved_model, QUERY_LAYER, "a NaN or an infinity")
    assert proc.stdout == ""


def test_a_non_finite_output_fails_in_one_line_instead_of_printing_nan(models, tmp_path):
    """Every weight finite (3e38 fits float32), the logits overflow to infinity, the
    probabilities come out NaN: a line `"probabilities": {"0": NaN}` is not JSON."""
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"text": "a gripping film"}\n\n{"text": "the novel"}\n')
    proc = ask(*classifier_flags(models, models["sst2_overflow"]), f"--input_file={queries}")
    assert_clean_error(proc, f"{queries}:1", "probabilities", "NaN or infinite")
    assert "NaN" not in proc.stdout and proc.stdout == ""


# ------------------------------------------------------------------ inference and hostile values

def test_a_pretraining_checkpoint_for_a_classifier_says_it_is_not_fine_tuned(models):
    proc = ask(*classifier_flags(models, models["pretrained"]), "--text=a gripping film")
    assert_clean_error(proc, models["pretrained"], "not a fine-tuned sst-2 classifier",
                       "output_weights", "bert-glue --task_name=sst-2 --do_train")
    assert len(proc.stderr.splitlines()) < 5, proc.stderr


def test_a_squad_checkpoint_for_a_classifier_says_which_head_it_has(models):
    assert_clean_error(ask(*classifier_flags(models, models["squad"]), "--text=a film"),
                       models["squad"], "not a fine-tuned sst-2 classifier",
                       "it has cls/squad/output_")


NOT_UTF8 = "a " + os.fsdecode(b"\xff") + " film"  # a byte that is not UTF-8, as argv holds it


@pytest.mark.parametrize("flag", ["--text", "--question"])
def test_a_byte_that_is_not_utf8_in_a_query_flag_names_the_flag(models, flag):
    if flag == "--question":
        args = [*squad_flags(models, models["squad"], "inference"), f"--question={NOT_UTF8}",
                "--context=jane austen wrote it"]
    else:
        args = [*classifier_flags(models, models["sst2"]), f"--text={NOT_UTF8}"]
    proc = ask(*args)
    assert_clean_error(proc, f"flag {flag}: ", "is not UTF-8 (byte 0xff at character 3)")
    assert proc.stdout == ""


@pytest.mark.parametrize("field", ["text_b", "context"])
def test_every_text_field_of_a_query_is_checked(field):
    """The same check in-process for the fields the command-line cases leave out."""
    from finetuning.inference import check_query
    from finetuning.tasks import ClassifierTask, SquadTask
    task = SquadTask() if field == "context" else ClassifierTask("sst-2", None, SEQ)
    query = ({"question": "who wrote it", "context": "jane"} if field == "context"
             else {"text": "a film", "text_b": "the novel"})
    check_query(task, query, "here")
    query[field] = NOT_UTF8
    with pytest.raises(ValueError, match=re.escape(
            f"here: '{field}' is not UTF-8 text (byte 0xff at character 3)")):
        check_query(task, query, "here")


def test_an_input_file_line_that_is_not_utf8_or_not_unicode_names_file_and_line(models,
                                                                               tmp_path):
    queries = tmp_path / "queries.jsonl"
    queries.write_bytes(b'{"text": "a film"}\n\n{"text": "a \xff film"}\n')
    proc = ask(*classifier_flags(models, models["sst2"]), f"--input_file={queries}")
    assert_clean_error(proc, f"{queries}:3: not UTF-8 text (byte 0xff at byte 13")
    queries.write_bytes(b'{"text": "a film"}\n{"text": "a \\ud800 film"}\n')
    proc = ask(*classifier_flags(models, models["sst2"]), f"--input_file={queries}")
    assert_clean_error(proc, f'{queries}:2: "text" is not Unicode text (lone surrogate \\ud800')


def test_a_question_longer_than_max_query_length_is_answered_with_a_warning(models):
    """Cut as Google's run_squad.py cuts it (the features stay Google's), and said."""
    question = "who wrote the novel pride and prejudice in 1813 , jane austen ?"
    pieces = len(question.split())  # each word is one piece of the vocabulary
    proc = ask(*squad_flags(models, models["squad"], "inference"), f"--question={question}",
               "--context=it was written by jane austen in 1813 .")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["answer"] is not None
    warnings = [line for line in proc.stderr.splitlines() if "max_query_length" in line]
    assert len(warnings) == 1, proc.stderr
    assert re.search(rf"question 0 has {pieces} WordPiece tokens: cut to its first {QUERY}\b",
                     warnings[0]), warnings[0]
    proc = ask(*squad_flags(models, models["squad"], "inference"), "--question=who wrote it",
               "--context=it was written by jane austen .")
    assert proc.returncode == 0 and "max_query_length" not in proc.stderr, proc.stderr


# ------------------------------------------------------------------ SQuAD versions

@pytest.fixture(scope="module")
def squad_files(shared_data, tmp_path_factory):
    """From the real v1.1 sample: `v1` (its first paragraphs), `v2` (the same as SQuAD v2.0
    writes it: every question with is_impossible, the third one unanswerable, its answers
    moved to plausible_answers)."""
    folder = tmp_path_factory.mktemp("squad_versions")
    with open(os.path.join(shared_data, "squad", "sample-v1.1.json"), encoding="utf-8") as r:
        sample = json.load(r)
    article = dict(sample["data"][0], paragraphs=sample["data"][0]["paragraphs"][:2])
    v1 = {"version": "1.1", "data": [article]}
    v2 = copy.deepcopy(v1)
    v2["version"] = "v2.0"
    questions = [qa for paragraph in v2["data"][0]["paragraphs"] for qa in paragraph["qas"]]
    for qa in questions:
        qa["is_impossible"] = False
    questions[2].update(is_impossible=True, plausible_answers=questions[2]["answers"],
                        answers=[])
    files = {}
    for name, dataset in (("v1", v1), ("v2", v2)):
        files[name] = folder / f"{name}.json"
        files[name].write_text(json.dumps(dataset))
    return files, questions[0]["id"], questions[2]["id"]


@pytest.mark.parametrize("is_training", [True, False], ids=["train", "predict"])
def test_v2_data_without_the_v2_flag_names_file_question_and_flag(squad_files, is_training):
    from finetuning import squad_data
    from finetuning.squad_eval import SquadFileError
    files, _, unanswerable = squad_files
    with pytest.raises(SquadFileError) as caught:
        squad_data.read_squad_examples(str(files["v2"]), is_training, False)
    assert str(caught.value) == (f"{files['v2']}: question {unanswerable} is unanswerable "
                                 "(is_impossible: true): SQuAD v2.0 data; pass "
                                 "--version_2_with_negative")
    assert squad_data.read_squad_examples(str(files["v2"]), is_training, True)
    assert squad_data.read_squad_examples(str(files["v1"]), is_training, False)


def test_v2_answers_removed_without_is_impossible_are_named_when_predicting(squad_files,
                                                                            tmp_path):
    """v1 metric on a question with no answer is undefined (it used to fail after
    predicting, in a traceback naming `<dataset>` and a flag run_squad.py does not have)."""
    from finetuning import squad_data
    from finetuning.squad_eval import SquadFileError
    files, _, unanswerable = squad_files
    dataset = json.loads(files["v2"].read_text())
    for paragraph in dataset["data"][0]["paragraphs"]:
        for qa in paragraph["qas"]:
            del qa["is_impossible"]
    path = tmp_path / "no-flags.json"
    path.write_text(json.dumps(dataset))
    with pytest.raises(SquadFileError, match=re.escape(
            f"{path}: question {unanswerable} has no answer while others have: SQuAD v2.0 "
            "data? pass --version_2_with_negative")):
        squad_data.read_squad_examples(str(path), False, False)


def test_v1_data_with_the_v2_flag_is_refused_for_training_and_warned_for_predicting(
        squad_files, caplog):
    from finetuning import squad_data
    from finetuning.squad_eval import SquadFileError
    files, first, _ = squad_files
    with pytest.raises(SquadFileError, match=re.escape(
            f"{files['v1']}: SQuAD v1.1 data: no question says whether it is answerable (no "
            f"'is_impossible', the first: {first}); drop --version_2_with_negative")):
        squad_data.read_squad_examples(str(files["v1"]), True, True)
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert squad_data.read_squad_examples(str(files["v1"]), False, True)
    lines = [r.getMessage() for r in caplog.records if "v1.1 data" in r.getMessage()]
    assert len(lines) == 1 and str(files["v1"]) in lines[0] and first in lines[0]
    assert "--version_2_with_negative" in lines[0]


@pytest.mark.slow  # a minute or more: its file starts early (conftest.py)
def test_run_squad_on_the_other_version_stops_in_one_line_before_training(models, squad_files,
                                                                          tmp_path):
    files, first, unanswerable = squad_files
    args = squad_flags(models, models["squad"])
    proc = run_python("run_squad.py", *args, "--do_train", f"--train_file={files['v2']}",
                      f"--output_dir={tmp_path / 'a'}")
    assert_clean_error(proc, str(files["v2"]), unanswerable, "--version_2_with_negative")
    assert not list((tmp_path / "a").glob("model.ckpt*"))
    # predicting: refused before training, not after it
    proc = run_python("run_squad.py", *args, "--do_train", f"--train_file={files['v1']}",
                      "--do_predict", f"--predict_file={files['v2']}",
                      f"--output_dir={tmp_path / 'b'}")
    assert_clean_error(proc, str(files["v2"]), unanswerable, "--version_2_with_negative")
    assert not list((tmp_path / "b").glob("model.ckpt*"))
    proc = run_python("run_squad.py", *args, "--do_train", f"--train_file={files['v1']}",
                      "--version_2_with_negative", f"--output_dir={tmp_path / 'c'}")
    assert_clean_error(proc, str(files["v1"]), first, "drop --version_2_with_negative")


# ------------------------------------------------------------------ NVIDIA's ignored flags

def _commands():
    from cli.finetuning_flags import define_classifier_flags, define_squad_flags
    from cli.pretraining_flags import define_flags as define_pretraining_flags
    from finetuning.options import ClassifierOptions, SquadOptions
    from pretraining.options import PretrainingOptions
    return {"run_pretraining": (define_pretraining_flags, PretrainingOptions),
            "run_classifier": (define_classifier_flags, ClassifierOptions),
            "run_squad": (define_squad_flags, SquadOptions)}


COMMANDS = ("run_pretraining", "run_classifier", "run_squad")


def _parsed(command, argv=()):
    define, _ = _commands()[command]
    values = flags.FlagValues()
    define(values)
    values(["command", *argv])
    return values


def _other_value(flag):
    """A command-line value of `flag` other than its default."""
    if flag.boolean:
        return f"--no{flag.name}" if flag.default else f"--{flag.name}"
    choices = getattr(flag.parser, "enum_values", None)
    if choices:
        return f"--{flag.name}={next(c for c in choices if c != flag.default)}"
    if flag.flag_type() in ("int", "float"):
        return f"--{flag.name}={(flag.default or 0) + 7}"
    return f"--{flag.name}={flag.default or ''}x"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_a_command_calls_ignored_changes_nothing(command):
    from cli.flag_options import options_from_flags
    from cli.nvidia_flags import ignored_flags, warn_ignored
    options_class = _commands()[command][1]
    values = _parsed(command)
    ignored = ignored_flags(values)
    assert ignored  # each of NVIDIA's three scripts has flags we ignore
    assert not set(ignored) & set(options_class.names())
    baseline = options_from_flags(values, options_class)
    for name in ignored:
        given = _parsed(command, [_other_value(values[name])])
        assert given[name].value != values[name].value
        assert options_from_flags(given, options_class) == baseline, name
        assert warn_ignored(given) == [name]


@pytest.mark.parametrize("command", COMMANDS)
def test_no_flag_a_command_uses_is_called_ignored(command, caplog):
    """Every option's flag given at once (run_squad.sh passes --doc_stride, which
    run_classifier.py ignores and run_squad.py uses): no warning."""
    from cli.flag_options import options_from_flags
    from cli.nvidia_flags import warn_ignored
    options_class = _commands()[command][1]
    values = _parsed(command)
    argv = [_other_value(values[name]) for name in options_class.names()
            if values[name].flag_type() != "multi_string"]
    given = _parsed(command, argv)
    chosen = options_from_flags(given, options_class).given
    assert "doc_stride" in chosen or command != "run_squad"
    with caplog.at_level("WARNING"):
        assert warn_ignored(given) == []
    assert "ignored" not in caplog.text
