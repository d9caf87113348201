"""Raw corpora to the common intermediate format: one document per line, plain UTF-8 text.

Why one document per line: sharding must keep every document whole and balance shards by size,
which is easiest (and streamable) when a document is one line whose byte offset and length
can be indexed in a single pass; sentence segmentation happens later, per shard.  Inside a
line all whitespace runs (newlines, tabs, paragraph breaks) become one space.

Sources:

* Wikipedia XML dumps (``.bz2``, ``.gz`` or plain; ``format_wikipedia``) go through
  ``wikiextractor`` in a child process (``python -m wikiextractor.WikiExtractor --json -o -``),
  whose output is read as a stream: the dump is never held in memory.  The child and all it
  forks die with us (``data_prep.processes.tethered_child``), even when we are killed with
  SIGKILL.  Redirects and pages that end up without text (pure lists, disambiguation stubs)
  are dropped.  Titles are not written: the first sentence of an article nearly always names
  its subject already, and a bare title is not a sentence (it would become a one-"sentence"
  segment for NSP).  Section headings stay, as the short lines wikiextractor makes of them.
  wikiextractor is run with ``--html-safe ''`` so that entities come out as characters (``&``
  not ``&amp;``), and a small clean-up (``strip_residual_markup``) removes what it
  occasionally leaves behind (table rows, unexpanded ``{{templates}}``, ``[[links]]``,
  ``<ref>`` tags).  A dump without a ``<siteinfo>`` header (a hand-cut fragment) is copied
  with a minimal one first: wikiextractor skips every line until it has seen ``</siteinfo>``.
* BookCorpus-style folders of ``.txt`` books (``format_books``): one book per line, with the
  Project Gutenberg header and licence footer cut off where the ``*** START OF`` /
  ``*** END OF`` markers are present.
* Any text (``format_custom``), a file or a folder of files: with ``unit="block"`` every block
  of lines separated by a blank line is a document (the convention of BERT's own input files);
  with ``unit="file"`` every file is one document.

Each source's ``write_*`` formats one input (a custom file: a range of its blocks) into an open
file: ``format_*`` here, or a job of ``formatting_jobs`` on a cluster.  Output is written to
``<output>.tmp-<pid>`` and renamed when complete.  Bad input raises ``FormattingError``: one
line ``<file>: <problem>``; invalid UTF-8 is reported with the byte offset of the first bad byte.
"""
from __future__ import annotations

import bz2
import codecs
import contextlib
import dataclasses
import gzip
import json
import os
import re
import shutil
import subprocess
import tempfile
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

from data_prep.errors import DataPrepError
from data_prep.processes.pause_point import pause_point
from data_prep.processes.tethered_child import tethered_command, tethered_env

# Titles of dropped (empty) articles remembered for the report; the count is always exact.
MAX_REMEMBERED_TITLES = 100


class FormattingError(DataPrepError):
    """Unusable input or output; ``str()`` is ``<file>: <problem>``."""


@dataclasses.dataclass
class FormattingStats:
    output_file: str
    documents: int = 0
    dropped_empty: int = 0
    dropped_titles: List[str] = dataclasses.field(default_factory=list)
    input_files: List[str] = dataclasses.field(default_factory=list)


# --------------------------------------------------------------------------- output

@contextlib.contextmanager
def atomic_text_writer(path: str):
    """A UTF-8 text file that appears under ``path`` only if the block completes."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise FormattingError(folder, f"cannot create output folder: {e.strerror or e}") from None
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        f = open(tmp, "w", encoding="utf-8", newline="\n")
    except OSError as e:
        raise FormattingError(path, f"cannot write output: {e.strerror or e}") from None
    try:
        with f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def normalize_whitespace(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------- input

def _iter_utf8_lines(path: str, start: int = 0, end: Optional[int] = None) -> Iterator[str]:
    """Lines of a UTF-8 file (those starting in [start, end) when given: ``start`` must be a
    line start), streamed; invalid UTF-8 raises with the byte offset in the file."""
    offset = start
    try:
        with open(path, "rb") as f:
            f.seek(start)
            for raw in f:
                if end is not None and offset >= end:
                    break
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise FormattingError(path, f"invalid UTF-8 at byte offset {offset + e.start} "
                                                f"(byte 0x{raw[e.start]:02x})") from None
                offset += len(raw)
    except OSError as e:
        raise FormattingError(path, f"cannot read: {e.strerror or e}") from None


def read_utf8(path: str) -> str:
    return "".join(_iter_utf8_lines(path))


def list_input_files(path: str, suffixes: Optional[Sequence[str]] = None) -> List[str]:
    """``path`` itself, or the files below a folder (sorted, hidden and temporary files skipped)."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FormattingError(path, "no such file or folder")
    found = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or ".tmp-" in name or name.endswith(".part"):
                continue
            if suffixes and not name.lower().endswith(tuple(suffixes)):
                continue
            found.append(os.path.join(root, name))
    if not found:
        wanted = f" ({', '.join(suffixes)})" if suffixes else ""
        raise FormattingError(path, f"folder has no input files{wanted}")
    return found


