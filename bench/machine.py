"""What the bench tables name: the CPU they ran on (one place for every script here).

Why more than the model name: a virtual machine's CPU often calls itself just "AMD EPYC",
yet two such machines of this workplace differed by 2x in the same TensorFlow serving
benchmark (AVX-512 on Zen 4 and on Zen 5 are not the same speed). The family and model
numbers and the vector extensions tell them apart."""

import os

# AMD's CPU families (the `cpu family` line of /proc/cpuinfo) by core generation; family 25
# holds Zen 3 and Zen 4, told apart by AVX-512, which Zen 4 has and Zen 3 has not (a virtual
# machine may mask the model number, not the flags the guest runs).
AMD_FAMILIES = {23: "Zen/Zen 2", 26: "Zen 5"}
AMD_FAMILY_25 = {False: "Zen 3", True: "Zen 4"}  # by AVX-512
VECTOR_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


# What each library reads to stop at a narrower instruction set, so that a CPU with more
# stands in for one with less (both sides of a comparison capped alike): oneDNN (in
# TensorFlow and in torch), torch's own vectorised kernels, MKL (torch's fp32 GEMM), and
# FBGEMM (torch's int8 GEMM: without it, it ran AVX-512 VNNI under the others' cap, 2.5-3x
# the speed of its AVX2 path on a 256 x 384 x 1536 product). "avx512_bf16" stands an AMX
# Xeon in for a Zen 4 or 5: AVX-512 with BF16 and VNNI, no AMX (FBGEMM has no AMX code: its
# cap there is VNNI, what it runs anyway).
INSTRUCTION_SET_CAPS = {
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2",
             "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512_bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
                    "DNNL_MAX_CPU_ISA": "AVX512_CORE_BF16", "ATEN_CPU_CAPABILITY": "avx512",
                    "MKL_ENABLE_INSTRUCTIONS": "AVX512", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512_E1"},
}
# The caps under which oneDNN has no bfloat16 arithmetic (TensorFlow aborts asking for it).
CAPS_WITHOUT_BF16 = ("avx2",)


def cap_instruction_set(name):
    """Caps this process's children (and libraries not loaded yet) at instruction set `name`
    (a key of INSTRUCTION_SET_CAPS; None or "" leaves them be). A stand-in, not the CPU:
    the caches, memory and clocks stay this machine's, so its figures say what the code paths
    do, not what an AVX2 CPU would measure."""
    if name:
        os.environ.update(INSTRUCTION_SET_CAPS[name])


def add_max_isa_flag(parser):
    """`--max_isa` on a bench's argparse parser; pass its value to cap_instruction_set."""
    parser.add_argument("--max_isa", choices=sorted(INSTRUCTION_SET_CAPS),
                        help="cap both sides (and the ceiling) at this instruction set: "
                             "a stand-in for a CPU without more (machine.cap_instruction_set)")


def refuse_bf16_when_capped(parser, max_isa, precisions, flag):
    """A parser error when bf16 (in `precisions`, given by `flag`) meets a `--max_isa` without
    it: oneDNN capped at AVX2 has no bf16 kernel, and TensorFlow aborts asking for one."""
    if max_isa in CAPS_WITHOUT_BF16 and "bf16" in precisions:
        parser.error(f"{flag} bf16 needs the CPU's bfloat16 instructions: not with "
                     f"--max_isa {max_isa}")


def instruction_set_cap():
    """The cap in force (see cap_instruction_set), for the tables: e.g. "AVX2", or None."""
    return os.environ.get("ONEDNN_MAX_CPU_ISA") or None


def _cpuinfo():
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as reader:
            for line in reader:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_name(fields=None):
    """The CPU's model name, its family/model numbers (with AMD's core generation) and its
    widest vector extensions, e.g. "AMD EPYC (family 26 model 2: Zen 5; avx512_bf16,
    avx512f, avx2)"; "unknown CPU" where /proc/cpuinfo is not there."""
    fields = _cpuinfo() if fields is None else fields
    if "model name" not in fields:
        return "unknown CPU"
    details = []
    if "cpu family" in fields:
        family = int(fields["cpu family"])
        amd = fields.get("vendor_id") == "AuthenticAMD"
        generation = AMD_FAMILIES.get(family) if amd else None
        if amd and family == 25:
            generation = AMD_FAMILY_25["avx512f" in fields.get("flags", "").split()]
        details.append(f"family {family} model {fields.get('model', '?')}"
                       + (f": {generation}" if generation else ""))
    flags = set(fields.get("flags", "").split())
    vectors = [flag for flag in VECTOR_FLAGS if flag in flags]
    if vectors:
        details.append(", ".join(vectors))
    cap = instruction_set_cap()
    named = [variables for variables in INSTRUCTION_SET_CAPS.values()
             if variables["ONEDNN_MAX_CPU_ISA"] == cap]
    if cap:
        details.append(f"capped at {cap} ({', '.join(named[0])})" if named
                       else f"ONEDNN_MAX_CPU_ISA={cap}")
    return fields["model name"] + (f" ({'; '.join(details)})" if details else "")


def matmul_ceiling(size=2048, seconds=3.0):
    """This machine's matmul ceiling now, {precision: GFLOP/s} (fp32, bf16: the faster of
    TensorFlow's kernel and XLA's for a size^3 matmul), measured in a fresh process by
    bench/pretrain.py's ceiling worker: the basis of every "fraction of the ceiling" here.
    Measured in the same run as what it is compared with, since machines of one name differ."""
    import json
    import subprocess
    import sys
    bench = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, os.path.join(bench, "pretrain.py"), "--worker",
                           "ceiling", "--matmul_size", str(size), "--matmul_seconds",
                           str(seconds)], capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit("the matmul ceiling worker failed:\n" + proc.stderr[-2000:])
    results = json.loads(lines[-1])["results"]
    return {precision: max(results[key]["gflops"] for key in (precision, precision + "+xla")
                           if key in results)
            for precision in ("fp32", "bf16") if precision in results}
