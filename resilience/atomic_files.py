"""Writing a small file so that readers see the old content or the new, never a part.

Through TensorFlow's file API, so `gs://`/`s3://` output folders work as local ones; the
temporary name `<path>.tmp-<pid>` is one that every input listing skips and that the next
run's clean-up removes if a kill leaves it behind. TensorFlow is imported when a file is
written, so TF-free modules (GLUE metrics) can import this one.
"""
import os


def write_text_atomically(path, text):
    """`text` into `path` through `<path>.tmp-<pid>` and a rename (overwriting `path`)."""
    import tensorflow as tf
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with tf.io.gfile.GFile(temporary, "w") as writer:
            writer.write(text)
        tf.io.gfile.rename(temporary, path, overwrite=True)
    finally:
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.remove(temporary)
