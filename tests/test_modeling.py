"""The encoder without any oracle: config validation, Google's names, dtypes, masking, XLA."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from encoder_runner import random_inputs, run_encoder
from modeling import BertConfig, BertModel, ConfigError, masked_lm_output, named_config
from modeling import PackedRows, next_sentence_output

tf1 = tf.compat.v1
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(**changes):
    return named_config("tiny").replace(vocab_size=101, **changes)


# ----------------------------------------------------------------------------- config
def test_shipped_configs_load_with_googles_values():
    base, large = named_config("base"), named_config("large")
    assert (base.hidden_size, base.num_hidden_layers, base.num_attention_heads) == (768, 12, 12)
    assert (large.hidden_size, large.num_hidden_layers, large.intermediate_size) == (1024, 24, 4096)
    assert base.vocab_size == 30522 and base.type_vocab_size == 2


def test_config_json_round_trip_keeps_extra_keys(tmp_path):
    path = tmp_path / "c.json"
    values = dict(named_config("tiny").to_dict(), model_type="bert", layer_norm_eps=1e-7)
    path.write_text(json.dumps(values))
    config = BertConfig.from_json_file(str(path))
    assert config.layer_norm_eps == 1e-7 and config.extra == {"model_type": "bert"}
    config.to_json_file(str(tmp_path / "out.json"))
    assert BertConfig.from_json_file(str(tmp_path / "out.json")) == config


@pytest.mark.parametrize("change, key", [
    ({"hidden_size": 65}, "num_attention_heads"),
    ({"num_hidden_layers": -1}, "num_hidden_layers"),
    ({"vocab_size": "many"}, "vocab_size"),
    ({"hidden_act": "swish2"}, "hidden_act"),
    ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob"),
])
def test_invalid_config_names_file_and_key(tmp_path, change, key):
    path = tmp_path / "bad_config.json"
    path.write_text(json.dumps(dict(named_config("tiny").to_dict(), **change)))
    with pytest.raises(ConfigError) as info:
        BertConfig.from_json_file(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}: {key}:") and "\n" not in message


def test_missing_key_and_bad_json_and_missing_file(tmp_path):
    values = named_config("tiny").to_dict()
    del values["num_attention_heads"]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(values))
    with pytest.raises(ConfigError, match=r"c\.json: num_attention_heads: missing"):
        BertConfig.from_json_file(str(path))
    path.write_text('{"vocab_size": 3,')
    with pytest.raises(ConfigError, match=r"c\.json: invalid JSON at line 1"):
        BertConfig.from_json_file(str(path))
    with pytest.raises(ConfigError, match=r"nope\.json: no such config file"):
        BertConfig.from_json_file(str(tmp_path / "nope.json"))


# ----------------------------------------------------------------------------- graph
def _build(config, compute_type="float32", batch=2, seq=8, heads=True):
    ids = tf1.placeholder(tf.int32, [batch, seq])
    model = BertModel(config, True, ids, compute_type=compute_type)
    if heads:
        masked_lm_output(config, model.get_sequence_output(), model.get_embedding_table(),
                         tf.zeros([batch, 2], tf.int32), tf.zeros([batch, 2], tf.int32),
                         tf.ones([batch, 2]), compute_type)
        next_sentence_output(config, model.get_pooled_output(), tf.zeros([batch], tf.int32))
    return model


def test_variable_names_are_googles():
    config = tiny()
    with tf.Graph().as_default():
        _build(config)
        names = {v.name[:-2]: v.shape.as_list() for v in tf1.global_variables()}
    h, i = config.hidden_size, config.intermediate_size
    expected = {
        "bert/embeddings/word_embeddings": [101, h],
        "bert/embeddings/token_type_embeddings": [2, h],
        "bert/embeddings/position_embeddings": [512, h],
        "bert/embeddings/LayerNorm/beta": [h], "bert/embeddings/LayerNorm/gamma": [h],
        "bert/pooler/dense/kernel": [h, h], "bert/pooler/dense/bias": [h],
        "cls/predictions/transform/dense/kernel": [h, h],
        "cls/predictions/transform/dense/bias": [h],
        "cls/predictions/transform/LayerNorm/beta": [h],
        "cls/predictions/transform/LayerNorm/gamma": [h],
        "cls/predictions/output_bias": [101],
        "cls/seq_relationship/output_weights": [2, h], "cls/seq_relationship/output_bias": [2],
    }
    for layer in range(config.num_hidden_layers):
        p = f"bert/encoder/layer_{layer}/"
        for part in ("query", "key", "value"):
            expected[p + f"attention/self/{part}/kernel"] = [h, h]
            expected[p + f"attention/self/{part}/bias"] = [h]
        expected.update({
            p + "attention/output/dense/kernel": [h, h], p + "attention/output/dense/bias": [h],
            p + "attention/output/LayerNorm/beta": [h], p + "attention/output/LayerNorm/gamma": [h],
            p + "intermediate/dense/kernel": [h, i], p + "intermediate/dense/bias": [i],
            p + "output/dense/kernel": [i, h], p + "output/dense/bias": [h],
            p + "output/LayerNorm/beta": [h], p + "output/LayerNorm/gamma": [h]})
    assert names == expected


@pytest.mark.parametrize("compute_type", ["float16", "bfloat16"])
def test_mixed_precision_keeps_float32_variables_and_outputs(compute_type):
    with tf.Graph().as_default():
        model = _build(tiny(), compute_type)
        assert all(v.dtype.base_dtype == tf.float32 for v in tf1.global_variables())
        assert model.get_embedding_output().dtype == tf.float32
        assert model.get_sequence_output().dtype == tf.float32
        assert model.get_pooled_output().dtype == tf.float32
        assert tf.as_dtype(compute_type) in _matmul_value_types(tf1.get_default_graph())


def _matmul_value_types(graph):
    """The dtypes whose values the graph's matmuls multiply. A float32 matmul of two
    casts from bfloat16 multiplies bfloat16 values (core.matmul on CPUs without native
    bf16 GEMMs), so it counts as bfloat16."""
    types = set()
    for op in graph.get_operations():
        if op.type not in ("MatMul", "BatchMatMulV2"):
            continue
        sources = [tensor.op for tensor in op.inputs]
        if all(s.type == "Cast" and s.get_attr("SrcT") == tf.bfloat16 for s in sources):
            types.add(tf.bfloat16)
        else:
            types.add(op.get_attr("T"))
    return types


def _save_random_checkpoint(config, path):
    with tf.Graph().as_default():
        _build(config, heads=False)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            return tf1.train.Saver().save(session, str(path))


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    config = tiny(hidden_act="gelu")
    return config, _save_random_checkpoint(config, tmp_path_factory.mktemp("ckpt") / "model.ckpt")


def test_padding_does_not_change_real_positions(tiny_checkpoint):
    config, ckpt = tiny_checkpoint
    ids, mask, segments = random_inputs(1, 6, config.vocab_size)
    short = run_encoder(config, ckpt, ids, mask, segments)
    pad = lambda x: np.pad(x, ((0, 0), (0, 10)))  # noqa: E731
    rng = np.random.default_rng(3)
    padded_ids = pad(ids)
    padded_ids[0, 6:] = rng.integers(1, config.vocab_size, 10)  # junk under the mask
    long = run_encoder(config, ckpt, padded_ids, pad(mask), pad(segments))
    np.testing.assert_allclose(long["sequence"][:, :6], short["sequence"], atol=2e-6)
    np.testing.assert_allclose(long["pooled"], short["pooled"], atol=2e-6)


def test_low_precision_tracks_float32(tiny_checkpoint):
    config, ckpt = tiny_checkpoint
    inputs = random_inputs(3, 16, config.vocab_size)
    reference = run_encoder(config, ckpt, *inputs)
    for compute_type, tolerance in (("bfloat16", 3e-2), ("float16", 5e-3)):
        low = run_encoder(config, ckpt, *inputs, compute_type=compute_type)
        for ref, got in zip(reference["layers"], low["layers"]):
            rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            assert rel < tolerance, (compute_type, rel)
        assert not np.allclose(low["sequence"], reference["sequence"], atol=1e-7)


def test_xla_compiled_encoder_matches_plain(tiny_checkpoint):
    config, ckpt = tiny_checkpoint
    inputs = random_inputs(2, 16, config.vocab_size)
    plain = run_encoder(config, ckpt, *inputs)
    compiled = run_encoder(config, ckpt, *inputs, jit=True)
    assert plain["xla_clusters_run"] == 0 and compiled["xla_clusters_run"] > 0
    np.testing.assert_allclose(compiled["sequence"], plain["sequence"], atol=1e-4)


def test_activation_choice_changes_output(tiny_checkpoint):
    config, ckpt = tiny_checkpoint
    inputs = random_inputs(2, 8, config.vocab_size)
    exact = run_encoder(config, ckpt, *inputs)["sequence"]
    tanh = run_encoder(config.replace(hidden_act="gelu_new"), ckpt, *inputs)["sequence"]
    relu = run_encoder(config.replace(hidden_act="relu"), ckpt, *inputs)["sequence"]
    assert 1e-6 < np.abs(exact - tanh).max() < 1e-2
    assert np.abs(exact - relu).max() > 1e-3


def test_sequence_longer_than_positions_is_refused():
    config = tiny(max_position_embeddings=8)
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="exceeds max_position_embeddings 8"):
            BertModel(config, False, tf.zeros([1, 9], tf.int32))


def test_masked_lm_loss_matches_numpy():
    config = tiny()
    rng = np.random.default_rng(1)
    seq = rng.normal(size=(2, 5, config.hidden_size)).astype(np.float32)
    positions = np.array([[1, 3, 0], [4, 2, 0]], np.int32)
    labels = np.array([[5, 7, 0], [9, 11, 0]], np.int32)
    weights = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    with tf.Graph().as_default():
        table = tf1.get_variable("table", [config.vocab_size, config.hidden_size])
        loss, per_example, log_probs = masked_lm_output(config, tf.constant(seq), table,
                                                        positions, labels, weights)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            loss, per_example, log_probs = session.run([loss, per_example, log_probs])
    picked = log_probs[np.arange(6), labels.reshape(-1)]
    np.testing.assert_allclose(per_example, -picked, rtol=1e-6)
    expected = (weights.reshape(-1) * -picked).sum() / (weights.sum() + 1e-5)
    np.testing.assert_allclose(loss, expected, rtol=1e-6)


def test_bfloat16_matmul_accumulates_in_float32_where_emulated(monkeypatch):
    """Where the CPU has no native bf16 GEMM, core.matmul multiplies the bf16 values in
    float32 and rounds the product once; the override picks either path."""
    from modeling import core
    rng = np.random.RandomState(3)
    a = tf.cast(tf.constant(rng.normal(size=(64, 96)).astype(np.float32)), tf.bfloat16)
    b = tf.cast(tf.constant(rng.normal(size=(96, 80)).astype(np.float32)), tf.bfloat16)
    exact = (tf.cast(a, tf.float64).numpy() @ tf.cast(b, tf.float64).numpy())
    results = {}
    for choice in ("emulate", "native"):
        monkeypatch.setenv("BERT_BF16_MATMUL", choice)
        core.emulate_bfloat16_matmul.cache_clear()
        assert core.emulate_bfloat16_matmul() == (choice == "emulate")
        out = core.matmul(a, b)
        assert out.dtype == tf.bfloat16
        results[choice] = tf.cast(out, tf.float64).numpy()
    core.emulate_bfloat16_matmul.cache_clear()
    # emulated = the exact product of the bf16 inputs, rounded once to bf16
    rounded_once = tf.cast(tf.cast(tf.constant(exact, tf.float32), tf.bfloat16), tf.float64)
    np.testing.assert_allclose(results["emulate"], rounded_once.numpy(), rtol=2 ** -7)
    for result in results.values():  # both are bf16 products, within bf16 rounding
        assert np.linalg.norm(result - exact) / np.linalg.norm(exact) < 2e-2


@pytest.mark.parametrize("cap, capped", [("AVX2", True), ("avx512_core", True),
                                         ("AVX512_CORE_BF16", False), ("", False)])
def test_onednn_capped_below_bf16_reads_its_isa_variable(monkeypatch, cap, capped):
    from modeling import core
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert core.onednn_capped_below_bfloat16() is capped
    core.cpu_has_native_bfloat16.cache_clear()
    try:
        if capped:
            assert core.cpu_has_native_bfloat16() is False
    finally:
        core.cpu_has_native_bfloat16.cache_clear()


def _cpu_flags_read_here():
    """The words of /proc/cpuinfo (its flags among them), read independently of modeling.core
    (the expectation of the tests below); empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as reader:
            return set(reader.read().split())
    except OSError:
        return set()


