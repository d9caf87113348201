"""The end-to-end demo: `bert-demo [--output_dir DIR] [--corpus FILE]` (or `python demo.py`).

Data preparation -> phase-1 and phase-2 pre-training of a tiny BERT -> fine-tuning -> SavedModel
export -> inference, on text already on this machine (see pipeline/demo.py). The log file
is <output_dir>/demo.log.
"""
from cli.command import Command
from cli.flag_groups import INPUT, OUTPUT, TRAINING, binders


def define_flags(flag_values):
    inp, train, out = binders(flag_values, INPUT, TRAINING, OUTPUT)
    inp.DEFINE_string("corpus", None, "Your own text: documents separated by blank lines. "
                      "Default: the Python standard library's docstrings, built on the spot.")
    train.DEFINE_integer("phase1_steps", 600, "Pre-training steps at sequence length 64.")
    train.DEFINE_integer("phase2_steps", 40, "Pre-training steps at sequence length 128.")
    out.DEFINE_string("output_dir", "demo_out", "Everything the demo makes goes here.")


def main(flags):
    from pipeline.demo import run_demo
    run_demo(flags.output_dir, flags.corpus, flags.phase1_steps, flags.phase2_steps)
    return 0


COMMAND = Command("demo", __doc__, define_flags, main,
                  log_folder=lambda flags: flags.output_dir)
