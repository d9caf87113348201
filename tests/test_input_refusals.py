"""Inputs no run can use, refused where they are read (issue 39, classes 2, 5 and 6).

* A vocabulary larger than the config's vocab_size: every command that reads both refuses it
  in one line naming both files and both sizes, before a model is built or a file written
  (`training.vocab_fit`, the same function pre-training's record check uses). It used to end
  in a 100-140-line traceback on a CPU, and on a GPU the lookup reads zeros: silent garbage.
* Silent input loss: a SQuAD file with a question id used twice is refused to predict (one
  answer overwrote the other, scored over one question fewer, exit 0) and warned to train; a
  subfolder of a pre-training input folder holding records is said, not skipped in silence.
* One line instead of a traceback: a cased Google checkpoint with --do_lower_case=True (a
  27-line traceback ending in the right message), a GLUE dev/test file holding only its
  header (an IndexError after training: refused before training now).

The commands' mains run in this process (the driver's `main` is what bert-glue/bert-squad
call after parsing flags; inference's and extract_features' take their flag values as
attributes): one process start, for the one case that shows the whole command line."""
import json
import os
import shutil
import types

import pytest

from bertprep_support import assert_clean_error
from test_messages import run_python

SEQ = 24
WORDS = ("who wrote the novel it was written by jane austen pride and prejudice is a in "
         "1813 . ? , word gripping film the cat sat on mat where did").split()
EXTRA = 10  # tokens the larger vocabulary has beyond the config's vocab_size
# A Google checkpoint name the case check knows (cased: --do_lower_case=False).
CASED = "cased_L-12_H-768_A-12"


@pytest.fixture(scope="module")
def material(tmp_path_factory):
    """Vocab, a larger vocab, the tiny config of the first, a pre-trained (encoder only)
    checkpoint in a folder named as Google's cased model, GLUE and SQuAD data."""
    import tensorflow as tf
    from modeling import BertModel, named_config
    tf1 = tf.compat.v1
    root = tmp_path_factory.mktemp("refusals")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS))
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (root / "big_vocab.txt").write_text(
        "\n".join(vocab + [f"extra{i}" for i in range(EXTRA)]) + "\n")
    config = named_config("tiny").replace(vocab_size=len(vocab))
    config.to_json_file(str(root / "bert_config.json"))
    with tf.Graph().as_default():
        BertModel(config, False, tf.zeros([1, 4], tf.int32))
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            checkpoint = tf1.train.Saver().save(session, str(root / CASED / "bert_model.ckpt"))
    glue = root / "glue"
    glue.mkdir()
    (glue / "train.tsv").write_text("sentence\tlabel\n" + "".join(
        f"{'a gripping film' if i % 2 else 'the novel'}\t{i % 2}\n" for i in range(8)))
    (glue / "dev.tsv").write_text("sentence\tlabel\na gripping film\t1\n")
    (glue / "test.tsv").write_text("index\tsentence\n0\tthe novel\n")
    qas = [{"id": "q1", "question": "where did the cat sit ?",
            "answers": [{"text": "on the mat", "answer_start": 12}]},
           {"id": "q2", "question": "who sat on the mat ?",
            "answers": [{"text": "the cat", "answer_start": 0}]}]
    squad = {"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": "the cat sat on the mat .", "qas": qas}]}]}
    (root / "squad.json").write_text(json.dumps(squad))
    return {"root": root, "vocab": str(root / "vocab.txt"), "big": str(root / "big_vocab.txt"),
            "config": str(root / "bert_config.json"), "checkpoint": checkpoint, "glue": glue,
            "squad": root / "squad.json", "squad_data": squad, "size": len(vocab)}


def driver_main(task, **values):
    """finetuning.driver.main with `task` ("glue" or "squad") and options `values`: the exit
    status, as bert-glue/bert-squad return it."""
    from finetuning import driver, options, tasks
    if task == "glue":
        return driver.main(tasks.ClassifierTask.from_options,
                           options.ClassifierOptions.of(task_name="sst-2", **values))
    return driver.main(tasks.SquadTask.from_options, options.SquadOptions.of(**values))


def model_values(material, vocab, out, **more):
    values = dict(vocab_file=vocab, bert_config_file=material["config"],
                  init_checkpoint=material["checkpoint"], output_dir=str(out),
                  do_lower_case=False, max_seq_length=SEQ, train_batch_size=2,
                  predict_batch_size=2)
    values.update(more)
    return values


