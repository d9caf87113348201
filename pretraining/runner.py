"""Runs pre-training (and its evaluation) from its options (`pretraining.options`: a
command's parsed flags, or `PretrainingOptions.of(...)`).

Resuming: the Estimator restores the latest checkpoint in --output_dir (weights, optimizer
slots, accumulation buffers, global step, loss scale, micro-step counter), and each rank
restores its input pipeline's state saved with that checkpoint (`training.resume`): no
example is trained on twice or skipped, and nothing consumed is re-read. Dropout masks are
seeded by the micro-step counter, so a resumed run reproduces the uninterrupted one.

Every run logs its plan (`pretraining.plan`: the effective global batch, learning rate and
steps for this number of ranks and local devices) at start-up.

--num_local_devices=N trains N in-graph towers in this one process (`runtime.towers`): the
input reads N x --train_batch_size sequences a micro-batch, which the model_fn splits.

Input: every file is checked at start-up, before anything is written
(`pretraining.record_checks`: metadata and first record); a bad record found later while
training stops the run with one line naming its file and record, or, with
--skip_bad_records, is skipped and counted up to --max_bad_records (`resilience.record_guard`).
"""
import os
import sys

import tensorflow as tf
from absl import logging

from modeling import BertConfig, ConfigError
from modeling.checkpoints import CheckpointError
from pretraining.dynamic_masking import DynamicMasking
from pretraining.input_pipeline import (InputError, check_rank_records, list_input_files,
                                        make_input_fn, reading_spec, training_input,
                                        value_ranges)
from pretraining.model_fn import make_model_fn
from pretraining.plan import plan_line, pretraining_plan
from pretraining.record_checks import check_input_files
from pretraining.record_kinds import DYNAMIC, given_dynamic_flags
from reporting.console import SHOW
from reporting.errors import UsageError
from resilience.failures import explained_failures
from resilience.record_guard import BadRecordLimitHook
from resilience.run_lock import run_lock
from runtime.distributed import Workers
from runtime.speed_defaults import resolve as resolve_speed
from training.eval_results import write_eval_results
from training.flops import peak_tflops_for_device, training_flops_per_sequence
from training.hooks import StepLoggingHook, WeightsFingerprintHook, job_start_time
from training.model_memory import check_model_fits
from training.option_ranges import out_of_range
from training.resume import exit_status, resume_point, train_resuming
from training.run_config import make_run_config
from training.settings import TrainingSettings, gradient_compression, precision_settings
from training.nccl_transport import NcclTransportHook, capture_nccl_log, nccl_built
from training.xla_evidence import XlaEvidenceHook

def _peak_flops(flags_peak_tflops):
    if flags_peak_tflops > 0:
        return flags_peak_tflops * 1e12
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        peak = peak_tflops_for_device(details.get("device_name", ""))
        return peak * 1e12 if peak else None
    return None


def _validate(options, config):
    if not (options.do_train or options.do_eval):
        raise UsageError("nothing to do: pass --do_train and/or --do_eval")
    if options.max_seq_length > config.max_position_embeddings:
        raise UsageError(f"--max_seq_length={options.max_seq_length} exceeds the config's "
                         f"max_position_embeddings {config.max_position_embeddings}")
    if options.max_predictions_per_seq > options.max_seq_length:
        raise UsageError("--max_predictions_per_seq cannot exceed --max_seq_length")
    problem = out_of_range(options)  # training/option_ranges.py: every numeric flag's range
    if problem:
        raise UsageError(problem)
    if options.do_train and not options.input_files_dir:
        raise UsageError("--do_train needs --input_files_dir")
    if options.do_eval and not options.eval_files_dir:
        raise UsageError("--do_eval needs --eval_files_dir")


def network_choice(environ=None):
    """The network the ranks talk on, for the plan: the launcher's choice and why
    (BERT_NETWORK_CHOICE, runtime.slurm_launch), else the interface Horovod's Gloo was given,
    else Horovod's own choice."""
    environ = os.environ if environ is None else environ
    if environ.get("BERT_NETWORK_CHOICE"):
        return environ["BERT_NETWORK_CHOICE"]
    interface = environ.get("NCCL_SOCKET_IFNAME") or environ.get("HOROVOD_GLOO_IFACE")
    return (f"{interface} (NCCL_SOCKET_IFNAME / HOROVOD_GLOO_IFACE)" if interface
            else "Horovod's choice")


