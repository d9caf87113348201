"""Our attention kernel (finetuning/kernels/, `BertPackedAttention`) and the load-time rewrite
that puts it in a frozen serving graph (finetuning/packed_attention.py): the op computes what
attention over the padded batch computes at each real row, with every vector code it has; a
served model holds one op a layer and answers as the graph of TensorFlow's ops does; where
the kernel cannot be built, the graph serves as it was, after one line saying why."""
import os

import numpy as np
import pytest
import tensorflow as tf

from finetuning import custom_ops, packed_attention
from finetuning.inference import SavedModelRunner
from finetuning.packed_attention import OP
from modeling import named_config
from modeling.core import cpu_has_native_bfloat16
from serving_models import (answers_of, assert_answers_as_before, served_nodes,
                            summation_order_tolerance)

HEADS, HEAD_SIZE = 3, 16
HIDDEN = HEADS * HEAD_SIZE
# real tokens a sequence, padded to 11: a full one, short ones, one with no real token (its
# position 0 is still a row), one whose position 0 is masked but later tokens are real
MASKS = [[1] * 11, [1] * 5 + [0] * 6, [0] * 11, [1] + [0] * 10, [0, 1, 1, 1] + [0] * 7]
ISAS = ("avx512", "avx2", "generic")


def _rows(mask):
    """[(first packed row, rows, which rows' keys count)] of each sequence, as RealRows packs."""
    spans, start = [], 0
    for flags in np.asarray(mask):
        kept = [j for j in range(len(flags)) if j == 0 or flags[j]]
        valid = np.array([flags[j] != 0 for j in kept])
        spans.append((start, len(kept), valid if valid.any() else np.ones_like(valid)))
        start += len(kept)
    return spans, start


def _reference(query, key, value, mask, scale):
    """float64 attention of each sequence's packed rows over its valid keys, head by head."""
    query, key, value = (np.asarray(x, np.float64) for x in (query, key, value))
    context = np.zeros_like(query)
    for start, length, valid in _rows(mask)[0]:
        for head in range(HEADS):
            columns = slice(head * HEAD_SIZE, (head + 1) * HEAD_SIZE)
            q, k, v = (x[start:start + length, columns] for x in (query, key, value))
            scores = q @ k.T * scale
            scores[:, ~valid] = -np.inf
            probs = np.exp(scores - scores.max(axis=1, keepdims=True))
            context[start:start + length, columns] = probs / probs.sum(1, keepdims=True) @ v
    return context


def _inputs(dtype):
    mask = np.array(MASKS, np.int32)
    rows = _rows(mask)[1]
    rng = np.random.default_rng(7)
    q, k, v = (tf.cast(rng.standard_normal((rows, HIDDEN)).astype(np.float32) * 2, dtype)
               for _ in range(3))
    return q, k, v, mask


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_the_op_computes_attention_over_each_sequences_real_rows(kernels, isa, dtype):
    q, k, v, mask = _inputs(dtype)
    scale = 1 / np.sqrt(HEAD_SIZE)
    got = kernels.bert_packed_attention(q, k, v, mask, num_heads=HEADS, scale=scale, isa=isa)
    assert got.dtype == dtype and got.shape == q.shape
    as_float = [tf.cast(x, tf.float32).numpy() for x in (q, k, v)]
    expected = _reference(*as_float, mask, scale)
    got = tf.cast(got, tf.float32).numpy()
    if dtype == tf.float32:
        np.testing.assert_allclose(got, expected, rtol=0, atol=summation_order_tolerance(expected))
    else:  # float32 inside, one bfloat16 rounding of the answer
        np.testing.assert_allclose(got, expected, rtol=2.0 ** -8, atol=1e-6)
    # the sequence with no real token attends to its one row: its value
    start = _rows(mask)[0][2][0]
    np.testing.assert_allclose(got[start], as_float[2][start], rtol=2.0 ** -8)


def test_the_op_refuses_a_mask_that_does_not_fit_its_rows(kernels):
    q, k, v, mask = _inputs(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="real rows"):
        kernels.bert_packed_attention(q[1:], k[1:], v[1:], mask, num_heads=HEADS, scale=1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="multiple of 16"):
        kernels.bert_packed_attention(q, k, v, mask, num_heads=HEADS * 2, scale=1.0)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_served_model_packs_every_layer_and_answers_as_before(kernels, exported, precision,
                                                               monkeypatch):
    """One op a layer in the runner's graph, no softmax of attention left; the
    answers, over requests of different lengths in one batch, are those of the graph of
    TensorFlow's ops: in float32 to its summation order; in bfloat16 (where the CPU has it)
    no further from float32's answers than that graph, give or take one bfloat16 rounding."""
    if precision == "bf16" and not cpu_has_native_bfloat16():
        pytest.skip("this CPU has no native bfloat16: no bf16 serving here")
    task, path = exported
    layers = named_config("tiny").num_hidden_layers
    served = SavedModelRunner(path, precision)
    nodes = served_nodes(served)
    ops = [node.op for node in nodes]
    # a classifier's last layer queries with [CLS] alone (BertModel.POOLED_ONLY): a pattern
    # of its own, left to TensorFlow's ops (one query row a sequence)
    packed = layers if task.name == "squad" else layers - 1
    assert ops.count(OP) == packed
    assert len([node for node in nodes if node.op in ("Softmax", "_MklSoftmax")
                and "/attention/" in node.name]) == layers - packed
    monkeypatch.setenv("BERT_PACKED_ATTENTION", "0")
    unpacked = SavedModelRunner(path, precision)
    assert OP not in [node.op for node in served_nodes(unpacked)]
    got, before, exact = answers_of([served, unpacked, SavedModelRunner(path, "fp32")], task, 4)
    assert_answers_as_before(got, before, exact, precision)


