"""Our int8 dense layer, `BertDenseInt8` (finetuning/kernels/dense_int8.h), on AMX-INT8's
tiles (dense_amx.h), on AVX-512 VNNI (dense_vnni.h, for CPUs with VNNI and no AMX: Zen 4
and 5) and on AVX2 (dense_int8_avx2.h: Zen 2 and 3), each where this CPU has it: it computes
what its quantization (each row of x its own 0..255 codes, 0..127 on AVX2, each column of W
its own int8 scale) says, and that quantization is nearer float than one scale a tensor; the
layout all three read puts each value where they read it;
served int8 models run every encoder dense layer on it and answer near float32, no further
than oneDNN's int8 does; oneDNN's cap chooses which code, or oneDNN's own int8."""
import math

import numpy as np
import pytest
import tensorflow as tf

from finetuning import packed_dense
from finetuning.inference import SavedModelRunner, run_in_batches
from finetuning.packed_dense import (OP_INT8, PANEL, amx_available, int8_kernel, pack_int8_tiles,
                                     quantize_columns)
from modeling import named_config
from modeling import core
from modeling.core import cpu_has_avx2, cpu_has_avx512_vnni
from finetuning.int8_dense import onednn_enabled
from finetuning.tasks import ClassifierTask
from serving_models import (LENGTH, assert_int8_answers, assert_onednn_cap_chooses,
                            dense_reference, export_tiny, request_features, served_nodes,
                            summation_order_tolerance)

ISAS = ["amx", "avx512_vnni", "avx2"]
LEVELS = {"amx": 255, "avx512_vnni": 255, "avx2": 127}  # the activation codes' top


def _needs(isa):
    """Skips where this process cannot run the op's `isa` code."""
    if isa == "amx" and not amx_available("int8"):
        pytest.skip("no AMX-INT8 tiles for this process (the CPU lacks them, oneDNN is capped "
                    "below them, or Linux refused them): the op's AMX code is not used here")
    if isa == "avx512_vnni" and not cpu_has_avx512_vnni():
        pytest.skip("no AVX-512 VNNI on this CPU (or oneDNN is capped below it): the op's "
                    "VNNI code is not used here")
    if isa == "avx2" and not cpu_has_avx2():
        pytest.skip("no AVX2 on this CPU (or oneDNN is capped below it): the op's AVX2 code "
                    "is not used here")


def _codes_as_the_kernel_makes_them(x, levels):
    """(codes, low, step) of each row of x, in float32 arithmetic as dense_int8.h's
    quantize_rows (no fused multiply-add: the units are built with -std=c++17)."""
    low = x.min(axis=1, keepdims=True)
    high = x.max(axis=1, keepdims=True)
    step = np.where(high > low, (high - low) / np.float32(levels),
                    np.float32(1)).astype(np.float32)
    inverse = (np.float32(1) / step).astype(np.float32)
    scaled = ((x - low).astype(np.float32) * inverse).astype(np.float32) + np.float32(0.5)
    return np.clip(np.floor(scaled), 0, levels), low, step


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation", ["linear", "gelu"])
@pytest.mark.parametrize("rows, depth, width", [(1, 64, 32), (13, 384, 96), (170, 1536, 64),
                                                (700, 384, 64)])
def test_the_int8_op_computes_its_quantized_product(kernels, isa, activation, rows, depth, width):
    """Against float64 of the same quantized operands: each row's codes of x - low (as the
    kernel rounds them), each column's int8 weights; off-centre rows, so a lost low · sum of
    the column's codes would show. Tails of rows (VNNI's 8-row blocks: 1, 13, 170 = 21 x 8
    + 2; AVX2's 2-row ones: 1, 13), two chunks at 170 x 1,536 and 700 x 384. On AVX2 the
    codes reach 127 at most, so that no pair of products (summed in 16 bits) saturates: rows
    whose codes reach their top meet weights of one sign at the top of theirs."""
    _needs(isa)
    rng = np.random.default_rng(rows)
    x = (rng.standard_normal((rows, depth)) * 0.7 + 1.5).astype(np.float32)
    weight = (rng.standard_normal((depth, width)) / math.sqrt(depth)).astype(np.float32)
    bias = rng.standard_normal(width).astype(np.float32)
    weight[:, 0] = np.abs(weight[:, 0])  # a column of one sign: saturated pairs would show
    codes, scale, sums = quantize_columns(weight)
    got = kernels.bert_dense_int8(x, pack_int8_tiles(codes), scale, sums, bias,
                                  activation=activation, isa=isa).numpy()
    x_codes, low, step = _codes_as_the_kernel_makes_them(x, LEVELS[isa])
    quantized = dense_reference(low.astype(np.float64) + x_codes * step,
                                codes.astype(np.float64) * scale, bias, activation)
    assert np.abs(got - quantized).max() <= summation_order_tolerance(quantized)
    lost = np.abs(low).max() * np.abs(sums).max()
    assert lost > 100 * summation_order_tolerance(quantized)


