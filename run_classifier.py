"""Fine-tune BERT on a GLUE task (Google's run_classifier.py flags).

    python run_classifier.py --task_name=MRPC --data_dir=glue/MRPC --vocab_file=vocab.txt \
        --bert_config_file=bert_config.json --init_checkpoint=bert_model.ckpt \
        --do_train --do_eval --max_seq_length=128 --train_batch_size=32 \
        --learning_rate=2e-5 --num_train_epochs=3 --output_dir=out [--export_dir=export]
"""
import sys

from absl import app, flags

from finetuning.flags import define_classifier_flags

define_classifier_flags()


def main(_):
    if flags.FLAGS.use_xla:
        from training.xla_env import enable_cpu_xla
        enable_cpu_xla()  # before TensorFlow is imported
    from finetuning.driver import main as driver_main
    from finetuning.tasks import ClassifierTask
    return driver_main(ClassifierTask.from_flags, flags.FLAGS)


if __name__ == "__main__":
    flags.mark_flags_as_required(["vocab_file", "bert_config_file", "output_dir"])
    sys.exit(app.run(main))
