"""Messages a user test found false or unhelpful: each case is one `error: ...` line on
stderr (naming the file or flag and the problem), a non-zero exit, no traceback, and no
half-written files left behind.  Tiny models only: a hand-written vocabulary, the `tiny`
config, and checkpoints saved from freshly initialised graphs (no training)."""
import functools
import hashlib
import http.server
import os
import re
import subprocess
import sys
import threading

import pytest

from bertprep_support import REPO, assert_clean_error, run_bertprep

SEQ, STRIDE, QUERY = 32, 16, 8
WORDS = ("who wrote the novel it was written by jane austen pride and prejudice is a in "
         "1813 . ? , word").split()


# --------------------------------------------------------------------------- download

@pytest.fixture
def listing_server(tmp_path):
    """A real `http.server` folder listing of `<tmp>/site/dumps/` (one file, a.txt)."""
    site = tmp_path / "site"
    (site / "dumps").mkdir(parents=True)
    (site / "dumps" / "a.txt").write_bytes(b"some text\n")
    handler = functools.partial(QuietFolderHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield site, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


class QuietFolderHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def download(working_dir, url, sha256):
    return run_bertprep(["--action", "download", "--dataset", "wikicorpus_en",
                         "--working_dir", str(working_dir), "--url", url, "--sha256", sha256])


def files_under(folder):
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, dirs, names in os.walk(folder) for name in names + dirs)


def test_wrong_sha256_of_a_kept_download_says_it_was_kept(listing_server, tmp_path):
    site, base = listing_server
    url = base + "/dumps/a.txt"
    good = hashlib.sha256((site / "dumps" / "a.txt").read_bytes()).hexdigest()
    assert download(tmp_path / "wd", url, good).returncode == 0
    line = assert_clean_error(download(tmp_path / "wd", url, "0" * 64), "a.txt",
                              "sha256 mismatch", good, "kept", "--sha256")
    assert "deleted" not in line
    assert (tmp_path / "wd" / "download" / "wikicorpus_en" / "a.txt").exists()


@pytest.mark.parametrize("kind", ["http listing", "http redirect to listing", "file url",
                                  "local path"])
def test_folder_url_with_sha256_is_refused_and_leaves_nothing(listing_server, tmp_path, kind):
    site, base = listing_server
    url = {"http listing": base + "/dumps/", "http redirect to listing": base + "/dumps",
           "file url": (site / "dumps").as_uri(), "local path": str(site / "dumps")}[kind]
    proc = download(tmp_path / "wd", url, "0" * 64)
    assert_clean_error(proc, url, "is a folder")
    assert [name for name in files_under(tmp_path / "wd")  # bertPrep.log: the run's log
            if name not in ("download", os.path.join("download", "wikicorpus_en"),
                            "bertPrep.log")] == []


# --------------------------------------------------------------------------- models

