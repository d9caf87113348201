"""The one fine-tuning driver: train, evaluate, predict and export any task.

    task = SquadTask.from_flags(FLAGS)      # or ClassifierTask.from_flags(FLAGS)
    results = run(task, FLAGS)

The task supplies data (examples -> features -> TFRecords), the head, and scoring; this
module owns everything else: tokenizer, Horovod, precision, the Estimator and its schedule,
resuming, prediction and SavedModel export.
"""
import os
import sys

import tensorflow as tf
from absl import logging

from data_prep.tokenization import FullTokenizer, VocabError, validate_case_matches_checkpoint
from finetuning.export import ExportError, TritonModel, export_saved_model, write_triton_repository
from finetuning.model_fn import make_model_fn
from finetuning.tasks import TaskDataError
from modeling import BertConfig, ConfigError
from modeling.checkpoints import CheckpointError, resolve_checkpoint
from reporting.console import SHOW
from reporting.errors import UsageError
from resilience.run_lock import run_lock
from runtime.distributed import Workers
from runtime.speed_defaults import resolve as resolve_speed
from training.hooks import StepLoggingHook
from training.option_ranges import out_of_range
from training.records import TrainingInput, record_input_fn
from training.resume import checkpoint_value, exit_status, train_resuming
from training.run_config import make_run_config
from training.settings import (TrainingSettings, gradient_compression,
                               peak_learning_rate, precision_settings)

tf1 = tf.compat.v1


def training_schedule(num_examples, flags, num_workers):
    """(num_train_steps, num_warmup_steps): epochs over the examples in optimizer steps."""
    global_batch = flags.train_batch_size * flags.num_accumulation_steps * num_workers
    steps = max(1, int(num_examples / global_batch * flags.num_train_epochs))
    return steps, int(steps * flags.warmup_proportion)


def predict(estimator, task, features, path, batch_size):
    """Runs PREDICT over `features` (written to `path`); returns a list of result dicts."""
    task.write_records(features, path)
    input_fn = record_input_fn([path], batch_size, task.feature_spec(is_training=False),
                               is_training=False, drop_remainder=False)
    return list(estimator.predict(input_fn, yield_single_examples=True))


def evaluated_step(flags):
    """global_step of the weights PREDICT used: the latest checkpoint in --output_dir, else
    --init_checkpoint's (0 when it has none), as eval_results.txt reports it."""
    if tf1.train.latest_checkpoint(flags.output_dir):
        return checkpoint_value(flags.output_dir, "global_step")
    if flags.init_checkpoint:
        reader = tf.train.load_checkpoint(resolve_checkpoint(flags.init_checkpoint))
        if reader.has_tensor("global_step"):
            return int(reader.get_tensor("global_step"))
    return 0


def _validate(task, flags, config):
    if not (flags.do_train or flags.do_predict or getattr(flags, "do_eval", False)
            or flags.export_dir or flags.export_triton or flags.triton_model_repository):
        raise UsageError("nothing to do: pass --do_train, --do_eval, --do_predict, "
                         "--export_dir or --export_triton")
    problem = out_of_range(flags)  # training/option_ranges.py: every numeric flag's range
    if problem:
        raise UsageError(problem)
    if flags.max_seq_length > config.max_position_embeddings:
        raise UsageError(f"--max_seq_length={flags.max_seq_length} exceeds the config's "
                         f"max_position_embeddings {config.max_position_embeddings}")
    task.validate_flags(flags)


def triton_model(flags, amp):
    """The TritonModel the flags ask for (--export_triton: NVIDIA's <output_dir>/triton_models;
    --triton_model_repository: that folder), or None."""
    repository = (os.path.join(flags.output_dir, "triton_models") if flags.export_triton
                  else flags.triton_model_repository)
    if not repository:
        return None
    return TritonModel(repository, flags.triton_model_name, flags.triton_model_version,
                       flags.triton_max_batch_size, flags.triton_dyn_batching_delay,
                       flags.triton_engine_count, amp, flags.triton_model_overwrite)


def run(task, flags):
    """Does what the flags ask; returns a dict of results (train summary, metrics, paths).
    Rank 0 holds the output folder's run lock throughout (`resilience.run_lock`)."""
    # a plain namespace of values (a library caller) may leave the devices out: one
    workers = Workers(flags.horovod, getattr(flags, "num_local_devices", 1))
    with run_lock(flags.output_dir, workers.is_chief):
        return _run(task, flags, workers)


