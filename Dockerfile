# GPU image: TensorFlow 2.15.1 on CUDA 12, Horovod 0.28.1 built with NCCL and Gloo, this package;
# all installed by scripts/install.sh exactly as on a GPU machine (BERT_TF_FLAVOR=gpu).
#   docker build -t bert-tf . && docker run --gpus all --rm -it bert-tf
# The base is a CUDA 12.2 devel image (TensorFlow 2.15 is built for CUDA 12.2): it brings what
# Horovod's NCCL build compiles with (nvcc, cuda_runtime.h, libcudart_static.a); cuDNN, cuBLAS and
# NCCL come with tensorflow[and-cuda] into the venv, as on any GPU machine.
FROM nvidia/cuda:12.2.2-devel-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive \
    TF_CPP_MIN_LOG_LEVEL=2
# Python 3.11 (Ubuntu 22.04's universe), cmake 3.x and g++ for Horovod's build. InfiniBand's
# user-space libraries for NCCL across nodes: its IB transport dlopens libibverbs.so.1
# (libibverbs1), which sees a device only through its provider (mlx5 and the others:
# ibverbs-providers, only Recommended by libibverbs1, so it is named here); librdmacm1 for
# RDMA-CM users beside NCCL (UCX, MPI, network plugins); ibv_devinfo (ibverbs-utils) to see the
# devices from inside the container. Without them NCCL falls back to TCP sockets.
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev cmake g++ make \
        libibverbs1 ibverbs-providers librdmacm1 ibverbs-utils \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /workspace/bert
COPY setup.py README.md ./
# Every package of setup.py (tests/test_layering.py checks the list), then the scripts.
COPY cli cli
COPY pretraining pretraining
COPY finetuning finetuning
COPY training training
COPY runtime runtime
COPY resilience resilience
COPY modeling modeling
COPY optimization optimization
COPY data_prep data_prep
COPY reporting reporting
COPY scripts scripts
COPY *.py ./
# No GPU is visible while an image builds, hence the explicit flavour; install.sh finds the
# toolkit through the nvcc on PATH (/usr/local/cuda/bin) and ends with horovodrun --check-build.
RUN BERT_TF_FLAVOR=gpu BERT_VENV=/workspace/bert/.venv BERT_CACHE_DIR=/tmp/bert-tf-cache \
        PYTHON=python3.11 bash scripts/install.sh \
    && rm -rf /tmp/bert-tf-cache /root/.cache/pip
ENV PATH=/workspace/bert/.venv/bin:$PATH
CMD ["bash"]
