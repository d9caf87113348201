"""Run state a resume reads, damaged or lost: the `checkpoint` state file (missing, empty,
garbage, naming a step that is not there), the newest checkpoint truncated or holding a NaN,
`data_order.json` and input-state markers of zero length or garbage. A run resumes from the
newest whole and finite checkpoint with one line, never trains from step 0 over checkpoints
(unless --start_over, which moves them aside), never overwrites one, never starts from or
saves non-finite weights (docs/faults.md, "Faults tried")."""
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from pretraining.runner import main as pretraining_main
from pretraining.runner import run as pretraining_run
from resilience import atomic_files, data_order
from test_finetuning import tiny_model  # noqa: F401  (fixture)
from test_pretraining import data, make_flags  # noqa: F401  (fixture)
from test_resume_position import files, skips, train  # noqa: F401  (fixtures)

pytestmark = pytest.mark.faults
tf1 = tf.compat.v1


def console_warnings(caplog, text):
    return [record.getMessage() for record in caplog.records
            if record.levelname == "WARNING" and text in record.getMessage()]


def file_bytes(folder, steps):
    """{name: bytes} of the weights (index and data files) of the model checkpoints `steps`
    in `folder` (a resume re-saves its own step at start-up: the same weights, a new .meta)."""
    return {os.path.basename(path): open(path, "rb").read() for step in steps
            for path in glob.glob(f"{folder}/model.ckpt-{step}.index")
            + glob.glob(f"{folder}/model.ckpt-{step}.data-*")}


