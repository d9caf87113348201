# Sourced by scripts/run.sub and scripts/nodes_check.sh inside a Slurm allocation (sbatch or
# salloc): the job's layout. Sets NODES (the job's nodes), GPUS_PER_NODE and gpus_from (where
# that count came from), HOSTS ("node1:8,node2:8"), TOTAL_GPUS, BERT_LAUNCHER (srun, or ssh
# for horovodrun, then HOROVOD_LAUNCH_FLAGS) and started_by, and says them in two lines.
# Expects `fail` (one line on stderr, exit 2) from the caller.
if [ -z "${SLURM_JOB_NODELIST:-}" ]; then
  fail "not inside a Slurm job (SLURM_JOB_NODELIST unset): submit it with" \
    "sbatch (e.g. sbatch --nodes=2 scripts/run.sub ...) or run it inside salloc; on one machine" \
    "use scripts/run_pretraining_lamb.sh"
fi
command -v scontrol >/dev/null 2>&1 || fail "scontrol is not on the PATH of this Slurm job's" \
  "shell: load Slurm's tools (e.g. module load slurm)"
# GPUs (ranks) per node, from the first of: GPUS_PER_NODE; SLURM_GPUS_ON_NODE (the GPUs this
# batch step was given on its node, whichever option asked: --gres=gpu:4, --gpus-per-node,
# --gpus); SLURM_GPUS_PER_NODE (--gpus-per-node, a typed "a100:8" counts 8); SLURM_JOB_GPUS
# (the job's GPU ids on this node); NVIDIA's --ntasks-per-node (one task per GPU); else 8.
# The allocation comes before the request: under slurm-wlm 22.05, `sbatch --gres=gpu:4
# run.sub` gets 4 GPUs a node with SLURM_GPUS_PER_NODE=8 from the #SBATCH line above
# (tests/test_slurm_steps.py), and SLURM_GPUS_PER_NODE is unset where only --gres asked.
gpus_from=GPUS_PER_NODE
if [ -z "${GPUS_PER_NODE:-}" ]; then
  tasks=${SLURM_NTASKS_PER_NODE:-1}; tasks=${tasks%%(*}
  job_gpus=${SLURM_JOB_GPUS:+$(echo "$SLURM_JOB_GPUS" | tr , '\n' | grep -c .)}
  for gpus_from in SLURM_GPUS_ON_NODE SLURM_GPUS_PER_NODE SLURM_JOB_GPUS \
                   SLURM_NTASKS_PER_NODE default; do
    case "$gpus_from" in
      SLURM_GPUS_ON_NODE) GPUS_PER_NODE=${SLURM_GPUS_ON_NODE:-} ;;
      SLURM_GPUS_PER_NODE) GPUS_PER_NODE=${SLURM_GPUS_PER_NODE:-}; GPUS_PER_NODE=${GPUS_PER_NODE##*:} ;;
      SLURM_JOB_GPUS) GPUS_PER_NODE=$job_gpus ;;
      SLURM_NTASKS_PER_NODE) (( tasks > 1 )) && GPUS_PER_NODE=$tasks ;;
      default) GPUS_PER_NODE=8 gpus_from="the default" ;;
    esac
    [ -z "$GPUS_PER_NODE" ] || break
  done
fi
[[ "$GPUS_PER_NODE" =~ ^[1-9][0-9]*$ ]] || fail "GPUS_PER_NODE=$GPUS_PER_NODE (from GPUS_PER_NODE" \
  "or --gpus-per-node): must be a positive whole number of ranks per node"
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
(( ${#NODES[@]} > 0 )) || fail "scontrol show hostnames $SLURM_JOB_NODELIST listed no node"
HOSTS=$(printf "%s:${GPUS_PER_NODE}," "${NODES[@]}"); HOSTS=${HOSTS%,}
TOTAL_GPUS=$(( ${#NODES[@]} * GPUS_PER_NODE ))

# Who starts the ranks (scripts/launch_common.sh `launch`): srun in a Slurm job unless
# BERT_LAUNCHER=ssh or HOROVOD_LAUNCH_FLAGS says otherwise; horovodrun outside a job.
if [ -z "${BERT_LAUNCHER:-}" ]; then
  BERT_LAUNCHER=ssh
  [ -n "${HOROVOD_LAUNCH_FLAGS:-}" ] || [ -z "${SLURM_JOB_ID:-}" ] || BERT_LAUNCHER=srun
fi
case "$BERT_LAUNCHER" in
  srun)  # srun --ntasks=TOTAL_GPUS --ntasks-per-node=GPUS_PER_NODE, from the job's nodes
    [ -z "${HOROVOD_LAUNCH_FLAGS:-}" ] || fail "BERT_LAUNCHER=srun and HOROVOD_LAUNCH_FLAGS" \
      "given together: srun starts the ranks itself; unset one of them"
    export GPUS_PER_NODE
    started_by="srun, one task per GPU" ;;
  ssh)  # horovodrun -H node1:N,...: NETWORK_INTERFACE pins Gloo to one interface (unset,
        # horovodrun finds a common one); SSH_PORT stays in the environment (horovodrun -p).
    flags="--gloo -H $HOSTS${NETWORK_INTERFACE:+ --network-interface $NETWORK_INTERFACE}"
    export HOROVOD_LAUNCH_FLAGS=${HOROVOD_LAUNCH_FLAGS:-$flags}
    started_by="horovodrun $HOROVOD_LAUNCH_FLAGS (ssh to the other nodes)" ;;
  *) fail "BERT_LAUNCHER=$BERT_LAUNCHER: must be srun (the default in a Slurm job) or ssh" ;;
esac
export BERT_LAUNCHER
echo "nodes: ${NODES[*]} -> $TOTAL_GPUS ranks, started by $started_by"
echo "GPUs per node: $GPUS_PER_NODE (from $gpus_from)"
