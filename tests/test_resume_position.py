"""Resuming the data position: per-rank input states restored in O(1) (no records skipped),
the skipping fallback, refusal of changed data settings, file-level sharding in
pre-training, and bit-identical weights after kill -9 at three seeded moments (with
accumulation, and under two Horovod ranks)."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from pretraining.dynamic_masking import DynamicMasking
from kill_support import (assert_same_weights, checkpoint_steps, seeded_moments,
                          train_killed_at_checkpoints)
from pretraining.input_pipeline import InputError, feature_spec, training_input
from pretraining_records import write_random_records, write_random_unmasked_records
from test_pretraining import (PREDICTIONS, SEQ, VOCAB, checkpoint_tensors,  # noqa: F401
                              command_line, data, write_data)
from reporting.errors import UsageError
from resilience import data_order
from runtime.distributed import Workers
from training import records
from training.records import TrainingInput, record_dataset
from training.resume import train_resuming
from training.run_config import make_run_config
from training.train_step import micro_step_variable

tf1 = tf.compat.v1


def record_files(folder, write):
    """Three files of 30 records, `write(path, count, seed)`."""
    paths = []
    for index in range(3):
        path = folder / f"part-{index}.tfrecord"
        write(path, 30, index)
        paths.append(str(path))
    return tuple(paths)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return record_files(tmp_path_factory.mktemp("records"), lambda path, count, index:
                        write_random_records(path, count, SEQ, PREDICTIONS, 10_000,
                                             seed=50 + index))


@pytest.fixture(scope="module")
def unmasked_files(tmp_path_factory):
    """Dynamic-masking records: the input pipeline masks them (pretraining.dynamic_masking)."""
    return record_files(tmp_path_factory.mktemp("unmasked"), lambda path, count, index:
                        write_random_unmasked_records(path, count, SEQ, 10_000,
                                                      seed=70 + index))


@pytest.fixture(scope="module")
def unmasked_data(tmp_path_factory):
    """test_pretraining's `data` with dynamic-masking records."""
    return write_data(tmp_path_factory.mktemp("unmasked_pretraining"),
                      lambda path, count, seed: write_random_unmasked_records(
                          path, count, SEQ, VOCAB, seed=seed))


@pytest.fixture(params=["static", "dynamic"])
def kind(request):
    """(files, masking) of static records or of dynamic-masking ones."""
    if request.param == "static":
        return request.getfixturevalue("files"), None
    return request.getfixturevalue("unmasked_files"), DynamicMasking(PREDICTIONS)


@pytest.fixture
def skips(monkeypatch):
    """Records skipped by every training pipeline built (what a resume re-reads)."""
    seen = []

    def spy(*args, **kwargs):
        if args[3]:  # is_training
            seen.append(kwargs.get("skip_records", 0))
        return record_dataset(*args, **kwargs)

    monkeypatch.setattr(records, "record_dataset", spy)
    return seen


class _Batches(tf1.train.SessionRunHook):
    """Collects a tensor (the tokens and masked positions) of every micro-batch trained on."""

    def __init__(self, ids, into):
        self._ids, self._into = ids, into

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs(self._ids)

    def after_run(self, run_context, run_values):
        self._into.append(run_values.results.tolist())


def train(output_dir, files, max_steps, batch_size=4, save_checkpoints_steps=2, seed=7,
          reset=None, masking=None):
    """Trains a counting model with train_resuming; returns the batches it trained on (their
    input_ids, then masked_lm_positions). `masking`: see `training_input`."""
    batches = []

    def model_fn(features, labels, mode, params=None):
        micro_step = micro_step_variable()
        global_step = tf1.train.get_or_create_global_step()
        weight = tf1.get_variable("weight", [], tf.float32, tf1.zeros_initializer())
        loss = weight * tf.reduce_sum(tf.cast(features["input_ids"], tf.float32))
        train_op = tf.group(micro_step.assign_add(1), global_step.assign_add(1))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, training_hooks=[
            _Batches(tf.concat([features["input_ids"], features["masked_lm_positions"]], 1),
                     batches)])

    workers = Workers(False)
    estimator = tf.estimator.Estimator(model_fn, config=make_run_config(
        str(output_dir), workers, save_checkpoints_steps, 5, seed=seed))
    stream = training_input(files, batch_size, SEQ, PREDICTIONS, seed, 1, 0, 16, masking)
    train_resuming(estimator, stream, str(output_dir), max_steps, workers,
                   save_checkpoints_steps, reset_data_position=reset)
    return batches


