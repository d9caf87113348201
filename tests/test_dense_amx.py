"""Our bfloat16 dense layers on AMX's tiles (finetuning/kernels/dense_amx.h) and on
AVX512_BF16's VDPBF16PS (dense_dpbf16.h, CPUs without AMX: Zen 4 and 5), rewritten in by
finetuning/packed_dense.py: `BertDense` in bfloat16 is within one bfloat16 rounding of a
float64 reference and no further from it than TensorFlow's bfloat16 ops; the layout puts each
1 KB tile where the kernel reads it; a served bf16 model runs every encoder dense layer on it
and answers as before; without native bfloat16 (the CPU, a oneDNN cap, a compiler that knows
no AMX) oneDNN's products stay. The int8 op, on AMX, VNNI or AVX2: tests/test_dense_int8.py."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from finetuning import packed_dense
from finetuning.inference import SavedModelRunner
from finetuning.packed_dense import OP, PANEL, amx_available, bf16_kernel, pack_kernel_tiles
from modeling import named_config
from modeling.core import cpu_has_avx512_bf16, cpu_has_native_bfloat16
from serving_models import (answers_of, assert_answers_as_before, assert_onednn_cap_chooses,
                            dense_reference, served_nodes, tensorflow_dense)


def _needs_amx(kind="bf16"):
    if not amx_available(kind):
        pytest.skip(f"no AMX-{kind.upper()} tiles for this process (the CPU lacks them, oneDNN "
                    "is capped below them, or Linux refused them): the op is not used here")


ISAS = ["amx", "avx512_bf16"]


def _needs(isa):
    """Skips where this process cannot run the bfloat16 op's `isa` code."""
    if isa == "amx":
        _needs_amx()
    elif not (cpu_has_avx512_bf16() and packed_dense.custom_ops.amx_built()):
        pytest.skip("no AVX512_BF16 here (or oneDNN is capped below it, or the library was "
                    "built by a compiler without AMX, whose unit holds this code too)")


BFLOAT16 = tf.bfloat16.as_numpy_dtype


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation", ["linear", "gelu"])
@pytest.mark.parametrize("rows, depth, width", [(1, 32, 32), (13, 384, 96), (170, 1536, 64),
                                                (700, 384, 64)])
def test_the_bfloat16_op_is_the_dense_layer(kernels, isa, activation, rows, depth, width):
    """Rows not a multiple of the 32-row block nor of VDPBF16PS's 12-row one; 170 rows of depth
    1,536 and 700 of depth 384: two chunks of rows each (kAmxChunkBytes, kDpbf16ChunkBytes).
    Inputs are bfloat16 values; the op's answer is within one bfloat16 rounding (2^-8 of the
    value) of the float64 reference, plus float32's own summation error there, and no further
    from it than TensorFlow's bfloat16 ops."""
    _needs(isa)
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, depth)).astype(BFLOAT16).astype(np.float32)
    weight = (rng.standard_normal((depth, width)) / math.sqrt(depth)).astype(BFLOAT16)
    weight = weight.astype(np.float32)
    bias = rng.standard_normal(width).astype(BFLOAT16).astype(np.float32)
    got = kernels.bert_dense(tf.constant(x.astype(BFLOAT16)),
                             tf.constant(pack_kernel_tiles(weight)), bias, activation=activation,
                             isa=isa)
    assert got.dtype == tf.bfloat16 and got.shape == (rows, width)
    expected = dense_reference(x, weight, bias, activation)
    error = np.abs(got.numpy().astype(np.float64) - expected)
    float32_error = np.abs(tensorflow_dense(x, weight, bias, activation) - expected).max()
    assert (error <= 2.0 ** -8 * np.abs(expected) + 4 * float32_error + 1e-30).all()
    low = [tf.constant(array.astype(BFLOAT16)) for array in (x, weight, bias)]
    tensorflow_bf16 = tensorflow_dense(*low, activation).astype(np.float64)
    assert error.max() <= np.abs(tensorflow_bf16 - expected).max()


