"""Bad input and environment: one line ``error: <file>: <problem>`` on stderr, a non-zero
exit, no traceback, and nothing left under a final output name."""
import os

import pytest

from bertprep_support import BOOKS, assert_clean_error, run_bertprep
from data_prep.bertprep import prep_actions
from data_prep.bertprep.prep_layout import PrepOptions

FORMATTED = "formatted_one_article_per_line"


def cli(wd, *args):
    return run_bertprep(["--working_dir", str(wd), *args])


def test_unknown_action_and_dataset(tmp_path):
    assert_clean_error(cli(tmp_path, "--action", "fly", "--dataset", "custom"),
                       "--action: unknown action 'fly'", "text_formatting")
    assert_clean_error(cli(tmp_path, "--action", "sharding", "--dataset", "imagenet"),
                       "--dataset: unknown dataset 'imagenet'", "wikicorpus_en")
    assert_clean_error(cli(tmp_path, "--action", "sharding", "--dataset", "squad"),
                       "squad is only downloaded")


def test_empty_input_file(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    proc = cli(tmp_path / "wd", "--action", "text_formatting", "--dataset", "custom",
               "--input", str(empty))
    assert_clean_error(proc, f"error: {empty}: empty file")
    assert os.listdir(tmp_path / "wd" / FORMATTED) == []


def test_non_utf8_byte_is_located(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"Fine first line.\n\nCaf\xe9 au lait.\n")
    proc = cli(tmp_path / "wd", "--action", "text_formatting", "--dataset", "custom",
               "--input", str(bad))
    assert_clean_error(proc, f"error: {bad}: invalid UTF-8 at byte offset 21 (byte 0xe9)")
    assert os.listdir(tmp_path / "wd" / FORMATTED) == []


def test_non_utf8_byte_in_a_wikipedia_dump(tmp_path, capsys):
    dump = tmp_path / "dump.xml"
    head = (b'<mediawiki>\n  <siteinfo>\n  </siteinfo>\n  <page>\n    <title>T</title>\n'
            b'    <ns>0</ns>\n    <id>1</id>\n    <revision>\n      <id>2</id>\n'
            b'      <text xml:space="preserve">Some text ')
    dump.write_bytes(head + b"\xff more text.</text>\n    </revision>\n  </page>\n</mediawiki>\n")
    options = PrepOptions(action="text_formatting", dataset="wikicorpus_en",
                          working_dir=str(tmp_path / "wd"), input=[str(dump)],
                          n_processes=1, progress=False)
    assert prep_actions.run_cli(options) == 1
    err = capsys.readouterr().err
    assert err == f"error: {dump}: invalid UTF-8 at byte offset {len(head)} of the XML " \
                  f"(byte 0xff)\n"
    assert os.listdir(tmp_path / "wd" / FORMATTED) == []


def test_working_dir_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    proc = cli(blocker / "wd", "--action", "text_formatting", "--dataset", "custom",
               "--input", str(blocker))
    assert_clean_error(proc, f"error: {blocker / 'wd'}: working dir is not writable")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes into read-only folders; covered by the other cases")
def test_read_only_working_dir(tmp_path):
    wd = tmp_path / "ro"
    wd.mkdir()
    wd.chmod(0o500)
    try:
        proc = cli(wd, "--action", "sharding", "--dataset", "custom")
        assert_clean_error(proc, f"error: {wd}: working dir is not writable")
    finally:
        wd.chmod(0o700)


def test_output_folder_that_cannot_be_created(tmp_path, capsys):
    wd = tmp_path / "wd"
    (wd / FORMATTED).mkdir(parents=True)
    (wd / FORMATTED / "custom.txt").write_text("One document. Two sentences.\n" * 3)
    # A file squats the name of the sharding output folder.
    (wd / "sharded_training_shards_1_test_shards_0_fraction_0").write_text("in the way")
    options = PrepOptions(action="sharding", dataset="custom", working_dir=str(wd),
                          n_training_shards=1, n_test_shards=0,
                          fraction_test_set=0.0, n_processes=1, progress=False)
    assert prep_actions.run_cli(options) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {wd / 'sharded_training_shards_1_test_shards_0_fraction_0'}")
    assert "cannot create output folder" in err and err.count("\n") == 1


def test_missing_previous_step_and_missing_vocab(tmp_path, capsys):
    def run(action):
        options = PrepOptions(action=action, dataset="custom",
                              working_dir=str(tmp_path), n_training_shards=1,
                              n_test_shards=0, progress=False)
        assert prep_actions.run_cli(options) == 1
        return capsys.readouterr().err
    assert "custom.txt: not found (run --action text_formatting first)" in run("sharding")
    assert "no shards (run --action sharding" in run("create_tfrecord_files")
    shard_dir = tmp_path / "sharded_training_shards_1_test_shards_0_fraction_0.1" / "custom"
    shard_dir.mkdir(parents=True)
    (shard_dir / "custom_training_0.txt").write_text("A sentence.\nAnother one.\n\n")
    assert "error: --vocab_file: not given, and" in run("create_tfrecord_files")


def test_one_bad_shard_does_not_lose_the_others(shared_data, minilm_vocab, tmp_path):
    wd = tmp_path / "wd"
    shard_dir = wd / "sharded_training_shards_3_test_shards_0_fraction_0.1" / "custom"
    shard_dir.mkdir(parents=True)
    text = open(os.path.join(shared_data, BOOKS[0]), encoding="utf-8").read()
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
    body = "".join(p + "\n" + ("\n" if i % 5 == 4 else "") for i, p in enumerate(paragraphs))
    for i in range(3):
        (shard_dir / f"custom_training_{i}.txt").write_text(body, encoding="utf-8")
    bad = shard_dir / "custom_training_1.txt"
    bad.write_bytes(bad.read_bytes()[:1000] + b"\xff" + bad.read_bytes()[1000:])
    proc = cli(wd, "--action", "create_tfrecord_files", "--dataset", "custom",
               "--n_training_shards", "3", "--n_test_shards", "0", "--vocab_file", minilm_vocab,
               "--max_seq_length", "64", "--max_predictions_per_seq", "10", "--dupe_factor", "1",
               "--n_processes", "2")
    assert_clean_error(proc, f"error: {bad}: invalid UTF-8 at byte offset 1000")
    out_dir = wd / ("tfrecord_lower_case_1_seq_len_64_max_pred_10_masked_lm_prob_0.15"
                    "_random_seed_12345_dupe_factor_1") / "custom"
    assert sorted(os.listdir(out_dir / "training")) == ["custom_training_0.tfrecord",
                                                        "custom_training_2.tfrecord"]
    assert sorted(os.listdir(out_dir / "training.meta")) == [
        "custom_training_0.tfrecord.meta.json", "custom_training_2.tfrecord.meta.json"]
    assert "2/3 shards complete" in proc.stdout


def test_bookscorpus_needs_a_url(tmp_path):
    proc = cli(tmp_path, "--action", "download", "--dataset", "bookscorpus")
    assert_clean_error(proc, "error: --url: bookscorpus has no official download")
    assert not os.path.exists(tmp_path / "download")


def _documents(path):
    return [line for line in open(path, encoding="utf-8").read().split("\n") if line]


def test_a_union_of_corpora_is_sharded_as_one(tmp_path):
    """`--dataset bookscorpus+custom`: each part formatted on its own, then sharded, given a
    vocabulary and turned into records as one corpus; bad unions refused in one line."""
    wd = tmp_path / "wd"
    books = tmp_path / "books"
    books.mkdir()
    for i in range(3):
        (books / f"book{i}.txt").write_text(" ".join(f"Book {i} sentence {j} is here."
                                                     for j in range(40)) + "\n")
    custom = tmp_path / "custom.txt"
    custom.write_text("\n\n".join(" ".join(f"Note {i} line {j} says little." for j in range(30))
                                  for i in range(5)) + "\n")
    assert cli(wd, "--action", "text_formatting", "--dataset", "bookscorpus",
               "--input", str(books)).returncode == 0
    assert cli(wd, "--action", "text_formatting", "--dataset", "custom",
               "--input", str(custom)).returncode == 0
    proc = cli(wd, "--action", "sharding", "--dataset", "bookscorpus+custom",
               "--n_training_shards", "2", "--n_test_shards", "1", "--fraction_test_set", "0.2")
    assert proc.returncode == 0, proc.stderr
    shards = wd / "sharded_training_shards_2_test_shards_1_fraction_0.2" / "bookscorpus+custom"
    text = "".join(p.read_text() for p in shards.glob("bookscorpus+custom_*.txt"))
    assert text.count("Book 2 sentence 39") == 1 and text.count("Note 4 line 29") == 1
    assert len(text.split("\n\n")) - 1 == 8  # 3 books + 5 notes, each one document
    proc = cli(wd, "--action", "create_vocab", "--dataset", "bookscorpus+custom",
               "--vocab_size", "200")
    assert proc.returncode == 0, proc.stderr
    assert (wd / "vocab" / "bookscorpus+custom_lower_case_1_vocab.txt").is_file()

    assert_clean_error(cli(wd, "--action", "sharding", "--dataset", "bookscorpus+imagenet"),
                       "--dataset: unknown dataset 'bookscorpus+imagenet'",
                       "wikicorpus_en+custom")
    assert_clean_error(cli(wd, "--action", "sharding", "--dataset", "custom+custom"),
                       "unknown dataset 'custom+custom'")
    assert_clean_error(cli(wd, "--action", "text_formatting", "--dataset", "bookscorpus+custom",
                           "--input", str(custom)),
                       "--input: give --input per part: format bookscorpus and custom")
    assert_clean_error(cli(wd, "--action", "download", "--dataset", "wikicorpus_en+custom"),
                       "a union is downloaded part by part: wikicorpus_en; custom text is "
                       "not downloaded")


def test_records_no_run_can_read_are_refused_as_the_flags_are_parsed(tmp_path, capsys):
    """create_tfrecord_files with --max_predictions_per_seq above --max_seq_length would write
    every shard, metadata included, for run_pretraining.py to refuse: refused in one line
    before the working dir (its log file) exists; the other actions write no records and
    ignore the two flags."""
    wd = tmp_path / "wd"
    error = assert_clean_error(
        cli(wd, "--action", "create_tfrecord_files", "--dataset", "custom",
            "--max_seq_length", "128", "--max_predictions_per_seq", "200"),
        "max_seq_length=128, max_predictions_per_seq=200, masking=static",
        "run_pretraining.py refuses records with more masked-LM predictions "
        "(--max_predictions_per_seq) than tokens (--max_seq_length)")
    assert error.endswith("(--help lists the flags)")
    assert not wd.exists()
    # the library's own check, for callers without a command line (Dask workers, the demo)
    options = PrepOptions(action="create_tfrecord_files", dataset="custom",
                          working_dir=str(wd), max_seq_length=128,
                          max_predictions_per_seq=200, progress=False)
    assert prep_actions.run_cli(options) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --max_predictions_per_seq=200 with --max_seq_length=128: run_pretraining.py "
        "refuses records with more masked-LM predictions (--max_predictions_per_seq) than "
        "tokens (--max_seq_length): pass at most the sequence length (NVIDIA's: 20 for 128, "
        "80 for 512)")
    # sharding takes the flags too and writes no records: not refused by them
    proc = cli(wd, "--action", "sharding", "--dataset", "custom", "--max_seq_length", "128",
               "--max_predictions_per_seq", "200")
    assert_clean_error(proc, "custom.txt: not found (run --action text_formatting first)")
