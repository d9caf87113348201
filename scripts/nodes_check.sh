#!/usr/bin/env bash
# The multi-node check's launch (`bert-preflight --nodes` runs it, and reads what it leaves):
# timed allreduces of BYTES on every rank the recipe would have, started as the recipe starts
# its ranks (scripts/launch_common.sh `launch`), NCCL's INFO lines kept in OUT.
#   bash scripts/nodes_check.sh OUT BYTES ITERATIONS [--allow_cpu]
# Where the ranks are: inside a Slurm allocation (sbatch, salloc), the job's layout
# (scripts/job_layout.sh: its nodes, GPUS_PER_NODE, srun or BERT_LAUNCHER=ssh); outside one,
# HOROVOD_LAUNCH_FLAGS' hosts (-H node1:8,node2:8: their ranks added up), else NUM_GPUS, else
# the GPUs nvidia-smi lists here, else 2 CPU ranks on this machine.
# Writes OUT/allreduce.json (runtime/allreduce_check.py) and OUT/nccl.HOST.PID.log (a rank's
# NCCL lines); exits with the launch's status.
set -euo pipefail
fail() { echo "nodes_check: $*" >&2; exit 2; }
(( $# >= 3 )) || fail "usage: bash scripts/nodes_check.sh OUT BYTES ITERATIONS [--allow_cpu]"
OUT=$1 BYTES=$2 ITERATIONS=$3; shift 3
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
mkdir -p "$OUT"

if [ -n "${SLURM_JOB_NODELIST:-}" ] && [ -z "${HOROVOD_LAUNCH_FLAGS:-}" ]; then
  source scripts/job_layout.sh
  num_gpus=$TOTAL_GPUS
else
  hosts=""
  if [ -n "${HOROVOD_LAUNCH_FLAGS:-}" ]; then
    words=($HOROVOD_LAUNCH_FLAGS)
    for ((i = 0; i < ${#words[@]}; i++)); do
      case "${words[i]}" in
        -H|--hosts) hosts=${words[i + 1]:-} ;;
        --hosts=*) hosts=${words[i]#--hosts=} ;;
      esac
    done
    [ -n "$hosts" ] || fail "HOROVOD_LAUNCH_FLAGS=\"$HOROVOD_LAUNCH_FLAGS\" names no hosts (-H)"
  fi
  if [ -n "$hosts" ]; then
    num_gpus=0
    for entry in ${hosts//,/ }; do
      slots=${entry##*:}; [[ "$entry" == *:* ]] || slots=1
      [[ "$slots" =~ ^[1-9][0-9]*$ ]] || fail "-H $hosts: '$entry' is not HOST:RANKS"
      num_gpus=$(( num_gpus + slots ))
    done
    echo "hosts: $hosts -> $num_gpus ranks, started by horovodrun (ssh to the other hosts)"
  else
    listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    num_gpus=${NUM_GPUS:-$(( ${listed:-0} > 0 ? listed : 2 ))}
    echo "one machine: $num_gpus ranks"
  fi
fi

source scripts/launch_common.sh
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# Every rank's NCCL lines about its set-up and its network, each in a file of its own.
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT,NET}
export NCCL_DEBUG_FILE="$(cd "$OUT" && pwd)/nccl.%h.%p.log"
launch -m runtime.allreduce_check --bytes "$BYTES" --iterations "$ITERATIONS" \
  --output "$(cd "$OUT" && pwd)/allreduce.json" "$@"