def test_without_a_compiler_the_graph_serves_as_it_was(exported, tmp_path, monkeypatch, capfd):
    task, path = exported
    monkeypatch.setattr(custom_ops, "_loaded", {})
    monkeypatch.setenv("BERT_TF_OPS_CACHE", str(tmp_path / "ops"))
    monkeypatch.setattr(custom_ops, "COMPILER", str(tmp_path / "no-such-g++"))
    served = SavedModelRunner(path, "fp32")
    assert OP not in [node.op for node in served_nodes(served)]
    said = [line for line in capfd.readouterr().err.splitlines() if "our kernels" in line]
    assert len(said) == 1 and "no C++ compiler" in said[0]
    assert len(answers_of([served], task, seed=4, count=2)[0]) == 2
    assert custom_ops.library() is None  # decided once a process
    assert not any("our kernels" in line for line in capfd.readouterr().err.splitlines())


def test_a_failed_build_leaves_no_library_behind(tmp_path, monkeypatch, capfd):
    """A compiler that fails (a flag it does not know) writes nothing under the library's
    name, so the next process tries again instead of loading half a build."""
    monkeypatch.setattr(custom_ops, "_loaded", {})
    monkeypatch.setenv("BERT_TF_OPS_CACHE", str(tmp_path / "ops"))
    monkeypatch.setattr(custom_ops, "_COMMON_FLAGS", custom_ops._COMMON_FLAGS + ["-fno-such-flag"])
    assert custom_ops.library() is None
    path, _ = custom_ops.library_path()
    assert not os.path.exists(path) and os.listdir(tmp_path / "ops") == []
    said = [line for line in capfd.readouterr().err.splitlines() if "our kernels" in line]
    assert len(said) == 1 and "no-such-flag" in said[0]


def test_switched_off_or_on_a_gpu_nothing_is_rewritten(monkeypatch):
    monkeypatch.setenv("BERT_PACKED_ATTENTION", "0")
    assert not packed_attention.enabled()
    monkeypatch.delenv("BERT_PACKED_ATTENTION")
    assert packed_attention.enabled()
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["GPU:0"] if kind == "GPU" else [])
    assert not packed_attention.enabled()


@pytest.mark.parametrize("cap, isa", [("", "avx512"), ("AVX512_CORE_AMX", "avx512"),
                                      ("AVX2", "avx2"), ("avx2_vnni", "avx2"),
                                      ("SSE41", "generic")])
def test_the_kernel_stays_below_onednns_cap(monkeypatch, cap, isa):
    """An AVX2 machine stood in for (`ONEDNN_MAX_CPU_ISA=AVX2`, bench/machine.py) runs our
    kernel's AVX2 code too, so that both sides of a comparison stay below one line."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert packed_attention.kernel_isa() == isa


def _frozen_encoder(heads, hidden=48):
    """A 2-layer encoder computing the real rows only (BertModel(skip_padding=True)), random
    weights frozen to constants, its sequence output named "out"."""
    from modeling import BertModel
    tf1 = tf.compat.v1
    config = named_config("tiny").replace(vocab_size=101, hidden_size=hidden,
                                          num_attention_heads=heads, intermediate_size=2 * hidden)
    with tf.Graph().as_default() as graph:
        tf1.set_random_seed(3)
        inputs = [tf1.placeholder(tf.int32, [None, None], name=name)
                  for name in ("input_ids", "input_mask", "segment_ids")]
        model = BertModel(config, False, *inputs, scope="bert", skip_padding=True)
        tf.identity(model.get_sequence_output(), name="out")
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            return tf1.graph_util.convert_variables_to_constants(
                session, graph.as_graph_def(), ["out"])


def _run_encoder(graph_def, mask):
    tf1 = tf.compat.v1
    ids = np.random.default_rng(1).integers(5, 101, mask.shape).astype(np.int32)
    with tf.Graph().as_default() as graph:
        tf1.import_graph_def(graph_def, name="")
        with tf1.Session(graph=graph) as session:
            return session.run("out:0", {"input_ids:0": ids, "input_mask:0": mask,
                                         "segment_ids:0": np.zeros_like(mask)})


def test_the_rewrite_serves_the_encoders_attention_and_leaves_other_head_sizes(kernels):
    """On the encoder's own graph: heads of 16 become one op a layer and the sequence output
    is the same at every real position, for masks with short, empty and position-0-masked
    rows; heads of 12 (not a multiple of 16) are left to TensorFlow's ops."""
    mask = np.array(MASKS, np.int32)
    graph_def = _frozen_encoder(heads=3)
    rewritten, count = packed_attention.pack_attention(graph_def)
    assert count == named_config("tiny").num_hidden_layers
    before, after = _run_encoder(graph_def, mask), _run_encoder(rewritten, mask)
    real = (mask != 0) | (np.arange(mask.shape[1]) == 0)
    np.testing.assert_allclose(after[real], before[real], rtol=0,
                               atol=summation_order_tolerance(before))
    assert packed_attention.pack_attention(_frozen_encoder(heads=4))[1] == 0