def states(output_dir):
    folder = os.path.join(output_dir, "input_state", "rank-0")
    return sorted(int(name.split("-")[1].split(".")[0]) for name in os.listdir(folder)
                  if name.endswith(".json"))


def test_resume_restores_the_input_state_and_skips_no_records(kind, tmp_path, skips):
    files, masking = kind
    reference = train(tmp_path / "reference", files, 12, masking=masking)
    assert skips == [0]
    out = tmp_path / "run"
    first = train(out, files, 5, masking=masking)
    # a state at every model checkpoint (steps 2, 4) and at the end (5), the last 3 kept
    assert states(out) == [2, 4, 5] == checkpoint_steps(out)[-3:]
    second = train(out, files, 12, masking=masking)
    assert skips == [0, 0, 0], "the resumed pipeline re-read records"
    assert first + second == reference
    # the Estimator's rule restarts at the resumed step: model checkpoints 7, 9, 11 and 12
    assert states(out) == [9, 11, 12] == checkpoint_steps(out)[-3:]


@pytest.mark.faults
def test_state_of_an_older_checkpoint_is_found_by_its_micro_step(files, tmp_path, skips):
    reference = train(tmp_path / "reference", files, 9)
    out = tmp_path / "run"
    train(out, files, 6)
    # as if killed after the input state of step 6 but before its model checkpoint
    tf1.train.update_checkpoint_state(str(out), str(out / "model.ckpt-4"))
    assert train(out, files, 9) == reference[4:]
    assert skips[-1] == 0


@pytest.mark.faults
def test_without_a_matching_state_the_pipeline_skips_exactly_and_warns(kind, tmp_path, skips,
                                                                       caplog):
    files, masking = kind
    reference = train(tmp_path / "reference", files, 10, masking=masking)
    out = tmp_path / "run"
    train(out, files, 5, masking=masking)
    shutil.rmtree(out / "input_state")
    os.remove(out / data_order.DATA_ORDER_FILE)  # as written by an older version
    with caplog.at_level("WARNING"):
        assert train(out, files, 10, masking=masking) == reference[5:]
    assert skips[-1] == 5 * 4
    assert "no input state for micro_step 5" in caplog.text
    assert "skipping 20 records (exact, but slower)" in caplog.text
    assert json.loads((out / data_order.DATA_ORDER_FILE).read_text())["start_micro_step"] == 0


@pytest.mark.faults
def test_states_saved_after_a_skipping_resume_are_restored(files, tmp_path, skips):
    """A run that resumed by skipping saves states of a pipeline that skips; the next resume
    rebuilds that pipeline and restores them (it used to fail: the saved iterator did not
    match a pipeline built without the skip), then re-reads nothing."""
    reference = train(tmp_path / "reference", files, 12)
    out = tmp_path / "run"
    first = train(out, files, 4)
    shutil.rmtree(out / "input_state")
    second = train(out, files, 8)
    assert skips[-1] == 4 * 4
    third = train(out, files, 12)
    assert first + second + third == reference
    assert skips[-1] == 4 * 4  # the same pipeline as the second run's, restored: no re-read


