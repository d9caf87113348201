"""BERT pre-training with tf.estimator: NVLAMB, AMP, XLA, gradient accumulation, Horovod.

    bert-pretrain --bert_config_file=bert_config.json \\
        --input_files_dir=data/training --eval_files_dir=data/test --output_dir=out \\
        --do_train --train_batch_size=64 --max_seq_length=128 --max_predictions_per_seq=20 \\
        --num_train_steps=7038 --num_warmup_steps=2000 --learning_rate=7.5e-4 --amp --use_xla
    horovodrun -np 8 bert-pretrain --horovod ...   # peak rate 8 x 7.5e-4 = 6e-3
    bert-pretrain --num_local_devices=8 ...        # the same in one process, no Horovod
    bert-pretrain --dry_run --dry_run_ranks=8 ...  # print the plan, run nothing
    (or: python run_pretraining.py ...)

Shows the plan, then `step N/total  loss  sequences/s  ETA` every --display_loss_steps,
the training summary and the evaluation (written to <output_dir>/eval_results.txt with
Google's names). The log file is <output_dir>/run_pretraining.log.
"""
from cli.command import Command
from cli.pretraining_flags import define_flags


def main(flags):
    from cli.flag_options import options_from_flags
    from cli.nvidia_flags import start_training_command, warn_ignored
    from pretraining.options import PretrainingOptions
    options = options_from_flags(flags, PretrainingOptions)
    if options.dry_run:  # the plan only: no TensorFlow, no data
        from pretraining.plan import plan_line, pretraining_plan
        warn_ignored(flags)
        print(plan_line(pretraining_plan(options, options.dry_run_ranks)))
        return 0
    start_training_command(flags, options)  # before TensorFlow is imported
    from pretraining.runner import main as run_main
    return run_main(options)


COMMAND = Command("run_pretraining", __doc__, define_flags, main,
                  required=("bert_config_file", "output_dir"),
                  log_folder=lambda flags: None if flags.dry_run else flags.output_dir)