def test_amx_and_vnni_give_the_same_answer(kernels):
    """Both sum the same integer products exactly and share the epilogue: bit for bit (AVX2's
    codes are coarser: the test above holds it to its own)."""
    _needs("amx")
    _needs("avx512_vnni")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((45, 768)).astype(np.float32)
    codes, scale, sums = quantize_columns(rng.standard_normal((768, 96)).astype(np.float32))
    bias = rng.standard_normal(96).astype(np.float32)
    amx, vnni = [kernels.bert_dense_int8(x, pack_int8_tiles(codes), scale, sums, bias,
                                         activation="gelu", isa=isa).numpy()
                  for isa in ("amx", "avx512_vnni")]
    np.testing.assert_array_equal(amx, vnni)


@pytest.mark.parametrize("isa", ISAS)
def test_a_row_and_a_column_of_their_own_scale_beat_one_scale_a_tensor(kernels, isa):
    """Rows of x and columns of W at scales 100x apart (as a layer norm's output and a
    trained weight have them): the op's answer is nearer the float answer than one 0..255
    scale for all of x and one int8 scale for all of W (int8_dense's) would be, row by row
    against the row's own size."""
    _needs(isa)
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((64, 384)) * np.geomspace(0.1, 10, 64)[:, None]).astype(np.float32)
    weight = (rng.standard_normal((384, 96)) * np.geomspace(0.01, 1, 96)).astype(np.float32)
    bias = np.zeros(96, np.float32)
    codes, scale, sums = quantize_columns(weight)
    got = kernels.bert_dense_int8(x, pack_int8_tiles(codes), scale, sums, bias, isa=isa).numpy()
    exact = x.astype(np.float64) @ weight
    step = (x.max() - x.min()) / 255.0
    one_scale_x = x.min() + np.round((x - x.min()) / step) * step
    w_step = np.abs(weight).max() / 127.0
    one_scale = one_scale_x @ (np.round(weight / w_step) * w_step)

    def worst_row(answer):  # the largest error of a row against that row's own size
        return (np.linalg.norm(answer - exact, axis=1) / np.linalg.norm(exact, axis=1)).max()

    ours, theirs = worst_row(got), worst_row(one_scale)
    assert ours < theirs / 4, (ours, theirs)


