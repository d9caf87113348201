"""Bad records and a full disk during pre-training: one `error:` line naming the file (and
record) or folder, never a TensorFlow traceback; checks of every file at start-up; skipping
and counting bad records with --skip_bad_records; half-written checkpoints removed and a
resume after space is freed."""
import os
import re
import shutil

import pytest
import tensorflow as tf

from data_prep.instances import record_metadata
from pretraining.input_pipeline import InputError, feature_spec, value_ranges
from pretraining.runner import main, run
from pretraining_records import rewrite_record, write_random_records
from test_pretraining import PREDICTIONS, SEQ, VOCAB, make_flags
from test_pretraining import data  # noqa: F401  (module fixture: tiny config and records)
from resilience import record_guard
from resilience.disk_space import CheckpointSpaceListener, DiskFullError
from resilience.failures import explained_failures
from resilience.record_scan import BadRecordError, locate_bad_record

RANGES = value_ranges(VOCAB, 2, SEQ)
SPEC = feature_spec(SEQ, PREDICTIONS)


def id_too_large(example):
    example.features.feature["input_ids"].int64_list.value[3] = VOCAB + 49


def one_id_too_many(example):
    example.features.feature["input_ids"].int64_list.value.append(5)


def corrupt_byte(path, offset=6000):
    data = bytearray(open(path, "rb").read())
    data[offset] ^= 0xFF
    open(path, "wb").write(bytes(data))


def write_metadata(path, records=48, vocab_size=VOCAB, masking="static", seq=SEQ):
    record_metadata.write(path, record_metadata.describe(records, seq, PREDICTIONS, vocab_size,
                                                         "same vocab", masking))


def copy_of(data, tmp_path, name):  # noqa: F811
    """A copy of the training records and of their metadata folder beside them."""
    folder = tmp_path / name
    shutil.copytree(data / "train", folder)
    if (data / "train.meta").is_dir():
        shutil.copytree(data / "train.meta", tmp_path / f"{name}.meta")
    return folder


def error_lines(text):
    return [line for line in text.splitlines() if line.startswith("error: ")]


def record_offset(path, index):
    """Byte offset of record `index` in a TFRecord file."""
    records = tf.compat.v1.io.tf_record_iterator(str(path))
    return sum(len(record) + 16 for _, record in zip(range(index), records))


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """Three files of 12 records, each bad past its first record: part-0 truncated inside
    record 11 (its metadata says 12 records), part-1 with a corrupt checksum in record 6,
    part-2 with one id too many in record 2 and an id >= vocab_size in record 5. A pass
    holds 27 good records and 4 bad ones (part-1's lost tail counts as 1: no metadata)."""
    folder = tmp_path_factory.mktemp("damaged") / "train"
    folder.mkdir()
    paths = [folder / f"part-{index}.tfrecord" for index in range(3)]
    for index, path in enumerate(paths):
        write_random_records(path, 12, SEQ, PREDICTIONS, VOCAB, seed=20 + index)
    os.truncate(paths[0], record_offset(paths[0], 11) + 30)
    write_metadata(paths[0], records=12)
    corrupt_byte(paths[1], record_offset(paths[1], 6) + 20)
    rewrite_record(paths[2], 2, one_id_too_many)
    rewrite_record(paths[2], 5, id_too_large)
    return folder


def test_start_up_checks_every_file_and_its_metadata(data, tmp_path):  # noqa: F811
    output = tmp_path / "out"

    def refused(folder, *fragments):
        with pytest.raises(InputError) as error:
            run(make_flags(data, output, input_files_dir=str(folder)))
        message = str(error.value)
        assert "\n" not in message and all(f in message for f in fragments), message
        assert not output.exists()  # refused before anything was written

    other_length = copy_of(data, tmp_path, "other_length")
    write_random_records(other_length / "part-1.tfrecord", 8, 32, PREDICTIONS, VOCAB)
    refused(other_length, f"{other_length / 'part-1.tfrecord'}: records have sequence length "
                          "32 but --max_seq_length=16")

    first_id = copy_of(data, tmp_path, "first_id")
    rewrite_record(first_id / "part-2.tfrecord", 0, id_too_large)
    refused(first_id, f"{first_id / 'part-2.tfrecord'}: record 0: input_ids holds 150 >= 101 "
                      "(the config's vocab_size)")

    meta = copy_of(data, tmp_path, "meta")
    for index in range(3):
        write_metadata(meta / f"part-{index}.tfrecord", masking="dynamic" if index else "static")
    refused(meta, f"{meta / 'part-1.tfrecord'}: has masking 'dynamic' but "
                  f"{meta / 'part-0.tfrecord'} has 'static'")
    write_metadata(meta / "part-1.tfrecord", vocab_size=30522)
    # the check every command makes of a vocabulary against a config (training.vocab_fit)
    refused(meta, f"{meta / 'part-1.tfrecord'}: records made with a vocabulary of 30522 "
                  "tokens, more than the vocab_size 101 of "
                  f"{data / 'bert_config.json'}: token ids from 101 up have no embedding")
    write_metadata(meta / "part-1.tfrecord", seq=128)
    refused(meta, f"{meta / 'part-1.tfrecord'} (per its metadata): records have sequence "
                  "length 128 but --max_seq_length=16")
    # The metadata lives beside the records' folder (`<folder>.meta/`), where NVIDIA's
    # `--input_files_dir/*` does not find it; metadata beside the records (the earlier
    # place) is still read.
    new_place = record_metadata.metadata_path(meta / "part-1.tfrecord")
    assert new_place == f"{meta}.meta/part-1.tfrecord.meta.json"
    open(new_place, "w").write("{")
    refused(meta, f"{new_place}: not valid JSON")
    os.remove(new_place)
    (meta / "part-1.tfrecord.meta.json").write_text("{")
    refused(meta, f"{meta / 'part-1.tfrecord.meta.json'}: not valid JSON")
    write_metadata(meta / "part-1.tfrecord")
    assert not (meta / "part-1.tfrecord.meta.json").exists()  # the rewrite replaced it
    open(meta / "part-1.tfrecord", "wb").close()
    refused(meta, f"{meta / 'part-1.tfrecord'}: empty, but its metadata says 48 records")


