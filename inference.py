"""Answers and labels from a fine-tuned model: the command `bert-inference` (cli/inference.py).

`python inference.py --help` lists its flags.
"""
from cli.inference import COMMAND

if __name__ == "__main__":
    COMMAND.run()
