"""Command-line flags of pre-training (`bert-pretrain`, run_pretraining.py; NVIDIA's TF1 BERT
names), in the help groups `--help` lists them by."""
from absl import flags

from cli.flag_groups import DISTRIBUTED, INPUT, MODEL, OUTPUT, PRECISION, TRAINING, binders
from cli.nvidia_flags import PRETRAINING, define_ignored


def define_flags(flag_values=flags.FLAGS):
    """Defines the flags on `flag_values` (tests pass a fresh `flags.FlagValues()`)."""
    inp, model, train, speed, dist, out, plan = binders(
        flag_values, INPUT, MODEL, TRAINING, PRECISION, DISTRIBUTED, OUTPUT, "Plan")
    model.DEFINE_string("bert_config_file", None, "bert_config.json of the model to train.")
    inp.DEFINE_string("input_files_dir", None,
                      "Training TFRecords: a directory, a glob, or a comma-separated list.")
    inp.DEFINE_string("eval_files_dir", None, "Evaluation TFRecords (same forms).")
    out.DEFINE_string("output_dir", None, "Checkpoints and logs; a checkpoint here is resumed.")
    model.DEFINE_string("init_checkpoint", None,
                        "Start from these weights only (phase 1 -> phase 2, Google's BERT); "
                        "optimizer state starts fresh. Ignored when --output_dir already "
                        "holds a checkpoint.")
    train.DEFINE_enum("optimizer_type", "lamb", ["lamb", "adam", "adamw"],
                      "NVLAMB, Google's AdamWeightDecay (adam: no bias correction) or the same "
                      "with Adam's bias correction (adamw: torch's AdamW).")
    inp.DEFINE_integer("max_seq_length", 512, "Must equal the records' sequence length "
                       "(NVIDIA's default 512; phase 1 passes 128).")
    inp.DEFINE_integer("max_predictions_per_seq", 80,
                       "Must equal the records' prediction count (static records); the most "
                       "tokens masked per sequence (dynamic-masking records).")
    inp.DEFINE_float("masked_lm_prob", None,
                     "Dynamic-masking records only: share of the real tokens masked (default "
                     "0.15). Static records are masked already: refused with them.")
    inp.DEFINE_bool("do_whole_word_mask", None,
                    "Dynamic-masking records only: mask whole words (a word's pieces together) "
                    "instead of single tokens (default: single tokens). Refused with static "
                    "records.")
    train.DEFINE_bool("do_train", False, "Train to --num_train_steps, resuming a checkpoint in "
                      "--output_dir.")
    train.DEFINE_bool("do_eval", False, "Evaluate on --eval_files_dir after training.")
    train.DEFINE_integer("train_batch_size", 32, "Sequences per micro-batch per rank (per "
                         "device with --num_local_devices).")
    train.DEFINE_integer("eval_batch_size", 8, "Sequences per evaluation batch.")
    train.DEFINE_float("learning_rate", 5e-5,
                       "Peak learning rate PER RANK, as in NVIDIA's BERT: under --horovod the "
                       "optimizer applies learning_rate x ranks (7.5e-4 on 8 GPUs = 6e-3); "
                       "x devices with --num_local_devices.")
    train.DEFINE_float("weight_decay_rate", 0.01, "Decoupled weight decay.")
    train.DEFINE_integer("num_train_steps", 100000, "Optimizer steps (global_step) to reach.")
    train.DEFINE_integer("num_warmup_steps", 10000, "Linear warm-up steps.")
    out.DEFINE_integer("save_checkpoints_steps", 1000, "Checkpoint every N optimizer steps.")
    out.DEFINE_integer("keep_checkpoint_max", 5, "Checkpoints to keep.")
    out.DEFINE_integer("display_loss_steps", 1, "Log the step and show progress (loss, "
                       "sequences/s, ETA) every N optimizer steps.")
    train.DEFINE_integer("max_eval_steps", 100, "Evaluation batches (of --eval_batch_size).")
    train.DEFINE_integer("num_accumulation_steps", 1, "Micro-batches per optimizer step.")
    dist.DEFINE_bool("allreduce_post_accumulation", False,
                     "One allreduce per optimizer step instead of one per micro-batch.")
    dist.DEFINE_bool("horovod", False, "Data-parallel over Horovod ranks (horovodrun -np N).")
    dist.DEFINE_integer("num_local_devices", 1,
                        "Data-parallel over N GPUs of this machine in ONE process, without "
                        "Horovod (in-graph towers, one gradient average; N logical CPU devices "
                        "on a machine without GPU). --train_batch_size and --learning_rate stay "
                        "per device, as per rank under --horovod.")
    speed.DEFINE_bool("amp", True,
                      "Automatic mixed precision: --amp_dtype compute, float32 weights "
                      "(NVIDIA's default: on; without a GPU, off unless given).")
    speed.DEFINE_enum("amp_dtype", "float16", ["float16", "bfloat16"],
                      "Compute type under --amp (float16 uses dynamic loss scaling).")
    speed.DEFINE_bool("manual_fp16", False,
                      "NVIDIA's float16 arithmetic with casts in the model instead of AMP's "
                      "graph rewrite: what --amp --amp_dtype=float16 computes here (our AMP "
                      "casts in the model), so it means exactly that.")
    speed.DEFINE_bool("use_xla", True, "Compile the step with XLA (NVIDIA's default: on; "
                      "without a GPU, off unless given).")
    speed.DEFINE_float("init_loss_scale", 2.0 ** 32,
                       "Initial dynamic loss scale (float16; NVIDIA's 2**32, halved per "
                       "overflow, doubled after 1000 good steps).")
    train.DEFINE_enum("lamb_layer_adaptation", "all", ["all", "weights"],
                      "LAMB trust ratio on every variable (all: NVIDIA's BERT) or not on "
                      "LayerNorm and biases (weights: tfa/Model Garden LAMB).")
    train.DEFINE_integer("max_consecutive_skips", 100,
                         "Stop with an error after this many optimizer steps in a row skipped "
                         "for non-finite gradients (0: never).")
    plan.DEFINE_integer("phase", None, "Phase number (1: seq 128, 2: seq 512), a label in the "
                        "plan and logs; the run scripts set it.")
    plan.DEFINE_bool("dry_run", False,
                     "Print the run's plan (effective batch, learning rate, steps) as one JSON "
                     "line and exit: nothing is read or trained.")
    plan.DEFINE_integer("dry_run_ranks", 1, "Ranks the --dry_run plan assumes (the GPUs).")
    out.DEFINE_string("dllog_path", None, "JSON-lines log of every logged step (rank 0).")
    train.DEFINE_integer("seed", 12345, "Seed of initialisation, data order and dropout.")
    out.DEFINE_bool("verbose_logging", False, "Log every trainable variable (name and shape) "
                    "when the graph is built (NVIDIA's flag).")
    define_ignored(flag_values, PRETRAINING)
    speed.DEFINE_float("peak_tflops", 0.0,
                       "Peak TFLOP/s of one device for the MFU estimate (0: look up the GPU).")
    inp.DEFINE_integer("shuffle_buffer", 1000, "Record shuffle window of the input pipeline.")
    inp.DEFINE_bool("skip_bad_records", False,
                    "Skip and count training records that cannot be read or parsed or hold "
                    "out-of-range values (a truncated or corrupt file loses its rest), instead "
                    "of stopping at the first one; for corpora too large to check beforehand.")
    inp.DEFINE_integer("max_bad_records", 1000,
                       "With --skip_bad_records: stop when more records than this were "
                       "skipped (over all ranks).")
    inp.DEFINE_bool("reset_data_position", False,
                    "Resume a checkpoint whose data settings (--train_batch_size, --seed, "
                    "--shuffle_buffer, input files, the masking flags of dynamic-masking records; "
                    "recorded in --output_dir/data_order.json) "
                    "differ from this run's, restarting the data order from its beginning at "
                    "the checkpoint's step: examples already trained on may be seen again. "
                    "Without it such a resume stops with an error. Another number of ranks "
                    "alone (a job requeued on other nodes) restarts the order by itself, "
                    "with a warning. Scripts: RESET_DATA_POSITION=1.")