def test_changed_data_settings_are_refused_unless_the_position_is_reset(files, tmp_path,
                                                                        skips):
    out = tmp_path / "run"
    train(out, files, 4)
    with pytest.raises(UsageError) as refused:
        train(out, files, 8, batch_size=8, reset=False)
    assert str(refused.value) == (
        f"{out}: its checkpoint's data position (micro_step 4) was reached with "
        "train_batch_size=4 but this run has train_batch_size=8; rerun with the recorded "
        "values or use a new --output_dir, or pass --reset_data_position to restart the data "
        "order on purpose")
    with pytest.raises(UsageError, match=r"seed=7 but this run has seed=8; rerun with the "
                                         r"recorded values or use a new --output_dir$"):
        train(out, files, 8, seed=8)  # a caller without a reset option (fine-tuning)
    # a reset restarts the order: the next batches are those of a fresh run with batch 8
    fresh = train(tmp_path / "fresh", files, 4, batch_size=8)
    assert train(out, files, 8, batch_size=8, reset=True) == fresh
    assert json.loads((out / data_order.DATA_ORDER_FILE).read_text())["start_micro_step"] == 4
    # and positions count from the reset: without states, 2 micro-batches of 8 are skipped
    shutil.rmtree(out / "input_state")
    assert train(out, files, 10, batch_size=8) == train(tmp_path / "fresh", files, 6,
                                                        batch_size=8)
    assert skips[-2] == 4 * 8 and skips[-1] == 0


def test_changed_masking_of_dynamic_records_is_refused(unmasked_files, tmp_path, caplog):
    """The masks of a micro-batch follow from (seed, rank, number) and the masking settings,
    so a resume that changes a setting would train the same position on other masks."""
    reference = train(tmp_path / "reference", unmasked_files, 8,
                      masking=DynamicMasking(PREDICTIONS))
    out = tmp_path / "run"
    assert train(out, unmasked_files, 4, masking=DynamicMasking(PREDICTIONS)) == reference[:4]
    for changed, recorded, given in [
            (DynamicMasking(PREDICTIONS, 0.2), "masked_lm_prob=0.15", "masked_lm_prob=0.2"),
            (DynamicMasking(PREDICTIONS, whole_word=True), "do_whole_word_mask=False",
             "do_whole_word_mask=True"),
            (DynamicMasking(PREDICTIONS - 1), f"max_predictions_per_seq={PREDICTIONS}",
             f"max_predictions_per_seq={PREDICTIONS - 1}")]:
        with pytest.raises(UsageError) as refused:
            train(out, unmasked_files, 8, masking=changed)
        assert str(refused.value) == (
            f"{out}: its checkpoint's data position (micro_step 4) was reached with "
            f"{recorded} but this run has {given}; rerun with the recorded values or use a "
            "new --output_dir")
    assert train(out, unmasked_files, 8, masking=DynamicMasking(PREDICTIONS)) == reference[4:]

    # a data_order.json written before the masking settings were recorded: they are unknown,
    # so this run's are assumed (with a warning) and recorded for the next resume
    path = out / data_order.DATA_ORDER_FILE
    masking = ("max_predictions_per_seq", "masked_lm_prob", "do_whole_word_mask")
    older = {key: value for key, value in json.loads(path.read_text()).items()
             if key not in masking}
    path.write_text(json.dumps(older))
    with caplog.at_level("WARNING"):
        train(out, unmasked_files, 10, masking=DynamicMasking(PREDICTIONS, 0.2))
    assert (f"{path} predates the recording of do_whole_word_mask, masked_lm_prob, "
            f"max_predictions_per_seq: assuming they were do_whole_word_mask=False, "
            f"masked_lm_prob=0.2, max_predictions_per_seq={PREDICTIONS}") in caplog.text
    assert json.loads(path.read_text())["masked_lm_prob"] == 0.2
    with pytest.raises(UsageError, match=r"reached with masked_lm_prob=0.2 but this run has "
                                         r"masked_lm_prob=0.15;"):
        train(out, unmasked_files, 12, masking=DynamicMasking(PREDICTIONS))


