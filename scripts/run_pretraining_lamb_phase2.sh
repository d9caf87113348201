#!/usr/bin/env bash
# Phase 2 of BERT pre-training with LAMB: sequence length 512, the last 10% of the steps,
# starting from phase 1's weights (fresh optimizer, its own warm-up and decay).
# Same 15 positional arguments as run_pretraining_lamb.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/pretraining_common.sh"
PHASE1_CHECKPOINT=${PHASE1_CHECKPOINT:-$RESULTS_DIR/phase_1}
if [ ! -f "$PHASE1_CHECKPOINT/checkpoint" ] && [ ! -f "$PHASE1_CHECKPOINT.index" ]; then
  echo "phase 2 needs phase 1's checkpoint: none at $PHASE1_CHECKPOINT (set PHASE1_CHECKPOINT)" >&2
  exit 1
fi
run_phase 2 512 80 "$train_batch_size_phase2" "$learning_rate_phase2" "$warmup_steps_phase2" \
  "$train_steps_phase2" "$num_accumulation_steps_phase2" "$TRAIN_DATA_PHASE2" "$EVAL_DATA_PHASE2" \
  --init_checkpoint="$PHASE1_CHECKPOINT"