def test_scan_names_the_first_bad_record_of_each_kind(damaged):
    files = [str(damaged / f"part-{i}.tfrecord") for i in range(3)]
    assert locate_bad_record(files, SPEC, RANGES) == (
        f"{files[0]}: record 11: truncated at byte {record_offset(files[0], 11)} (the file "
        "ends inside this record)")
    assert locate_bad_record(files[1:], SPEC, RANGES).startswith(
        f"{files[1]}: record 6: corrupt (checksum mismatch near byte ")
    assert locate_bad_record(files[2:], SPEC, RANGES) == (
        f"{files[2]}: record 2: feature 'input_ids' has 17 values, expected 16")
    copy = damaged.parent / "part-2-copy.tfrecord"  # record 2 mended: the id error behind it
    shutil.copy(files[2], copy)
    rewrite_record(copy, 2, lambda example: example.features.feature["input_ids"]
                   .int64_list.value.pop())
    assert locate_bad_record([str(copy)], SPEC, RANGES) == (
        f"{copy}: record 5: input_ids holds 150 >= 101 (the config's vocab_size)")


def test_bad_record_deep_in_a_file_ends_the_run_in_one_line(data, tmp_path,
                                                            capsys):  # noqa: F811
    """Through the entry point's main (what run_pretraining.py returns as its exit status):
    a token id >= vocab_size in record 5 (a CPU would fail in the embedding lookup with a
    traceback, a GPU would silently read zeros)."""
    late_id = copy_of(data, tmp_path, "late_id")
    rewrite_record(late_id / "part-2.tfrecord", 5, id_too_large)
    assert main(make_flags(data, tmp_path / "out", num_train_steps=60,
                           input_files_dir=str(late_id))) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and error_lines(err) == [
        f"error: {late_id / 'part-2.tfrecord'}: record 5: input_ids holds 150 >= 101 "
        "(the config's vocab_size)"]
    assert not list((tmp_path / "out").glob("*_temp*"))


def test_unreadable_record_in_the_pipeline_is_named(damaged):
    """TensorFlow's DataLossError from the iterator ("truncated record at N", no file) turns
    into BadRecordError naming the file and record."""
    path = str(damaged / "part-0.tfrecord")
    with pytest.raises(BadRecordError) as error:
        with explained_failures("unused", [path], SPEC, RANGES):
            for _ in tf.data.TFRecordDataset(path):
                pass
    assert str(error.value) == (f"{path}: record 11: truncated at byte "
                                f"{record_offset(path, 11)} (the file ends inside this record)")


def test_tolerant_reading_counts_every_bad_record_exactly(damaged):
    """Files read in order to their end: what is kept and the final count are exact."""
    good = str(damaged.parent / "good.tfrecord")
    write_random_records(good, 10, SEQ, PREDICTIONS, VOCAB, seed=5)
    files = [str(damaged / f"part-{i}.tfrecord") for i in range(3)] + [good]
    sizes = [os.path.getsize(path) for path in files]
    counts = [12, -1, -1, -1]  # metadata: only the truncated file's count is known
    records = tf.data.Dataset.from_tensor_slices((files, sizes, counts)).interleave(
        record_guard.read_file_tolerantly, cycle_length=1)
    kept = list(record_guard.drop_bad_records(records, SPEC, RANGES))
    assert len(kept) == 11 + 6 + 10 + 10
    assert int(kept[-1][record_guard.BAD_RECORDS]) == 1 + 1 + 2
    assert all(int(max(example["input_ids"])) < VOCAB for example in kept)
    counts[1] = 12  # with part-1's metadata, its lost tail counts exactly: 6 records
    records = tf.data.Dataset.from_tensor_slices((files, sizes, counts)).interleave(
        record_guard.read_file_tolerantly, cycle_length=1)
    kept = list(record_guard.drop_bad_records(records, SPEC, RANGES))
    assert int(kept[-1][record_guard.BAD_RECORDS]) == 1 + 6 + 2


