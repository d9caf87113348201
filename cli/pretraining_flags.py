"""Command-line flags of pre-training (`bert-pretrain`, run_pretraining.py; NVIDIA's TF1 BERT
names), in the help groups `--help` lists them by. Their defaults are the job's own
(`pretraining.options.PretrainingOptions`), which the parsed flags become
(`cli.flag_options.options_from_flags`)."""
from absl import flags

from cli.flag_groups import (DISTRIBUTED, INPUT, MODEL, OUTPUT, PRECISION, START_OVER_HELP,
                              TRAINING, binders)
from cli.nvidia_flags import PRETRAINING, define_ignored
from pretraining.options import PretrainingOptions as OPTIONS


def define_flags(flag_values=flags.FLAGS):
    """Defines the flags on `flag_values` (tests pass a fresh `flags.FlagValues()`)."""
    inp, model, train, speed, dist, out, plan = binders(
        flag_values, INPUT, MODEL, TRAINING, PRECISION, DISTRIBUTED, OUTPUT, "Plan")
    model.DEFINE_string("bert_config_file", OPTIONS.bert_config_file,
                        "bert_config.json of the model to train.")
    inp.DEFINE_string("input_files_dir", OPTIONS.input_files_dir,
                      "Training TFRecords: a directory, a glob, or a comma-separated list.")
    inp.DEFINE_string("eval_files_dir", OPTIONS.eval_files_dir,
                      "Evaluation TFRecords (same forms).")
    out.DEFINE_string("output_dir", OPTIONS.output_dir,
                      "Checkpoints and logs; a checkpoint here is resumed.")
    model.DEFINE_string("init_checkpoint", OPTIONS.init_checkpoint,
                        "Start from these weights only (phase 1 -> phase 2, Google's BERT); "
                        "optimizer state starts fresh. Ignored when --output_dir already "
                        "holds a checkpoint.")
    train.DEFINE_enum("optimizer_type", OPTIONS.optimizer_type, ["lamb", "adam", "adamw"],
                      "NVLAMB, Google's AdamWeightDecay (adam: no bias correction) or the same "
                      "with Adam's bias correction (adamw: torch's AdamW).")
    inp.DEFINE_integer("max_seq_length", OPTIONS.max_seq_length,
                       "Must equal the records' sequence length "
                       "(NVIDIA's default 512; phase 1 passes 128).")
    inp.DEFINE_integer("max_predictions_per_seq", OPTIONS.max_predictions_per_seq,
                       "Must equal the records' prediction count (static records); the most "
                       "tokens masked per sequence (dynamic-masking records).")
    inp.DEFINE_float("masked_lm_prob", OPTIONS.masked_lm_prob,
                     "Dynamic-masking records only: share of the real tokens masked (default "
                     "0.15). Static records are masked already: refused with them.")
    inp.DEFINE_bool("do_whole_word_mask", OPTIONS.do_whole_word_mask,
                    "Dynamic-masking records only: mask whole words (a word's pieces together) "
                    "instead of single tokens (default: single tokens). Refused with static "
                    "records.")
    train.DEFINE_bool("do_train", OPTIONS.do_train,
                      "Train to --num_train_steps, resuming a checkpoint in --output_dir.")
    train.DEFINE_bool("do_eval", OPTIONS.do_eval, "Evaluate on --eval_files_dir after training.")
    train.DEFINE_integer("train_batch_size", OPTIONS.train_batch_size,
                         "Sequences per micro-batch per rank (per "
                         "device with --num_local_devices).")
    train.DEFINE_integer("eval_batch_size", OPTIONS.eval_batch_size,
                         "Sequences per evaluation batch.")
    train.DEFINE_float("learning_rate", OPTIONS.learning_rate,
                       "Peak learning rate PER RANK, as in NVIDIA's BERT: under --horovod the "
                       "optimizer applies learning_rate x ranks (7.5e-4 on 8 GPUs = 6e-3); "
                       "x devices with --num_local_devices.")
    train.DEFINE_float("weight_decay_rate", OPTIONS.weight_decay_rate, "Decoupled weight decay.")
    train.DEFINE_integer("num_train_steps", OPTIONS.num_train_steps,
                         "Optimizer steps (global_step) to reach.")
    train.DEFINE_integer("num_warmup_steps", OPTIONS.num_warmup_steps, "Linear warm-up steps.")
    out.DEFINE_integer("save_checkpoints_steps", OPTIONS.save_checkpoints_steps,
                       "Checkpoint every N optimizer steps.")
    out.DEFINE_integer("keep_checkpoint_max", OPTIONS.keep_checkpoint_max, "Checkpoints to keep.")
    out.DEFINE_bool("start_over", OPTIONS.start_over, START_OVER_HELP)
    out.DEFINE_integer("display_loss_steps", OPTIONS.display_loss_steps,
                       "Log the step and show progress (loss, "
                       "sequences/s, ETA) every N optimizer steps.")
    train.DEFINE_integer("max_eval_steps", OPTIONS.max_eval_steps,
                         "Evaluation batches (of --eval_batch_size).")
    train.DEFINE_integer("num_accumulation_steps", OPTIONS.num_accumulation_steps,
                         "Micro-batches per optimizer step.")
    dist.DEFINE_bool("allreduce_post_accumulation", OPTIONS.allreduce_post_accumulation,
                     "One allreduce per optimizer step instead of one per micro-batch.")
    dist.DEFINE_bool("horovod", OPTIONS.horovod,
                     "Data-parallel over Horovod ranks (horovodrun -np N).")
    dist.DEFINE_integer("num_local_devices", OPTIONS.num_local_devices,
                        "Data-parallel over N GPUs of this machine in ONE process, without "
                        "Horovod (in-graph towers, one gradient average; N logical CPU devices "
                        "on a machine without GPU). --train_batch_size and --learning_rate stay "
                        "per device, as per rank under --horovod.")
    dist.DEFINE_bool("allow_cpu", OPTIONS.allow_cpu,
                     "Run on the CPU where a GPU is expected (/dev/nvidia* or "
                     "CUDA_VISIBLE_DEVICES) but TensorFlow sees none; without it such a run "
                     "stops at start-up naming the cause (CPU-only TensorFlow, CUDA libraries "
                     "not found).")
    speed.DEFINE_bool("amp", OPTIONS.amp,
                      "Automatic mixed precision: --amp_dtype compute, float32 weights "
                      "(NVIDIA's default: on; without a GPU, off unless given).")
    speed.DEFINE_enum("amp_dtype", OPTIONS.amp_dtype, ["float16", "bfloat16"],
                      "Compute type under --amp (float16 uses dynamic loss scaling).")
    speed.DEFINE_bool("manual_fp16", OPTIONS.manual_fp16,
                      "NVIDIA's float16 arithmetic with casts in the model instead of AMP's "
                      "graph rewrite: what --amp --amp_dtype=float16 computes here (our AMP "
                      "casts in the model), so it means exactly that.")
    speed.DEFINE_bool("use_xla", OPTIONS.use_xla,
                      "Compile the step with XLA (NVIDIA's default: on; "
                      "without a GPU, off unless given).")
    speed.DEFINE_float("init_loss_scale", OPTIONS.init_loss_scale,
                       "Initial dynamic loss scale (float16; NVIDIA's 2**32, halved per "
                       "overflow, doubled after 1000 good steps).")
    train.DEFINE_enum("lamb_layer_adaptation", OPTIONS.lamb_layer_adaptation, ["all", "weights"],
                      "LAMB trust ratio on every variable (all: NVIDIA's BERT) or not on "
                      "LayerNorm and biases (weights: tfa/Model Garden LAMB).")
    train.DEFINE_integer("max_consecutive_skips", OPTIONS.max_consecutive_skips,
                         "Stop with an error after this many optimizer steps in a row skipped "
                         "for non-finite gradients (0: never).")
    plan.DEFINE_integer("phase", OPTIONS.phase,
                        "Phase number (1: seq 128, 2: seq 512), a label in the "
                        "plan and logs; the run scripts set it.")
    plan.DEFINE_bool("dry_run", OPTIONS.dry_run,
                     "Print the run's plan (effective batch, learning rate, steps) as one JSON "
                     "line and exit: nothing is read or trained.")
    plan.DEFINE_integer("dry_run_ranks", OPTIONS.dry_run_ranks,
                        "Ranks the --dry_run plan assumes (the GPUs).")
    out.DEFINE_string("dllog_path", OPTIONS.dllog_path,
                      "JSON-lines log of every logged step (rank 0).")
    train.DEFINE_integer("seed", OPTIONS.seed, "Seed of initialisation, data order and dropout.")
    out.DEFINE_bool("verbose_logging", OPTIONS.verbose_logging,
                    "Log every trainable variable (name and shape) "
                    "when the graph is built (NVIDIA's flag).")
    define_ignored(flag_values, PRETRAINING)
    speed.DEFINE_float("peak_tflops", OPTIONS.peak_tflops,
                       "Peak TFLOP/s of one device for the MFU estimate (0: look up the GPU).")
    inp.DEFINE_integer("shuffle_buffer", OPTIONS.shuffle_buffer,
                       "Record shuffle window of the input pipeline.")
    inp.DEFINE_bool("skip_bad_records", OPTIONS.skip_bad_records,
                    "Skip and count training records that cannot be read or parsed or hold "
                    "out-of-range values (a truncated or corrupt file loses its rest), instead "
                    "of stopping at the first one; for corpora too large to check beforehand.")
    inp.DEFINE_integer("max_bad_records", OPTIONS.max_bad_records,
                       "With --skip_bad_records: stop when more records than this were "
                       "skipped (over all ranks).")
    inp.DEFINE_bool("reset_data_position", OPTIONS.reset_data_position,
                    "Resume a checkpoint whose data settings or global batch "
                    "(--train_batch_size, --num_accumulation_steps, --num_local_devices, "
                    "--seed, --shuffle_buffer, input files, the masking flags of "
                    "dynamic-masking records; recorded in --output_dir/data_order.json) "
                    "differ from this run's, restarting the data order from its beginning at "
                    "the checkpoint's step: examples already trained on may be seen again. "
                    "Without it such a resume stops with an error. Another number of ranks "
                    "or local devices with the global batch kept (a job requeued on other "
                    "nodes, its accumulation rescaled) restarts the order by itself, with a "
                    "warning. Scripts: RESET_DATA_POSITION=1.")