@pytest.mark.parametrize("cap", ["AVX2", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX2_VNNI", ""])
def test_int8_sums_in_32_bits_only_with_vnni_or_amx_under_no_lower_cap(monkeypatch, cap):
    from modeling import core
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    flags = _cpu_flags_read_here()
    expected = {"": bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"}),
                "AVX512_CORE_VNNI": bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"}),
                "AVX2_VNNI": "avx_vnni" in flags}.get(cap, False)
    assert core.cpu_sums_int8_in_32_bits() is expected


@pytest.mark.parametrize("cap, amx_isa", [("", True), ("AVX512_CORE_AMX", True),
                                          ("AVX512_CORE_BF16", False), ("AVX2", False)])
def test_amx_is_named_only_where_the_cpu_has_it_and_onednn_is_not_capped_below(
        monkeypatch, cap, amx_isa):
    from modeling import core
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    has_amx = "amx_bf16" in _cpu_flags_read_here()
    assert core.cpu_has_amx() is (has_amx and amx_isa)


def test_a_cpu_stood_in_for_by_an_avx2_cap_neither_picks_nor_aborts_in_bf16():
    """ONEDNN_MAX_CPU_ISA=AVX2 (how bench/machine.py stands in for an AVX2 CPU, or a user's
    own cap) leaves oneDNN without a bf16 matmul, and TensorFlow aborts the process asking
    for one (where the CPU has AVX512_BF16, as bench/pretrain.py's ceiling did). Capped,
    serving and the demo choose fp32, a bf16 model's matmul is emulated (it runs), and bf16
    serving asked for by name is refused in one line."""
    script = (
        "import numpy as np, tensorflow as tf\n"
        "from modeling import core\n"
        "from finetuning.inference import serving_precision\n"
        "a = tf.cast(tf.constant(np.ones((64, 96), np.float32)), tf.bfloat16)\n"
        "product = core.matmul(a, tf.transpose(a))\n"
        "print(serving_precision('auto'), core.emulate_bfloat16_matmul(),\n"
        "      float(tf.reduce_max(tf.cast(product, tf.float32))))\n"
        "try:\n"
        "    serving_precision('bf16')\n"
        "except ValueError as err:\n"
        "    print(err)\n"
        "from finetuning.inference import SavedModelRunner\n"
        "try:\n"  # a library caller is refused before the model loads, not aborted
        "    SavedModelRunner('no-such-model', 'bf16')\n"
        "except ValueError as err:\n"
        "    print(err)\n")
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", TF_ENABLE_ONEDNN_OPTS="1",
               TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("BERT_BF16_MATMUL", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    chosen, refused, runner_refused = done.stdout.splitlines()
    assert chosen.split() == ["fp32", "True", "96.0"]
    assert refused == runner_refused == ("--precision=bf16: oneDNN is capped below bfloat16 "
                                         "here (ONEDNN_MAX_CPU_ISA=AVX2): serve in fp32, or "
                                         "unset it")


# ----------------------------------------------------------------------------- output positions
@pytest.mark.parametrize("packed", [False, True])
def test_output_positions_compute_the_same_rows_and_gradients_as_the_full_model(packed):
    """A model built with `output_positions` (the last layer computes only those rows and the
    [CLS] rows) gives the full model's sequence output at those positions, the same pooled
    output and the same gradients, in float32 to 1e-5; `POOLED_ONLY` the same pooled output."""
    config = tiny(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    rng = np.random.default_rng(3)
    batch, seq = 3, 16
    ids = rng.integers(1, config.vocab_size, (batch, seq)).astype(np.int32)
    mask = np.ones((batch, seq), np.int32)
    mask[1, 11:] = 0
    positions = np.sort(rng.choice(np.arange(1, 10), (batch, 4)), axis=1).astype(np.int32)
    packing = None
    with tf.Graph().as_default():
        if packed:   # two instances per row: tokens 0-6 and 7-15 (the second [CLS] at 7)
            instance_ids = np.where(np.arange(seq) < 7, 1, 2)[None].repeat(batch, 0) * mask
            position_ids = np.where(np.arange(seq) < 7, np.arange(seq), np.arange(seq) - 7)
            packing = PackedRows(
                tf.constant(instance_ids), tf.constant(position_ids[None].repeat(batch, 0)),
                tf.constant([[0, 7]] * batch))
        results = {}
        for name, chosen in (("full", None), ("selected", tf.constant(positions)),
                             ("pooled", BertModel.POOLED_ONLY)):
            with tf1.variable_scope("", reuse=tf1.AUTO_REUSE):
                model = BertModel(config, True, tf.constant(ids), tf.constant(mask),
                                  scope="bert", packing=packing, output_positions=chosen)
            sequence = model.get_sequence_output()
            if name == "full":
                sequence = tf.gather(sequence, positions, batch_dims=1)
            objective = tf.reduce_sum(model.get_pooled_output() ** 2)
            if name != "pooled":
                objective += tf.reduce_sum(sequence * tf.sin(tf.range(config.hidden_size,
                                                                      dtype=tf.float32)))
            variables = tf1.trainable_variables()
            results[name] = (sequence, model.get_pooled_output(), objective,
                             [tf.convert_to_tensor(g) for g in tf.gradients(objective, variables)])
        assert {v.op.name.split("/")[0] for v in tf1.trainable_variables()} == {"bert"}
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            values = session.run(results)
    full, selected, pooled = values["full"], values["selected"], values["pooled"]
    assert selected[0].shape == (batch, 4, config.hidden_size)
    np.testing.assert_allclose(selected[0], full[0], rtol=0, atol=1e-5)
    for other in (selected, pooled):
        np.testing.assert_allclose(other[1], full[1], rtol=0, atol=1e-5)
    for got, want in zip(selected[3], full[3]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert max(np.abs(g).max() for g in full[3]) > 1e-3   # the gradients are not trivially 0
