"""Stands in for the ``python`` that NVIDIA's bertPrep.py starts its record writers with.

NVIDIA's ``bertPrep.py --action create_tfrecord_files`` runs, through a shell, the literal
command ``python /workspace/bert/utils/create_pretraining_data.py ...``: the paths of its
container (WORKDIR /workspace/bert, PYTHONPATH /workspace/bert) and TensorFlow 1.15. Outside
that container, ``bench/data_prep_peers.py`` puts a folder first on PATH whose ``python``
runs this module with the peer environment's interpreter. It maps ``/workspace/bert/`` to
``$NV_BERT_DIR`` (a read-only checkout of DeepLearningExamples'
TensorFlow/LanguageModeling/BERT, never modified), makes ``import tensorflow as tf`` give
``tf.compat.v1`` (the script calls ``tf.python_io.TFRecordWriter``, a TF1 name that TF 2
keeps only there), and runs the script unchanged. Any other command line is passed to the
real interpreter as it is.

    python /workspace/bert/utils/create_pretraining_data.py --input_file=... (via bertPrep)
"""
import os
import runpy
import sys

CONTAINER_ROOT = "/workspace/bert/"


def main():
    if len(sys.argv) < 2 or not sys.argv[1].startswith(CONTAINER_ROOT):
        os.execv(sys.executable, [sys.executable] + sys.argv[1:])
    nv_root = os.environ.get("NV_BERT_DIR")
    if not nv_root or not os.path.isdir(nv_root):
        raise SystemExit("nvidia_python: set NV_BERT_DIR to NVIDIA's TensorFlow/"
                         "LanguageModeling/BERT folder")
    script = os.path.join(nv_root, sys.argv[1][len(CONTAINER_ROOT):])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    sys.modules["tensorflow"] = tf.compat.v1
    sys.argv = [script] + sys.argv[2:]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
