"""`TrainingSettings`: everything a model_fn needs to build a training step, for
pre-training and fine-tuning alike (no global flags inside model_fns)."""
import dataclasses
from typing import Callable, Optional


class UsageError(ValueError):
    """Flags that cannot work together."""


@dataclasses.dataclass
class TrainingSettings:
    bert_config: object
    learning_rate: float = 5e-5
    num_train_steps: int = 100
    num_warmup_steps: int = 10
    start_step: int = 0
    optimizer_type: str = "lamb"           # lamb | adam
    init_checkpoint: Optional[str] = None
    compute_type: str = "float32"          # float32 | float16 | bfloat16
    loss_scale: Optional[object] = None    # None | "dynamic" | number | loss-scale object
    init_loss_scale: float = 2.0 ** 15
    num_accumulation_steps: int = 1
    allreduce_post_accumulation: bool = False
    allreduce_fn: Optional[Callable] = None
    seed: int = 12345
    rank: int = 0
    weight_decay_rate: float = 0.01


def precision_settings(amp, amp_dtype):
    """(compute_type, loss_scale) for the --amp/--amp_dtype flags: float16 needs dynamic loss
    scaling, bfloat16 has float32's exponent range and does not."""
    if not amp:
        return "float32", None
    return amp_dtype, ("dynamic" if amp_dtype == "float16" else None)
