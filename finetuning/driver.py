"""The one fine-tuning driver: train, evaluate, predict and export any task.

    options = SquadOptions.of(...)          # or ClassifierOptions (finetuning.options)
    task = SquadTask.from_options(options)  # or ClassifierTask.from_options(options)
    results = run(task, options)

The task supplies data (examples -> features -> TFRecords), the head, and scoring; this
module owns everything else: tokenizer, Horovod, precision, the Estimator and its schedule,
resuming, prediction and SavedModel export.
"""
import os
import sys

import tensorflow as tf
from absl import logging

from data_prep.wordpiece.tokenization import (FullTokenizer, VocabError,
                                              validate_case_matches_checkpoint)
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
from training.hooks import StepLoggingHook, job_start_time
from training.model_memory import check_model_fits
from training.option_ranges import out_of_range
from training.records import TrainingInput, record_input_fn
from training.resume import checkpoint_value, exit_status, resume_point, train_resuming
from training.run_config import make_run_config
from training.settings import (TrainingSettings, gradient_compression,
                               peak_learning_rate, precision_settings)
from training.vocab_fit import check_vocab_fits

tf1 = tf.compat.v1


def training_schedule(num_examples, options, num_workers):
    """(num_train_steps, num_warmup_steps): epochs over the examples in optimizer steps."""
    global_batch = options.train_batch_size * options.num_accumulation_steps * num_workers
    steps = max(1, int(num_examples / global_batch * options.num_train_epochs))
    return steps, int(steps * options.warmup_proportion)


# The flags the training records are made with (at every start): a resume must keep them.
RECORD_FLAGS = ("max_seq_length", "doc_stride", "max_query_length", "do_lower_case")


def record_flags(options):
    """{flag: value} of RECORD_FLAGS that this task has (`training.resume.train_resuming`)."""
    return {name: getattr(options, name) for name in RECORD_FLAGS if hasattr(options, name)}


def predict(estimator, task, features, path, batch_size):
    """Runs PREDICT over `features` (written to `path`); returns a list of result dicts."""
    task.write_records(features, path)
    input_fn = record_input_fn([path], batch_size, task.feature_spec(is_training=False),
                               is_training=False, drop_remainder=False)
    return list(estimator.predict(input_fn, yield_single_examples=True))


def evaluated_step(options):
    """global_step of the weights PREDICT used: the latest checkpoint in --output_dir, else
    --init_checkpoint's (0 when it has none), as eval_results.txt reports it."""
    if tf1.train.latest_checkpoint(options.output_dir):
        return checkpoint_value(options.output_dir, "global_step")
    if options.init_checkpoint:
        reader = tf.train.load_checkpoint(resolve_checkpoint(options.init_checkpoint))
        if reader.has_tensor("global_step"):
            return int(reader.get_tensor("global_step"))
    return 0


def no_learning_warning(finding, options):
    """The one line for an evaluation that scores what a constant answer or chance does:
    what was seen, the optimizer and learning rate that trained the model, what to try. Why:
    such a run (LAMB at fine-tuning rates: each tensor moves by ~learning rate x its norm,
    so the new head hardly moves) otherwise ends with exit 0 and a plausible-looking file."""
    if not options.do_train:
        return (f"{finding}: the model learned nothing (not trained in this run: is "
                "--init_checkpoint a fine-tuned model?)")
    if options.optimizer_type == "lamb":
        advice = ("LAMB moves each tensor by ~learning rate x its norm, too little for a new "
                  "head at fine-tuning rates: try --optimizer_type=adam (docs/finetuning.md)")
    else:
        advice = ("try a higher --learning_rate (Google's: 2e-5 to 5e-5), more "
                  "--num_train_epochs or examples, and check --init_checkpoint")
    return (f"{finding}: the model learned nothing; optimizer {options.optimizer_type} at "
            f"learning rate {options.learning_rate:g}: {advice}")