@pytest.mark.slow  # a minute or more: its file starts early (conftest.py)
def test_skip_bad_records_trains_counts_and_stops_over_the_bound(data, damaged, tmp_path,
                                                                 capsys, caplog):  # noqa: F811
    flags = dict(input_files_dir=str(damaged), skip_bad_records=True, num_train_steps=5,
                 train_batch_size=8)
    results = run(make_flags(data, tmp_path / "skip", **flags))
    # 5 steps of 8 records read more than one pass (27 good records, 4 bad) and less than two
    train = results["train"]
    assert train["final_step"] == 5 and 4 <= train["bad_records_skipped"] <= 8
    assert "bad records skipped so far (--max_bad_records=1000)" in caplog.text
    assert main(make_flags(data, tmp_path / "bounded", max_bad_records=1, **flags)) == 1
    [line] = error_lines(capsys.readouterr().err)
    skipped = re.fullmatch(
        rf"error: {re.escape(str(damaged))}: (\d+) bad records skipped, more than "
        r"--max_bad_records=1: regenerate or remove the damaged files \(run without "
        r"--skip_bad_records to stop at the first bad record and name it\)", line)
    assert skipped and int(skipped.group(1)) > 1, line


class CountingLimitHook(record_guard.BadRecordLimitHook):
    """Counts the session runs, and those that fetched the bad-record sum over ranks."""
    made = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.runs = self.fetching_runs = 0
        CountingLimitHook.made.append(self)

    def before_run(self, run_context):
        args = super().before_run(run_context)
        fetched = args.fetches.values() if isinstance(args.fetches, dict) else [args.fetches]
        self.runs += 1
        self.fetching_runs += any(value is self._total for value in fetched)
        return args


def test_bad_record_sum_over_ranks_is_fetched_once_per_window(data, damaged, tmp_path,
                                                              monkeypatch):  # noqa: F811
    """The sum over ranks is a collective: fetched every micro-batch it made each one a
    synchronisation point of all ranks. Once per accumulation window it costs what the
    window's allreduce costs anyway, and stops at the same boundary."""
    from pretraining import runner
    monkeypatch.setattr(runner, "BadRecordLimitHook", CountingLimitHook)
    results = run(make_flags(data, tmp_path / "windows", input_files_dir=str(damaged),
                             skip_bad_records=True, num_train_steps=3, train_batch_size=2,
                             num_accumulation_steps=4))
    [hook] = CountingLimitHook.made
    assert results["train"]["final_step"] == 3
    assert hook.runs == 12 and hook.fetching_runs == 3, (hook.runs, hook.fetching_runs)
    # 12 micro-batches of 2 read 24 of the 27 good records: the bad ones met on the way counted
    assert results["train"]["bad_records_skipped"] >= 1


@pytest.mark.slow  # a minute or more: its file starts early (conftest.py)
def test_full_disk_fails_in_one_line_leaves_nothing_half_written_and_resumes(
        data, small_disk, capsys):  # noqa: F811
    disk = small_disk("disk", "24m")
    output = disk / "out"
    flags = dict(num_train_steps=2, save_checkpoints_steps=2)
    assert run(make_flags(data, output, **flags))["train"]["final_step"] == 2
    (output / "model.ckpt-9_temp").mkdir()  # left by a run killed during a save
    (output / "model.ckpt-9_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x")
    (output / "model.ckpt-9.index").write_bytes(b"x")
    stat = os.statvfs(disk)
    filler = disk / "filler"
    filler.write_bytes(bytes(stat.f_bavail * stat.f_frsize - 1_000_000))  # 1 MB stays free

    assert main(make_flags(data, output, **dict(flags, num_train_steps=4))) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = error_lines(err)
    assert line.startswith(f"error: {output}: disk full (") and "No space left on device" in line
    # The need is the latest checkpoint's files (variables, graph) plus the input state.
    checkpoint_mb = sum(path.stat().st_size for path in output.glob("model.ckpt-2.*")) / 1e6
    need = re.search(r"a checkpoint needs about ([\d.]+) MB \(model\.ckpt-2 and the input "
                     r"state\)", line)
    assert need and round(checkpoint_mb, 1) <= float(need.group(1)) <= checkpoint_mb + 0.5, line
    assert line.endswith(" MB free; free space and rerun the same command to resume from "
                         "model.ckpt-2")
    leftovers = [name for name in os.listdir(output) if "_temp" in name or ".tmp" in name
                 or name.startswith("model.ckpt-9")]
    assert leftovers == []

    with tf.Graph().as_default():  # a save that cannot fit is refused before writing
        tf.compat.v1.get_variable("v", [1000, 1000])
        listener = CheckpointSpaceListener(str(output))
        listener.begin()
        with pytest.raises(DiskFullError, match=r"not enough disk space for a checkpoint: a "
                                                rf"checkpoint needs about {checkpoint_mb:.1f} MB "
                                                r"\(model\.ckpt-2\)"):
            listener.before_save(None, 4)

    filler.unlink()
    assert run(make_flags(data, output, **dict(flags, num_train_steps=4)))["train"][
        "final_step"] == 4
    assert tf.train.latest_checkpoint(str(output)).endswith("model.ckpt-4")