def input_files(inputs: Sequence[str], suffixes: Optional[Sequence[str]] = None) -> List[str]:
    return [f for path in inputs for f in list_input_files(path, suffixes)]


def _check_not_empty(path: str) -> None:
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise FormattingError(path, f"cannot read: {e.strerror or e}") from None
    if size == 0:
        raise FormattingError(path, "empty file")


# --------------------------------------------------------------------------- Wikipedia

_REF = re.compile(r"<ref[^>]*/>|<ref[^>]*>.*?</ref>|</?ref[^>]*>", re.S | re.I)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")
_LINK = re.compile(r"\[\[(?:[^\[\]|]*\|)?([^\[\]]*)\]\]")
_TABLE_LINE = re.compile(r"^\s*(?:\{\||\|\}|\|-|\|\+|\||!)")
# Tag-like leftovers such as <onlyinclude>, <br/>, </small>; "a < b" (space after <) is kept.
_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>")
_LEFTOVER = re.compile(r"\{\{|\}\}|\{\||\|\}|\[\[|\]\]")


def strip_residual_markup(text: str) -> str:
    """Removes wiki markup wikiextractor sometimes leaves (templates inside chemistry or math
    it does not expand, table rows, links, references, stray tags such as <onlyinclude>),
    keeping the words of links."""
    text = _COMMENT.sub("", _REF.sub("", text))
    for _ in range(8):  # nested templates, innermost first
        text, n = _TEMPLATE.subn("", text)
        if not n:
            break
    text = _LINK.sub(r"\1", text)
    lines = [line for line in text.split("\n") if not _TABLE_LINE.match(line)]
    return _LEFTOVER.sub("", _TAG.sub("", "\n".join(lines)))


def _open_maybe_compressed(path: str):
    with open(path, "rb") as f:
        magic = f.read(3)
    if magic == b"BZh":
        return bz2.open(path, "rb")
    if magic[:2] == b"\x1f\x8b":
        return gzip.open(path, "rb")
    return open(path, "rb")


def _compression_matches_name(path: str) -> bool:
    """wikiextractor picks the decompressor from the file name; it must agree with the bytes."""
    with open(path, "rb") as f:
        magic = f.read(3)
    ext = os.path.splitext(path)[1].lower()
    if magic == b"BZh":
        return ext == ".bz2"
    if magic[:2] == b"\x1f\x8b":
        return ext == ".gz"
    return ext not in (".bz2", ".gz")


def _has_siteinfo(path: str, probe_bytes: int = 1 << 20) -> bool:
    try:
        with _open_maybe_compressed(path) as f:
            head = f.read(probe_bytes)
    except (OSError, EOFError) as e:
        raise FormattingError(path, f"cannot read dump: {e}") from None
    site = head.find(b"<siteinfo")
    page = head.find(b"<page")
    return site >= 0 and (page < 0 or site < page)


_MINIMAL_SITEINFO = (b"  <siteinfo>\n    <namespaces>\n"
                     b'      <namespace key="10" case="first-letter">Template</namespace>\n'
                     b'      <namespace key="828" case="first-letter">Module</namespace>\n'
                     b"    </namespaces>\n  </siteinfo>\n")


def _plain_copy_with_siteinfo(path: str, folder: str, add_siteinfo: bool) -> str:
    """An uncompressed copy of the dump (streamed) that wikiextractor can read. Named as a
    temporary of this process (``*.tmp-<pid>``, read as plain XML), so that when we are killed
    the next run over the folder removes it (``data_prep.processes.temporaries``)."""
    fd, tmp = tempfile.mkstemp(prefix=".wiki-", suffix=f".xml.tmp-{os.getpid()}", dir=folder)
    with _open_maybe_compressed(path) as src, os.fdopen(fd, "wb") as out:
        if add_siteinfo:
            first = src.readline()
            if b"<mediawiki" in first and b"<page" not in first:
                out.write(first)
                out.write(_MINIMAL_SITEINFO)
            else:
                out.write(_MINIMAL_SITEINFO)
                out.write(first)
        shutil.copyfileobj(src, out, 1 << 20)
    pause_point("wiki_scratch_copy")  # tests: killed while the copy is there
    return tmp