def one_error_line(capsys):
    """The one `error: ` line the command printed (and that it is the only line on stderr)."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def nothing_written(out):
    """A refused run leaves no output folder (the run lock removes the one it created)."""
    return not os.path.exists(out)


# ------------------------------------------------------------------ class 2: the vocabulary

def inference_flags(material, vocab, **more):
    values = dict(saved_model=None, init_checkpoint=material["checkpoint"],
                  bert_config_file=material["config"], vocab_file=vocab, task_name="sst-2",
                  max_seq_length=SEQ, do_lower_case=False, doc_stride=8, max_query_length=8,
                  version_2_with_negative=False, question=None, context=None, text="a film",
                  text_b=None, input_file=None)
    values.update(more)
    return types.SimpleNamespace(**values)


def extract_flags(material, vocab, out, **more):
    source = material["root"] / "lines.txt"
    source.write_text("the cat sat on the mat\n")
    values = dict(input_file=str(source), output_file=str(out), vocab_file=vocab,
                  bert_config_file=material["config"], init_checkpoint=material["checkpoint"],
                  do_lower_case=False, max_seq_length=SEQ, layers="-1", batch_size=2,
                  compute_type="float32")
    values.update(more)
    return types.SimpleNamespace(**values)


def run_command(command, material, vocab, out, **more):
    """Runs `command`'s main in this process with the model's files and `vocab`; returns its
    exit status."""
    from cli import extract_features, inference
    if command == "bert-glue":
        return driver_main("glue", **model_values(material, vocab, out, do_train=True,
                                                  data_dir=str(material["glue"]), **more))
    if command == "bert-squad":
        return driver_main("squad", **model_values(material, vocab, out, do_train=True,
                                                   train_file=str(material["squad"]),
                                                   doc_stride=8, max_query_length=8, **more))
    if command == "bert-inference":
        return inference.main(inference_flags(material, vocab, **more))
    return extract_features.main(extract_flags(material, vocab, out, **more))


COMMANDS = ["bert-glue", "bert-squad", "bert-inference", "bert-extract-features"]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_vocabulary_larger_than_the_config_is_one_line_before_anything_is_built(
        material, tmp_path, capsys, command):
    out = tmp_path / "out"
    assert run_command(command, material, material["big"], out) == 1
    line = one_error_line(capsys)
    # the words of training.vocab_fit, which every command uses (pre-training's record
    # check too: test_bad_records, test_dynamic_masking)
    size, big = material["size"], material["size"] + EXTRA
    assert line == (f"error: {material['big']}: a vocabulary of {big} tokens, more than the "
                    f"vocab_size {size} of {material['config']}: token ids from {size} up have "
                    "no embedding (a GPU would read zeros for them); use the vocabulary the "
                    f"model was made with, or a config whose vocab_size is at least {big}")
    assert nothing_written(out)


@pytest.mark.parametrize("direction", ["tf2hf", "hf2tf"])
def test_checkpoint_conversion_checks_the_vocabulary_against_the_config(material, tmp_path,
                                                                       direction):
    """bert-convert-checkpoint reads both too (its main prints the ConfigError in one line;
    called here before it starts the console, which a test process must not)."""
    from cli.convert_checkpoint import check_vocab, parser
    from modeling import BertConfig
    from modeling.config import ConfigError
    from modeling.convert import config_to_hf
    if direction == "tf2hf":
        args = ["tf2hf", "--tf_checkpoint", material["checkpoint"], "--bert_config_file",
                material["config"], "--vocab_file", material["big"]]
        config_file = material["config"]
    else:
        hf_dir = tmp_path / "hf"
        hf_dir.mkdir()
        config_file = str(hf_dir / "config.json")
        with open(config_file, "w") as writer:
            json.dump(config_to_hf(BertConfig.from_json_file(material["config"])), writer)
        shutil.copy(material["big"], hf_dir / "vocab.txt")
        args = ["hf2tf", "--hf_dir", str(hf_dir)]
    args += ["--output_dir", str(tmp_path / "out")]
    with pytest.raises(ConfigError) as caught:
        check_vocab(parser().parse_args(args))
    assert f"a vocabulary of {material['size'] + EXTRA} tokens, more than the vocab_size " \
           f"{material['size']} of {config_file}" in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_run_classifier_says_it_in_one_line_on_its_command_line(material, tmp_path):
    """The whole command (flags, console, exit status): it used to print 140 lines."""
    out = tmp_path / "out"
    proc = run_python("run_classifier.py", "--task_name=sst-2", f"--data_dir={material['glue']}",
                      f"--vocab_file={material['big']}",
                      f"--bert_config_file={material['config']}",
                      f"--init_checkpoint={material['checkpoint']}", "--do_lower_case=False",
                      "--do_train", f"--max_seq_length={SEQ}", f"--output_dir={out}")
    assert_clean_error(proc, material["big"], material["config"],
                       f"{material['size'] + EXTRA} tokens", f"vocab_size {material['size']}")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not list(out.glob("*.tf_record")) and not list(out.glob("model.ckpt*"))


# ------------------------------------------------------------------ class 6: one line, not a traceback

@pytest.mark.parametrize("command", COMMANDS)
def test_a_cased_checkpoint_with_do_lower_case_is_one_line(material, tmp_path, capsys, command):
    out = tmp_path / "out"
    assert run_command(command, material, material["vocab"], out, do_lower_case=True) == 1
    line = one_error_line(capsys)
    assert line == (f"error: --do_lower_case=True does not match --init_checkpoint="
                    f"{material['checkpoint']}: {CASED} is a cased model, pass "
                    "--do_lower_case=False")
    assert nothing_written(out)


@pytest.mark.parametrize("split", ["dev", "test"])
def test_a_glue_dev_or_test_file_holding_only_its_header_is_refused_before_training(
        material, tmp_path, capsys, split):
    data = tmp_path / "glue"
    shutil.copytree(material["glue"], data)
    name, flag = ("dev.tsv", "do_eval") if split == "dev" else ("test.tsv", "do_predict")
    header = (data / name).read_text().splitlines()[0]
    (data / name).write_text(header + "\n")
    out = tmp_path / "out"
    status = driver_main("glue", **model_values(material, material["vocab"], out,
                                                do_train=True, data_dir=str(data),
                                                **{flag: True}))
    assert status == 1
    line = one_error_line(capsys)
    assert line.startswith(f"error: {data / name}: no {split} examples to ")
    assert f"(a header alone?): fill it, or drop --{flag}" in line
    assert nothing_written(out)  # before training: no records, no checkpoint


# ------------------------------------------------------------------ class 5: silent input loss

def with_repeated_id(material, tmp_path):
    """The SQuAD file with its second question given the first one's id."""
    dataset = json.loads(json.dumps(material["squad_data"]))
    dataset["data"][0]["paragraphs"][0]["qas"][1]["id"] = "q1"
    path = tmp_path / "repeated.json"
    path.write_text(json.dumps(dataset))
    return path