def error_lines(capsys):
    """The `error: ` lines written to stderr since the last call (progress lines aside)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("error: ")]


def truncate(path, keep):
    with open(path, "r+b") as handle:
        handle.truncate(keep if keep >= 0 else os.path.getsize(path) // 2)


@pytest.fixture(scope="module")
def trained(files, tmp_path_factory):  # noqa: F811
    """(reference batches of 9 uninterrupted steps, a folder trained to step 6 with a
    checkpoint and an input state every 2 steps)."""
    root = tmp_path_factory.mktemp("run_state")
    reference = train(root / "reference", files, 9)
    train(root / "base", files, 6)
    assert sorted(os.path.basename(p) for p in glob.glob(f"{root}/base/model.ckpt-*.index")) \
        == ["model.ckpt-0.index", "model.ckpt-2.index", "model.ckpt-4.index",
            "model.ckpt-6.index"]
    return reference, root / "base"


DATA = "model.ckpt-6.data-00000-of-00001"
# damage -> (the checkpoint resumed from, words of the one line that says why)
STATE_DAMAGES = {
    "state file missing": (lambda out: os.remove(out / "checkpoint"),
                           6, "its 'checkpoint' file is missing"),
    "state file empty": (lambda out: (out / "checkpoint").write_text(""),
                         6, "its 'checkpoint' file is empty"),
    "state file garbage": (lambda out: (out / "checkpoint").write_bytes(b"\x00\xff{ not ]"),
                           6, "its 'checkpoint' file is not a checkpoint state file"),
    "state file names a missing step": (
        lambda out: (out / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-40"\n'),
        6, "names model.ckpt-40, which is not there"),
    "newest .data truncated": (lambda out: truncate(out / DATA, -1),
                               4, "names model.ckpt-6, which is damaged"),
    "newest .index truncated, state file missing": (
        lambda out: (truncate(out / "model.ckpt-6.index", 10), os.remove(out / "checkpoint")),
        4, "model.ckpt-6 is damaged"),
}


def test_lost_or_damaged_state_resumes_from_the_newest_whole_checkpoint(trained, files,  # noqa: F811
                                                                        tmp_path, caplog):
    """Each damage: the rerun continues the data exactly from the newest whole checkpoint
    (not from step 0: it used to retrain from 0 over the folder's checkpoints, or stop in a
    traceback), in one line naming it and why; no checkpoint file it kept is rewritten, and
    the damaged one is moved aside, not deleted."""
    reference, base = trained
    for name, (damage, start, why) in STATE_DAMAGES.items():
        out = tmp_path / name.replace(" ", "_").replace(",", "")
        shutil.copytree(base, out)
        damage(out)
        kept = file_bytes(out, range(2, start + 1, 2))
        caplog.clear()
        with caplog.at_level("WARNING"):
            batches = train(out, files, 9)
        assert batches == reference[start:9], name
        lines = console_warnings(caplog, "resuming from")
        assert len(lines) == 1 and f"resuming from model.ckpt-{start}: " in lines[0] \
            and why in lines[0], (name, lines)
        assert file_bytes(out, range(2, start + 1, 2)) == kept, f"{name}: a checkpoint rewritten"
        if start == 4:  # the damaged one is set aside whole, with the line saying where
            aside = glob.glob(f"{out}/set_aside-*/model.ckpt-6.*")
            assert len(aside) >= 2 and "set_aside-" in lines[0], (name, aside)
        assert tf.train.latest_checkpoint(str(out)).endswith("model.ckpt-9")


def test_damaged_data_order_and_input_state_files_are_treated_as_missing(trained, files,  # noqa: F811
                                                                          tmp_path, caplog,
                                                                          skips):  # noqa: F811
    """Zero-length or garbled `data_order.json` and input-state files (a crash before their
    data reached the disk): one warning each, the position recomputed or read from what is
    left, the data continued exactly (it used to be a JSONDecodeError traceback)."""
    reference, base = trained
    marker = os.path.join("input_state", "rank-0", "micro_step-6.json")
    # both zero-length: no record of the order is left, so the position is recomputed
    out = tmp_path / "zero_length"
    shutil.copytree(base, out)
    (out / "data_order.json").write_text("")
    (out / marker).write_text("")
    with caplog.at_level("WARNING"):
        assert train(out, files, 9) == reference[6:9]
    assert console_warnings(caplog, "data_order.json is damaged (empty): treated as missing")
    assert console_warnings(caplog, "micro_step-6.json is damaged (empty)")
    assert skips[-1] == 6 * 4  # rebuilt and skipped what was consumed: exact, slower
    assert atomic_files.read_json_object(str(out / "data_order.json"))[0]["start_micro_step"] == 0
    # data_order.json of the wrong shape, the marker whole: the order it recorded stands in,
    # and the input state is restored in O(1)
    out = tmp_path / "wrong_shape_order"
    shutil.copytree(base, out)
    (out / "data_order.json").write_text("[1, 2]")
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert train(out, files, 9) == reference[6:9]
    assert console_warnings(caplog, "data_order.json is damaged (not a JSON object): treated "
                                    "as missing, using the data order recorded with the input "
                                    "state of micro_step 6")
    assert skips[-1] == 0
    # the snapshot truncated under a whole marker: no input state, skipping (it used to stop
    # with "cannot restore the input state")
    out = tmp_path / "truncated_snapshot"
    shutil.copytree(base, out)
    truncate(out / "input_state" / "rank-0" / "micro_step-6.data-00000-of-00001", -1)
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert train(out, files, 9) == reference[6:9]
    assert console_warnings(caplog, "micro_step-6.data-00000-of-00001 is damaged: ")
    assert skips[-1] == 6 * 4


def test_run_state_is_flushed_to_disk_before_it_is_named(tmp_path, monkeypatch):
    """data_order.json (as every run-state file: one routine, resilience.atomic_files): the
    file, then its folder (the rename), are fsync'ed, so a power loss cannot leave a
    zero-length file behind a rename that survived."""
    synced = []
    real_fsync = os.fsync

    def spy(descriptor):
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        return real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", spy)
    data_order.record(str(tmp_path), {"start_micro_step": 3})
    path = tmp_path / data_order.DATA_ORDER_FILE
    assert json.loads(path.read_text()) == {"start_micro_step": 3}
    assert synced and synced[0].startswith(f"{path}.tmp-") and synced[-1] == str(tmp_path)
    assert not list(tmp_path.glob("*.tmp-*"))


def poison(prefix):
    """Rewrites checkpoint `prefix` with a NaN in its first model weight (name order);
    returns that weight's name."""
    reader = tf.train.load_checkpoint(prefix)
    tensors = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    name = sorted(n for n, v in tensors.items()
                  if n.startswith("bert/") and getattr(v, "dtype", None) == np.float32)[0]
    tensors[name] = np.array(tensors[name], copy=True)
    tensors[name].flat[0] = np.nan
    names = sorted(tensors)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tensors[n] for n in names])
    return name


