"""Downloads against a real HTTP server on 127.0.0.1: resume with Range, retries, checksums,
atomic final names, and refusal of archives that would write outside their folder."""
import hashlib
import io
import os
import tarfile
import zipfile

import pytest

from bertprep_support import FixtureServer, assert_clean_error, run_bertprep
from data_prep.bertprep import download, fetcher
from data_prep.errors import DownloadError

PAYLOAD = os.urandom(700_000)
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


def quiet(_message):
    pass


def fetch(url, dest, **kwargs):
    kwargs.setdefault("backoff", 0.001)
    kwargs.setdefault("timeout", 10)
    return fetcher.fetch(url, dest, progress=False, log=quiet, **kwargs)


@pytest.fixture
def server():
    with FixtureServer() as srv:
        srv.files["/data.bin"] = PAYLOAD
        yield srv


def test_normal_download_verifies_checksum(server, tmp_path):
    dest = str(tmp_path / "sub" / "data.bin")
    fetch(server.url("/data.bin"), dest, sha256=PAYLOAD_SHA)
    assert open(dest, "rb").read() == PAYLOAD
    assert os.listdir(tmp_path / "sub") == ["data.bin"]
    assert server.log == [("/data.bin", None, 200)]
    # Complete files are kept: no second request.
    fetch(server.url("/data.bin"), dest, sha256=PAYLOAD_SHA)
    assert len(server.log) == 1


@pytest.mark.faults
def test_cut_transfer_is_resumed_with_range(server, tmp_path):
    server.faults["/data.bin"] = [("cut", 250_000)]
    dest = str(tmp_path / "data.bin")
    fetch(server.url("/data.bin"), dest, sha256=PAYLOAD_SHA, retries=2)
    assert open(dest, "rb").read() == PAYLOAD
    assert [entry[1:] for entry in server.log] == [(None, 200), ("bytes=250000-", 206)]
    assert not os.path.exists(dest + ".part")


@pytest.mark.faults
def test_interrupted_download_resumes_in_a_later_run(server, tmp_path):
    server.faults["/data.bin"] = [("cut", 123_456), ("status", 503), ("status", 503)]
    dest = str(tmp_path / "data.bin")
    with pytest.raises(DownloadError) as err:
        fetch(server.url("/data.bin"), dest, sha256=PAYLOAD_SHA, retries=1)
    assert "HTTP 503" in str(err.value) and "resume" in str(err.value)
    assert not os.path.exists(dest)
    assert os.path.getsize(dest + ".part") == 123_456
    fetch(server.url("/data.bin"), dest, sha256=PAYLOAD_SHA)
    assert open(dest, "rb").read() == PAYLOAD
    assert server.log[-1] == ("/data.bin", "bytes=123456-", 206)


def test_checksum_mismatch_leaves_no_file(server, tmp_path):
    dest = str(tmp_path / "data.bin")
    with pytest.raises(DownloadError) as err:
        fetch(server.url("/data.bin"), dest, sha256="0" * 64)
    assert "sha256 mismatch" in str(err.value) and PAYLOAD_SHA in str(err.value)
    assert os.listdir(tmp_path) == []


def test_503_then_200_is_retried(server, tmp_path):
    server.faults["/data.bin"] = [("status", 503)]
    dest = str(tmp_path / "data.bin")
    fetch(server.url("/data.bin"), dest, sha256=PAYLOAD_SHA)
    assert [entry[2] for entry in server.log] == [503, 200]
    assert open(dest, "rb").read() == PAYLOAD


def test_404_fails_at_once(server, tmp_path):
    with pytest.raises(DownloadError) as err:
        fetch(server.url("/missing.bin"), str(tmp_path / "x"), retries=5)
    assert "HTTP 404" in str(err.value)
    assert len(server.log) == 1 and os.listdir(tmp_path) == []


def _zip_bytes(entries):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in entries:
            z.writestr(zipfile.ZipInfo(name), data)
    return buf.getvalue()


