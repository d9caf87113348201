"""The end-to-end demo: `python demo.py [--output_dir DIR] [--corpus FILE]`.

Data preparation -> phase-1 and phase-2 pre-training of a tiny BERT -> fine-tuning -> SavedModel
export -> inference, on text already on this machine (see pipeline/demo.py).
"""
from absl import app, flags

flags.DEFINE_string("output_dir", "demo_out", "Everything the demo makes goes here.")
flags.DEFINE_string("corpus", None, "Your own text: documents separated by blank lines. "
                    "Default: the Python standard library's docstrings, built on the spot.")
flags.DEFINE_integer("phase1_steps", 300, "Pre-training steps at sequence length 64.")
flags.DEFINE_integer("phase2_steps", 40, "Pre-training steps at sequence length 128.")
FLAGS = flags.FLAGS


def main(_):
    from pipeline.demo import run_demo
    run_demo(FLAGS.output_dir, FLAGS.corpus, FLAGS.phase1_steps, FLAGS.phase2_steps)


if __name__ == "__main__":
    app.run(main)