def run_python(*args, timeout=300):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny SQuAD material: vocab, config, a pre-trained (encoder only) checkpoint, a
    "fine-tuned" one (encoder, SQuAD head and global step) and its exported SavedModel."""
    import tensorflow as tf
    from finetuning.model_fn import make_model_fn
    from finetuning.tasks import SquadTask
    from modeling import BertModel, named_config
    from training.settings import TrainingSettings
    tf1 = tf.compat.v1
    root = tmp_path_factory.mktemp("messages")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = named_config("tiny").replace(vocab_size=len(vocab))
    config.to_json_file(str(root / "bert_config.json"))

    def save(path, build):
        with tf.Graph().as_default():
            build()
            with tf1.Session() as session:
                session.run(tf1.global_variables_initializer())
                return tf1.train.Saver().save(session, str(path))

    def squad_graph():
        tf1.train.get_or_create_global_step()
        features = {name: tf1.placeholder(tf.int32, [None, SEQ], name)
                    for name in ("input_ids", "input_mask", "segment_ids")}
        features["unique_ids"] = tf1.placeholder(tf.int32, [None], "unique_ids")
        make_model_fn(SquadTask(max_seq_length=SEQ), TrainingSettings(bert_config=config))(
            features, None, tf.estimator.ModeKeys.PREDICT)

    paths = {"root": root,
             "pretrained": save(root / "pretrained" / "bert_model.ckpt",
                                lambda: BertModel(config, False, tf.zeros([1, 4], tf.int32))),
             "tuned": save(root / "tuned" / "model.ckpt", squad_graph)}
    proc = export_squad(root, paths["tuned"], root / "export")
    assert proc.returncode == 0, proc.stderr[-3000:]
    paths["export"] = root / "export"
    paths["saved_model"] = proc.stdout.split("SavedModel: ")[1].split()[0]
    return paths


def export_squad(root, checkpoint, export_dir):
    """run_squad.py exporting `checkpoint` without training."""
    return run_python("run_squad.py", f"--vocab_file={root / 'vocab.txt'}",
                      f"--bert_config_file={root / 'bert_config.json'}",
                      f"--init_checkpoint={checkpoint}", f"--output_dir={export_dir}.out",
                      f"--export_dir={export_dir}", f"--max_seq_length={SEQ}",
                      f"--doc_stride={STRIDE}", f"--max_query_length={QUERY}")


def ask(*args):
    return run_python("inference.py", *args)


# --------------------------------------------------------------------------- inference

def test_missing_saved_model_folder_is_named(models):
    missing = str(models["root"] / "no-such-export")
    assert_clean_error(ask(f"--saved_model={missing}", "--question=who", "--context=jane"),
                       missing, "SavedModel folder does not exist")


def test_export_folder_instead_of_saved_model_names_the_saved_model(models):
    assert_clean_error(ask(f"--saved_model={models['export']}", "--question=who",
                           "--context=jane"), "export folder", models["saved_model"])


def test_text_on_a_squad_model_asks_for_question_and_context(models):
    line = assert_clean_error(ask(f"--saved_model={models['saved_model']}", "--text=a film"),
                              models["saved_model"], "SQuAD model", "--question", "--context")
    assert "'context'" not in line


@pytest.mark.parametrize("question, context, empty", [
    ("", "jane austen wrote it", "--question"), ("who wrote it", "  ", "--context")])
def test_empty_question_or_context_is_refused(models, question, context, empty):
    proc = ask(f"--saved_model={models['saved_model']}", f"--question={question}",
               f"--context={context}")
    assert_clean_error(proc, empty, "empty")
    assert proc.stdout == ""


def test_empty_context_in_input_file_names_the_line(models, tmp_path):
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"question": "who", "context": "jane"}\n\n'
                       '{"question": "who", "context": ""}\n')
    assert_clean_error(ask(f"--saved_model={models['saved_model']}", f"--input_file={queries}"),
                       f"{queries}:3", '"context" is empty')


def test_long_context_says_how_many_windows(models):
    proc = ask(f"--saved_model={models['saved_model']}", "--question=who wrote it",
               "--context=" + " ".join(["word"] * 600))
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [line for line in proc.stderr.splitlines()
             if line.startswith("note: ") and "bf16" not in line]  # not the precision's note
    assert len(notes) == 1, proc.stderr
    windows = int(re.search(r"split into (\d+) windows", notes[0]).group(1))
    # 600 one-piece words; 32 - 3 (question) - 3 ([CLS], [SEP] x2) = 26 context tokens a
    # window, a new window every 16: windows start at 0, 16, ..., 576.
    assert windows == 37 and "600 words" in notes[0]
    assert f"max_seq_length={SEQ}" in notes[0] and f"doc_stride={STRIDE}" in notes[0]
    assert proc.stdout.count("\n") == 1 and '"answer"' in proc.stdout


# --------------------------------------------------------------------------- export

def test_export_of_a_pretrained_checkpoint_says_fine_tune_first(models, tmp_path):
    export_dir = tmp_path / "export"
    (export_dir / "temp-1700000000").mkdir(parents=True)  # left by an interrupted export
    proc = export_squad(models["root"], models["pretrained"], export_dir)
    assert_clean_error(proc, models["pretrained"], "squad head", "cls/squad/output_weights",
                       "--do_train")
    assert os.listdir(export_dir) == []


def test_failed_export_leaves_no_temp_folder(models, tmp_path):
    """A checkpoint whose index and sizes are fine but whose data is corrupt (checksums) is
    named as damaged when its weights are read to be checked finite (it used to fail inside
    the Estimator's restore, after the Estimator had created `temp-*`); a truncated one is
    named as damaged before anything is read."""
    def broken_copy(folder, damage):
        folder.mkdir()
        for name in os.listdir(os.path.dirname(models["tuned"])):
            if name.startswith("model.ckpt."):
                data = open(os.path.join(os.path.dirname(models["tuned"]), name), "rb").read()
                if name.startswith("model.ckpt.data"):
                    data = damage(data)
                (folder / name).write_bytes(data)
        return folder / "model.ckpt"

    corrupt = broken_copy(tmp_path / "corrupt",
                          lambda data: data[:len(data) // 2] + bytes(len(data) - len(data) // 2))
    export_dir = tmp_path / "export"
    proc = export_squad(models["root"], corrupt, export_dir)
    assert_clean_error(proc, f"{corrupt}: damaged checkpoint: ", "Checksum does not match")
    assert not export_dir.exists() or os.listdir(export_dir) == []

    truncated = broken_copy(tmp_path / "truncated", lambda data: data[:len(data) // 2])
    proc = export_squad(models["root"], truncated, tmp_path / "export2")
    assert_clean_error(proc, "model.ckpt.data-00000-of-00001: damaged checkpoint (truncated?)")
    assert not (tmp_path / "export2").exists() or os.listdir(tmp_path / "export2") == []


def test_export_on_a_full_disk_says_how_much_it_needs_and_writes_nothing(models, small_disk):
    export_dir = small_disk("disk", "256k") / "export"
    proc = export_squad(models["root"], models["tuned"], export_dir)
    needs = re.search(r"the SavedModel needs about ([\d.]+) MB \(its variables and graph\), "
                      r"([\d.]+) MB free; free space and rerun the same command$",
                      assert_clean_error(proc, f"{export_dir}: not enough disk space for the "
                                               "SavedModel: "))
    assert needs and float(needs.group(1)) > 0.3 and float(needs.group(2)) <= 0.3
    assert not export_dir.exists()  # refused before writing


def test_a_vocab_file_larger_than_the_saved_models_is_refused_before_it_loads(models, tmp_path,
                                                                            capsys):
    """--vocab_file given instead of the SavedModel's own: checked against the vocab_size the
    export records (`training.vocab_fit`), in one line naming both, before the model loads
    (a larger vocabulary gives ids beyond the embeddings: a traceback on a CPU, zeros read
    on a GPU). Run in this process: inference's main takes its flag values as attributes."""
    import json
    import types

    from cli.inference import main
    task_file = os.path.join(models["saved_model"], "assets.extra", "bert_task.json")
    vocab = (models["root"] / "vocab.txt").read_text().splitlines()
    assert json.load(open(task_file))["vocab_size"] == len(vocab)  # the config's
    larger = tmp_path / "larger_vocab.txt"
    larger.write_text("\n".join(vocab + ["more", "tokens"]) + "\n")
    flags = types.SimpleNamespace(saved_model=models["saved_model"], vocab_file=str(larger),
                                  question="who wrote it", context="jane austen wrote it",
                                  text=None, text_b=None, input_file=None, precision="auto")
    assert main(flags) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: {larger}: a vocabulary of {len(vocab) + 2} tokens, more than the vocab_size "
        f"{len(vocab)} of {task_file}: token ids from {len(vocab)} up have no embedding (a GPU "
        "would read zeros for them); use the vocabulary the model was made with, or a config "
        f"whose vocab_size is at least {len(vocab) + 2}"]
    flags.vocab_file = str(models["root"] / "vocab.txt")  # the model's own: answered
    assert main(flags) == 0