def _validate(task, options, config):
    if not (options.do_train or options.do_predict or getattr(options, "do_eval", False)
            or options.export_dir or options.export_triton or options.triton_model_repository):
        raise UsageError("nothing to do: pass --do_train, --do_eval, --do_predict, "
                         "--export_dir or --export_triton")
    problem = out_of_range(options)  # training/option_ranges.py: every numeric flag's range
    if problem:
        raise UsageError(problem)
    if options.max_seq_length > config.max_position_embeddings:
        raise UsageError(f"--max_seq_length={options.max_seq_length} exceeds the config's "
                         f"max_position_embeddings {config.max_position_embeddings}")
    task.validate_options(options)


def triton_model(options, amp):
    """The TritonModel the options ask for (--export_triton: NVIDIA's <output_dir>/triton_models;
    --triton_model_repository: that folder), or None."""
    repository = (os.path.join(options.output_dir, "triton_models") if options.export_triton
                  else options.triton_model_repository)
    if not repository:
        return None
    return TritonModel(repository, options.triton_model_name, options.triton_model_version,
                       options.triton_max_batch_size, options.triton_dyn_batching_delay,
                       options.triton_engine_count, amp, options.triton_model_overwrite)


def run(task, options):
    """Does what the options ask; returns a dict of results (train summary, metrics, paths).
    Rank 0 holds the output folder's run lock throughout (`resilience.run_lock`)."""
    started_at = job_start_time()
    # a plain namespace of values (a library caller) may leave the devices out: one
    workers = Workers(options.horovod, getattr(options, "num_local_devices", 1),
                      getattr(options, "allow_cpu", False))
    with run_lock(options.output_dir, workers.is_chief):
        return _run(task, options, workers, started_at)


