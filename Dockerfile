# GPU image: TensorFlow 2.15 with CUDA, Horovod built with NCCL and Gloo, this package installed.
#   docker build -t bert-tf . && docker run --gpus all --rm -it bert-tf
FROM tensorflow/tensorflow:2.15.0-gpu

ENV DEBIAN_FRONTEND=noninteractive \
    HOROVOD_GPU_OPERATIONS=NCCL \
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    TF_CPP_MIN_LOG_LEVEL=2
RUN apt-get update && apt-get install -y --no-install-recommends cmake g++ git \
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
# The base image ships TensorFlow 2.15.0; pin the rest of the stack to match it.
RUN pip install --no-cache-dir "tensorflow==2.15.1" "numpy<2" && \
    pip install --no-cache-dir -e . && \
    pip install --no-cache-dir --no-build-isolation "horovod==0.28.1" && \
    horovodrun --check-build
CMD ["bash"]