def test_the_int8_layout_holds_a_tile_per_panel_depth_block_and_half():
    """packed[p, kb, h, i, c, j] (as [n/32, k/64, 2, 16, 16, 4]) is Wq[64 kb + 4 i + j,
    32 p + 16 h + c]."""
    depth, width = 128, 64
    codes = (np.arange(depth * width) % 251 - 125).astype(np.int8).reshape(depth, width)
    packed = pack_int8_tiles(codes)
    assert packed.shape == (width // PANEL, depth, PANEL) and packed.dtype == np.int8
    tiles = packed.reshape(width // PANEL, depth // 64, 2, 16, 16, 4)
    for p, kb, h, i, c, j in [(0, 0, 0, 0, 0, 3), (1, 1, 1, 15, 3, 0), (1, 0, 0, 7, 15, 2)]:
        assert tiles[p, kb, h, i, c, j] == codes[64 * kb + 4 * i + j, 32 * p + 16 * h + c]


@pytest.mark.parametrize("isa", ISAS)
def test_the_int8_op_refuses_a_depth_off_the_tiles(kernels, isa):
    _needs(isa)
    with pytest.raises(tf.errors.InvalidArgumentError, match="multiple of 64"):
        kernels.bert_dense_int8(np.zeros((3, 96), np.float32), np.zeros((1, 96, PANEL), np.int8),
                                *[np.zeros(PANEL, np.float32)] * 3, isa=isa)


@pytest.mark.parametrize("cap, expected", [("", None), ("AVX512_CORE_BF16", "avx512_vnni"),
                                           ("AVX512_CORE_VNNI", "avx512_vnni"),
                                           ("AVX512_CORE", "avx2"), ("AVX2", "avx2"),
                                           ("SSE41", None)])
def test_onednns_cap_chooses_the_int8_code(kernels, monkeypatch, cap, expected):
    """ONEDNN_MAX_CPU_ISA stands in for other CPUs: below AMX (a Zen 4 or 5) VNNI's code,
    below VNNI (Skylake, a Zen 3) AVX2's, below AVX2 oneDNN's int8; uncapped, the best this
    CPU has."""
    _needs("avx512_vnni")
    assert_onednn_cap_chooses(monkeypatch, int8_kernel, cap, expected,
                              "amx" if amx_available("int8") else "avx512_vnni")


@pytest.mark.parametrize("isa", ISAS)
def test_a_served_int8_model_runs_its_dense_layers_on_the_op(kernels, exported, monkeypatch, isa):
    """On AMX-INT8, on VNNI (AMX set aside, as on a Zen 4) and on AVX2 (VNNI too, as on a
    Zen 3): six `BertDenseInt8` a layer (one with the GELU) on that code, no oneDNN int8
    matmul, the pooler and head still float32; outputs near fp32's, and no further from them
    than oneDNN's int8 layers (BERT_DENSE=0) are, give or take a hundredth of their scale."""
    _needs(isa)
    if isa != "amx":
        monkeypatch.setattr(packed_dense, "amx_available", lambda *_: False)
    if isa == "avx2":
        monkeypatch.setattr(core, "cpu_has_avx512_vnni", lambda: False)
    task, path = exported
    layers = named_config("tiny").num_hidden_layers
    ours, fp32 = SavedModelRunner(path, "int8"), SavedModelRunner(path, "fp32")
    nodes = served_nodes(ours)
    dense = [node for node in nodes if node.op == OP_INT8]
    assert len(dense) == 6 * layers
    assert {node.attr["isa"].s for node in dense} == {isa.encode()}
    assert sum(node.attr["activation"].s == b"gelu" for node in dense) == layers
    assert not [node for node in nodes if node.op.startswith("Quantized")]
    monkeypatch.setenv("BERT_DENSE", "0")
    onednn = SavedModelRunner(path, "int8")
    assert [node for node in served_nodes(onednn) if node.op.startswith("Quantized")]
    features = request_features(6, np.random.default_rng(4))
    got, theirs, float32 = [run_in_batches(runner, features, task.extra_serving_inputs)
                            for runner in (ours, onednn, fp32)]
    assert_int8_answers(got, float32, theirs)


def test_layers_off_the_ops_sizes_stay_int8_on_onednns(kernels, tmp_path):
    """A feed-forward of 80 (its first layer's width not a multiple of 32, its second's depth
    not of 64): our op takes the four other layers of each block, oneDNN's int8 matmul those
    two, so no layer asked for in int8 is served in float32; answers near fp32's."""
    if packed_dense.int8_kernel() is None or not onednn_enabled():
        pytest.skip("needs our int8 kernels and oneDNN's int8 matmul in one process")
    task = ClassifierTask("sst-2", None, LENGTH)
    path = export_tiny(task, tmp_path, intermediate_size=80)
    layers = named_config("tiny").num_hidden_layers
    ours, fp32 = SavedModelRunner(path, "int8"), SavedModelRunner(path, "fp32")
    ops = [node.op for node in served_nodes(ours)]
    assert ops.count(OP_INT8) == 4 * layers
    assert ops.count("QuantizedMatMulWithBiasAndDequantize") == 2 * layers
    features = request_features(6, np.random.default_rng(5))
    assert_int8_answers(*[run_in_batches(runner, features, task.extra_serving_inputs)
                          for runner in (ours, fp32)])
