"""Which of the GPUs a Horovod rank sees is its own, however its launcher bound them.

Two bindings are common, and both are right:
* every rank on a node sees all the node's GPUs (horovodrun, a plain srun step): local rank
  k takes the k-th;
* each rank sees one GPU, its own: Slurm's `--gpus-per-task=1` or `--gpu-bind=single:1` (or a
  site default) sets each task's CUDA_VISIBLE_DEVICES to one index (tested under slurm-wlm
  with fake GPUs: tests/test_slurm_steps.py), as do wrappers that set it from the local
  rank. That GPU is the rank's whatever its local rank: TensorFlow's GPU 0.
Anything else leaves two ranks on one GPU or a rank without one, and is refused in one line
whose advice fits the case. SLURM_GPUS_ON_NODE ("GPUs available to the step on this node")
tells a step given fewer GPUs than ranks, whatever each task sees. No TensorFlow here: the
count of GPUs the rank sees is passed in.
"""
import os

from reporting.errors import UsageError


def _visible_setting(environ):
    value = environ.get("CUDA_VISIBLE_DEVICES")
    return "CUDA_VISIBLE_DEVICES unset" if value is None else f"CUDA_VISIBLE_DEVICES={value}"


def rank_gpu(local_rank, local_size, visible, environ=None):
    """The index, among the `visible` GPUs this rank sees, of the GPU that is its own
    (TensorFlow's GPU:<index> before the rank hides the others); UsageError when the rank
    has none of its own. Only for ranks that see a GPU (visible >= 1)."""
    environ = os.environ if environ is None else environ
    setting = _visible_setting(environ)
    where = f"Horovod local rank {local_rank} of {local_size} on this node"
    step_gpus = environ.get("SLURM_GPUS_ON_NODE", "")
    if step_gpus.isdigit() and int(step_gpus) < local_size:
        raise UsageError(
            f"{where}: Slurm gave the step {step_gpus} GPU(s) on this node (SLURM_GPUS_ON_NODE) "
            f"for {local_size} ranks; ask for {local_size} a node (sbatch --gpus-per-node="
            f"{local_size} or --gres=gpu:{local_size}), or start {step_gpus} rank(s) a node "
            f"(GPUS_PER_NODE={step_gpus})")
    if visible >= local_size:
        return local_rank
    named = [item for item in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if item.strip()]
    if visible == 1 and len(named) == 1:
        return 0   # bound to this rank by its launcher: its own
    if visible == 1:
        raise UsageError(
            f"{where}, which shows this rank 1 GPU ({setting}) that every rank on the node "
            f"would share: start one rank a node (GPUS_PER_NODE=1 with run.sub or srun, -H "
            "HOST:1 with horovodrun)")
    raise UsageError(
        f"{where} sees {visible} GPUs ({setting}): a rank must see either one GPU, its own "
        f"(srun --gpus-per-task=1 or --gpu-bind=single:1), or at least one GPU per rank on the "
        f"node ({local_size}); if the node has only {visible}, start {visible} ranks a node "
        f"(GPUS_PER_NODE={visible})")
