#!/usr/bin/env bash
# Phase 2 of BERT pre-training with LAMB: sequence length 512, 10% of train_steps scaled by
# the phase-1/phase-2 global-batch ratio (NVIDIA's 1564 by default), starting from phase 1's
# FINAL checkpoint (fresh optimizer, its own warm-up and decay).
# Same 15 positional arguments as run_pretraining_lamb.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/pretraining_common.sh"
if [ "${DRY_RUN:-0}" != 1 ] && [ ! -f "$PHASE1_FINAL_CHECKPOINT.index" ]; then
  echo "phase 2 needs phase 1's final checkpoint $PHASE1_FINAL_CHECKPOINT (step $train_steps_phase1):" \
       "not there; finish phase 1 first (rerun the same command to resume it) or set PHASE1_CHECKPOINT" >&2
  exit 1
fi
run_phase 2 512 80 "$train_batch_size_phase2" "$learning_rate_phase2" "$warmup_steps_phase2" \
  "$train_steps_phase2" "$num_accumulation_steps_phase2" "$TRAIN_DATA_PHASE2" "$EVAL_DATA_PHASE2" \
  --init_checkpoint="$PHASE1_FINAL_CHECKPOINT"