def finite(prefix):
    reader = tf.train.load_checkpoint(prefix)
    return all(np.isfinite(reader.get_tensor(name)).all()
               for name, dtype in reader.get_variable_to_dtype_map().items() if dtype.is_floating)


def test_pretraining_never_resumes_starts_from_or_saves_non_finite_weights(data, tmp_path,  # noqa: F811
                                                                           caplog, capsys):
    """A NaN in the checkpoint resumed from: back to the newest finite one, in one line. No
    checkpoint left usable: refused in one line, and --start_over moves them aside and starts
    at step 0. A NaN --init_checkpoint: one line naming it and the variable (it used to
    train on with every step skipped and save the NaN weights as model.ckpt-0). Weights
    that become non-finite while training are never saved: the run stops in one line."""
    out = tmp_path / "run"
    pretraining_run(make_flags(data, out, num_train_steps=4, save_checkpoints_steps=2))
    poisoned = poison(str(out / "model.ckpt-4"))
    with caplog.at_level("WARNING"):
        results = pretraining_run(make_flags(data, out, num_train_steps=6,
                                             save_checkpoints_steps=2))
    lines = console_warnings(caplog, "resuming from")
    assert len(lines) == 1 and lines[0].startswith(f"{out}: resuming from model.ckpt-2: its "
                                                    "'checkpoint' file names model.ckpt-4, "
                                                    f"which holds a NaN or an infinity in "
                                                    f"{poisoned}"), lines
    assert results["train"]["final_step"] == 6 and finite(str(out / "model.ckpt-6"))
    assert finite(str(out / "model.ckpt-4"))  # trained again from step 2
    nan_checkpoint = glob.glob(f"{out}/set_aside-*/model.ckpt-4.index")[0][:-len(".index")]
    assert not finite(nan_checkpoint)

    # every checkpoint damaged: refused, nothing written; then started over on purpose
    for path in glob.glob(f"{out}/model.ckpt-*.data-*"):
        truncate(path, 0)
    before = sorted(os.listdir(out))
    capsys.readouterr()
    assert pretraining_main(make_flags(data, out, num_train_steps=6)) == 1
    error = error_lines(capsys)
    assert len(error) == 1 and error[0].startswith(f"error: {out}: holds checkpoints (") \
        and "but none to resume from: model.ckpt-6 is damaged" in error[0] \
        and "pass --start_over" in error[0], error
    assert sorted(os.listdir(out)) == before
    caplog.clear()
    with caplog.at_level("WARNING"):
        results = pretraining_run(make_flags(data, out, num_train_steps=2, start_over=True))
    assert results["train"]["final_step"] == 2
    moved = console_warnings(caplog, "--start_over: moved the earlier run's checkpoints")
    assert len(moved) == 1
    newest_aside = max(glob.glob(f"{out}/set_aside-*"))
    assert {"checkpoint", "data_order.json", "input_state", "model.ckpt-6.index"} \
        <= set(os.listdir(newest_aside))

    # a NaN --init_checkpoint: one line naming checkpoint and variable, no checkpoint saved
    fresh = tmp_path / "from_nan"
    assert pretraining_main(make_flags(data, fresh, init_checkpoint=nan_checkpoint)) == 1
    error = error_lines(capsys)
    assert error == [f"error: {nan_checkpoint}: variable {poisoned} holds a NaN or an "
                     "infinity: refusing to initialise from it (use an earlier checkpoint of "
                     "the run that wrote it)"]
    assert not glob.glob(f"{fresh}/model.ckpt-*")

    # weights that overflow while training (a learning rate beyond float32): never saved
    diverged = tmp_path / "diverged"
    assert pretraining_main(make_flags(data, diverged, optimizer_type="adam",
                                       learning_rate=1e39, num_train_steps=3,
                                       save_checkpoints_steps=1)) == 1
    error = error_lines(capsys)
    assert len(error) == 1 and error[0].startswith(
        f"error: {diverged}: refusing to save a checkpoint at step 1: ") \
        and "holds a NaN or an infinity" in error[0] \
        and "model.ckpt-0 stays the latest checkpoint" in error[0], error
    assert [os.path.basename(p) for p in glob.glob(f"{diverged}/model.ckpt-*.index")] \
        == ["model.ckpt-0.index"] and finite(str(diverged / "model.ckpt-0"))


