"""NVIDIA's defaults `--amp` and `--use_xla` (both on) on a machine without a GPU.

Every flag that NVIDIA's BERT scripts share with ours takes NVIDIA's default, so their
command lines train their recipe here. Two of those defaults are about GPUs: `--amp` means
float16 arithmetic with loss scaling, which CPUs run slower than float32, and `--use_xla`
compiles the step with XLA, slower than TensorFlow's own kernels on the CPUs measured here
(XLA's CPU matmuls do not use oneDNN). A run never fails, nor slows down, because of a
default: on a machine without a GPU each of these two, when left at its default, is turned
off, and the run says so in one line. Given on the command line (`--amp`, `--amp_dtype`,
`--use_xla`, or set by a caller), they are honoured everywhere.

This module must not import TensorFlow: commands decide about XLA's environment flag before
TensorFlow starts (`runtime.xla_env`).
"""
import dataclasses
import os
from typing import List

from runtime.devices import gpu_expected


@dataclasses.dataclass(frozen=True)
class Speed:
    """What a run uses: AMP and its dtype, XLA auto-clustering of the step (`use_xla`), the
    XLA-fused optimizer update (`fused_update`, see `fused_update`); and the lines that say
    what changed."""
    amp: bool
    amp_dtype: str
    use_xla: bool
    notes: tuple = ()
    fused_update: bool = True


def fused_update(options, use_xla):
    """Whether the optimizer's update is XLA-compiled (`optimization.decoupled_weight_decay`):
    with XLA, and where XLA is off only because a CPU turned NVIDIA's default off (the fused
    update alone is measured faster there, and a CPU's XLA needs no toolchain). A
    `--nouse_xla` the user gave means no XLA anywhere: a GPU node whose XLA toolchain is
    broken (ptxas) then trains. `BERT_FUSED_OPTIMIZER=0` turns it off in any run."""
    if os.environ.get("BERT_FUSED_OPTIMIZER", "").strip() == "0":
        return False
    return bool(use_xla) or not given(options, "use_xla")


def gpu_visible():
    """Whether this process should see an NVIDIA GPU, known without importing TensorFlow
    (`runtime.devices.gpu_expected`). Once TensorFlow has started, a run passes what it
    found instead (`resolve(options, gpu=...)`): a GPU expected but absent is refused, or,
    with --allow_cpu, computes as a CPU run."""
    return gpu_expected() is not None


def given(options, name):
    """Whether option `name` was chosen (on the command line or by a caller), not left at its
    default: `options.given` (`training.options.RunOptions`)."""
    chosen = getattr(options, "given", None)
    return True if chosen is None else name in chosen  # a plain namespace: all are choices


def resolve(options, gpu=None):
    """The run's Speed from its options (`amp`, `amp_dtype`, `use_xla`) on this machine."""
    gpu = gpu_visible() if gpu is None else gpu
    amp, amp_dtype, use_xla = bool(options.amp), options.amp_dtype, bool(options.use_xla)
    if getattr(options, "manual_fp16", False):  # NVIDIA's casts in the model: our AMP's way
        use_xla = use_xla if gpu or given(options, "use_xla") else False
        return Speed(True, "float16", use_xla, (), fused_update(options, use_xla))
    turned_off: List[str] = []
    if not gpu:
        if amp and not (given(options, "amp") or given(options, "amp_dtype")):
            amp = False
            turned_off.append("--amp")
        if use_xla and not given(options, "use_xla"):
            use_xla = False
            turned_off.append("--use_xla")
    notes = ()
    if turned_off:
        without = "without XLA auto-clustering (the optimizer update stays XLA-fused)"
        what = {("--amp",): "in float32", ("--use_xla",): without,
                ("--amp", "--use_xla"): f"in float32 {without}"}[tuple(turned_off)]
        notes = (f"defaults: {' and '.join(turned_off)} (NVIDIA's defaults) are for GPUs; "
                 f"without a GPU this run computes {what}, faster here (give "
                 f"{' or '.join(turned_off)} on the command line to insist)",)
    return Speed(amp, amp_dtype, use_xla, notes, fused_update(options, use_xla))
