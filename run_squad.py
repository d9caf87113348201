"""SQuAD fine-tuning: the command `bert-squad` (cli/finetune.py).

`python run_squad.py --help` lists its flags.
"""
from cli.finetune import SQUAD

if __name__ == "__main__":
    SQUAD.run()
