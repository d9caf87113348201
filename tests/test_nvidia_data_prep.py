"""NVIDIA's data preparation command lines against our bertPrep.py: their dataset names and
flags, their defaults and folder layout, and the bertPrep.py calls of their
`data/create_datasets_from_start.sh` run as they are, reading the public files from a local
mirror (`BERT_PREP_MIRROR`) instead of the internet."""
import bz2
import io
import os
import zipfile

import pytest

from bertprep_support import FixtureServer, assert_clean_error, run_bertprep
from data_prep.bertprep import download
from data_prep.bertprep.prep_layout import PrepOptions

NGC = "/api.ngc.nvidia.com/v2/models/nvidia"


def zipped(files):
    """A zip archive holding {name: bytes}."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def mirror_path(url):
    """Where a table URL lives on a mirror served from the root."""
    return "/" + url.split("://", 1)[1]


@pytest.fixture
def mirror():
    with FixtureServer() as server:
        yield server


def prep(wd, *args, env=None):
    return run_bertprep(["--working_dir", str(wd), *args], env=env)


def test_nvidia_dataset_spellings_download_from_a_mirror(mirror, tmp_path):
    """`sst-2` and `SST-2` are one dataset; `nvidia_pretrained_weights` lands where NVIDIA's
    scripts look (download/nvidia_pretrained/<folder>/model.ckpt*); with BERT_PREP_MIRROR
    every table URL is read from the mirror, host and path kept."""
    sst = download.DATASETS["SST-2"][0]
    mirror.files[mirror_path(sst.url)] = zipped({"SST-2/train.tsv": "sentence\tlabel\nok\t1\n",
                                                 "SST-2/dev.tsv": "sentence\tlabel\nno\t0\n"})
    for resource in download.DATASETS["nvidia_pretrained_weights"]:
        mirror.files[mirror_path(resource.url)] = zipped({
            "model.ckpt.index": b"index", "model.ckpt.data-00000-of-00001": b"data",
            "bert_config.json": b"{}", "vocab.txt": b"[PAD]\n"})
    env = {download.MIRROR_ENV: mirror.url("")}
    wd = tmp_path / "wd"
    proc = prep(wd, "--action", "download", "--dataset", "sst-2", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (wd / "download" / "glue" / "SST-2" / "dev.tsv").read_text().endswith("no\t0\n")
    again = prep(wd, "--action", "download", "--dataset", "SST-2", env=env)
    assert again.returncode == 0 and "already downloaded" in again.stdout
    assert [entry[0] for entry in mirror.log] == [mirror_path(sst.url)]

    proc = prep(wd, "--action", "download", "--dataset", "NVIDIA_pretrained_weights", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for folder in ("bert_tf_pretraining_large_lamb", "bert_tf_squad11_large_384",
                   "bert_tf_squad11_base_128"):
        assert (wd / "download" / "nvidia_pretrained" / folder / "model.ckpt.index").is_file()


def test_nvidia_flags_and_defaults(tmp_path):
    """--input_files (NVIDIA's name of --input, also for sharding), NVIDIA's defaults, and
    the datasets NVIDIA's bertPrep.py names that are not here, refused in one line."""
    options = PrepOptions()
    assert (options.n_training_shards, options.n_test_shards, options.fraction_test_set,
            options.max_seq_length, options.max_predictions_per_seq, options.dupe_factor,
            options.masked_lm_prob, options.random_seed, options.do_lower_case) == \
        (1472, 1472, 0.1, 512, 20, 5, 0.15, 12345, True)
    help_text = run_bertprep(["--help"]).stdout
    for flag, default in (("n_training_shards", 1472), ("n_test_shards", 1472),
                          ("max_predictions_per_seq", 20), ("max_seq_length", 512)):
        assert f"--{flag}=INT" in help_text
        assert f"(default: {default})" in help_text.split(f"--{flag}=INT", 1)[1][:400]

    text = tmp_path / "notes.txt"
    text.write_text("\n\n".join(f"Note {i} says a thing. It says more." for i in range(12)))
    wd = tmp_path / "wd"
    proc = prep(wd, "--action", "text_formatting", "--dataset", "custom", "--input_files",
                str(text))
    assert proc.returncode == 0, proc.stderr
    formatted = wd / "formatted_one_article_per_line" / "custom.txt"
    mine = tmp_path / "mine.txt"  # NVIDIA's sharding takes formatted files by --input_files
    mine.write_text(formatted.read_text() + "Another document. With two sentences.\n")
    proc = prep(wd, "--action", "sharding", "--dataset", "custom", "--input_files", str(mine),
                "--n_training_shards", "2", "--n_test_shards", "1")
    assert proc.returncode == 0, proc.stderr
    shards = wd / "sharded_training_shards_2_test_shards_1_fraction_0.1" / "custom"
    assert "Another document." in "".join(p.read_text() for p in shards.iterdir())

    assert_clean_error(prep(wd, "--action", "download", "--dataset", "pubmed_baseline"),
                       "pubmed_baseline: PubMed is not supported here", "--dataset custom")
    assert_clean_error(prep(wd, "--action", "sharding", "--dataset", "all"),
                       "all: only --action download takes all datasets")
    assert_clean_error(prep(wd, "--action", "sharding", "--dataset", "custom",
                            "--input_files", str(tmp_path / "missing.txt")),
                       f"{tmp_path / 'missing.txt'}: no such formatted file")


# The bertPrep.py calls of NVIDIA's data/create_datasets_from_start.sh (DeepLearningExamples,
# TensorFlow/LanguageModeling/BERT, commit 729963dd), in its order and with its arguments,
# for its default `wiki_only` corpus. The script also fetches NVIDIA's checkpoints with wget
# and unzip; `--dataset nvidia_pretrained_weights` does that here.
CREATE_DATASETS_FROM_START = (
    ["--action", "download", "--dataset", "wikicorpus_en"],
    ["--action", "download", "--dataset", "squad"],
    ["--action", "download", "--dataset", "mrpc"],
    ["--action", "download", "--dataset", "sst-2"],
    ["--action", "download", "--dataset", "google_pretrained_weights"],
    ["--action", "download", "--dataset", "nvidia_pretrained_weights"],
    ["--action", "download", "--dataset", "google_pretrained_weights"],
    ["--action", "text_formatting", "--dataset", "wikicorpus_en"],
    ["--action", "sharding", "--dataset", "wikicorpus_en"],
    ["--action", "create_tfrecord_files", "--dataset", "wikicorpus_en", "--max_seq_length",
     "128", "--max_predictions_per_seq", "20", "--vocab_file",
     "{wd}/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt"],
    ["--action", "create_tfrecord_files", "--dataset", "wikicorpus_en", "--max_seq_length",
     "512", "--max_predictions_per_seq", "80", "--vocab_file",
     "{wd}/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt"],
)
DOCUMENTS = 15000  # NVIDIA's 1472 test shards need 1472 test documents: 10% of 14,720


def synthetic_dump(header, sentences, documents):
    """A MediaWiki dump (bz2) of `documents` short articles made of real sentences, under the
    real fragment's <siteinfo>."""
    pages = []
    for index in range(documents):
        text = " ".join(sentences[(index * 3 + k) % len(sentences)] for k in range(3))
        pages.append(f"  <page>\n    <title>Article {index}</title>\n    <ns>0</ns>\n"
                     f"    <id>{index + 1}</id>\n    <revision>\n      <id>{index + 1}</id>\n"
                     f"      <text xml:space=\"preserve\">{text}</text>\n    </revision>\n"
                     f"  </page>\n")
    return bz2.compress((header + "".join(pages) + "</mediawiki>\n").encode("utf-8"))


def fill_mirror(mirror, shared_data, vocab_text):
    """Every file the script downloads, at its mirror path: a synthetic Wikipedia, small SQuAD
    and GLUE files, checkpoint archives whose large uncased one holds a real vocabulary."""
    import re
    with bz2.open(os.path.join(shared_data, "wiki", "enwiki-latest-pages-articles1.xml-"
                                                   "p000000010p000030302-shortened.bz2")) as f:
        head = f.read(200_000).decode("utf-8")
    header = head[:head.index("</siteinfo>") + len("</siteinfo>\n")]
    book = open(os.path.join(shared_data, "books", "pg1342_pride_and_prejudice.txt"),
                encoding="utf-8").read()
    sentences = [s.strip().replace("\n", " ").replace("<", " ").replace("&", "and")
                 for s in re.split(r"(?<=[.!?])\s+", book) if 40 < len(s) < 200]
    wiki = download.DATASETS["wikicorpus_en"][0]
    mirror.files[mirror_path(wiki.url)] = synthetic_dump(header, sentences, DOCUMENTS)
    for resource in download.DATASETS["squad"]:
        mirror.files[mirror_path(resource.url)] = (
            b'{"version": "1.1", "data": []}' if resource.dest.endswith(".json")
            else b"print('an evaluation script')\n")
    mirror.files[mirror_path(download.DATASETS["SST-2"][0].url)] = zipped(
        {"SST-2/dev.tsv": "sentence\tlabel\nfine\t1\n"})
    mrpc_rows = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "".join(
        f"{i % 2}\t{i}\t{i + 100}\tA sentence {i}.\tAnother sentence {i}.\n" for i in range(6))
    train, test, dev_ids = download.DATASETS["MRPC"]
    mirror.files[mirror_path(train.url)] = mrpc_rows.encode()
    mirror.files[mirror_path(test.url)] = mrpc_rows.encode()
    mirror.files[mirror_path(dev_ids.url)] = b"0\t100\n"
    for resource in download.DATASETS["google_pretrained_weights"]:
        name = os.path.basename(resource.dest)[:-len(".zip")]
        mirror.files[mirror_path(resource.url)] = zipped({f"{name}/vocab.txt": vocab_text,
                                                          f"{name}/bert_config.json": "{}"})
    for resource in download.DATASETS["nvidia_pretrained_weights"]:
        mirror.files[mirror_path(resource.url)] = zipped({"model.ckpt.index": b"index",
                                                          "vocab.txt": vocab_text})


@pytest.mark.slow
def test_create_datasets_from_start_runs_against_a_local_mirror(mirror, shared_data,
                                                              minilm_vocab, tmp_path):
    """NVIDIA's bertPrep.py calls, unchanged, with BERT_PREP_WORKING_DIR and a mirror: every
    one succeeds, and the records are where NVIDIA's pre-training scripts read them
    (1472 training/ and 1472 test/ files, nothing else in those folders)."""
    fill_mirror(mirror, shared_data, open(minilm_vocab, encoding="utf-8").read())
    wd = tmp_path / "data"
    env = {"BERT_PREP_WORKING_DIR": str(wd), download.MIRROR_ENV: mirror.url("")}
    for args in CREATE_DATASETS_FROM_START:
        args = [arg.format(wd=wd) for arg in args]
        proc = run_bertprep(args, env=env, timeout=1200)
        assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr
    for seq, pred in ((128, 20), (512, 80)):
        records = wd / (f"tfrecord_lower_case_1_seq_len_{seq}_max_pred_{pred}_masked_lm_prob"
                        f"_0.15_random_seed_12345_dupe_factor_5") / "wikicorpus_en"
        for split in ("training", "test"):
            names = os.listdir(records / split)
            assert len(names) == 1472 and all(n.endswith(".tfrecord") for n in names)
            assert len(os.listdir(records / f"{split}.meta")) == 1472
    assert (wd / "download" / "nvidia_pretrained" / "bert_tf_pretraining_large_lamb" /
            "model.ckpt.index").is_file()
    assert (wd / "download" / "glue" / "MRPC" / "dev.tsv").is_file()