def log_plan(plan, dllog_path):
    """The run's effective recipe, at start-up, on the console and in the dllog."""
    line = plan_line(plan)
    logging.info("plan: %s", line, extra=SHOW)
    if dllog_path:
        os.makedirs(os.path.dirname(os.path.abspath(dllog_path)), exist_ok=True)
        with open(dllog_path, "a", encoding="utf-8") as writer:
            writer.write(line + "\n")


def run(options):
    """Trains and/or evaluates. Returns a dict of results (training summary, eval metrics).
    Rank 0 holds the output folder's run lock throughout (`resilience.run_lock`)."""
    started_at = job_start_time()
    # a plain namespace of values (a library caller) may leave the devices out: one
    workers = Workers(options.horovod, getattr(options, "num_local_devices", 1),
                      getattr(options, "allow_cpu", False))
    with run_lock(options.output_dir, workers.is_chief):
        return _run(options, workers, started_at)


def _run(options, workers, started_at):
    config = BertConfig.from_json_file(options.bert_config_file)
    check_model_fits(config, options.bert_config_file, workers.used_gpus(), options.do_train)
    _validate(options, config)
    # Before anything reads the folder's checkpoints, on every rank: the one to resume from.
    resume = resume_point(options.output_dir, workers, getattr(options, "start_over", False))
    # NVIDIA's --amp/--use_xla defaults on a machine without GPU
    speed = resolve_speed(options, gpu=bool(workers.gpus))
    compute_type, loss_scale = precision_settings(speed.amp, speed.amp_dtype)
    results = {"plan": dict(pretraining_plan(options, workers.size, speed),
                            devices=workers.describe_devices())}
    if workers.size > 1:
        results["plan"]["network"] = network_choice()
    if workers.is_chief:
        for note in speed.notes:
            logging.info("%s", note, extra=SHOW)
        workers.log_towers(results["plan"]["global_batch_size"])
        log_plan(results["plan"], options.dllog_path if options.do_train else None)

    train_files = eval_files = None
    # Dynamic-masking records are masked by the input pipeline (pretraining.dynamic_masking).
    masking, dynamic_flags = DynamicMasking.from_options(options), given_dynamic_flags(options)
    ranges = value_ranges(config.vocab_size, config.type_vocab_size, options.max_seq_length)
    if options.do_train:
        train_files = list_input_files(options.input_files_dir)
        train_records, record_counts = check_input_files(
            train_files, options.max_seq_length, options.max_predictions_per_seq, config,
            dynamic_flags)
        check_rank_records(train_files, record_counts, workers.size)
        train_input = training_input(  # one batch for all towers: [devices * batch, ...]
            train_files, options.train_batch_size * workers.num_devices, options.max_seq_length,
            options.max_predictions_per_seq, options.seed, workers.size, workers.rank,
            options.shuffle_buffer, masking if train_records.kind == DYNAMIC else None,
            train_records.sequences_per_row, ranges, options.skip_bad_records, record_counts)
        mine = train_input.rank_files()
        logging.info("rank %d reads %d training file(s): %s", workers.rank, len(mine),
                     ", ".join(mine[:4]) + (", ..." if len(mine) > 4 else ""))
        if train_records.sequences_per_row:
            logging.info("packed records, up to %d instances a row: %s",
                         train_records.sequences_per_row, options.input_files_dir)
        if train_records.kind == DYNAMIC:
            logging.info("dynamic masking of %s: %s", options.input_files_dir, masking)
    if options.do_eval:
        eval_files = list_input_files(options.eval_files_dir)
        eval_records, _ = check_input_files(eval_files, options.max_seq_length,
                                            options.max_predictions_per_seq, config,
                                            () if options.do_train else dynamic_flags)

    settings = TrainingSettings(
        model_dir=options.output_dir, resume_checkpoint=resume.checkpoint or "",
        bert_config=config, learning_rate=results["plan"]["peak_learning_rate"],
        num_train_steps=options.num_train_steps, num_warmup_steps=options.num_warmup_steps,
        optimizer_type=options.optimizer_type,
        init_checkpoint=options.init_checkpoint, compute_type=compute_type,
        loss_scale=loss_scale, init_loss_scale=options.init_loss_scale,
        num_accumulation_steps=options.num_accumulation_steps,
        allreduce_post_accumulation=options.allreduce_post_accumulation,
        allreduce_fn=workers.allreduce_fn(gradient_compression(speed.amp, speed.amp_dtype)),
        seed=options.seed, rank=workers.rank, devices=tuple(workers.devices),
        weight_decay_rate=options.weight_decay_rate,
        lamb_layer_adaptation=options.lamb_layer_adaptation,
        max_consecutive_skips=options.max_consecutive_skips, log_variables=options.verbose_logging,
        fused_update=speed.fused_update, keep_checkpoint_max=options.keep_checkpoint_max)

    log_hooks = []
    device_peak = _peak_flops(options.peak_tflops)
    # rank 0 of Horovod ranks on GPUs: NCCL's choice of network, said once NCCL is up
    nccl_log = (capture_nccl_log(options.output_dir) if workers.is_chief and workers.use_horovod
                and workers.gpus and options.do_train and nccl_built() else None)

    def logging_hooks(tensors):
        hook = StepLoggingHook(
            tensors, options.display_loss_steps,
            global_batch_size=options.train_batch_size * workers.replicas,
            flops_per_sequence=training_flops_per_sequence(
                config, options.max_seq_length, options.max_predictions_per_seq),
            peak_flops=device_peak and device_peak * workers.replicas,
            dllog_path=options.dllog_path, is_chief=workers.is_chief,
            total_steps=options.num_train_steps, ranks=workers.size, started_at=started_at)
        log_hooks.append(hook)
        chief = [XlaEvidenceHook(options.dllog_path)] if workers.is_chief else []
        if nccl_log:
            chief.append(NcclTransportHook(nccl_log, options.dllog_path))
        return [hook] + chief

    if workers.is_chief:
        tf.io.gfile.makedirs(options.output_dir)
    run_config = make_run_config(options.output_dir, workers, options.save_checkpoints_steps,
                                 options.keep_checkpoint_max, speed.use_xla, options.seed,
                                 xla_memory_optimizer_off=True)
    estimator = tf.estimator.Estimator(make_model_fn(settings, logging_hooks), config=run_config)

    if options.do_train:
        extra = [WeightsFingerprintHook(workers.rank)] if workers.use_horovod else []
        bad_records = (BadRecordLimitHook(options.max_bad_records, workers, options.input_files_dir)
                       if options.skip_bad_records else None)
        preemption = train_resuming(estimator, train_input, options.output_dir,
                                    options.num_train_steps, workers,
                                    options.save_checkpoints_steps, extra,
                                    reset_data_position=options.reset_data_position,
                                    bad_records=bad_records, resume=resume,
                                    accumulation_steps=options.num_accumulation_steps)
        if preemption is not None:
            if log_hooks:
                results["train"] = log_hooks[-1].summary()
            if bad_records is not None:
                results.setdefault("train", {})["bad_records_skipped"] = bad_records.total
            results["preempted"] = preemption.received is not None
            results["exit_status"] = exit_status(preemption)
            if preemption.received is not None:
                return results

    if options.do_eval and workers.is_chief:
        input_fn = make_input_fn(eval_files, options.eval_batch_size, options.max_seq_length,
                                 options.max_predictions_per_seq, False,
                                 masking if eval_records.kind == DYNAMIC else None,
                                 eval_records.sequences_per_row, value_ranges=ranges)
        eval_spec = reading_spec(options.max_seq_length, options.max_predictions_per_seq,
                                 eval_records.kind == DYNAMIC, eval_records.sequences_per_row)
        with explained_failures(options.output_dir, eval_files, eval_spec, ranges):
            metrics = estimator.evaluate(input_fn, steps=options.max_eval_steps)
        results["eval"] = {k: float(v) for k, v in metrics.items()}
        path = os.path.join(options.output_dir, "eval_results.txt")
        write_eval_results(path, metrics)
        logging.info("eval results (%s): %s", path, ", ".join(
            f"{key} = {value:.4g}" for key, value in sorted(results["eval"].items())), extra=SHOW)
    return results


def main(options):
    """Entry point for run_pretraining.py: one-line errors, exit codes."""
    try:
        results = run(options)
    except (UsageError, ConfigError, CheckpointError, InputError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return results.get("exit_status", 0)