def _link_with_telling_name(path: str, folder: str) -> str:
    with open(path, "rb") as f:
        magic = f.read(3)
    suffix = ".xml.bz2" if magic == b"BZh" else ".xml.gz" if magic[:2] == b"\x1f\x8b" else ".xml"
    fd, link = tempfile.mkstemp(prefix=".wiki-", suffix=suffix, dir=folder)
    os.close(fd)
    os.remove(link)
    os.symlink(os.path.abspath(path), link)
    return link


def find_invalid_utf8(path: str) -> Optional[Tuple[int, int]]:
    """(offset, byte) of the first invalid UTF-8 byte of the (decompressed) file, or None.

    Only run after wikiextractor failed to decode: its message gives a position inside some
    internal buffer, which does not help anyone find the byte.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    fed = 0
    with _open_maybe_compressed(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as e:
                offset = fed - pending + e.start
                return offset, e.object[e.start]
            fed += len(chunk)
    pending = decoder.getstate()[0]
    if pending:  # a multi-byte sequence cut by the end of the file
        return fed - len(pending), pending[0]
    return None


def _wikiextractor_command(dump: str, processes: int, expand_templates: bool) -> List[str]:
    """wikiextractor tethered to this process: killed with us, with all it forks."""
    args = [dump, "--json", "-o", "-", "--processes", str(max(1, processes)),
            "--html-safe", "", "-q"]
    if not expand_templates:
        args.append("--no-templates")
    return tethered_command("wikiextractor.WikiExtractor", args)


def _last_error_line(stderr_text: str) -> str:
    lines = [line.strip() for line in stderr_text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def iter_wikipedia_articles(dump: str, processes: int = 1, expand_templates: bool = True,
                            scratch_dir: Optional[str] = None) -> Iterator[dict]:
    """``{"title", "text"}`` per page of a MediaWiki dump, as wikiextractor extracts them.

    Streams the child's JSON lines; raises ``FormattingError`` (naming the dump) when
    wikiextractor fails, e.g. on bytes that are not UTF-8.
    """
    _check_not_empty(dump)
    needs_siteinfo = not _has_siteinfo(dump)
    source, tmp = dump, None
    scratch = scratch_dir or os.path.dirname(os.path.abspath(dump))
    if needs_siteinfo:  # only hand-cut fragments: a copy is affordable
        tmp = source = _plain_copy_with_siteinfo(dump, scratch, True)
    elif not _compression_matches_name(dump):  # a link whose name tells the compression
        tmp = source = _link_with_telling_name(dump, scratch)
    err = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
    proc = subprocess.Popen(_wikiextractor_command(source, processes, expand_templates),
                            stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                            env=tethered_env(dict(os.environ, PYTHONIOENCODING="utf-8")))
    try:
        for raw in proc.stdout:
            try:
                page = json.loads(raw)
            except ValueError:
                continue  # a stray non-JSON line (warnings go to stderr, but be lenient)
            yield page
        rc = proc.wait()
        if rc != 0:
            err.seek(0)
            message = _last_error_line(err.read())
            if "UnicodeDecodeError" in message:
                bad = find_invalid_utf8(dump)
                if bad:
                    raise FormattingError(dump, f"invalid UTF-8 at byte offset {bad[0]} of the "
                                                f"XML (byte 0x{bad[1]:02x})")
            raise FormattingError(dump, f"wikiextractor failed (exit {rc}): {message}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        err.close()
        if tmp:
            with contextlib.suppress(OSError):
                os.remove(tmp)


def write_wikipedia_dump(dump: str, out, stats: FormattingStats, processes: int = 1,
                         expand_templates: bool = True, scratch_dir: Optional[str] = None,
                         bar=None) -> None:
    """One dump's articles, one a line, to the text file ``out``; counts go to ``stats``."""
    for page in iter_wikipedia_articles(dump, processes, expand_templates, scratch_dir):
        text = normalize_whitespace(strip_residual_markup(page.get("text", "")))
        if text:
            out.write(text + "\n")
            stats.documents += 1
        else:
            stats.dropped_empty += 1
            if len(stats.dropped_titles) < MAX_REMEMBERED_TITLES:
                stats.dropped_titles.append(page.get("title", ""))
        if bar is not None:
            bar.update(1)


def no_articles(dumps: Sequence[str]) -> FormattingError:
    return FormattingError(",".join(dumps), "no articles found (is this a MediaWiki XML "
                                            "pages-articles dump?)")


