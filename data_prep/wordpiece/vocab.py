"""Training a WordPiece vocabulary for pre-training from scratch (domain text: biomedical,
legal, code...), with HuggingFace `tokenizers`' trainer.

The trainer is given the same normalisation Google's tokenizer applies (clean text, CJK
split, lower-case and accent stripping when uncased), so every learned piece is reachable by
`FullTokenizer`. `[PAD]` is id 0, as the pre-training records and attention masks assume,
followed by `[UNK] [CLS] [SEP] [MASK]`.
"""
import os
import sys

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


class VocabTrainingError(ValueError):
    """The corpus cannot produce a vocabulary."""


def train_wordpiece_vocab(input_files, output_file, vocab_size=30522, do_lower_case=True,
                          min_frequency=2, limit_alphabet=1000, progress=False):
    """Trains on `input_files` (plain text) and writes `output_file` (one token a line,
    atomically). Returns the number of tokens written. `progress`: the trainer's own bars
    (None: on a terminal only; they have no plain-line form for logs)."""
    from tokenizers import BertWordPieceTokenizer

    missing = [path for path in input_files if not os.path.isfile(path)]
    if missing:
        raise VocabTrainingError(f"{missing[0]}: no such input file")
    if not input_files or all(os.path.getsize(path) == 0 for path in input_files):
        raise VocabTrainingError(f"{input_files[0] if input_files else '<none>'}: "
                                 "no text to train a vocabulary on")
    tokenizer = BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=True,
                                       strip_accents=do_lower_case, lowercase=do_lower_case)
    tokenizer.train(list(input_files), vocab_size=vocab_size, min_frequency=min_frequency,
                    limit_alphabet=limit_alphabet, special_tokens=SPECIAL_TOKENS,
                    wordpieces_prefix="##",
                    show_progress=sys.stderr.isatty() if progress is None else progress)
    vocab = tokenizer.get_vocab()
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    if tokens[:len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
        raise VocabTrainingError(f"{output_file}: trainer did not put the special tokens first")
    tmp = f"{output_file}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as writer:
        writer.write("\n".join(tokens) + "\n")
    os.replace(tmp, output_file)
    return len(tokens)
