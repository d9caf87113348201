"""Fine-tuning commands: GLUE classification (`bert-glue`, run_classifier.py) and SQuAD
(`bert-squad`, run_squad.py), with Google's and NVIDIA's flags. Both run the one driver
(finetuning/driver.py) with their task; TensorFlow is imported only inside `main` (XLA on the
CPU needs its environment flag set before TensorFlow starts).
"""
from cli.command import Command
from cli.finetuning_flags import define_classifier_flags, define_squad_flags

GLUE_DOC = """Fine-tune BERT on a GLUE task (Google's run_classifier.py flags).

    bert-glue --task_name=MRPC --data_dir=glue/MRPC --vocab_file=vocab.txt \\
        --bert_config_file=bert_config.json --init_checkpoint=bert_model.ckpt \\
        --do_train --do_eval --max_seq_length=128 --train_batch_size=32 \\
        --learning_rate=2e-5 --num_train_epochs=3 --output_dir=out [--export_dir=export]
    (or: python run_classifier.py ...)

Shows `step N/total  loss  sequences/s  ETA` while training and the dev metrics at the end;
<output_dir>/eval_results.txt has Google's names (eval_accuracy, eval_loss, global_step,
loss; then eval_f1 / MCC / eval_pearson ... where the task has them). The log file is
<output_dir>/run_classifier.log.
"""

SQUAD_DOC = """Fine-tune BERT on SQuAD v1.1/v2.0 and predict (Google's/NVIDIA's run_squad.py flags).

    bert-squad --vocab_file=vocab.txt --bert_config_file=bert_config.json \\
        --init_checkpoint=bert_model.ckpt --do_train --train_file=train-v1.1.json \\
        --do_predict --predict_file=dev-v1.1.json --train_batch_size=32 --learning_rate=3e-5 \\
        --num_train_epochs=2 --max_seq_length=384 --doc_stride=128 --output_dir=out
    (or: python run_squad.py ...)

Writes predictions.json, nbest_predictions.json (null_odds.json for v2.0) and, when the
predict file has answers, eval_results.txt with the official metric (exact_match, f1; v2.0:
exact, f1, HasAns_/NoAns_/best_ entries). The log file is <output_dir>/run_squad.log.
"""

REQUIRED = ("vocab_file", "bert_config_file", "output_dir")


def _main(task_class_name, options_class_name):
    """The command's main: runs the driver with `finetuning.tasks.<task_class_name>` on
    `finetuning.options.<options_class_name>`."""
    def main(flags):
        from cli.flag_options import options_from_flags
        from cli.nvidia_flags import start_training_command
        from finetuning import options as finetuning_options
        options = options_from_flags(flags, getattr(finetuning_options, options_class_name))
        start_training_command(flags, options)  # before TensorFlow is imported
        from finetuning import tasks
        from finetuning.driver import main as driver_main
        return driver_main(getattr(tasks, task_class_name).from_options, options)
    return main


def _output_dir(flags):
    return flags.output_dir


GLUE = Command("run_classifier", GLUE_DOC, define_classifier_flags,
               _main("ClassifierTask", "ClassifierOptions"), REQUIRED, _output_dir)
SQUAD = Command("run_squad", SQUAD_DOC, define_squad_flags, _main("SquadTask", "SquadOptions"),
                REQUIRED, _output_dir)