REPEATED = ("question id 'q1' is used twice, by data[0].paragraphs[0].qas[0] and "
            "data[0].paragraphs[0].qas[1]")


def test_a_squad_question_id_used_twice_is_refused_to_predict_before_training(
        material, tmp_path, capsys):
    """Predicted, one answer overwrote the other and the scores covered one question fewer,
    exit 0: refused, naming the file, the id and both places, before training."""
    repeated = with_repeated_id(material, tmp_path)
    out = tmp_path / "out"
    status = driver_main("squad", **model_values(
        material, material["vocab"], out, do_train=True, train_file=str(material["squad"]),
        do_predict=True, predict_file=str(repeated), doc_stride=8, max_query_length=8))
    assert status == 1
    line = one_error_line(capsys)
    assert line.startswith(f"error: {repeated}: {REPEATED}: answers are keyed by id")
    assert nothing_written(out)


def test_a_squad_question_id_used_twice_trains_with_one_warning_and_is_not_scored(
        material, tmp_path, caplog, capsys):
    from finetuning import squad_data, squad_eval
    repeated = with_repeated_id(material, tmp_path)
    with caplog.at_level("WARNING"):
        examples = squad_data.read_squad_examples(str(repeated), True, False)
    assert [example.qas_id for example in examples] == ["q1", "q1"]  # both trained on
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith(f"{repeated}: {REPEATED}"), warnings
    # the official metric's command line: the same refusal, in one line
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps({"q1": "on the mat"}))
    assert squad_eval.main([str(repeated), str(predictions)]) == 1
    assert one_error_line(capsys).startswith(f"error: {repeated}: {REPEATED}")


def test_a_subfolder_of_the_input_folder_holding_records_is_said(tmp_path, caplog):
    """NVIDIA's run_pretraining.py globs `<dir>/*` (a subfolder fails there as a file): not
    read, but said in one warning line with how many input files it holds and how to read
    them; hidden, temporary and metadata files do not count."""
    from pretraining.input_pipeline import list_input_files
    folder = tmp_path / "training"
    for name in ("part-0.tfrecord", "part-1.tfrecord", "more/part-2.tfrecord",
                 "more/deeper/part-3.tfrecord", "more/.part-4.tfrecord",
                 "more/part-5.tfrecord.tmp-7", "more/.git/objects", ".cache/part-6.tfrecord",
                 "hidden_only/.DS_Store"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"")
    with caplog.at_level("WARNING"):
        files = list_input_files(str(folder))
    assert files == [str(folder / "part-0.tfrecord"), str(folder / "part-1.tfrecord")]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"{folder / 'more'}: a subfolder holding 2 input files, not read "
                        "(only the files directly in the folder are, as NVIDIA's "
                        "run_pretraining.py reads them); to read them too, add it after a "
                        f"comma: {folder},{folder / 'more'}"]
    caplog.clear()
    with caplog.at_level("WARNING"):
        both = list_input_files(f"{folder},{folder / 'more'}")
    assert both == files + [str(folder / "more" / "part-2.tfrecord")]
    assert [r.getMessage() for r in caplog.records if "more/deeper" in r.getMessage()]
