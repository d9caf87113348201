# Sourced by the run scripts: precision and XLA flags, and the Horovod launcher.
# Expects PYTHON and num_gpus to be set by the caller.

ROOT=${ROOT:-"$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"}
PYTHON="${PYTHON:-$( [ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3 )}"

precision_flags() {  # fp16|bf16|fp32|tf32 -> PREC_FLAGS
  case "$1" in
    fp16) PREC_FLAGS="--amp --amp_dtype=float16" ;;
    bf16) PREC_FLAGS="--amp --amp_dtype=bfloat16" ;;
    fp32) PREC_FLAGS=""; export NVIDIA_TF32_OVERRIDE=0 ;;  # true float32: no TF32 matmuls
    tf32) PREC_FLAGS="" ;;                                # float32 with TF32 Tensor Cores
    *) echo "unknown precision '$1': use fp16, bf16, fp32 or tf32" >&2; exit 2 ;;
  esac
}

xla_flags() {  # true|false -> XLA_FLAGS_ARG
  case "$1" in
    true) XLA_FLAGS_ARG="--use_xla" ;;
    false) XLA_FLAGS_ARG="" ;;
    *) echo "use_xla must be true or false, got '$1'" >&2; exit 2 ;;
  esac
}

# One process per GPU under Horovod (Gloo/NCCL); a single process otherwise.
launch() {
  if [ "$num_gpus" -gt 1 ]; then
    if command -v horovodrun >/dev/null 2>&1 || [ -x "$(dirname "$PYTHON")/horovodrun" ]; then
      local hvd; hvd=$(command -v horovodrun || echo "$(dirname "$PYTHON")/horovodrun")
      # HOROVOD_LAUNCH_FLAGS replaces the single-node default (scripts/run.sub sets the hosts).
      "$hvd" -np "$num_gpus" ${HOROVOD_LAUNCH_FLAGS:---gloo -H localhost:$num_gpus} \
        "$PYTHON" "$@" --horovod
    elif command -v mpirun >/dev/null 2>&1; then
      mpirun -np "$num_gpus" --allow-run-as-root -bind-to none -map-by slot \
        -x NCCL_DEBUG -x LD_LIBRARY_PATH -x PATH "$PYTHON" "$@" --horovod
    else
      echo "num_gpus=$num_gpus needs horovodrun or mpirun on the PATH" >&2; exit 1
    fi
  else
    "$PYTHON" "$@"
  fi
}
