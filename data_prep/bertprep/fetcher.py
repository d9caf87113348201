"""Fetching one file into the working dir: resumed, retried, locked, verified, atomic.

Why this is more than ``urllib.request.urlretrieve``: the English Wikipedia dump is ~20 GB and
takes hours, so an interrupted transfer must not start over (the partial file is kept as
``<name>.part`` and resumed with an HTTP ``Range`` request), flaky connections and overloaded
mirrors (5xx, 429) are retried with exponential backoff, two downloads of one file wait for
each other, and a file is only ever visible under its final name once it is complete (and
matches its sha256 when one is known). A ``file://`` URL or a plain local path (a dump
fetched by hand) is copied the same way. ``data_prep.bertprep.download`` calls ``fetch`` for each
file of its table.

Errors are ``DownloadError`` (a ``DataPrepError``): one line ``<file or url>: <problem>``.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, Optional

from data_prep.errors import DownloadError

CHUNK = 1 << 20
USER_AGENT = "bert-tf-bertPrep/0.1 (+urllib)"
# Status codes worth retrying: the server (or a proxy before it) is overloaded or restarting.
RETRY_STATUS = {408, 429, 500, 502, 503, 504}


def is_remote(url: str) -> bool:
    return urllib.parse.urlsplit(url).scheme.lower() in ("http", "https")


def _local_path(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() == "file":
        return urllib.request.url2pathname(parts.path)
    return os.path.expanduser(url)


def basename_of(url: str) -> str:
    """The file name a URL or path points at (``download`` for a bare host)."""
    if is_remote(url) or url.lower().startswith("file:"):
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
    if not is_remote(url):
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
    if not is_remote(url):
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
