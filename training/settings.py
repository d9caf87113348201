"""`TrainingSettings`: everything a model_fn needs to build a training step, for
pre-training and fine-tuning alike (no global flags inside model_fns)."""
import dataclasses
from typing import Callable, Optional


@dataclasses.dataclass
class TrainingSettings:
    bert_config: object
    learning_rate: float = 5e-5
    num_train_steps: int = 100
    num_warmup_steps: int = 10
    optimizer_type: str = "lamb"           # lamb | adam (Google's) | adamw (bias-corrected)
    init_checkpoint: Optional[str] = None
    compute_type: str = "float32"          # float32 | float16 | bfloat16
    loss_scale: Optional[object] = None    # None | "dynamic" | number | loss-scale object
    init_loss_scale: float = 2.0 ** 32
    num_accumulation_steps: int = 1
    allreduce_post_accumulation: bool = False
    allreduce_fn: Optional[Callable] = None
    seed: int = 12345
    rank: int = 0
    weight_decay_rate: float = 0.01
    lamb_layer_adaptation: str = "all"     # all (NVIDIA) | weights (tfa, Model Garden)
    max_consecutive_skips: int = 100       # stop a run whose steps are all skipped
    log_variables: bool = False            # --verbose_logging: every trainable variable
    model_dir: Optional[str] = None        # the run's folder: its checkpoint must fit the graph
    # the checkpoint training resumes from (training.resume.resume_point; "": none), None:
    # model_dir's latest
    resume_checkpoint: Optional[str] = None
    devices: tuple = ()                    # tower devices of --num_local_devices (runtime.towers)
    # the optimizer's update XLA-compiled (runtime.speed_defaults.fused_update); None: its default
    fused_update: Optional[bool] = None
    # the RunConfig's: a Saver the training step installs keeps as many checkpoints
    keep_checkpoint_max: int = 5


def precision_settings(amp, amp_dtype):
    """(compute_type, loss_scale) for the --amp/--amp_dtype flags: float16 needs dynamic loss
    scaling, bfloat16 has float32's exponent range and does not."""
    if not amp:
        return "float32", None
    return amp_dtype, ("dynamic" if amp_dtype == "float16" else None)


def gradient_compression(amp, amp_dtype):
    """Compression of the gradient allreduce: "fp16" only under float16 AMP.

    Only there are the allreduced gradients loss-scaled, i.e. shifted into float16's range
    (see optimization.train_op). bfloat16 and float32 gradients are unscaled: a float16
    wire format would round an element of 1e-6 by ~6% and flush anything below ~6e-8 to
    zero, so they are allreduced in float32, exactly."""
    return "fp16" if amp and amp_dtype == "float16" else None


def peak_learning_rate(learning_rate_per_rank, ranks):
    """The learning rate the optimizer applies at the end of warm-up: NVIDIA's scripts take
    `--learning_rate` per GPU and multiply it by the number of Horovod ranks."""
    return float(learning_rate_per_rank) * int(ranks)
