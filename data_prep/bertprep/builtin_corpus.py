"""A small real-text corpus available on every machine: the docstrings of Python's standard
library, one module a document.

It lets the demo and the tests run the whole pipeline (vocab, pre-training data, pre-training)
on a fresh machine with no download and nothing copied into the repository. Source files are
parsed with `ast`, never imported, so no module's import-time side effects run.

Docstrings are not all prose: one-line docstrings without a full stop, signatures, tables
and code run together into "sentences" hundreds of tokens long, which pre-training data
cuts at the sequence length (the demo used to lose 28% of its tokens that way, and warned of
it five times). `sentence_document` keeps what the data preparation's own sentence segmenter
(`sentence_segmentation`, the one sharding uses) finds as whole sentences of a sequence's
length, so the demo teaches no one to ignore that warning.
"""
import ast
import os
import re
import sysconfig

from data_prep.bertprep.sentence_segmentation import get_splitter

_WHITESPACE = re.compile(r"\s+")
# Lines that are code or doctest rather than prose.
_NOT_PROSE = re.compile(r"^\s*(>>>|\.\.\.|[-=~*]{3,}|:\w+:|\$ )")


def _prose(docstring):
    lines = [line for line in docstring.splitlines() if not _NOT_PROSE.match(line)]
    return _WHITESPACE.sub(" ", " ".join(lines)).strip()


def module_document(path):
    """All docstrings of one source file (module, classes, functions) as one line of text;
    '' for a file that does not parse."""
    try:
        with open(path, "r", encoding="utf-8") as reader:
            tree = ast.parse(reader.read(), filename=path)
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return ""
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node)
            if docstring:
                text = _prose(docstring)
                if len(text) > 20:
                    parts.append(text)
    return " ".join(parts)


# A kept sentence: at most this many characters (about 38 WordPiece tokens of the demo's
# 4,000-token vocabulary, so a sequence of 64 holds it whole), begun with a capital, a digit
# or an opening quote and ended by . ! or ? (so the segmenter finds it again, and it is prose).
MAX_SENTENCE_CHARS = 160
_SENTENCE_START = re.compile(r"^[\"'“‘(\[]?[A-Z0-9]")
_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*$")


def _is_whole_sentence(sentence):
    return (len(sentence) <= MAX_SENTENCE_CHARS and bool(_SENTENCE_START.match(sentence))
            and bool(_SENTENCE_END.search(sentence)))


def sentence_document(text, split=None):
    """The whole sentences of `text` (see `_is_whole_sentence`) as one line, such that
    `split` (default: the segmenter sharding uses) finds exactly them in it again: sentences
    it would join are dropped too."""
    split = split or get_splitter("auto")
    kept = [sentence for sentence in split(text) if _is_whole_sentence(sentence)]
    while True:  # ends: every pass that changes `kept` makes it shorter
        again = split(" ".join(kept)) if kept else []
        if again == kept:
            return " ".join(kept)
        kept = [sentence for sentence in again if _is_whole_sentence(sentence)]


def stdlib_source_files(stdlib_dir=None):
    """Sorted .py files of the standard library, without tests and third-party packages."""
    stdlib_dir = stdlib_dir or sysconfig.get_paths()["stdlib"]
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__",
            "lib2to3", "turtledemo", "ensurepip"}
    files = []
    for folder, subfolders, names in os.walk(stdlib_dir):
        subfolders[:] = sorted(d for d in subfolders if d not in skip)
        files.extend(os.path.join(folder, n) for n in sorted(names) if n.endswith(".py"))
    return sorted(files)


def iter_documents(min_chars=200, stdlib_dir=None):
    """Yields (module path, document text) for modules with at least `min_chars` of prose."""
    for path in stdlib_source_files(stdlib_dir):
        text = module_document(path)
        if len(text) >= min_chars:
            yield path, text


def write_corpus(output_file, max_documents=None, min_chars=200):
    """Writes one document a line (the `text_formatting` layout). Returns (documents, bytes)."""
    tmp = f"{output_file}.tmp-{os.getpid()}"
    count = size = 0
    with open(tmp, "w", encoding="utf-8") as writer:
        for _, text in iter_documents(min_chars):
            if max_documents is not None and count >= max_documents:
                break
            writer.write(text + "\n")
            count += 1
            size += len(text.encode("utf-8")) + 1
    os.replace(tmp, output_file)
    return count, size