def test_the_amx_layout_holds_a_tile_per_panel_depth_block_and_half():
    """packed[p, kb, h, i, c, j] (as [n/32, k/32, 2, 16, 16, 2]) is W[32 kb + 2 i + j,
    32 p + 16 h + c]: each 1 KB B tile is 16 depth pairs of 16 columns."""
    depth, width = 64, 96
    weight = np.arange(depth * width, dtype=np.float32).reshape(depth, width) / 64
    packed = pack_kernel_tiles(weight)
    assert packed.shape == (width // PANEL, depth, PANEL) and packed.dtype == BFLOAT16
    tiles = packed.reshape(width // PANEL, depth // 32, 2, 16, 16, 2).astype(np.float32)
    rounded = weight.astype(BFLOAT16).astype(np.float32)
    for p, kb, h, i, c, j in [(0, 0, 0, 0, 0, 1), (2, 1, 1, 15, 3, 0), (1, 0, 1, 7, 15, 1)]:
        assert tiles[p, kb, h, i, c, j] == rounded[32 * kb + 2 * i + j, 32 * p + 16 * h + c]


@pytest.mark.parametrize("isa", ISAS)
def test_the_bfloat16_op_refuses_a_depth_off_the_tiles(kernels, isa):
    _needs(isa)
    with pytest.raises(tf.errors.InvalidArgumentError, match="multiple of 32"):
        kernels.bert_dense(tf.zeros((3, 48), tf.bfloat16), tf.zeros((1, 48, PANEL), tf.bfloat16),
                           np.zeros(PANEL, np.float32), isa=isa)


def test_both_bfloat16_codes_agree(kernels):
    """AMX's tiles and VDPBF16PS sum the same bfloat16 pairs in float32 in the same depth
    order, so their outputs (rounded once to bfloat16) agree but for a rounding step where a
    float32 sum falls differently."""
    _needs("amx")
    _needs("avx512_bf16")
    rng = np.random.default_rng(7)
    x = tf.constant(rng.standard_normal((45, 384)).astype(BFLOAT16))
    packed = tf.constant(pack_kernel_tiles(rng.standard_normal((384, 96)) / 20))
    bias = rng.standard_normal(96).astype(np.float32)
    amx, vector = [kernels.bert_dense(x, packed, bias, activation="gelu", isa=isa).numpy()
                   .astype(np.float32) for isa in ISAS]
    assert (np.abs(amx - vector) <= 2.0 ** -7 * np.abs(amx) + 1e-30).all()


@pytest.mark.parametrize("cap, expected", [("", None), ("AVX512_CORE_BF16", "avx512_bf16"),
                                           ("AVX512_CORE_VNNI", None), ("AVX2", None)])
def test_onednns_cap_chooses_the_bfloat16_code(kernels, monkeypatch, cap, expected):
    """ONEDNN_MAX_CPU_ISA stands in for other CPUs: below AMX (a Zen 4 or 5) VDPBF16PS's code,
    below AVX512_BF16 none (no bfloat16 serving there at all); uncapped, the best this CPU
    has; `BERT_DENSE=0` none."""
    _needs("avx512_bf16")
    assert_onednn_cap_chooses(monkeypatch, bf16_kernel, cap, expected,
                              "amx" if amx_available("bf16") else "avx512_bf16")


def test_amx_is_not_used_below_onednns_cap(monkeypatch):
    """ONEDNN_MAX_CPU_ISA below AMX (a Zen 4 or an AVX2 CPU stood in for) keeps our kernels
    below it too."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert not amx_available()


@pytest.mark.parametrize("isa", ISAS)
def test_a_served_bfloat16_model_runs_its_dense_layers_on_the_op(kernels, exported, monkeypatch,
                                                                  isa):
    """On AMX, and on VDPBF16PS (AMX set aside, as on a Zen 4): six bfloat16 ops a layer on
    that code, one with the GELU, no Erf left; answers no further from float32's than oneDNN's
    bfloat16 products give (`assert_answers_as_before`). Without either the bfloat16 graph
    keeps oneDNN's products."""
    if not cpu_has_native_bfloat16():
        pytest.skip("this CPU has no native bfloat16: no bf16 serving here")
    task, path = exported
    monkeypatch.setattr(packed_dense, "bf16_kernel", lambda: None)
    before = SavedModelRunner(path, "bf16")
    assert OP not in [node.op for node in served_nodes(before)]
    monkeypatch.undo()
    _needs(isa)
    if isa != "amx":
        monkeypatch.setattr(packed_dense, "amx_available", lambda *_: False)
    layers = named_config("tiny").num_hidden_layers
    served = SavedModelRunner(path, "bf16")
    dense = [node for node in served_nodes(served) if node.op == OP]
    assert len(dense) == 6 * layers
    assert all(node.attr["T"].type == tf.bfloat16.as_datatype_enum for node in dense)
    assert {node.attr["isa"].s for node in dense} == {isa.encode()}
    assert sum(node.attr["activation"].s == b"gelu" for node in dense) == layers
    assert not [node for node in served_nodes(served) if node.op == "Erf"]
    got, expected, float32 = answers_of([served, before, SavedModelRunner(path, "fp32")], task,
                                        8)
    assert_answers_as_before(got, expected, float32, "bf16")


def test_a_compiler_without_amx_builds_the_rest_and_the_rewrite_keeps_onednns(tmp_path):
    """A compiler that knows no -mamx-tile (GCC before 11): the library is built all the
    same, with a stand-in for the AMX unit and the marker beside it; the float32 op works,
    and the bfloat16 rewrite is not asked for, on AMX or VDPBF16PS (a fresh process: a library
    loads once)."""
    compiler = tmp_path / "g++-without-amx"
    compiler.write_text("#!/bin/sh\ncase \"$*\" in *-mamx-tile*) "
                        "echo \"g++: error: unrecognized command-line option '-mamx-tile'\" >&2; "
                        "exit 1;; esac\nexec g++ \"$@\"\n")
    compiler.chmod(0o755)
    env = dict(os.environ, CXX=str(compiler), BERT_TF_OPS_CACHE=str(tmp_path / "ops"),
               TF_CPP_MIN_LOG_LEVEL="2")
    probe = ("import numpy as np\n"
             "from finetuning import custom_ops, packed_dense\n"
             "library = custom_ops.library()\n"
             "y = library.bert_dense(np.ones((2, 32), np.float32),\n"
             "                       packed_dense.pack_kernel(2 * np.eye(32, dtype=np.float32)),\n"
             "                       np.zeros(32, np.float32))\n"
             "print(custom_ops.amx_built(), packed_dense.amx_available(),\n"
             "      packed_dense.bf16_kernel(), float(y[1, 5]))\n")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                          timeout=600, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "False", "None", "2.0"]
    (library,) = [name for name in os.listdir(tmp_path / "ops") if name.endswith(".so")]
    assert os.path.exists(tmp_path / "ops" / (library + ".no_amx"))
