"""What a fine-tuning run is given, by the names of run_classifier.py's and run_squad.py's
flags (Google's and NVIDIA's names): `FinetuningOptions` for what both take, then
`ClassifierOptions` and `SquadOptions`, each with the defaults of NVIDIA's script of the same
name where the two scripts differ, but one: GLUE's optimizer (`ClassifierOptions`). The
commands define their flags from these defaults and their meaning is in their `--help`
(`cli/finetuning_flags.py`); `ClassifierOptions.of(...)` runs `finetuning.driver` without a
command line."""
import dataclasses
from typing import Optional

from training.options import RunOptions


@dataclasses.dataclass(frozen=True)
class FinetuningOptions(RunOptions):
    # model and data
    vocab_file: Optional[str] = None
    bert_config_file: Optional[str] = None
    init_checkpoint: Optional[str] = None
    output_dir: Optional[str] = None
    do_lower_case: bool = True
    max_seq_length: int = 128
    # what to do, and the recipe
    do_train: bool = False
    do_predict: bool = False
    train_batch_size: int = 32
    predict_batch_size: int = 8
    learning_rate: float = 5e-05                  # per rank (NVIDIA's)
    num_train_epochs: float = 3.0
    warmup_proportion: float = 0.1
    num_accumulation_steps: int = 1
    optimizer_type: str = "adam"                  # adam | adamw | lamb (not NVIDIA's lamb: README)
    seed: int = 12345
    # devices, ranks, precision
    horovod: bool = False
    num_local_devices: int = 1
    allow_cpu: bool = False                       # ours: a GPU machine without GPU may run
    amp: bool = True
    amp_dtype: str = "float16"
    use_xla: bool = True
    init_loss_scale: float = 2.0 ** 32
    # output, export, logs
    save_checkpoints_steps: int = 1000
    keep_checkpoint_max: int = 2
    start_over: bool = False                      # ours: move earlier checkpoints aside
    export_dir: Optional[str] = None
    triton_model_repository: Optional[str] = None
    export_triton: bool = False
    triton_model_name: str = "bert"
    triton_model_version: int = 1
    triton_model_overwrite: bool = False
    triton_max_batch_size: int = 8
    triton_dyn_batching_delay: float = 0.0
    triton_engine_count: int = 1
    verbose_logging: bool = False
    dllog_path: Optional[str] = None
    display_loss_steps: int = 10


@dataclasses.dataclass(frozen=True)
class ClassifierOptions(FinetuningOptions):
    """run_classifier.py: NVIDIA's GLUE defaults (128 / 5e-5 / 32), but Google's
    AdamWeightDecay, not NVIDIA's LAMB: at fine-tuning rates LAMB moves each tensor by
    ~learning rate x its norm and a real model ends at the majority class (README;
    docs/finetuning.md has the measurements)."""
    task_name: Optional[str] = None
    data_dir: Optional[str] = None
    do_eval: bool = False
    eval_batch_size: int = 8


@dataclasses.dataclass(frozen=True)
class SquadOptions(FinetuningOptions):
    """run_squad.py: NVIDIA's SQuAD defaults (AdamWeightDecay, 384 / 5e-6 / 8, a checkpoint
    every 5000 steps)."""
    max_seq_length: int = 384
    train_batch_size: int = 8
    learning_rate: float = 5e-06
    save_checkpoints_steps: int = 5000
    optimizer_type: str = "adam"
    train_file: Optional[str] = None
    predict_file: Optional[str] = None
    doc_stride: int = 128
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    version_2_with_negative: bool = False
    null_score_diff_threshold: float = 0.0
    eval_script: Optional[str] = None
    num_eval_iterations: Optional[int] = None