def test_other_files_are_refused_and_other_ranks_restart_the_order(files, tmp_path, caplog):
    """A job requeued on another node count with the global batch kept (fewer ranks, more
    accumulation) resumes (weights and step) with a new data order, said in one line; other
    files, or other ranks together with another batch, are refused."""
    def order(ranks=1, batch=4, accumulation=1, devices=1, stream_files=files):
        stream = TrainingInput(stream_files, batch * devices, {}, seed=7, num_shards=ranks)
        return data_order.job_order(stream.order(), accumulation, devices)

    data_order.record(str(tmp_path), dict(order(accumulation=2), start_micro_step=0))
    two_ranks = order(ranks=2)
    with caplog.at_level("WARNING"):
        resolved = data_order.resolve(str(tmp_path), two_ranks, 6)
    assert resolved == dict(two_ranks, start_micro_step=6)
    assert (f"{tmp_path}: its data position (micro_step 6) was reached on 1 rank and this run "
            "has 2 (global batch 8 kept: --num_accumulation_steps=1): the weights and step "
            "resume, the data order restarts from its beginning on 2 ranks") in caplog.text
    # towers count as ranks do: 2 local devices without accumulation keep the batch too
    assert data_order.resolve(str(tmp_path), order(devices=2), 6)["start_micro_step"] == 6
    bigger = order(ranks=2, batch=8)
    with pytest.raises(UsageError, match=r"reached with num_accumulation_steps=2, ranks=1, "
                                         r"train_batch_size=4 but this run has "
                                         r"num_accumulation_steps=1, ranks=2, train_batch_size=8;"):
        data_order.resolve(str(tmp_path), bigger, 6)
    fewer = order(accumulation=2, stream_files=files[:2])
    with pytest.raises(UsageError, match=r"with input_files=3, input_files_sha256=\w+ but "
                                         r"this run has input_files=2, input_files_sha256="):
        data_order.resolve(str(tmp_path), fewer, 6)
    assert data_order.resolve(str(tmp_path), two_ranks, 0)["start_micro_step"] == 0


def test_another_global_batch_is_refused_naming_the_flag(files, tmp_path, caplog):
    """Another --num_accumulation_steps (2 -> 4, 2 -> 1), or other ranks or local devices
    that do not keep the global batch, would train the rest of the run on another recipe:
    refused in one line naming the flag, both values and the accumulation that keeps it."""
    def order(ranks=1, accumulation=2, devices=1):
        stream = TrainingInput(files, 4 * devices, {}, seed=7, num_shards=ranks)
        return data_order.job_order(stream.order(), accumulation, devices)

    data_order.record(str(tmp_path), dict(order(), start_micro_step=0))
    recorded = ("was trained with a global batch of 8 sequences (--train_batch_size=4 x "
                "--num_accumulation_steps=2 x 1 rank)")
    for changed, now, given in [
            (order(accumulation=4), 16, "--num_accumulation_steps=4 where it had 2"),
            (order(accumulation=1), 4, "--num_accumulation_steps=1 where it had 2")]:
        with pytest.raises(UsageError) as refused:
            data_order.resolve(str(tmp_path), changed, 6, reset=False)
        assert str(refused.value) == (
            f"{tmp_path}: its checkpoint (micro_step 6) {recorded} and this run's would be "
            f"{now} ({given}); pass --num_accumulation_steps=2 to keep it, pass "
            "--reset_data_position to change it on purpose, or start over (--start_over, or "
            "a new --output_dir)")
    with pytest.raises(UsageError) as refused:  # a requeue on 2 ranks, accumulation unchanged
        data_order.resolve(str(tmp_path), order(ranks=2), 6)
    assert str(refused.value).endswith(
        "and this run's would be 16 (2 ranks where it had 1); pass --num_accumulation_steps=1 "
        "to keep it, or start over (--start_over, or a new --output_dir)")
    with pytest.raises(UsageError, match=r"x --num_local_devices=1\) and this run's would be "
                                         r"16 \(--num_local_devices=2 where it had 1\); pass "
                                         r"--num_accumulation_steps=1 to keep it"):
        data_order.resolve(str(tmp_path), order(devices=2), 6)
    # on purpose: the order restarts, and the new global batch is said
    with caplog.at_level("WARNING"):
        assert data_order.resolve(str(tmp_path), order(accumulation=4), 6,
                                  reset=True)["start_micro_step"] == 6
    assert ("--reset_data_position: the data order restarts from its beginning at micro_step "
            "6, and the global batch changes from 8 to 16 sequences") in caplog.text

    # a data_order.json from before the accumulation was recorded, its batch per process
    # (local devices x the flag): unknown, so a layout change restarts as it did, and the
    # same settings resume where they were
    older = {key: value for key, value in order(devices=2).items()
             if key not in ("num_accumulation_steps", "num_local_devices")}
    older["train_batch_size"] = 8
    data_order.record(str(tmp_path), dict(older, start_micro_step=2))
    with caplog.at_level("WARNING"):
        assert data_order.resolve(str(tmp_path), order(devices=2, accumulation=3),
                                  6)["start_micro_step"] == 2
    assert ("predates the recording of num_accumulation_steps, num_local_devices: assuming "
            "they were num_accumulation_steps=3, num_local_devices=2") in caplog.text
    assert data_order.resolve(str(tmp_path), order(ranks=2, devices=2), 6)["start_micro_step"] == 6


