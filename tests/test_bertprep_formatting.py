"""text_formatting on real material: the Wikipedia dump fragment (one line per article with
prose, redirects and empty pages dropped), the table-heavy dump (no markup left), books
(Project Gutenberg boilerplate cut) and custom text."""
import bz2
import os
import re
import xml.etree.ElementTree as ET

import pytest

from bertprep_support import BOOKS, TABLE_DUMP, WIKI_DUMP, formatted_corpus
from data_prep.bertprep import text_formatting as tf

MARKUP = ("{|", "|-", "|}", "{{", "}}", "[[", "]]", "<ref", "</ref", "&amp;", "&lt;", "&quot;")
# A wikitext line that begins with words (after quotes or bold/italic marks) is prose; lines
# of lists, tables, templates, headings and categories begin with markup characters.
PROSE_LINE = re.compile(r"^[\"'(]*[A-Za-z0-9]", re.M)


def dump_pages(path):
    """(title, namespace, is_redirect, wikitext) of every page, read with the XML parser."""
    with bz2.open(path) as f:
        for _, el in ET.iterparse(f):
            if el.tag.endswith("}page"):
                yield (el.find("{*}title").text, el.find("{*}ns").text,
                       el.find("{*}redirect") is not None,
                       el.find("{*}revision/{*}text").text or "")
                el.clear()


def test_wikipedia_fragment_one_line_per_article(shared_data):
    root, stats = formatted_corpus(shared_data)
    stats = stats["wikicorpus_en"]
    out = os.path.join(root, "formatted_one_article_per_line", "wikicorpus_en.txt")
    pages = list(dump_pages(os.path.join(shared_data, WIKI_DUMP)))
    articles = [(title, text) for title, ns, redirect, text in pages
                if ns == "0" and not redirect]
    redirects = [title for title, _, redirect, _ in pages if redirect]
    assert redirects and len(articles) < len(pages)
    with_prose = [title for title, text in articles if PROSE_LINE.search(text)]
    lines = open(out, encoding="utf-8").read().split("\n")
    assert lines[-1] == ""
    lines = lines[:-1]
    assert len(lines) == stats.documents == len(with_prose)
    # Only pages without prose are dropped, and every article is accounted for.
    assert stats.documents + stats.dropped_empty == len(articles)
    assert sorted(stats.dropped_titles) == sorted(
        title for title, text in articles if not PROSE_LINE.search(text))
    assert all(line and line == " ".join(line.split()) for line in lines)
    # Articles keep their order and start with their prose (the title is not repeated).
    first_title, first_text = articles[0]
    prose = first_text[PROSE_LINE.search(first_text).start():]
    first_words = re.sub(r"'{2,3}|\[\[|\]\]", "", prose).split()[:4]
    assert lines[0].split()[:4] == first_words, (lines[0][:80], first_words)
    # No markup survives.
    for line in lines:
        for mark in ("{|", "|-", "[[", "]]", "<ref", "&amp;"):
            assert mark not in line


def test_table_markup_is_stripped(shared_data, tmp_path):
    dump = os.path.join(shared_data, TABLE_DUMP)
    pages = [p for p in dump_pages(dump) if p[1] == "0" and not p[2]]
    raw = "".join(p[3] for p in pages)
    assert all(mark in raw for mark in ("{|", "|-", "{{", "[[", "<ref"))  # the test has teeth
    out = str(tmp_path / "tables.txt")
    stats = tf.format_wikipedia([dump], out, progress=False)
    text = open(out, encoding="utf-8").read()
    assert stats.documents == len(pages) == len(text.splitlines())
    for mark in MARKUP:
        assert mark not in text, (mark, text[max(0, text.find(mark) - 80):text.find(mark) + 80])
    assert re.search(r"<[A-Za-z/]", text) is None
    # The prose survives: the first sentence of the first page, with bold marks removed.
    assert "The constructive vote of no confidence (in German:" in text
    assert os.listdir(tmp_path) == ["tables.txt"]


def test_books_one_per_line_with_gutenberg_boilerplate_cut(shared_data, tmp_path):
    alice = open(os.path.join(shared_data, BOOKS[0]), encoding="utf-8").read()
    folder = tmp_path / "books"
    (folder / "sub").mkdir(parents=True)
    (folder / "a_gutenberg.txt").write_text(
        "\ufeffThe Project Gutenberg eBook of Alice's Adventures in Wonderland\n\n"
        "This eBook is for the use of anyone anywhere.\n\n"
        "*** START OF THE PROJECT GUTENBERG EBOOK ALICE'S ADVENTURES IN WONDERLAND ***\n"
        + alice + "\n*** END OF THE PROJECT GUTENBERG EBOOK ALICE'S ADVENTURES IN WONDERLAND ***"
        "\n\nUpdated editions will replace the previous one. Project Gutenberg License.\n",
        encoding="utf-8")
    (folder / "sub" / "b_plain.txt").write_text(alice, encoding="utf-8")
    (folder / "notes.md").write_text("not a book", encoding="utf-8")
    out = str(tmp_path / "books.txt")
    stats = tf.format_books([str(folder)], out, progress=False)
    lines = open(out, encoding="utf-8").read().splitlines()
    assert stats.documents == 2 and len(lines) == 2
    assert lines[0] == lines[1] == " ".join(alice.split())
    assert "Gutenberg" not in lines[0] and "\ufeff" not in lines[0]


def test_custom_text_block_and_file_units(tmp_path):
    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "a.txt").write_text("First block\nstill first.\n\n  \nSecond block.\n",
                                  encoding="utf-8")
    (folder / "b.txt").write_text("Only block of b.", encoding="utf-8")
    out = str(tmp_path / "custom.txt")
    tf.format_custom([str(folder)], out, unit="block", progress=False)
    assert open(out, encoding="utf-8").read() == (
        "First block still first.\nSecond block.\nOnly block of b.\n")
    tf.format_custom([str(folder)], out, unit="file", progress=False)
    assert open(out, encoding="utf-8").read() == (
        "First block still first. Second block.\nOnly block of b.\n")


@pytest.mark.parametrize("text, expected", [
    ("a {{cite|x={{y}}}} b", "a  b"),
    ("see [[Paris|the city]] and [[Rome]]", "see the city and Rome"),
    ("x<ref name=a>{{cite web|url=u}}</ref> y<ref name=b/>", "x y"),
    ("{| class=x\n|-\n| cell\n|}\nprose", "prose"),
    ("a < b and c > d <br/>", "a < b and c > d "),
])
def test_strip_residual_markup(text, expected):
    assert tf.strip_residual_markup(text) == expected
