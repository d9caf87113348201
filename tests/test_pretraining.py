"""run_pretraining end to end on small records: precisions x XLA x accumulation, SIGTERM,
start-up checks, input sharding (whole files per rank). Exact resume after kill -9:
tests/test_resume_position.py."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from pretraining.input_pipeline import InputError, make_dataset
from pretraining.options import PretrainingOptions
from pretraining.runner import run
from pretraining_records import write_random_records

SEQ, PREDICTIONS, VOCAB = 16, 3, 101


def write_data(root, write=None):
    """train/ (3 files), eval/ and a tiny bert_config.json under `root`; `write(path, count,
    seed)` writes records (default: static ones)."""
    write = write or (lambda path, count, seed: write_random_records(
        path, count, SEQ, PREDICTIONS, VOCAB, seed=seed))
    (root / "train").mkdir()
    for index in range(3):
        write(root / "train" / f"part-{index}.tfrecord", 48, index)
    (root / "eval").mkdir()
    write(root / "eval" / "part-0.tfrecord", 32, 9)
    from modeling import named_config
    named_config("tiny").replace(vocab_size=VOCAB).to_json_file(str(root / "bert_config.json"))
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("pretraining"))


def make_flags(data, output_dir, **overrides):
    """The options of a tiny pre-training run on `data` (`pretraining.options`)."""
    settings = dict(bert_config_file=str(data / "bert_config.json"),
                    input_files_dir=str(data / "train"), eval_files_dir=str(data / "eval"),
                    output_dir=str(output_dir), do_train=True, train_batch_size=4,
                    max_seq_length=SEQ, max_predictions_per_seq=PREDICTIONS,
                    num_train_steps=3, num_warmup_steps=1, learning_rate=1e-3,
                    display_loss_steps=1, save_checkpoints_steps=100, shuffle_buffer=20)
    settings.update(overrides)
    return PretrainingOptions.of(**settings)


def command_line(data, output_dir, **overrides):
    values = make_flags(data, output_dir, **overrides)
    args = [sys.executable, "run_pretraining.py"]
    for name in ("bert_config_file", "input_files_dir", "output_dir", "train_batch_size",
                 "max_seq_length", "max_predictions_per_seq", "num_train_steps",
                 "num_warmup_steps", "learning_rate", "display_loss_steps",
                 "save_checkpoints_steps", "shuffle_buffer", "num_accumulation_steps"):
        args.append(f"--{name}={getattr(values, name)}")
    return args + ["--do_train"]


def checkpoint_tensors(path):
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.mark.parametrize("accumulation", [1, 4])
@pytest.mark.parametrize("xla", [False, True], ids=["no_xla", "xla"])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_every_precision_xla_accumulation_combination_trains(data, tmp_path, precision, xla,
                                                             accumulation):
    amp = precision != "fp32"
    dtype = {"fp16": "float16", "bf16": "bfloat16"}.get(precision, "float16")
    values = make_flags(data, tmp_path, amp=amp, amp_dtype=dtype, use_xla=xla,
                        num_accumulation_steps=accumulation, num_train_steps=2,
                        init_loss_scale=2.0 ** 10)
    results = run(values)
    records = results["train"]
    assert records["final_step"] == 2 and np.isfinite(records["total_loss"])
    state = checkpoint_tensors(tf.train.latest_checkpoint(str(tmp_path)))
    assert state["global_step"] == 2 and state["micro_step"] == 2 * accumulation
    assert ("gradient_accumulation/local_step" in state) == (accumulation > 1)
    if precision == "fp16":
        assert state["loss_scale/loss_scale"] in (2.0 ** 10, 2.0 ** 9, 2.0 ** 8)
    assert all(np.isfinite(v).all() for v in state.values() if v.dtype.kind == "f")


def test_eval_reports_googles_metrics(data, tmp_path):
    results = run(make_flags(data, tmp_path, do_eval=True, max_eval_steps=4, eval_batch_size=8))
    assert {"masked_lm_accuracy", "masked_lm_loss", "next_sentence_accuracy",
            "next_sentence_loss"} <= results["eval"].keys()
    lines = (tmp_path / "eval_results.txt").read_text().splitlines()
    assert any(line.startswith("masked_lm_accuracy = ") for line in lines)


def test_records_that_do_not_match_the_flags_fail_at_start(data, tmp_path):
    with pytest.raises(InputError, match=r"part-0\.tfrecord: records have sequence length 16 "
                                         r"but --max_seq_length=32"):
        run(make_flags(data, tmp_path, max_seq_length=32))
    with pytest.raises(InputError, match=r"3 masked-LM predictions but "
                                         r"--max_predictions_per_seq=5"):
        run(make_flags(data, tmp_path, max_predictions_per_seq=5))
    with pytest.raises(InputError, match="no input files"):
        run(make_flags(data, tmp_path, input_files_dir=str(tmp_path / "none")))


def test_command_line_errors_are_one_line(data, tmp_path, repo_root):
    args = command_line(data, tmp_path) + ["--max_seq_length=600"]
    result = subprocess.run(args, capture_output=True, text=True, cwd=repo_root, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --max_seq_length=600 exceeds the config's max_position_embeddings 512")
    assert "Traceback" not in result.stderr


@pytest.mark.faults
def test_sigterm_saves_a_checkpoint_and_exits_143(data, tmp_path, repo_root):
    """Stopped by a signal, the run saves and exits 128 + the signal, so that
    `run_pretraining.py && next-step` does not go on (it used to exit 0)."""
    output = tmp_path / "run"
    args = command_line(data, output, num_train_steps=100000, save_checkpoints_steps=100000,
                        display_loss_steps=1)
    process = subprocess.Popen(args, cwd=repo_root, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    log = ""
    while "step 5/" not in log:  # the progress line of step 5
        line = process.stderr.readline()
        assert line or process.poll() is None, "run ended early"
        log += line
        assert time.time() < deadline
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, rest[-2000:]
    assert "preempted: saved" in rest
    latest = tf.train.latest_checkpoint(str(output))
    step = int(latest.rsplit("-", 1)[1])
    assert step >= 5 and checkpoint_tensors(latest)["global_step"] == step


def _ids(dataset, batches):
    iterator = iter(dataset.take(batches))
    return [[tuple(row) for row in batch["input_ids"].numpy()] for batch in iterator]


def test_input_sharding_is_disjoint_and_skip_resumes_exactly(tmp_path):
    files = []
    for index in range(4):
        path = tmp_path / f"f{index}.tfrecord"
        write_random_records(path, 10, SEQ, PREDICTIONS, 10_000, seed=100 + index)
        files.append(str(path))

    def rows(num_shards, shard_index, file_list, skip=0, batches=5):
        dataset = make_dataset(file_list, 2, SEQ, PREDICTIONS, True, seed=7,
                               num_shards=num_shards, shard_index=shard_index,
                               skip_records=skip, shuffle_buffer=4)
        return [row for batch in _ids(dataset, batches) for row in batch]

    # whole files per rank: the ranks' records never overlap
    rank0, rank1 = set(rows(2, 0, files, batches=10)), set(rows(2, 1, files, batches=10))
    assert rank0 and rank1 and not rank0 & rank1
    # fewer files than ranks: refused (pre-training shards by whole files only)
    with pytest.raises(InputError, match=r"^1 training input file for 2 ranks: .* re-shard "
                                         r"with `bertPrep\.py --action sharding "
                                         r"--n_training_shards=K` \(K a multiple of 2\)$"):
        rows(2, 1, files[:1])
    # skipping k records continues the same stream exactly
    full = rows(1, 0, files, batches=8)
    assert rows(1, 0, files, skip=6, batches=5) == full[6:16]


@pytest.mark.horovod
def test_two_horovod_ranks_stay_identical(data, tmp_path, repo_root):
    pytest.importorskip("horovod.tensorflow", reason="Horovod not installed "
                        "(bash scripts/install.sh builds it)")
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    args = command_line(data, tmp_path / "hvd", num_train_steps=4, num_accumulation_steps=2)
    args = [horovodrun, "-np", "2", "--gloo", "-H", "localhost:2"] + args + [
        "--horovod", "--allreduce_post_accumulation", "--amp", "--amp_dtype=bfloat16"]
    result = subprocess.run(args, capture_output=True, text=True, cwd=repo_root, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    fingerprints = {}
    for line in output.splitlines():
        if "weights fingerprint" in line:
            rank = int(line.split("rank ")[1].split()[0])
            fingerprints[rank] = float(line.rsplit(" ", 1)[1])
    assert set(fingerprints) == {0, 1}
    assert fingerprints[0] == fingerprints[1]
    state = checkpoint_tensors(tf.train.latest_checkpoint(str(tmp_path / "hvd")))
    assert state["global_step"] == 4 and state["micro_step"] == 8
    # only rank 0 writes into --output_dir
    assert len(list((tmp_path / "hvd").glob("events.out.tfevents*"))) == 1


def _file_bytes(folder):
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))
            if name.startswith("model.ckpt") or name == "checkpoint"}


def test_a_resume_with_another_model_config_refuses_and_keeps_the_checkpoint(data, tmp_path):
    """The same --output_dir with another config: one line naming a variable, exit 1, and the
    checkpoint (index, data, .meta) byte for byte as it was. (Fewer layers used to train on and
    replace the checkpoint with the smaller model; more or wider ones died in a traceback
    after writing the new graph's .meta.)"""
    from modeling import BertConfig
    output = tmp_path / "run"
    first = subprocess.run(command_line(data, output, num_train_steps=2), capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    before = _file_bytes(output)
    assert any(name.endswith(".meta") for name in before)
    config = BertConfig.from_json_file(str(data / "bert_config.json"))
    for change in (dict(num_hidden_layers=1), dict(hidden_size=128), dict(num_hidden_layers=3)):
        other = tmp_path / "other_config.json"
        config.replace(**change).to_json_file(str(other))
        second = subprocess.run(command_line(data, output, num_train_steps=4,
                                             bert_config_file=str(other)),
                                capture_output=True, text=True, timeout=300)
        assert second.returncode == 1, (change, second.stderr[-3000:])
        assert "Traceback" not in second.stderr
        error = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
        assert len(error) == 1 and "of another model" in error[0] and "bert/" in error[0], error
        assert _file_bytes(output) == before, change


@pytest.mark.horovod
def test_a_rank_with_only_an_empty_file_stops_every_rank_in_one_line(data, tmp_path, repo_root):
    """Two ranks, one of whose files is a zero-byte .tfrecord: both stop at start-up naming
    it (this used to print the plan and then wait in the first allreduce forever)."""
    pytest.importorskip("horovod.tensorflow", reason="Horovod not installed "
                        "(bash scripts/install.sh builds it)")
    train = tmp_path / "train"
    train.mkdir()
    write_random_records(train / "part-0.tfrecord", 48, SEQ, PREDICTIONS, VOCAB, seed=1)
    (train / "part-1.tfrecord").write_bytes(b"")
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    args = command_line(data, tmp_path / "hvd", num_train_steps=4)
    args = [horovodrun, "-np", "2", "--gloo", "-H", "localhost:2"] + [
        arg if not arg.startswith("--input_files_dir=") else f"--input_files_dir={train}"
        for arg in args] + ["--horovod"]
    result = subprocess.run(args, capture_output=True, text=True, cwd=repo_root, timeout=240)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    errors = [line for line in output.splitlines() if "error: " in line]
    assert len(errors) == 2 and all("part-1.tfrecord: empty, and rank 1 of 2 reads nothing "
                                    "else" in line for line in errors), errors
    # (horovodrun itself ends in a traceback of its own when a rank fails; the ranks do not)
    assert not [line for line in output.splitlines()
                if line.startswith(("[0]", "[1]")) and "Traceback" in line]
    assert not list((tmp_path / "hvd").glob("model.ckpt-*"))


def test_an_unwritable_output_dir_is_one_line_naming_it(data, tmp_path):
    """Seen as a user without root's overrides (`setpriv` drops the capabilities; root
    ignores permissions): a read-only --output_dir used to end in a PermissionError
    traceback from the run lock."""
    import shutil
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop root's permission overrides")
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        result = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-all",
                                 *command_line(data, folder, num_train_steps=1)],
                                capture_output=True, text=True, timeout=300)
    finally:
        folder.chmod(0o755)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last == f"error: {folder}: cannot write to the output folder (Permission denied)"
    assert os.listdir(folder) == []