def test_fine_tuning_record_flags_are_refused_by_name(files, tmp_path, caplog):
    """Fine-tuning makes its training records at every start: a resume with another
    --max_seq_length (--doc_stride, ...) reads other records, refused naming the flag (before:
    only the records' digest, 64 hex digits a side)."""
    from finetuning.driver import record_flags
    from finetuning.options import ClassifierOptions, SquadOptions
    assert record_flags(ClassifierOptions.of(max_seq_length=64)) == {
        "max_seq_length": 64, "do_lower_case": True}
    assert record_flags(SquadOptions.of(doc_stride=32)) == {
        "max_seq_length": 384, "doc_stride": 32, "max_query_length": 64, "do_lower_case": True}

    def order(flags, stream_files=files):
        stream = TrainingInput(stream_files, 8, {}, seed=7, shard_by="records")
        return data_order.job_order(stream.order(), 2, 1, flags)

    data_order.record(str(tmp_path), dict(order({"max_seq_length": 16}), start_micro_step=0))
    with pytest.raises(UsageError, match=r"was reached with input_files=3, "
                                         r"input_files_sha256=\w{12}, max_seq_length=16 but "
                                         r"this run has input_files=2, input_files_sha256="
                                         r"\w{12}, max_seq_length=32; rerun with the recorded "
                                         r"values or use a new --output_dir$"):
        data_order.resolve(str(tmp_path), order({"max_seq_length": 32}, files[:2]), 4)
    # a folder from before the flags were recorded: unknown, this run's assumed
    with caplog.at_level("WARNING"):
        assert data_order.resolve(str(tmp_path), order({"max_seq_length": 16,
                                                        "doc_stride": 32}), 4) is not None
    assert "predates the recording of doc_stride: assuming they were doc_stride=32" in caplog.text


def test_pretraining_shards_whole_files_and_fine_tuning_records(files):
    with pytest.raises(InputError, match=r"^2 training input files for 3 ranks: .*"
                                         r"--n_training_shards=K` \(K a multiple of 3\)$"):
        training_input(files[:2], 4, SEQ, PREDICTIONS, 7, 3, 0, 16)
    spec = feature_spec(SEQ, PREDICTIONS)

    def ids(rank):
        dataset = record_dataset([files[0]], 30, spec, False, num_shards=2, shard_index=rank,
                                 shard_by="records", drop_remainder=False)
        return {tuple(row) for batch in dataset for row in batch["input_ids"].numpy()}

    rank0, rank1 = ids(0), ids(1)
    assert len(rank0) == len(rank1) == 15 and not rank0 & rank1
    with pytest.raises(ValueError, match="1 files cannot be split by file over 2 shards"):
        record_dataset([files[0]], 4, spec, True, num_shards=2)


