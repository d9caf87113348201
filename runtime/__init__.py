"""Where the process runs: Horovod ranks and their devices (`distributed`), several devices
in one process (`towers`), CPU affinity and thread counts, oneDNN and XLA switches that must
be set before TensorFlow starts, and NVIDIA's GPU-only defaults on a machine without GPU
(`speed_defaults`)."""
