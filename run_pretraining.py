"""Pre-training: the command `bert-pretrain` (cli/pretrain.py).

`python run_pretraining.py --help` lists its flags.
"""
from cli.pretrain import COMMAND

if __name__ == "__main__":
    COMMAND.run()