@pytest.mark.faults
def test_three_kills_with_accumulation_resume_bit_identical(unmasked_data, tmp_path, repo_root):
    """kill -9 at three seeded checkpoints (the kill lands at or shortly after one, often
    inside an accumulation window); before the third run the input states are deleted, so it
    resumes by skipping records. The weights equal an uninterrupted run's, bit for bit.
    On dynamic-masking records with whole-word masking, so the masks must be reproduced too
    (static records: the two-rank test below)."""
    overrides = dict(num_train_steps=16, save_checkpoints_steps=2, num_accumulation_steps=3)
    reference = tmp_path / "reference"
    dynamic = ["--do_whole_word_mask", "--masked_lm_prob=0.2"]
    subprocess.run(command_line(unmasked_data, reference, **overrides) + dynamic, cwd=repo_root,
                   check=True, capture_output=True, timeout=300)

    run = tmp_path / "interrupted"
    moments = seeded_moments("run_pretraining 1 rank", list(range(0, 13, 2)))
    train_killed_at_checkpoints(command_line(unmasked_data, run, **overrides) + dynamic, run,
                                moments, 16, tmp_path, repo_root, drop_input_states_before=2)
    assert_same_weights(reference / "model.ckpt-16", run / "model.ckpt-16")
    assert checkpoint_tensors(str(run / "model.ckpt-16"))["micro_step"] == 48


