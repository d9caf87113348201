"""Where the process runs: the GPUs a run uses and no silent CPU on a GPU node (`devices`),
Horovod ranks and their devices (`distributed`), ranks started by Slurm's srun without ssh
(`slurm_launch`), several devices in one process (`towers`), CPU affinity and thread counts,
oneDNN and XLA switches that must be set before TensorFlow starts (`xla_env`), and NVIDIA's
GPU-only defaults on a machine without GPU (`speed_defaults`)."""
