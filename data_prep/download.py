"""Fetching the public datasets and checkpoints BERT pre-training and fine-tuning start from.

Why this is more than ``urllib.request.urlretrieve``: the English Wikipedia dump is ~20 GB and
takes hours, so an interrupted transfer must not start over (the partial file is kept as
``<name>.part`` and resumed with an HTTP ``Range`` request), flaky connections and overloaded
mirrors (5xx, 429) are retried with exponential backoff, a file is only ever visible under its
final name once it is complete (and matches its sha256 when one is known), and archives from
the network are never trusted to stay inside the folder they are extracted into.

Everything the project downloads is in one table, ``DATASETS``.  A ``--url`` (http(s), a
``file://`` URL or a plain local path, e.g. a dump fetched by hand) replaces the table's URL
for single-file datasets; BookCorpus has no official public URL any more and needs one.
``$BERT_PREP_MIRROR`` reads the table's files from a mirror of their sites (``mirrored``).

Errors are ``DownloadError`` (a ``DataPrepError``): one line ``<file or url>: <problem>``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import http.client
import os
import shutil
import stat
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from typing import Callable, Dict, List, Optional, Sequence

from data_prep.errors import DataPrepError

CHUNK = 1 << 20
USER_AGENT = "bert-tf-bertPrep/0.1 (+urllib)"
# Status codes worth retrying: the server (or a proxy before it) is overloaded or restarting.
RETRY_STATUS = {408, 429, 500, 502, 503, 504}
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


class DownloadError(DataPrepError):
    """A download or extraction that cannot succeed; ``str()`` is ``<file or url>: <problem>``."""


@dataclasses.dataclass(frozen=True)
class Resource:
    """One file of a dataset: where it comes from and where it goes under ``download/``.

    ``dest`` is relative to the working dir's ``download/`` folder.  ``extract``: unpack the
    archive into the folder holding it (safely, see ``extract_archive``).
    """
    url: str
    dest: str
    sha256: Optional[str] = None
    extract: bool = False


_GOOGLE = "https://storage.googleapis.com/bert_models"
_SQUAD = "https://rajpurkar.github.io/SQuAD-explorer/dataset"
_GLUE = "https://dl.fbaipublicfiles.com/glue/data"
_SENTEVAL = "https://dl.fbaipublicfiles.com/senteval/senteval_data"
_NGC = "https://api.ngc.nvidia.com/v2/models/nvidia"
_CODALAB = "https://worksheets.codalab.org/rest/bundles"


def _google(release: str, name: str) -> Resource:
    return Resource(f"{_GOOGLE}/{release}/{name}.zip",
                    f"google_pretrained_weights/{name}.zip", extract=True)


def _ngc(model: str, folder: str, version: str = "19.03.1") -> Resource:
    return Resource(f"{_NGC}/{model}/versions/{version}/zip",
                    f"nvidia_pretrained/{folder}/{model}_{version}.zip", extract=True)


def _glue(archive: str) -> List[Resource]:
    return [Resource(f"{_GLUE}/{archive}", f"glue/{archive}", extract=True)]


# The one table of everything downloadable.  No sha256 is published for these files (the
# providers replace "latest" dumps twice a month), so none is pinned; pass --sha256 to check one.
DATASETS: Dict[str, List[Resource]] = {
    "wikicorpus_en": [Resource(
        "https://dumps.wikimedia.org/enwiki/latest/enwiki-latest-pages-articles.xml.bz2",
        "wikicorpus_en/enwiki-latest-pages-articles.xml.bz2")],
    "wikicorpus_zh": [Resource(
        "https://dumps.wikimedia.org/zhwiki/latest/zhwiki-latest-pages-articles.xml.bz2",
        "wikicorpus_zh/zhwiki-latest-pages-articles.xml.bz2")],
    # BookCorpus is no longer distributed by its authors: there is no URL to put here.
    "bookscorpus": [],
    "google_pretrained_weights": [
        _google("2018_10_18", "uncased_L-12_H-768_A-12"),
        _google("2018_10_18", "uncased_L-24_H-1024_A-16"),
        _google("2018_10_18", "cased_L-12_H-768_A-12"),
        _google("2018_10_18", "cased_L-24_H-1024_A-16"),
        _google("2018_11_03", "multilingual_L-12_H-768_A-12"),
        _google("2018_11_23", "multi_cased_L-12_H-768_A-12"),
        _google("2018_11_03", "chinese_L-12_H-768_A-12"),
        _google("2019_05_30", "wwm_uncased_L-24_H-1024_A-16"),
        _google("2019_05_30", "wwm_cased_L-24_H-1024_A-16"),
    ],
    # NVIDIA's checkpoints from NGC, where NVIDIA's create_datasets_from_start.sh puts them
    # (download/nvidia_pretrained/<folder>/model.ckpt*): its run_squad.sh and run_glue.sh
    # start from the LAMB-pre-trained BERT-large by default.
    "nvidia_pretrained_weights": [
        _ngc("bert_tf_ckpt_large_pretraining_amp_lamb", "bert_tf_pretraining_large_lamb"),
        _ngc("bert_tf_ckpt_large_qa_squad11_amp_384", "bert_tf_squad11_large_384"),
        _ngc("bert_tf_ckpt_base_qa_squad11_amp_128", "bert_tf_squad11_base_128"),
    ],
    # With the official evaluation scripts, from where NVIDIA's SquadDownloader takes them:
    # NVIDIA's run_squad.sh passes --eval_script=$SQUAD_DIR/evaluate-v<version>.py.
    "squad": [
        Resource(f"{_SQUAD}/train-v1.1.json", "squad/v1.1/train-v1.1.json"),
        Resource(f"{_SQUAD}/dev-v1.1.json", "squad/v1.1/dev-v1.1.json"),
        Resource(f"{_CODALAB}/0xbcd57bee090b421c982906709c8c27e1/contents/blob/",
                 "squad/v1.1/evaluate-v1.1.py"),
        Resource(f"{_SQUAD}/train-v2.0.json", "squad/v2.0/train-v2.0.json"),
        Resource(f"{_SQUAD}/dev-v2.0.json", "squad/v2.0/dev-v2.0.json"),
        Resource(f"{_CODALAB}/0x6b567e1cf2e041ec80d7098f031c5c9e/contents/blob/",
                 "squad/v2.0/evaluate-v2.0.py"),
    ],
    "CoLA": _glue("CoLA.zip"),
    "SST-2": _glue("SST-2.zip"),
    "STS-B": _glue("STS-B.zip"),
    "QQP": _glue("QQP-clean.zip"),
    "MNLI": _glue("MNLI.zip"),
    "QNLI": _glue("QNLIv2.zip"),
    "RTE": _glue("RTE.zip"),
    "WNLI": _glue("WNLI.zip"),
    # GLUE cannot host MRPC; its own download script takes SentEval's copy and GLUE's dev ids
    # (``text_formatting.format_mrpc`` turns them into train/dev/test.tsv).
    "MRPC": [
        Resource(f"{_SENTEVAL}/msr_paraphrase_train.txt", "glue/MRPC/msr_paraphrase_train.txt"),
        Resource(f"{_SENTEVAL}/msr_paraphrase_test.txt", "glue/MRPC/msr_paraphrase_test.txt"),
        Resource(f"{_GLUE}/mrpc_dev_ids.tsv", "glue/MRPC/mrpc_dev_ids.tsv"),
    ],
}
GLUE_TASKS = ("CoLA", "MRPC", "SST-2", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI")


MIRROR_ENV = "BERT_PREP_MIRROR"


def mirrored(url: str, mirror: Optional[str] = None) -> str:
    """``url`` as found on a mirror of the public sites: ``https://host/path`` ->
    ``<mirror>/host/path``, where the mirror (default ``$BERT_PREP_MIRROR``) is an http(s) or
    ``file://`` URL or a local folder. For clusters without internet access: fill the mirror
    once (the same host/path tree), and every ``download`` of the table's datasets, NVIDIA's
    scripts' included, reads from it unchanged. Without a mirror, ``url`` itself."""
    mirror = mirror if mirror is not None else os.environ.get(MIRROR_ENV, "")
    if not mirror or not _is_remote(url):
        return url
    parts = urllib.parse.urlsplit(url)
    tail = parts.netloc + parts.path + (f"?{parts.query}" if parts.query else "")
    if _is_remote(mirror) or mirror.lower().startswith("file:"):
        return mirror.rstrip("/") + "/" + tail
    # A folder: a URL ending in "/" (CodaLab's blobs) is the file named by its last part.
    return os.path.join(os.path.expanduser(mirror), *tail.rstrip("/").split("/"))