def test_resume_with_another_batch_size_is_refused_in_one_line(data, tmp_path, repo_root):
    """Another --train_batch_size, or another --num_accumulation_steps (1 -> 2: before, a
    list of the checkpoint variables the new graph has and the checkpoint lacks), is refused
    in one line; --reset_data_position changes both on purpose, the new accumulation buffers
    starting empty (`resilience.accumulation_state`)."""
    out = tmp_path / "run"
    subprocess.run(command_line(data, out, num_train_steps=2), cwd=repo_root, check=True,
                   capture_output=True, timeout=300)

    def last_error(**overrides):
        result = subprocess.run(command_line(data, out, num_train_steps=4, **overrides),
                                cwd=repo_root, capture_output=True, text=True, timeout=300)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        return [line for line in result.stderr.splitlines() if line.startswith("error:")]

    assert last_error(train_batch_size=8) == [
        f"error: {out}: its checkpoint's data position (micro_step 2) was reached with "
        "train_batch_size=4 but this run has train_batch_size=8; rerun with the recorded "
        "values or use a new --output_dir, or pass --reset_data_position to restart the data "
        "order on purpose"]
    assert last_error(num_accumulation_steps=2) == [
        f"error: {out}: its checkpoint (micro_step 2) was trained with a global batch of 4 "
        "sequences (--train_batch_size=4 x --num_accumulation_steps=1 x 1 rank) and this run's "
        "would be 8 (--num_accumulation_steps=2 where it had 1); pass "
        "--num_accumulation_steps=1 to keep it, pass --reset_data_position to change it on "
        "purpose, or start over (--start_over, or a new --output_dir)"]
    result = subprocess.run(command_line(data, out, num_train_steps=4, train_batch_size=8,
                                         num_accumulation_steps=2) +
                            ["--reset_data_position"], cwd=repo_root, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (f"{out}: --reset_data_position: the data order restarts from its beginning at "
            "micro_step 2, and the global batch changes from 4 to 16 sequences") in result.stderr
    order = json.loads((out / "data_order.json").read_text())
    assert order["start_micro_step"] == 2 and order["num_accumulation_steps"] == 2
    state = checkpoint_tensors(str(out / "model.ckpt-4"))
    assert state["global_step"] == 4 and state["micro_step"] == 2 + 2 * 2
    assert state["gradient_accumulation/local_step"] == 0


@pytest.mark.horovod
@pytest.mark.faults
def test_two_horovod_ranks_resume_their_own_input_states(data, tmp_path, repo_root):
    """kill -9 of horovodrun and both ranks at two seeded checkpoints: each rank restores its
    own input state (or skips, when the kill fell before rank 1 saved its state for rank 0's
    checkpoint); the weights equal an uninterrupted run's, bit for bit. (Two kills, not three
    as in the one-rank test above: each costs a two-rank start-up; the second kill already
    resumes a resumed run.)"""
    pytest.importorskip("horovod.tensorflow", reason="Horovod not installed "
                        "(bash scripts/install.sh builds it)")
    horovodrun = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", "2",
                  "--gloo", "-H", "localhost:2"]

    def args(output, **overrides):
        settings = dict(num_train_steps=12, save_checkpoints_steps=2, num_accumulation_steps=2)
        settings.update(overrides)
        return horovodrun + command_line(data, output, **settings) + ["--horovod"]

    reference, run = tmp_path / "reference", tmp_path / "interrupted"
    result = subprocess.run(args(reference), cwd=repo_root, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    moments = seeded_moments("run_pretraining 2 ranks", list(range(0, 9, 2)), count=2)
    train_killed_at_checkpoints(args(run), run, moments, 12, tmp_path, repo_root, ranks=(0, 1))
    assert_same_weights(reference / "model.ckpt-12", run / "model.ckpt-12")

    single = tmp_path / "one_file"
    single.mkdir()
    os.symlink(data / "train" / "part-0.tfrecord", single / "part-0.tfrecord")
    result = subprocess.run(args(tmp_path / "few", input_files_dir=str(single)), cwd=repo_root,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    # the ranks' own output (horovodrun prefixes it with [rank]; it may stop the second rank
    # before that prints) holds no traceback, only the one-line error
    ranks = [line.split(":", 1)[1] for line in (result.stdout + result.stderr).splitlines()
             if line.startswith(("[0]<stderr>:", "[1]<stderr>:"))]
    assert not any("Traceback" in line for line in ranks)
    assert {line for line in ranks if line.startswith("error:")} == {
        "error: 1 training input file for 2 ranks: each rank reads whole files, so there "
        "must be at least one per rank; re-shard with `bertPrep.py --action sharding "
        "--n_training_shards=K` (K a multiple of 2)"}


@pytest.mark.horovod
@pytest.mark.faults
def test_a_job_requeued_on_fewer_ranks_resumes_with_a_new_data_order(tmp_path, repo_root):
    """Preempted on 2 ranks, resubmitted on 1 with twice the accumulation (a 2-node job
    requeued on one node, its global batch kept): the weights and step resume, the data order
    restarts on 1 rank, said in one line, and the run ends. (The same requeue without the
    accumulation, which changes the global batch, is refused: the test above.)"""
    pytest.importorskip("horovod.tensorflow", reason="Horovod not installed "
                        "(bash scripts/install.sh builds it)")
    data = tmp_path / "data"
    data.mkdir()
    write_data(data)

    def run(ranks, steps, **overrides):
        horovodrun = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np",
                      str(ranks), "--gloo", "-H", f"localhost:{ranks}"]
        result = subprocess.run(
            horovodrun + command_line(data, tmp_path / "run", num_train_steps=steps,
                                      save_checkpoints_steps=2, **overrides) + ["--horovod"],
            cwd=repo_root, capture_output=True, text=True, timeout=400)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout + result.stderr

    run(2, 2)
    first = checkpoint_tensors(str(tmp_path / "run" / "model.ckpt-2"))
    assert "gradient_accumulation/local_step" not in first
    # the global batch kept: twice the accumulation, whose buffers the checkpoint lacks
    output = run(1, 4, num_accumulation_steps=2)
    said = [line for line in output.splitlines() if "data position" in line]
    assert len(said) == 1 and said[0].endswith(
        f"{tmp_path / 'run'}: its data position (micro_step 2) was reached on 2 ranks and this "
        "run has 1 (global batch 8 kept: --num_accumulation_steps=2): the weights and step "
        "resume, the data order restarts from its beginning on 1 rank (records of the current "
        "epoch may be seen again)"), said
    assert "error:" not in output
    order = json.loads((tmp_path / "run" / "data_order.json").read_text())
    assert order["ranks"] == 1 and order["start_micro_step"] == 2
    assert order["num_accumulation_steps"] == 2
    last = checkpoint_tensors(str(tmp_path / "run" / "model.ckpt-4"))
    assert last["global_step"] == 4 and last["micro_step"] == 2 + 2 * 2
    # steps 3 and 4 ran, from the 2-rank checkpoint: not steps 1-4 from a fresh start
    steps = {line.split("step ", 1)[1].split()[0] for line in output.splitlines()
             if "step " in line and "/4" in line}
    assert "3/4" in steps and "1/4" not in steps, steps
    kernel = "bert/encoder/layer_0/attention/self/query/kernel"
    assert not np.array_equal(first[kernel], last[kernel])
