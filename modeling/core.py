"""Graph-mode building blocks shared by every BERT layer: shapes, variables, dense, layer norm.

Variables are always created in float32 (the master weights) and cast to the layer's compute
dtype when read, which is what mixed precision needs: float16/bfloat16 matmuls with float32
weights to update. Layer norm always computes in float32, because its mean/variance lose too
much precision in 16 bits, and its float32 output carries the residual stream. Variable names follow Google's `tf.layers.dense` and
`tf.contrib.layers.layer_norm` (`kernel`/`bias`, `LayerNorm/beta|gamma`) so checkpoints
match theirs without any mapping.
"""
import functools
import os

import tensorflow as tf

tf1 = tf.compat.v1

# CPU flags of native bfloat16 matrix arithmetic (oneDNN uses them for bf16 GEMMs).
_NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")

_DTYPES = {"float32": tf.float32, "fp32": tf.float32, "float16": tf.float16, "fp16": tf.float16,
           "bfloat16": tf.bfloat16, "bf16": tf.bfloat16}


def as_compute_dtype(dtype):
    """Normalises 'float16'/'fp16'/tf.float16/... to a `tf.DType`; only float types allowed."""
    if isinstance(dtype, str):
        if dtype.lower() not in _DTYPES:
            raise ValueError(f"unsupported compute dtype {dtype!r}: use float32, float16 or bfloat16")
        return _DTYPES[dtype.lower()]
    dtype = tf.as_dtype(dtype)
    if dtype not in (tf.float32, tf.float16, tf.bfloat16):
        raise ValueError(f"unsupported compute dtype {dtype.name}: use float32, float16 or bfloat16")
    return dtype


def get_shape_list(tensor, expected_rank=None, name=None):
    """Static dimensions where known, dynamic scalars elsewhere (so reshapes work in both)."""
    if expected_rank is not None:
        ranks = expected_rank if isinstance(expected_rank, (list, tuple)) else [expected_rank]
        if tensor.shape.ndims not in ranks:
            raise ValueError(f"tensor {name or tensor.name} has rank {tensor.shape.ndims}, "
                             f"expected {ranks}")
    shape = tensor.shape.as_list()
    dynamic = None
    for index, dim in enumerate(shape):
        if dim is None:
            if dynamic is None:
                dynamic = tf.shape(tensor)
            shape[index] = dynamic[index]
    return shape


def create_initializer(initializer_range=0.02):
    """Truncated normal, as Google initialises every BERT weight."""
    return tf1.truncated_normal_initializer(stddev=initializer_range)


def get_variable(name, shape, initializer, compute_dtype=tf.float32):
    """A float32 variable, returned cast to `compute_dtype` (a no-op in float32)."""
    variable = tf1.get_variable(name, shape=shape, dtype=tf.float32, initializer=initializer)
    if compute_dtype != tf.float32:
        return tf.cast(variable, compute_dtype)
    return variable


@functools.lru_cache(maxsize=None)
def emulate_bfloat16_matmul():
    """Whether bfloat16 matmuls should run as float32 matmuls of bfloat16 values.

    GPUs and CPUs with AVX512_BF16/AMX have native bf16 GEMMs (fp32 accumulation). On other
    CPUs TensorFlow emulates them, and measurably worse: on an AVX2 EPYC a [240x384]x[384x1536]
    product has relative error 4.1e-3 against 2.9e-3 for bf16 inputs accumulated exactly and
    rounded to bf16 (what torch computes there), at the same speed as a float32 matmul of
    the bf16 values, which gives the exact-accumulation result. So on such CPUs we compute
    that. `BERT_BF16_MATMUL=native|emulate` overrides the choice."""
    choice = os.environ.get("BERT_BF16_MATMUL", "").strip().lower()
    if choice in ("native", "emulate"):
        return choice == "emulate"
    if tf.config.list_physical_devices("GPU"):
        return False
    return cpu_has_native_bfloat16() is False


@functools.lru_cache(maxsize=None)
def cpu_has_native_bfloat16():
    """True where the CPU multiplies bfloat16 natively (AVX512_BF16 or AMX), False where it
    does not, None where /proc/cpuinfo cannot be read (not Linux): bf16 then is neither
    chosen nor refused by default. False too where oneDNN is told to stop below those
    instructions (`ONEDNN_MAX_CPU_ISA=AVX2`, how an AVX2 CPU is stood in for): oneDNN then
    has no bf16 matmul at all, and TensorFlow aborts the process asking for one."""
    if onednn_capped_below_bfloat16():
        return False
    flags = _cpu_flags()
    return None if flags is None else any(flag in flags for flag in _NATIVE_BF16_CPU_FLAGS)


