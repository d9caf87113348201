"""Runs Google's own create_pretraining_data.py (google-research/bert, TF1) under TF 2.

The peer for bench/data_prep.py. Google's script calls TF1 names (tf.flags, tf.gfile,
tf.python_io, tf.logging, tf.app); TensorFlow 2 keeps all of them under tf.compat.v1, so
this shim puts that module where the script's `import tensorflow as tf` finds it and runs
the script unchanged from a checkout of google-research/bert:

    python bench/google_data_prep.py GOOGLE_BERT_DIR --input_file=... --output_file=... ...
"""
import os
import runpy
import sys


def main():
    if len(sys.argv) < 2 or not os.path.isfile(
            os.path.join(sys.argv[1], "create_pretraining_data.py")):
        raise SystemExit("google_data_prep: the first argument must be a checkout of "
                         "google-research/bert (holding create_pretraining_data.py)")
    google_dir = sys.argv[1]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    sys.modules["tensorflow"] = tf.compat.v1
    sys.path.insert(0, google_dir)
    sys.argv = [os.path.join(google_dir, "create_pretraining_data.py")] + sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
