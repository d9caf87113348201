"""The tokenizer: Google's WordPiece, exact and fast (`tokenization`, with Google's reference
classes in `tokenization_reference` and its character classes in `char_classes`), and
training a vocabulary on a corpus (`vocab`)."""