def _cpu_flags():
    """The words of /proc/cpuinfo (its flags among them), or None where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as reader:
            return set(reader.read().split())
    except OSError:
        return None


# oneDNN's instruction-set names (ONEDNN_MAX_CPU_ISA) from which it multiplies bfloat16.
_ONEDNN_BF16_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX",
                     "AVX512_CORE_AMX_FP16", "AVX10_1_512", "AVX10_1_512_AMX",
                     "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2", "ALL", "DEFAULT")


def onednn_isa_cap():
    """The instruction set oneDNN is capped at (ONEDNN_MAX_CPU_ISA, or its older name
    DNNL_MAX_CPU_ISA), upper-case, or "" where it is not capped."""
    for variable in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        cap = os.environ.get(variable, "").strip().upper()
        if cap:
            return cap
    return ""


def _cap_allows(isas):
    """Whether oneDNN's cap (onednn_isa_cap) leaves it the instruction sets of `isas` (the
    names from which it uses them): no cap, or a cap among them."""
    cap = onednn_isa_cap()
    return not cap or cap in isas


def onednn_capped_below_bfloat16():
    """Whether oneDNN's cap (onednn_isa_cap) is an instruction set without bfloat16
    arithmetic."""
    return not _cap_allows(_ONEDNN_BF16_ISAS)


# oneDNN's instruction-set names from which it multiplies on AMX's tiles.
_ONEDNN_AMX_ISAS = tuple(isa for isa in _ONEDNN_BF16_ISAS
                         if "AMX" in isa or isa in ("ALL", "DEFAULT"))


def cpu_has_amx(kind="bf16"):
    """Whether oneDNN multiplies on AMX here (an Intel Xeon from Sapphire Rapids on, and no
    oneDNN cap below AMX): the CPU some serving choices were measured on apart. `kind`: the
    tile product asked for, "bf16" or "int8"."""
    return _cap_allows(_ONEDNN_AMX_ISAS) and f"amx_{kind}" in (_cpu_flags() or set())


# CPU flags of an int8 dot product that adds its products in 32 bits (VNNI, AMX).
_INT8_DOT_CPU_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
# oneDNN's instruction-set names from which it uses them.
_ONEDNN_INT8_DOT_ISAS = ("AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE_VNNI") + _ONEDNN_BF16_ISAS


def cpu_sums_int8_in_32_bits():
    """Whether oneDNN's u8 x s8 matmul here adds products in 32 bits (VNNI or AMX, and no
    oneDNN cap below them). Without them (AVX2, AVX-512 before VNNI) it adds pairs of
    products in 16 bits first, which saturate when both reach 255 x 127: measured under
    ONEDNN_MAX_CPU_ISA=AVX2, a dense layer 5.5% off where VNNI's was 0.18% off."""
    if not _cap_allows(_ONEDNN_INT8_DOT_ISAS):
        return False
    flags = _cpu_flags() or set()
    if onednn_isa_cap().startswith("AVX2_VNNI"):  # capped below AVX-512: the 256-bit VNNI only
        return "avx_vnni" in flags
    return any(flag in flags for flag in _INT8_DOT_CPU_FLAGS)


# oneDNN's instruction-set names from which it uses AVX-512 VNNI, and AVX2 at all.
_ONEDNN_AVX512_VNNI_ISAS = ("AVX512_CORE_VNNI",) + _ONEDNN_BF16_ISAS
_ONEDNN_AVX2_ISAS = ("AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE") + _ONEDNN_AVX512_VNNI_ISAS


def cpu_has_avx512_vnni():
    """Whether this CPU has AVX-512 VNNI (VPDPBUSD on 512-bit registers: Intel from Cascade
    Lake, AMD from Zen 4) and oneDNN is not capped below it (`ONEDNN_MAX_CPU_ISA=AVX2` stands
    in for a CPU without it, and our kernels keep below the same line)."""
    return _cap_allows(_ONEDNN_AVX512_VNNI_ISAS) and \
        {"avx512_vnni", "avx512bw"} <= (_cpu_flags() or set())


def cpu_has_avx512_bf16():
    """Whether the CPU has AVX512_BF16's VDPBF16PS (AMD Zen 4 and 5, Intel from Cooper Lake)
    and oneDNN is not capped below it: our bfloat16 dense layers' code for CPUs without AMX
    (finetuning/kernels/dense_dpbf16.h)."""
    return _cap_allows(_ONEDNN_BF16_ISAS) and "avx512_bf16" in (_cpu_flags() or set())


def cpu_has_avx2():
    """Whether this CPU has AVX2 and FMA and oneDNN is not capped below AVX2 (a cap at SSE4.1
    stands in for an older CPU; our kernels keep below the same line)."""
    return _cap_allows(_ONEDNN_AVX2_ISAS) and {"avx2", "fma"} <= (_cpu_flags() or set())


