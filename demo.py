"""The end-to-end demo: the command `bert-demo` (cli/demo.py).

`python demo.py --help` lists its flags.
"""
from cli.demo import COMMAND

if __name__ == "__main__":
    COMMAND.run()
