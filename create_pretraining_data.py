"""Google's pre-training data creation: the command `bert-create-pretraining-data`
(cli/create_pretraining_data.py).

`python create_pretraining_data.py --help` lists its flags.
"""
from cli.create_pretraining_data import COMMAND

if __name__ == "__main__":
    COMMAND.run()