def _run(task, flags, workers):
    config = BertConfig.from_json_file(flags.bert_config_file)
    _validate(task, flags, config)
    tokenizer = FullTokenizer(flags.vocab_file, flags.do_lower_case)
    validate_case_matches_checkpoint(flags.do_lower_case, flags.init_checkpoint)
    tf.io.gfile.makedirs(flags.output_dir)
    results = {}

    num_train_steps, num_warmup_steps, train_file = 1, 0, None
    if flags.do_train:
        train_file = os.path.join(flags.output_dir, "train.tf_record")
        num_examples = task.write_train_records(tokenizer, train_file)
        if num_examples < workers.size:  # a rank without records would wait forever
            raise TaskDataError(f"{num_examples} training example(s) for {workers.size} "
                                "ranks: every rank needs at least one")
        num_train_steps, num_warmup_steps = training_schedule(num_examples, flags,
                                                              workers.replicas)
        workers.log_towers(flags.train_batch_size * flags.num_accumulation_steps
                           * workers.replicas)
        logging.info("fine-tuning %s on %d examples: %d steps (%d warm-up)", task.name,
                     num_examples, num_train_steps, num_warmup_steps, extra=SHOW)

    speed = resolve_speed(flags)  # NVIDIA's --amp/--use_xla defaults on a machine without GPU
    if workers.is_chief:
        for note in speed.notes:
            logging.info("%s", note, extra=SHOW)
    triton = triton_model(flags, speed.amp)
    if triton and workers.is_chief:
        triton.check_writable()  # before training, not after it
    compute_type, loss_scale = precision_settings(speed.amp, speed.amp_dtype)
    settings = TrainingSettings(
        model_dir=flags.output_dir,
        bert_config=config,
        learning_rate=peak_learning_rate(flags.learning_rate, workers.replicas),
        num_train_steps=num_train_steps,
        num_warmup_steps=num_warmup_steps, optimizer_type=flags.optimizer_type,
        init_checkpoint=flags.init_checkpoint, compute_type=compute_type,
        loss_scale=loss_scale, init_loss_scale=flags.init_loss_scale,
        num_accumulation_steps=flags.num_accumulation_steps,
        allreduce_post_accumulation=flags.num_accumulation_steps > 1,
        allreduce_fn=workers.allreduce_fn(gradient_compression(speed.amp, speed.amp_dtype)),
        seed=flags.seed, rank=workers.rank, devices=tuple(workers.devices),
        log_variables=flags.verbose_logging)
    log_hooks = []

    def logging_hooks(tensors):
        hook = StepLoggingHook(tensors, flags.display_loss_steps,
                               global_batch_size=flags.train_batch_size * workers.replicas,
                               dllog_path=flags.dllog_path, is_chief=workers.is_chief,
                               total_steps=num_train_steps)
        log_hooks.append(hook)
        return [hook]

    run_config = make_run_config(flags.output_dir, workers, flags.save_checkpoints_steps,
                                 flags.keep_checkpoint_max, speed.use_xla, flags.seed)
    estimator = tf.estimator.Estimator(make_model_fn(task, settings, logging_hooks),
                                       config=run_config)

    if flags.do_train:
        # One training file: under Horovod every rank reads it and keeps every N-th record;
        # towers read one batch of devices x --train_batch_size, split by the model_fn.
        train_input = TrainingInput(
            (train_file,), flags.train_batch_size * workers.num_devices,
            task.feature_spec(is_training=True),
            seed=flags.seed, num_shards=workers.size, shard_index=workers.rank,
            shard_by="records")
        preemption = train_resuming(estimator, train_input, flags.output_dir,
                                    num_train_steps, workers, flags.save_checkpoints_steps)
        if preemption is not None:
            results["train"] = log_hooks[-1].summary() if log_hooks else {}
            if preemption.received is not None:
                results["preempted"] = True
                results["exit_status"] = exit_status(preemption)
                return results
    if not workers.is_chief:
        return results

    for split, wanted, batch_size in (("dev", getattr(flags, "do_eval", False),
                                       getattr(flags, "eval_batch_size", 8)),
                                      ("predict", flags.do_predict, flags.predict_batch_size)):
        if not wanted:
            continue
        examples, features = task.load_split(split, tokenizer)
        outputs = predict(estimator, task, features,
                          os.path.join(flags.output_dir, f"{split}.tf_record"), batch_size)
        results[split] = task.evaluate(split, examples, features, outputs, flags.output_dir,
                                       evaluated_step(flags))
        logging.info("%s results: %s", split, results[split])

    if flags.export_dir or triton:
        checkpoint = tf1.train.latest_checkpoint(flags.output_dir)
        if checkpoint is None and flags.init_checkpoint:  # export an existing checkpoint
            checkpoint = resolve_checkpoint(flags.init_checkpoint)
        # Without --export_dir the SavedModel is written for Triton only (NVIDIA's export):
        # in a scratch folder of the output folder, removed once laid out.
        export_dir = flags.export_dir or os.path.join(flags.output_dir, "export_for_triton")
        path = export_saved_model(estimator, task, export_dir, flags.max_seq_length,
                                  checkpoint, flags.vocab_file, flags.do_lower_case)
        if flags.export_dir:
            results["saved_model"] = path
            logging.info("SavedModel written to %s", path)
        if triton:
            results["triton"] = write_triton_repository(path, triton, task,
                                                        flags.max_seq_length)
            logging.info("Triton model written to %s", results["triton"], extra=SHOW)
            if not flags.export_dir:
                tf.io.gfile.rmtree(export_dir)
    return results


def main(task_factory, flags):
    """Entry point of run_squad.py / run_classifier.py: one-line errors and exit codes."""
    try:
        results = run(task_factory(flags), flags)
    except (UsageError, ConfigError, CheckpointError, VocabError, TaskDataError, ExportError,
            RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for split in ("dev", "predict"):
        if split in results and results[split]:
            print(f"{split}: " + ", ".join(f"{k} = {v:.4f}" if isinstance(v, float) else
                                           f"{k} = {v}" for k, v in results[split].items()))
    if "saved_model" in results:
        print(f"SavedModel: {results['saved_model']}")
    return results.get("exit_status", 0)
