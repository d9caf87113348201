"""Unpacking downloaded archives without trusting them.

Archives from the network are never trusted to stay inside the folder they are extracted
into: ``check_archive`` refuses, before anything is written, every entry that could land
outside it (absolute names, ``..``, links that lead out, devices), and ``extract_archive``
unpacks into a staging folder and moves each top-level entry into place, so an interruption
never leaves a half-written entry under its final name. This is about the archive formats
(zip, tar), not the transfer (``data_prep.bertprep.fetcher``); ``data_prep.bertprep.download``
unpacks with it.
"""
from __future__ import annotations

import os
import shutil
import stat
import tarfile
import zipfile
from typing import List

from data_prep.errors import DownloadError

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def is_archive(path: str) -> bool:
    return path.lower().endswith(ARCHIVE_SUFFIXES)


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