def test_finetuning_refuses_unusable_checkpoints_and_nan_init_in_one_line(tiny_model,  # noqa: F811
                                                                          tmp_path, repo_root):
    """run_classifier.py over an output folder whose checkpoints are all damaged: one line
    naming it and --start_over; with --start_over they are moved aside, and a NaN
    --init_checkpoint is then refused in one line naming the variable."""
    config = json.loads((tiny_model / "bert_config.json").read_text())
    nan_init = str(tmp_path / "nan_init" / "model.ckpt")
    os.makedirs(os.path.dirname(nan_init))
    embeddings = np.zeros([config["vocab_size"], config["hidden_size"]], np.float32)
    embeddings[3, 1] = np.inf
    tf.raw_ops.SaveV2(prefix=nan_init, tensor_names=["bert/embeddings/word_embeddings"],
                      shape_and_slices=[""], tensors=[embeddings])
    data_dir = tmp_path / "sst"
    data_dir.mkdir()
    (data_dir / "train.tsv").write_text("sentence\tlabel\n" + "".join(
        f"{word} film\t{index % 2}\n" for index, word in enumerate(["good", "bad"] * 8)))
    out = tmp_path / "glue"
    out.mkdir()
    (out / "model.ckpt-3.index").write_bytes(b"not an index")
    (out / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-3"\n')
    args = [sys.executable, "run_classifier.py", "--task_name=SST-2", f"--data_dir={data_dir}",
            f"--vocab_file={tiny_model / 'vocab.txt'}", f"--output_dir={out}",
            f"--bert_config_file={tiny_model / 'bert_config.json'}", "--do_train",
            "--max_seq_length=16", "--train_batch_size=4", f"--init_checkpoint={nan_init}"]

    def refused(*extra):
        result = subprocess.run(args + list(extra), capture_output=True, text=True,
                                cwd=repo_root, timeout=300)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
        return [line for line in result.stderr.splitlines() if line.startswith("error: ")]

    errors = refused()
    assert len(errors) == 1 and errors[0].startswith(
        f"error: {out}: holds checkpoints (model.ckpt-3) but none to resume from: "
        "model.ckpt-3 is damaged") and "--start_over" in errors[0], errors
    errors = refused("--start_over")
    assert errors == [f"error: {nan_init}: variable bert/embeddings/word_embeddings holds a "
                      "NaN or an infinity: refusing to initialise from it (use an earlier "
                      "checkpoint of the run that wrote it)"]
    aside = glob.glob(f"{out}/set_aside-*")
    assert len(aside) == 1 and sorted(os.listdir(aside[0])) == ["checkpoint",
                                                                "model.ckpt-3.index"]
    assert not glob.glob(f"{out}/model.ckpt-*")