def _tar_bytes(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(payload)
                t.addfile(info, io.BytesIO(payload))
            else:
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = payload
                t.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize("archive, data, entry", [
    ("evil.zip", _zip_bytes([("ok.txt", b"fine"), ("../evil.txt", b"owned")]), "../evil.txt"),
    ("abs.zip", _zip_bytes([("/tmp/bertprep-abs-evil.txt", b"owned")]),
     "/tmp/bertprep-abs-evil.txt"),
    ("link.tar.gz", _tar_bytes([("data/link", "symlink", "../../outside"),
                                ("data/link/evil.txt", "file", b"owned")]), "data/link"),
    ("abslink.tar.gz", _tar_bytes([("etc", "symlink", "/etc")]), "etc"),
    ("hard.tar.gz", _tar_bytes([("pw", "hardlink", "../../etc/passwd")]), "pw"),
], ids=["evil.zip", "abs.zip", "link.tar.gz", "abslink.tar.gz", "hard.tar.gz"])
# (named ids: gzip's header holds the time, so ids made from the bytes differed between two
# xdist workers collecting a second apart, and xdist refused the run)
def test_unsafe_archives_are_refused(server, tmp_path, archive, data, entry):
    server.files["/" + archive] = data
    target = tmp_path / "download" / "x"
    with pytest.raises(DownloadError) as err:
        download.download_resources(
            [download.Resource(server.url("/" + archive), f"x/{archive}", extract=True)],
            str(tmp_path / "download"), backoff=0.001, progress=False, log=quiet)
    message = str(err.value)
    assert "\n" not in message and archive in message and repr(entry) in message
    # Nothing was extracted, inside or outside the target folder.
    assert sorted(os.listdir(target)) == [archive]
    assert not os.path.exists(tmp_path / "download" / "evil.txt")
    assert not os.path.exists("/tmp/bertprep-abs-evil.txt")


def test_safe_archives_are_extracted(server, tmp_path):
    server.files["/model.zip"] = _zip_bytes([("model/vocab.txt", b"[PAD]\n"),
                                             ("model/config.json", b"{}")])
    server.files["/books.tar.gz"] = _tar_bytes([("books/a.txt", "file", b"A book."),
                                                ("books/latest", "symlink", "a.txt")])
    root = tmp_path / "download"
    download.download_resources(
        [download.Resource(server.url("/model.zip"), "m/model.zip", extract=True),
         download.Resource(server.url("/books.tar.gz"), "b/books.tar.gz", extract=True)],
        str(root), backoff=0.001, progress=False, log=quiet)
    assert (root / "m" / "model" / "vocab.txt").read_bytes() == b"[PAD]\n"
    assert (root / "b" / "books" / "latest").read_bytes() == b"A book."
    assert not [n for n in os.listdir(root / "m") if n.startswith(".extracting")]


def test_url_table_has_the_public_sources():
    urls = {ds: [r.url for r in res] for ds, res in download.DATASETS.items()}
    assert urls["wikicorpus_en"] == [
        "https://dumps.wikimedia.org/enwiki/latest/enwiki-latest-pages-articles.xml.bz2"]
    assert urls["wikicorpus_zh"][0].startswith("https://dumps.wikimedia.org/zhwiki/latest/")
    assert all(u.startswith("https://storage.googleapis.com/bert_models/")
               for u in urls["google_pretrained_weights"])
    assert [u for u in urls["squad"] if u.endswith(".json")] == [
        f"https://rajpurkar.github.io/SQuAD-explorer/dataset/{name}" for name in
        ("train-v1.1.json", "dev-v1.1.json", "train-v2.0.json", "dev-v2.0.json")]
    evaluators = {r.dest: r.url for r in download.DATASETS["squad"] if r.dest.endswith(".py")}
    assert sorted(evaluators) == ["squad/v1.1/evaluate-v1.1.py", "squad/v2.0/evaluate-v2.0.py"]
    assert all(u.startswith("https://worksheets.codalab.org/rest/bundles/")
               for u in evaluators.values())
    for task in download.GLUE_TASKS:
        assert urls[task] and all(u.startswith("https://dl.fbaipublicfiles.com/")
                                  for u in urls[task])
    assert urls["bookscorpus"] == []


def test_cli_download_with_url_and_sha256(server, tmp_path):
    wd = str(tmp_path / "wd")
    proc = run_bertprep(["--action", "download", "--dataset", "wikicorpus_en",
                         "--working_dir", wd, "--url", server.url("/data.bin"),
                         "--sha256", PAYLOAD_SHA])
    assert proc.returncode == 0, proc.stderr
    assert open(os.path.join(wd, "download", "wikicorpus_en", "data.bin"), "rb").read() == PAYLOAD
    proc = run_bertprep(["--action", "download", "--dataset", "bookscorpus", "--working_dir", wd])
    assert_clean_error(proc, "--url", "BookCorpus")


def test_mrpc_is_split_into_glue_files(tmp_path):
    from data_prep.bertprep import mrpc_format
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    (tmp_path / "msr_paraphrase_train.txt").write_text(
        header + "1\t11\t12\tA cat sat.\tA cat was sitting.\n"
                 "0\t21\t22\tIt rained.\tThe sun shone.\n"
                 "1\t31\t32\tHe left.\tHe went away.\n", encoding="utf-8")
    (tmp_path / "msr_paraphrase_test.txt").write_text(
        header + "1\t41\t42\tGood day.\tNice day.\n", encoding="utf-8")
    (tmp_path / "mrpc_dev_ids.tsv").write_text("21\t22\n", encoding="utf-8")
    mrpc_format.format_mrpc(str(tmp_path))
    assert (tmp_path / "train.tsv").read_text().splitlines()[1:] == [
        "1\t11\t12\tA cat sat.\tA cat was sitting.", "1\t31\t32\tHe left.\tHe went away."]
    assert (tmp_path / "dev.tsv").read_text().splitlines() == [
        header.strip("\n"), "0\t21\t22\tIt rained.\tThe sun shone."]
    assert (tmp_path / "test.tsv").read_text().splitlines() == [
        "index\t#1 ID\t#2 ID\t#1 String\t#2 String", "0\t41\t42\tGood day.\tNice day."]


@pytest.mark.faults
def test_two_downloads_of_one_file_at_once_make_one_whole_file(server, tmp_path):
    """Two bertPrep.py downloads over one file used to append to one .part together (3.1 MB
    for a 1.7 MB file, renamed into place, reported downloaded). The second waits for the
    first's lock and then finds the file whole; the server is asked once."""
    import threading
    server.faults["/data.bin"] = [("slow", 2.0)]
    dest = str(tmp_path / "data.bin")
    messages, errors = [], []

    def download_once():
        try:
            fetcher.fetch(server.url("/data.bin"), dest, sha256=None, progress=False,
                          log=messages.append, timeout=10)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=download_once) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert open(dest, "rb").read() == PAYLOAD
    assert os.listdir(tmp_path) == ["data.bin"]  # no .part, no .lock left
    assert [entry[2] for entry in server.log] == [200]
    assert any("another process is downloading it; waiting" in m for m in messages)
    assert sum(m.endswith("already downloaded") for m in messages) == 1


def test_a_part_file_longer_than_the_servers_file_is_never_called_complete(server, tmp_path):
    """A .part that is not a prefix of the file (here: longer than the whole file, as two
    writers left it) is restarted, not renamed into place."""
    dest = str(tmp_path / "data.bin")
    with open(dest + ".part", "wb") as part:
        part.write(PAYLOAD + PAYLOAD[:1000])
    fetch(server.url("/data.bin"), dest, retries=2)
    assert open(dest, "rb").read() == PAYLOAD
