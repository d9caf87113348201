"""A vocabulary larger than the model's embedding table, refused before anything is built.

Token ids index the word embeddings, which have the config's `vocab_size` rows. A vocabulary
with more tokens gives ids the table has no row for: on a CPU the lookup fails minutes later
in a 100-140-line traceback (`indices[..] = 4132 is not in [0, 4000)`); on a GPU the same
lookup returns zeros for an out-of-range id instead of failing, so a run there trains or
predicts on garbage and says nothing. A vocabulary smaller than the table is sound (Google
and NVIDIA pad `vocab_size` up, e.g. to a multiple of 8) and passes.

Every command that reads a vocabulary and a config compares them here, before a model is
built or a file written: fine-tuning (GLUE, SQuAD), inference (from a checkpoint, or a
SavedModel that recorded its vocab_size), feature extraction; and pre-training, whose
vocabulary is the one its records were made with (their metadata, or the `masking_vocab`
of dynamic-masking records): `vocab_fit_problem` gives the one line all of them print.
"""
from modeling.config import ConfigError


def vocab_fit_problem(tokens, vocab_source, model_vocab_size, config_source,
                      holder="a vocabulary of"):
    """The one line saying that `tokens` (the size of the vocabulary `vocab_source` holds, or
    was made with: `holder`) is more than `model_vocab_size` (the `vocab_size` of
    `config_source`), or None when it fits."""
    if tokens <= model_vocab_size:
        return None
    return (f"{vocab_source}: {holder} {tokens} tokens, more than the vocab_size "
            f"{model_vocab_size} of {config_source}: token ids from {model_vocab_size} up have "
            "no embedding (a GPU would read zeros for them); use the vocabulary the model was "
            f"made with, or a config whose vocab_size is at least {tokens}")


def check_vocab_fits(tokenizer, model_vocab_size, config_source):
    """Raises ConfigError (the line above) when the vocabulary of `tokenizer` (a
    `FullTokenizer`: WordPiece file or SentencePiece model) has more tokens than the model
    has embeddings: `model_vocab_size`, read from `config_source` (a bert_config.json, or
    the metadata of an exported SavedModel)."""
    problem = vocab_fit_problem(tokenizer.vocab_size, tokenizer.vocab_file, model_vocab_size,
                                config_source)
    if problem:
        raise ConfigError(problem)
