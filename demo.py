"""Runs the end-to-end demo: `python demo.py [--output_dir DIR] [--corpus FILE]`."""
from absl import app, flags

flags.DEFINE_string("output_dir", "demo_out", "Everything the demo makes goes here.")
flags.DEFINE_string("corpus", None, "A text file, one document a line; default: the Python "
                    "standard library's docstrings, built on the spot.")
flags.DEFINE_string("sentence", "BERT reads text in both directions at once.",
                    "The sentence to encode.")
flags.DEFINE_enum("compute_type", "float32", ["float32", "float16", "bfloat16"],
                  "Compute precision.")
FLAGS = flags.FLAGS


def main(_):
    from pipeline.demo import run_demo
    run_demo(FLAGS.output_dir, FLAGS.corpus, FLAGS.sentence, compute_type=FLAGS.compute_type)


if __name__ == "__main__":
    app.run(main)
