"""GLUE fine-tuning: the command `bert-glue` (cli/finetune.py).

`python run_classifier.py --help` lists its flags.
"""
from cli.finetune import GLUE

if __name__ == "__main__":
    GLUE.run()