def _run(task, options, workers, started_at):
    config = BertConfig.from_json_file(options.bert_config_file)
    check_model_fits(config, options.bert_config_file, workers.used_gpus(), options.do_train)
    _validate(task, options, config)
    tokenizer = FullTokenizer(options.vocab_file, options.do_lower_case)
    check_vocab_fits(tokenizer, config.vocab_size, options.bert_config_file)
    validate_case_matches_checkpoint(options.do_lower_case, options.init_checkpoint)
    tf.io.gfile.makedirs(options.output_dir)
    # Before anything reads the folder's checkpoints, on every rank: the one to resume from.
    resume = resume_point(options.output_dir, workers, getattr(options, "start_over", False))
    results = {}

    num_train_steps, num_warmup_steps, train_file = 1, 0, None
    if options.do_train:
        train_file = os.path.join(options.output_dir, "train.tf_record")
        num_examples = task.write_train_records(tokenizer, train_file)
        if num_examples < workers.size:  # a rank without records would wait forever
            raise TaskDataError(f"{num_examples} training example(s) for {workers.size} "
                                "ranks: every rank needs at least one")
        num_train_steps, num_warmup_steps = training_schedule(num_examples, options,
                                                              workers.replicas)
        workers.log_towers(options.train_batch_size * options.num_accumulation_steps
                           * workers.replicas)
        logging.info("fine-tuning %s on %d examples: %d steps (%d warm-up) on %s", task.name,
                     num_examples, num_train_steps, num_warmup_steps,
                     workers.describe_devices(), extra=SHOW)

    # NVIDIA's --amp/--use_xla defaults on a machine without GPU
    speed = resolve_speed(options, gpu=bool(workers.gpus))
    if workers.is_chief:
        for note in speed.notes:
            logging.info("%s", note, extra=SHOW)
    triton = triton_model(options, speed.amp)
    if triton and workers.is_chief:
        triton.check_writable()  # before training, not after it
    compute_type, loss_scale = precision_settings(speed.amp, speed.amp_dtype)
    settings = TrainingSettings(
        model_dir=options.output_dir, resume_checkpoint=resume.checkpoint or "",
        bert_config=config,
        learning_rate=peak_learning_rate(options.learning_rate, workers.replicas),
        num_train_steps=num_train_steps,
        num_warmup_steps=num_warmup_steps, optimizer_type=options.optimizer_type,
        init_checkpoint=options.init_checkpoint, compute_type=compute_type,
        loss_scale=loss_scale, init_loss_scale=options.init_loss_scale,
        num_accumulation_steps=options.num_accumulation_steps,
        allreduce_post_accumulation=options.num_accumulation_steps > 1,
        allreduce_fn=workers.allreduce_fn(gradient_compression(speed.amp, speed.amp_dtype)),
        seed=options.seed, rank=workers.rank, devices=tuple(workers.devices),
        log_variables=options.verbose_logging, fused_update=speed.fused_update,
        keep_checkpoint_max=options.keep_checkpoint_max)
    log_hooks = []

    def logging_hooks(tensors):
        hook = StepLoggingHook(tensors, options.display_loss_steps,
                               global_batch_size=options.train_batch_size * workers.replicas,
                               dllog_path=options.dllog_path, is_chief=workers.is_chief,
                               total_steps=num_train_steps, started_at=started_at)
        log_hooks.append(hook)
        return [hook]

    run_config = make_run_config(options.output_dir, workers, options.save_checkpoints_steps,
                                 options.keep_checkpoint_max, speed.use_xla, options.seed)
    estimator = tf.estimator.Estimator(make_model_fn(task, settings, logging_hooks),
                                       config=run_config)

    if options.do_train:
        # One training file: under Horovod every rank reads it and keeps every N-th record;
        # towers read one batch of devices x --train_batch_size, split by the model_fn.
        train_input = TrainingInput(
            (train_file,), options.train_batch_size * workers.num_devices,
            task.feature_spec(is_training=True),
            seed=options.seed, num_shards=workers.size, shard_index=workers.rank,
            shard_by="records")
        preemption = train_resuming(estimator, train_input, options.output_dir,
                                    num_train_steps, workers, options.save_checkpoints_steps,
                                    resume=resume,
                                    accumulation_steps=options.num_accumulation_steps,
                                    record_flags=record_flags(options))
        if preemption is not None:
            results["train"] = log_hooks[-1].summary() if log_hooks else {}
            if preemption.received is not None:
                results["preempted"] = True
                results["exit_status"] = exit_status(preemption)
                return results
    if not workers.is_chief:
        return results

    for split, wanted, batch_size in (("dev", getattr(options, "do_eval", False),
                                       getattr(options, "eval_batch_size", 8)),
                                      ("predict", options.do_predict, options.predict_batch_size)):
        if not wanted:
            continue
        examples, features = task.load_split(split, tokenizer)
        outputs = predict(estimator, task, features,
                          os.path.join(options.output_dir, f"{split}.tf_record"), batch_size)
        results[split] = task.evaluate(split, examples, features, outputs, options.output_dir,
                                       evaluated_step(options))
        logging.info("%s results: %s", split, results[split])
        check = getattr(task, "no_learning", None) if split == "dev" else None
        finding = check(features, outputs) if check else None
        if finding:
            logging.warning("%s", no_learning_warning(finding, options))

    if options.export_dir or triton:
        checkpoint = tf1.train.latest_checkpoint(options.output_dir)
        if checkpoint is None and options.init_checkpoint:  # export an existing checkpoint
            checkpoint = resolve_checkpoint(options.init_checkpoint)
        # Without --export_dir the SavedModel is written for Triton only (NVIDIA's export):
        # in a scratch folder of the output folder, removed once laid out.
        export_dir = options.export_dir or os.path.join(options.output_dir, "export_for_triton")
        path = export_saved_model(estimator, task, export_dir, options.max_seq_length,
                                  checkpoint, options.vocab_file, options.do_lower_case,
                                  config.vocab_size)
        if options.export_dir:
            results["saved_model"] = path
            logging.info("SavedModel written to %s", path)
        if triton:
            results["triton"] = write_triton_repository(path, triton, task,
                                                        options.max_seq_length)
            logging.info("Triton model written to %s", results["triton"], extra=SHOW)
            if not options.export_dir:
                tf.io.gfile.rmtree(export_dir)
    return results


def main(task_factory, options):
    """Entry point of run_squad.py / run_classifier.py: one-line errors and exit codes."""
    try:
        results = run(task_factory(options), options)
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
