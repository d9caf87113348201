"""Per-token embeddings: the command `bert-extract-features` (cli/extract_features.py).

`python extract_features.py --help` lists its flags.
"""
from cli.extract_features import COMMAND

if __name__ == "__main__":
    COMMAND.run()