def is_archive(path: str) -> bool:
    return path.lower().endswith(ARCHIVE_SUFFIXES)


def _is_remote(url: str) -> bool:
    return urllib.parse.urlsplit(url).scheme.lower() in ("http", "https")


def _local_path(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() == "file":
        return urllib.request.url2pathname(parts.path)
    return os.path.expanduser(url)


def basename_of(url: str) -> str:
    """The file name a URL or path points at (``download`` for a bare host)."""
    if _is_remote(url) or url.lower().startswith("file:"):
        name = os.path.basename(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    else:
        name = os.path.basename(os.path.normpath(_local_path(url)))
    return name or "download"


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _progress(total: Optional[int], initial: int, desc: str, enabled: Optional[bool]):
    from reporting.progress import bar
    # enabled=None: a bar on a terminal, occasional plain lines in the log of a batch job.
    return bar(total=total, initial=initial, desc=desc, unit="B", unit_scale=True,
               unit_divisor=1024, enabled=enabled, leave=False)


class _Retryable(Exception):
    """A failure worth another attempt (connection trouble, 5xx, short transfer)."""


def _check_sha256(path: str, expected: Optional[str], source: str, fate: str) -> None:
    """Raises ``DownloadError`` when ``path`` does not hash to ``expected``.

    ``fate`` finishes the message with what happened to the file and what to do, because
    the caller decides that (a fresh download is deleted, an earlier one is kept) and a
    message claiming the wrong one sends the user looking for the wrong problem.
    """
    if not expected:
        return
    _refuse_checksum_of_folder(path, expected, path)
    got = sha256_of(path)
    if got.lower() != expected.lower():
        raise DownloadError(source, f"sha256 mismatch: expected {expected.lower()}, got {got}; "
                                    f"{fate}")


_FRESH_MISMATCH = "the download was deleted: check --sha256 and the URL"
_KEPT_MISMATCH = ("this file was downloaded earlier and is kept: check --sha256, or delete "
                  "the file to download it again")


def _refuse_directory_listing(url: str, response) -> None:
    """Refuses a URL that answers with a web server's folder listing instead of a file.

    Such a page would otherwise be saved as the dataset (and fail its checksum, or worse,
    pass on to text formatting as HTML); a URL ending in ``/`` after redirects that serves
    HTML is a folder.
    """
    final_path = urllib.parse.urlsplit(response.geturl() or url).path
    content_type = (response.headers.get("Content-Type") or "").lower()
    if final_path.endswith("/") and content_type.startswith("text/html"):
        raise DownloadError(url, "is a folder (the server answers with a listing page), not a "
                                 "file: pass the URL of the file to download")


def _http_attempt(url: str, part: str, timeout: float, progress: Optional[bool],
                  desc: str) -> Optional[int]:
    """One request: appends to ``part`` from its current size; raises ``_Retryable``.
    Returns the file's whole length as the server gave it (None when it did not say)."""
    have = os.path.getsize(part) if os.path.exists(part) else 0
    headers = {"User-Agent": USER_AGENT}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:
            # Our part may already hold the whole file ("bytes */<total>").
            total = (e.headers.get("Content-Range") or "").rpartition("/")[2]
            e.close()
            if total.isdigit() and int(total) == have:
                return have
            os.remove(part)  # stale partial file from another version of the resource
            raise _Retryable(f"HTTP 416 for a resume at byte {have}; restarting") from None
        e.close()
        if e.code in RETRY_STATUS:
            raise _Retryable(f"HTTP {e.code} {e.reason}") from None
        raise DownloadError(url, f"HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        raise _Retryable(f"cannot connect: {reason}") from None
    with response:
        _refuse_directory_listing(url, response)
        status = response.status
        if have and status == 200:  # the server ignored our Range: start again
            have = 0
        elif status == 206:
            start = (response.headers.get("Content-Range") or "").split(" ")[-1].split("-")[0]
            if start != str(have):
                os.remove(part)
                raise _Retryable(f"unexpected Content-Range {response.headers.get('Content-Range')!r}")
        length = response.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None
        total = have + expected if expected is not None else None
        received = 0
        with open(part, "ab" if have else "wb") as out, \
                _progress(total, have, desc, progress) as bar:
            try:
                while True:
                    block = response.read(CHUNK)
                    if not block:
                        break
                    out.write(block)
                    received += len(block)
                    bar.update(len(block))
            except (OSError, http.client.HTTPException) as e:
                raise _Retryable(f"transfer interrupted after {have + received} bytes: "
                                 f"{type(e).__name__}") from None
        if expected is not None and received < expected:
            raise _Retryable(f"transfer cut after {have + received} of {total} bytes")
        return total


def fetch(url: str, dest: str, sha256: Optional[str] = None, retries: int = 5,
          backoff: float = 1.0, timeout: float = 60.0, progress: Optional[bool] = None,
          log: Callable[[str], None] = print) -> str:
    """Fetches ``url`` (http(s), ``file://`` or a local path) to ``dest``; returns ``dest``.

    An existing ``dest`` is complete by construction (it is only ever created by renaming a
    finished, verified ``dest.part``) and is kept.  ``retries`` counts consecutive failed
    attempts: an attempt that made progress resets it, so a long download over a flaky link
    still finishes.  Waits ``backoff * 2**k`` seconds (at most 60) after the k-th failure.
    """
    if os.path.exists(dest):
        _check_sha256(dest, sha256, dest, _KEPT_MISMATCH)
        log(f"{dest}: already downloaded")
        return dest
    if not _is_remote(url):
        _refuse_checksum_of_folder(_local_path(url), sha256, url)
    folder = os.path.dirname(os.path.abspath(dest))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise DownloadError(folder, f"cannot create folder: {e.strerror or e}") from None
    with _target_lock(dest, log):
        if os.path.exists(dest):  # another process finished it while we waited
            _check_sha256(dest, sha256, dest, _KEPT_MISMATCH)
            log(f"{dest}: already downloaded")
            return dest
        return _fetch_locked(url, dest, sha256, retries, backoff, timeout, progress, log)


@contextlib.contextmanager
def _target_lock(dest: str, log: Callable[[str], None]):
    """Holds ``dest.lock`` (flock) while ``dest`` is downloaded: two downloads of one file
    at once (two bertPrep.py runs) used to append to one ``.part`` together, and the
    interleaved result was renamed into place as if complete. The second now waits, then
    finds the file there. As in ``resilience.run_lock``, the holder removes the lock file
    while still holding it; a waiter that then locks a removed file tries again."""
    path = dest + ".lock"
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise DownloadError(path, f"cannot create: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"{dest}: another process is downloading it; waiting")
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a filesystem without locks: as before, unlocked
            break
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
        os.close(fd)


def _fetch_locked(url, dest, sha256, retries, backoff, timeout, progress, log):
    part = dest + ".part"
    desc = os.path.basename(dest)
    if not _is_remote(url):
        _copy_local(_local_path(url), dest, part, progress)
    else:
        failures = 0
        while True:
            before = os.path.getsize(part) if os.path.exists(part) else 0
            try:
                total = _http_attempt(url, part, timeout, progress, desc)
                if total is not None and os.path.getsize(part) != total:
                    os.remove(part)  # never renamed into place: it is not the server's file
                    raise _Retryable(f"{part} holds another length than the server's "
                                     f"{total} bytes; restarting")
                break
            except _Retryable as e:
                after = os.path.getsize(part) if os.path.exists(part) else 0
                failures = 1 if after > before else failures + 1
                if failures > retries:
                    resume = f"; rerun to resume from {part}" if after else ""
                    raise DownloadError(url, f"{e} (gave up after {retries} retries{resume})") \
                        from None
                delay = min(60.0, backoff * 2 ** (failures - 1))
                log(f"{url}: {e}; retrying in {delay:.1f} s")
                time.sleep(delay)
            except OSError as e:  # writing the part file
                raise DownloadError(part, f"cannot write: {e.strerror or e}") from None
    try:
        _check_sha256(part, sha256, url, _FRESH_MISMATCH)
    except DownloadError:
        os.remove(part)
        raise
    os.replace(part, dest)
    log(f"{dest}: downloaded ({os.path.getsize(dest)} bytes)")
    return dest


def _refuse_checksum_of_folder(path: str, sha256: Optional[str], shown: str) -> None:
    """Refuses ``--sha256`` for a local folder ``path`` (``shown`` as the user wrote it)
    before anything is copied.

    A folder has no single sha256; without this check a folder ``--url`` is copied to
    ``*.part`` and then fails with "Is a directory", leaving the copy behind.  Also used for
    a folder copied by an earlier run without ``--sha256``.
    """
    if sha256 and os.path.isdir(path):
        raise DownloadError(shown, "is a folder, and --sha256 checks a single file: drop "
                                    "--sha256 to copy the folder, or pass the file itself")


def _copy_local(source: str, dest: str, part: str, progress: Optional[bool]) -> None:
    """Copies a hand-fetched file (or a folder of files) into the working dir atomically."""
    if not os.path.exists(source):
        raise DownloadError(source, "no such file or folder")
    try:
        if os.path.isdir(source):
            if os.path.exists(part):
                shutil.rmtree(part)
            shutil.copytree(source, part, symlinks=False)
        else:
            with open(source, "rb") as src, open(part, "wb") as out, \
                    _progress(os.path.getsize(source), 0, os.path.basename(dest), progress) as bar:
                for block in iter(lambda: src.read(CHUNK), b""):
                    out.write(block)
                    bar.update(len(block))
    except OSError as e:
        raise DownloadError(e.filename or source, f"cannot copy: {e.strerror or e}") from None


# --------------------------------------------------------------------------- archives

def _escapes(target: str, root: str) -> bool:
    root = os.path.realpath(root)
    full = os.path.realpath(os.path.join(root, target))
    return os.path.commonpath([root, full]) != root


def _check_member_name(archive: str, name: str) -> None:
    normalized = name.replace("\\", "/")
    if normalized.startswith("/") or (len(normalized) > 1 and normalized[1] == ":"):
        raise DownloadError(archive, f"unsafe entry {name!r}: absolute path; nothing extracted")
    if ".." in normalized.split("/"):
        raise DownloadError(archive, f"unsafe entry {name!r}: leaves the target folder "
                                     f"through '..'; nothing extracted")


def check_archive(archive: str, root: str) -> None:
    """Refuses (``DownloadError``) an archive with any entry that could land outside ``root``.

    Checked before anything is written: absolute names, ``..`` components, symbolic links
    whose target resolves outside ``root`` (relative to the link's own folder), hard links to
    a path outside ``root``, and device/FIFO entries (nothing in a dataset needs them).
    """
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                _check_member_name(archive, info.filename)
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    target = z.read(info).decode("utf-8", "replace")
                    link_dir = os.path.dirname(info.filename)
                    if os.path.isabs(target) or _escapes(os.path.join(link_dir, target), root):
                        raise DownloadError(archive, f"unsafe entry {info.filename!r}: symlink "
                                                     f"to {target!r} outside the target folder")
        return
    try:
        with tarfile.open(archive) as t:
            for member in t:
                _check_member_name(archive, member.name)
                if member.issym():
                    link_dir = os.path.dirname(member.name)
                    if os.path.isabs(member.linkname) or \
                            _escapes(os.path.join(link_dir, member.linkname), root):
                        raise DownloadError(archive, f"unsafe entry {member.name!r}: symlink to "
                                                     f"{member.linkname!r} outside the target folder")
                elif member.islnk():
                    if os.path.isabs(member.linkname) or _escapes(member.linkname, root):
                        raise DownloadError(archive, f"unsafe entry {member.name!r}: hard link "
                                                     f"to {member.linkname!r} outside the target "
                                                     f"folder")
                elif not (member.isfile() or member.isdir()):
                    raise DownloadError(archive, f"unsafe entry {member.name!r}: device or FIFO")
    except tarfile.TarError as e:
        raise DownloadError(archive, f"not a readable zip or tar archive: {e}") from None


def extract_archive(archive: str, target: str) -> List[str]:
    """Safely unpacks ``archive`` into ``target``; returns the top-level names it created.

    Unpacks into a temporary folder inside ``target`` first and then moves each top-level entry
    into place, so an interrupted extraction never leaves a half-written entry under its final
    name (an existing entry of the same name is replaced).
    """
    os.makedirs(target, exist_ok=True)
    check_archive(archive, target)
    staging = os.path.join(target, f".extracting-{os.getpid()}")
    if os.path.exists(staging):
        shutil.rmtree(staging)
    os.makedirs(staging)
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                z.extractall(staging)
        else:
            with tarfile.open(archive) as t:
                # Checked above; the "data" filter (Python >= 3.11.4) is a second line of defence.
                if hasattr(tarfile, "data_filter"):
                    t.extractall(staging, filter="data")
                else:  # pragma: no cover - older Pythons
                    t.extractall(staging)
        names = sorted(os.listdir(staging))
        for name in names:
            final = os.path.join(target, name)
            if os.path.isdir(final) and not os.path.islink(final):
                shutil.rmtree(final)
            os.replace(os.path.join(staging, name), final)
    except (OSError, zipfile.BadZipFile, tarfile.TarError) as e:
        raise DownloadError(archive, f"cannot extract: {getattr(e, 'strerror', None) or e}") \
            from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return names


def download_resources(resources: Sequence[Resource], download_dir: str,
                       retries: int = 5, backoff: float = 1.0, timeout: float = 60.0,
                       progress: Optional[bool] = None,
                       log: Callable[[str], None] = print) -> List[str]:
    """Fetches (and unpacks) every resource under ``download_dir``; returns the final paths.

    An archive is unpacked once: a ``.<name>.extracted`` marker next to it records success,
    so a rerun after an interruption fetches and unpacks only what is missing.
    """
    paths = []
    for res in resources:
        dest = os.path.join(download_dir, res.dest)
        fetch(res.url, dest, res.sha256, retries=retries, backoff=backoff, timeout=timeout,
              progress=progress, log=log)
        if res.extract and os.path.isfile(dest):
            folder = os.path.dirname(dest)
            marker = os.path.join(folder, f".{os.path.basename(dest)}.extracted")
            if not os.path.exists(marker):
                names = extract_archive(dest, folder)
                with open(marker, "w", encoding="utf-8") as f:
                    f.write("\n".join(names) + "\n")
                log(f"{dest}: extracted {', '.join(names)}")
        paths.append(dest)
    return paths