def format_wikipedia(dumps: Sequence[str], output_file: str, processes: int = 1,
                     expand_templates: bool = True, progress: Optional[bool] = None
                     ) -> FormattingStats:
    """Wikipedia dump(s) to one article per line (see the module docstring)."""
    from reporting.progress import bar as progress_bar
    stats = FormattingStats(output_file=output_file, input_files=list(dumps))
    with atomic_text_writer(output_file) as out, \
            progress_bar(desc="articles", unit=" art", enabled=progress) as bar:
        for dump in dumps:
            write_wikipedia_dump(dump, out, stats, processes, expand_templates,
                                 os.path.dirname(os.path.abspath(output_file)), bar)
        if stats.documents == 0:
            raise no_articles(dumps)
    return stats


# --------------------------------------------------------------------------- books

_GUTENBERG_START = re.compile(r"^\s*\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG.*$",
                              re.I | re.M)
_GUTENBERG_END = re.compile(r"^\s*\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG.*$",
                            re.I | re.M)


def strip_gutenberg_boilerplate(text: str) -> str:
    """The body of a Project Gutenberg book: after ``*** START OF ...``, before ``*** END OF ...``.

    Text without the markers is returned unchanged (already-clean books, other sources).
    """
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end():]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[:end.start()]
    return text


def write_book(path: str, out, stats: FormattingStats) -> None:
    """One book as one line of ``out``; counts go to ``stats``."""
    _check_not_empty(path)
    text = normalize_whitespace(strip_gutenberg_boilerplate(read_utf8(path).lstrip("\ufeff")))
    if text:
        out.write(text + "\n")
        stats.documents += 1
    else:
        stats.dropped_empty += 1


def no_book_text(files: Sequence[str], inputs: Sequence[str]) -> FormattingError:
    return FormattingError(files[0] if len(files) == 1 else inputs[0], "no text")


def format_books(inputs: Sequence[str], output_file: str, progress: Optional[bool] = None
                 ) -> FormattingStats:
    """``.txt`` books (files, or folders searched recursively) to one book per line."""
    from reporting.progress import bar
    files = input_files(inputs, (".txt",))
    stats = FormattingStats(output_file=output_file, input_files=files)
    with atomic_text_writer(output_file) as out:
        for path in bar(files, desc="books", unit=" book", enabled=progress):
            write_book(path, out, stats)
        if stats.documents == 0:
            raise no_book_text(files, inputs)
    return stats


# --------------------------------------------------------------------------- custom

def _blocks(lines: Iterable[str]) -> Iterator[str]:
    block: List[str] = []
    for line in lines:
        if line.strip():
            block.append(line)
        elif block:
            yield " ".join(block)
            block = []
    if block:
        yield " ".join(block)


CUSTOM_UNITS = ("block", "file")


def check_custom_unit(unit: str) -> None:
    if unit not in CUSTOM_UNITS:
        raise FormattingError("--custom_document_unit", f"must be 'block' or 'file', got {unit!r}")


def write_custom(path: str, out, stats: FormattingStats, unit: str = "block", start: int = 0,
                 end: Optional[int] = None) -> None:
    """The documents of one text file (with ``unit="block"``, of the lines starting in
    [start, end): ``start`` must begin a block, ``end`` too or be the file's end) to ``out``,
    one a line; counts go to ``stats``."""
    if start == 0:
        _check_not_empty(path)
    lines = _iter_utf8_lines(path, start, end)
    if unit == "block":
        for block in _blocks(lines):
            text = normalize_whitespace(block.lstrip("\ufeff"))
            if text:
                out.write(text + "\n")
                stats.documents += 1
        return
    wrote = False
    for line in lines:
        words = line.lstrip("\ufeff").split()
        if words:
            out.write((" " if wrote else "") + " ".join(words))
            wrote = True
    if wrote:
        out.write("\n")
        stats.documents += 1
    else:
        stats.dropped_empty += 1


def no_custom_text(files: Sequence[str], inputs: Sequence[str]) -> FormattingError:
    return FormattingError(files[0] if len(files) == 1 else ",".join(inputs),
                           "no text (only whitespace)")


def format_custom(inputs: Sequence[str], output_file: str, unit: str = "block",
                  progress: Optional[bool] = None) -> FormattingStats:
    """Plain text files (or folders of them) to one document per line.

    ``unit="block"``: a document is a block of lines separated by blank lines; ``"file"``: a
    document is a whole file.  Files are streamed line by line.
    """
    from reporting.progress import bar
    check_custom_unit(unit)
    files = input_files(inputs)
    stats = FormattingStats(output_file=output_file, input_files=files)
    with atomic_text_writer(output_file) as out:
        for path in bar(files, desc="files", unit=" file", enabled=progress):
            write_custom(path, out, stats, unit)
        if stats.documents == 0:
            raise no_custom_text(files, inputs)
    return stats