def matmul(a, b, transpose_b=False):
    """`tf.matmul` in the inputs' dtype; bfloat16 with float32 accumulation where the
    hardware has no native bf16 GEMM (`emulate_bfloat16_matmul`). Output dtype = input's."""
    if a.dtype == tf.bfloat16 and emulate_bfloat16_matmul():
        product = tf.matmul(tf.cast(a, tf.float32), tf.cast(b, tf.float32),
                            transpose_b=transpose_b)
        return tf.cast(product, tf.bfloat16)
    return tf.matmul(a, b, transpose_b=transpose_b)


def dense(inputs, units, name, activation=None, initializer_range=0.02, compute_dtype=None):
    """`tf.layers.dense` equivalent on the last axis: [..., in] -> [..., units].

    Creates `<name>/kernel` [in, units] and `<name>/bias` [units]. The inputs are cast to
    `compute_dtype` (default: their own dtype) and so is the output. Rank-3 inputs are
    folded to rank 2 for the matmul (one large GEMM rather than a batched one).
    """
    compute_dtype = compute_dtype or inputs.dtype
    inputs = tf.cast(inputs, compute_dtype)
    in_width = inputs.shape[-1]
    with tf1.variable_scope(name):
        kernel = get_variable("kernel", [in_width, units], create_initializer(initializer_range),
                              compute_dtype)
        bias = get_variable("bias", [units], tf1.zeros_initializer(), compute_dtype)
    shape = get_shape_list(inputs)
    flat = tf.reshape(inputs, [-1, in_width]) if len(shape) != 2 else inputs
    output = tf.nn.bias_add(matmul(flat, kernel), bias)
    if activation is not None:
        output = activation(output)
    if len(shape) != 2:
        output = tf.reshape(output, shape[:-1] + [units])
    return output


def layer_norm(inputs, name="LayerNorm", epsilon=1e-12):
    """Layer normalisation over the last axis, computed and returned in float32.

    Returning float32 keeps the residual stream between layers in full precision (as
    automatic mixed precision does on GPUs); only matmul inputs are cast down.
    """
    width = inputs.shape[-1]
    with tf1.variable_scope(name):
        beta = tf1.get_variable("beta", [width], tf.float32, tf1.zeros_initializer())
        gamma = tf1.get_variable("gamma", [width], tf.float32, tf1.ones_initializer())
    x = tf.cast(inputs, tf.float32)
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    normed = (x - mean) * tf.math.rsqrt(variance + epsilon) * gamma + beta
    return normed


class stateless_dropout:
    """Context manager: dropout built inside it draws its masks from `seed` ([2] int tensor:
    a base below 2**32, a step counter) statelessly, each dropout op with its own sub-seed
    (its index in construction order).

    Stateful dropout restarts its random stream in every new session, so a run resumed from
    a checkpoint would repeat the masks of its first steps. Seeding each step's masks from
    the step counter instead makes a resumed run draw exactly the masks the uninterrupted
    run would have drawn (and makes Horovod ranks differ when their seeds do).
    """
    _active = None

    def __init__(self, seed):
        self.seed = tf.cast(seed, tf.int64)
        self.count = 0

    def __enter__(self):
        if stateless_dropout._active is not None:
            raise RuntimeError("stateless_dropout contexts do not nest")
        stateless_dropout._active = self
        return self

    def __exit__(self, *exc_info):
        stateless_dropout._active = None

    def next_seed(self):
        self.count += 1
        # The op index goes to the high bits of the first seed word; seeds must keep the
        # first word below 2**32 and the second (a step counter) free.
        return self.seed + tf.constant([self.count << 32, 0], tf.int64)


def dropout(inputs, rate, is_training):
    """Dropout only when training with a non-zero rate (keeps inference graphs free of it);
    stateless inside a `stateless_dropout` context."""
    if not is_training or rate is None or rate == 0.0:
        return inputs
    context = stateless_dropout._active
    if context is not None:
        return tf.nn.experimental.stateless_dropout(inputs, rate=rate, seed=context.next_seed())
    return tf.nn.dropout(inputs, rate=rate)


def gather_indexes(sequence_tensor, positions):
    """Rows of `sequence_tensor` [batch, seq, width] at `positions` [batch, n] ->
    [batch*n, width]."""
    batch, seq, width = get_shape_list(sequence_tensor, expected_rank=3)
    offsets = tf.reshape(tf.range(0, batch, dtype=tf.int32) * seq, [-1, 1])
    flat_positions = tf.reshape(tf.cast(positions, tf.int32) + offsets, [-1])
    flat_sequence = tf.reshape(sequence_tensor, [batch * seq, width])
    return tf.gather(flat_sequence, flat_positions)
