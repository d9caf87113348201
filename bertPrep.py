"""NVIDIA's data preparation: the command `bert-prep` (cli/bert_prep.py).

`python bertPrep.py --help` lists its flags.
"""
from cli.bert_prep import COMMAND

if __name__ == "__main__":
    COMMAND.run()
