"""A small real-text corpus available on every machine: the docstrings of Python's standard
library, one module a document.

It lets the demo and the tests run the whole pipeline (vocab, pre-training data, pre-training)
on a fresh machine with no download and nothing copied into the repository. Source files are
parsed with `ast`, never imported, so no module's import-time side effects run.
"""
import ast
import os
import re
import sysconfig

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
