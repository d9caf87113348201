#!/usr/bin/env bash
# Two-phase BERT pre-training with LAMB (NVIDIA's positional arguments and defaults):
#   bash scripts/run_pretraining_lamb.sh [train_batch_size_phase1=64] [train_batch_size_phase2=8]
#     [eval_batch_size=8] [learning_rate_phase1=7.5e-4] [learning_rate_phase2=5e-4]
#     [precision=fp16|bf16|fp32|tf32] [use_xla=true] [num_gpus=8] [warmup_steps_phase1=2000]
#     [warmup_steps_phase2=200] [train_steps=7820] [save_checkpoints_steps=100]
#     [num_accumulation_steps_phase1=128] [num_accumulation_steps_phase2=512]
#     [bert_model=large|base]
# Environment: DATA_DIR (or BERT_PREP_WORKING_DIR), TRAIN_DATA_PHASE1/2, EVAL_DATA_PHASE1/2,
# BERT_CONFIG, RESULTS_DIR, INIT_CHECKPOINT (phase 1 start), PYTHON.
# Rerunning the same command resumes an interrupted phase from its last checkpoint.
# Learning rates are per GPU (x num_gpus in the optimizer); phase 2 runs 10% of train_steps
# scaled by the global-batch ratio (NVIDIA's arithmetic). DRY_RUN=1 prints each phase's plan.
set -euo pipefail
HERE="$(dirname "${BASH_SOURCE[0]}")"
source "$HERE/pretraining_common.sh"
if [ "${DRY_RUN:-0}" = 1 ]; then  # one JSON plan line per phase; nothing launched or written
  bash "$HERE/run_pretraining_lamb_phase1.sh" "$@"
  bash "$HERE/run_pretraining_lamb_phase2.sh" "$@"
  exit 0
fi
mkdir -p "$RESULTS_DIR"
LOGFILE="$RESULTS_DIR/pretraining.log"
# A rank lost outside Slurm (horovodrun's hosts, or one machine): the run goes on with the
# hosts that answer, as run.sub's job does (scripts/elastic.sh; BERT_MAX_RESTARTS,
# BERT_MIN_NODES). This shell runs the attempts; each runs this script again.
if [ -z "${BERT_ELASTIC_ATTEMPT:-}" ] && (( num_gpus > 1 )) && [ "${BERT_LAUNCHER:-ssh}" = ssh ]; then
  source "$HERE/elastic.sh"
  fail() { echo "run_pretraining_lamb.sh: $*" | tee -a "$LOGFILE" >&2; exit 2; }
  if elastic_layout_from_flags "$num_gpus"; then
    BERT_LAUNCHER=ssh PHASE_SCRIPTS=("$HERE/run_pretraining_lamb.sh")
    ARGS=("$train_batch_size_phase1" "$train_batch_size_phase2" "$eval_batch_size"
          "$learning_rate_phase1" "$learning_rate_phase2" "$precision" "$use_xla" "$num_gpus"
          "$warmup_steps_phase1" "$warmup_steps_phase2" "$train_steps" "$save_checkpoints_steps"
          "$num_accumulation_steps_phase1" "$num_accumulation_steps_phase2" "$bert_model")
    elastic_settings run_pretraining_lamb.sh pretraining.log written
    status=0
    elastic_run || status=$?
    exit "$status"
  fi
fi
echo "global batch: phase 1 $(( train_batch_size_phase1 * num_gpus * num_accumulation_steps_phase1 )), phase 2 $(( train_batch_size_phase2 * num_gpus * num_accumulation_steps_phase2 )); log $LOGFILE"
# TERM/INT to this shell reach the phase's launcher (scripts/launch_common.sh), which stops
# the ranks at an accumulation boundary with a checkpoint; `tee -i` ignores Ctrl-C so the
# ranks' output pipe stays open while they save. A preempted phase ends this script with
# 128 + the signal's number.
catch_preemption
run_logged() { bash "$@" 2>&1 | tee -i -a "$LOGFILE"; }
run_logged "$HERE/run_pretraining_lamb_phase1.sh" "$@" &
supervise $! forward_to_launchers
# A preempted phase 1 exits 0 with a checkpoint short of its last step: stop here, so that
# phase 2 never starts from partial weights; rerunning the same command resumes phase 1.
if ! phase_finished "$RESULTS_DIR/phase_1" "$train_steps_phase1"; then
  echo "phase 1 stopped before step $train_steps_phase1 (preempted?): not starting phase 2;" \
       "rerun the same command to resume" | tee -a "$LOGFILE" >&2
  exit 75  # EX_TEMPFAIL: rerun later
fi
catch_preemption
run_logged "$HERE/run_pretraining_lamb_phase2.sh" "$@" &
supervise $! forward_to_launchers
