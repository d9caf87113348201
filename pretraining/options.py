"""`PretrainingOptions`: everything a pre-training run is given, by the names of
run_pretraining.py's flags (NVIDIA's TF1 BERT names), with NVIDIA's defaults. The command
defines its flags from these defaults and their meaning is in its `--help`
(`cli/pretraining_flags.py`); `PretrainingOptions.of(...)` runs `pretraining.runner` without a
command line."""
import dataclasses
from typing import Optional

from training.options import RunOptions


@dataclasses.dataclass(frozen=True)
class PretrainingOptions(RunOptions):
    # model and data
    bert_config_file: Optional[str] = None
    input_files_dir: Optional[str] = None
    eval_files_dir: Optional[str] = None
    output_dir: Optional[str] = None
    init_checkpoint: Optional[str] = None
    max_seq_length: int = 512
    max_predictions_per_seq: int = 80
    masked_lm_prob: Optional[float] = None        # dynamic-masking records only
    do_whole_word_mask: Optional[bool] = None     # dynamic-masking records only
    shuffle_buffer: int = 1000
    skip_bad_records: bool = False
    max_bad_records: int = 1000
    reset_data_position: bool = False
    start_over: bool = False                      # ours: move earlier checkpoints aside
    # what to do, and the recipe
    do_train: bool = False
    do_eval: bool = False
    optimizer_type: str = "lamb"                  # lamb | adam | adamw
    train_batch_size: int = 32
    eval_batch_size: int = 8
    learning_rate: float = 5e-05                  # per rank (NVIDIA's)
    weight_decay_rate: float = 0.01
    num_train_steps: int = 100000
    num_warmup_steps: int = 10000
    max_eval_steps: int = 100
    num_accumulation_steps: int = 1
    lamb_layer_adaptation: str = "all"            # all (NVIDIA's) | weights
    max_consecutive_skips: int = 100
    seed: int = 12345
    # precision and speed
    amp: bool = True
    amp_dtype: str = "float16"
    manual_fp16: bool = False
    use_xla: bool = True
    init_loss_scale: float = 2.0 ** 32
    peak_tflops: float = 0.0
    # devices and ranks
    horovod: bool = False
    allreduce_post_accumulation: bool = False
    num_local_devices: int = 1
    allow_cpu: bool = False                       # ours: a GPU machine without GPU may run
    # output and logs
    save_checkpoints_steps: int = 1000
    keep_checkpoint_max: int = 5
    display_loss_steps: int = 1
    dllog_path: Optional[str] = None
    verbose_logging: bool = False
    # the plan
    phase: Optional[int] = None
    dry_run: bool = False
    dry_run_ranks: int = 1
