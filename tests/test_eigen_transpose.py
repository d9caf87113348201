"""A frozen serving graph transposes its float tensors as integers of the same width, on
TensorFlow's own kernel rather than oneDNN's (finetuning/eigen_transpose.py): the same bits
come out, under the same names, and a served model answers exactly as without it."""
import numpy as np
import pytest
import tensorflow as tf

from finetuning import frozen_session
from finetuning.eigen_transpose import transpose_as_integers
from finetuning.inference import SavedModelRunner, run_in_batches
from modeling import named_config
from modeling.core import cpu_has_native_bfloat16
from serving_models import request_features, run_graph, served_nodes

tf1 = tf.compat.v1


def _small_graph():
    """Two float transposes (float32, bfloat16; one behind a control input) and an int32 one."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 3, 4, 5], name="x")
        first = tf.identity(x, name="first")
        perm = tf.constant([0, 2, 1, 3])
        with tf.control_dependencies([first]):
            tf.transpose(x, perm, name="t32")
        tf.transpose(tf.cast(x, tf.bfloat16), [3, 1, 2, 0], name="t16")
        tf.transpose(tf.cast(x, tf.int32), [1, 0, 2, 3], name="tint")
    return graph.as_graph_def()


def test_float_transposes_move_the_same_bits_as_integers_under_their_names():
    graph_def = _small_graph()
    rewritten, moved = transpose_as_integers(graph_def)
    assert moved == 2
    nodes = {node.name: node for node in rewritten.node}
    for name, integer in (("t32", tf.int32), ("t16", tf.int16)):
        assert nodes[name].op == "Bitcast"  # consumers read the same name
        transpose = nodes[name + "/as_integers/transpose"]
        assert transpose.op == "Transpose" and transpose.attr["T"].type == integer.as_datatype_enum
    assert "^first" in nodes["t32/as_integers/transpose"].input
    assert nodes["tint"].op == "Transpose"  # an integer transpose is left as it was
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    fetches = ["t32:0", "t16:0", "tint:0"]
    before, after = run_graph(graph_def, fetches, x), run_graph(rewritten, fetches, x)
    np.testing.assert_array_equal(after[0], np.transpose(x, [0, 2, 1, 3]))
    for old, new in zip(before, after):
        assert old.dtype == new.dtype
        np.testing.assert_array_equal(new, old)
    assert transpose_as_integers(rewritten)[1] == 0  # nothing float is left to move


def test_a_name_taken_by_the_rewrite_is_refused():
    graph_def = _small_graph()
    clash = graph_def.node.add()
    clash.CopyFrom(next(node for node in graph_def.node if node.name == "first"))
    clash.name = "t32/as_integers"
    with pytest.raises(ValueError, match="t32/as_integers"):
        transpose_as_integers(graph_def)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_served_model_transposes_no_floats_and_answers_exactly_as_before(
        exported, precision, monkeypatch):
    """The runner's frozen graph holds no float transpose (attention's four a layer moved),
    and its outputs are bit for bit those of the same graph with oneDNN's transposes. The
    graph where TensorFlow's ops serve attention (without our kernel: packed_attention)."""
    monkeypatch.setenv("BERT_PACKED_ATTENTION", "0")
    task, path = exported
    layers = named_config("tiny").num_hidden_layers
    served = SavedModelRunner(path, precision)
    nodes = served_nodes(served)
    float_types = {tf.float32.as_datatype_enum, tf.bfloat16.as_datatype_enum}
    assert not [node.name for node in nodes
                if node.op == "Transpose" and node.attr["T"].type in float_types]
    assert sum(node.op == "Transpose" for node in nodes) >= 4 * layers
    monkeypatch.setattr(frozen_session, "transpose_as_integers", lambda graph_def: (graph_def, 0))
    unrewritten = SavedModelRunner(path, precision)
    before = served_nodes(unrewritten)
    assert sum(node.op == "Bitcast" for node in before) == 0
    if precision == "bf16" and cpu_has_native_bfloat16():
        # the bf16 rewrite ran first (bf16_graph): attention's transposes move bfloat16 bits
        # as int16, with no cast added around them
        assert sum(node.op == "Transpose" and node.attr["T"].type == tf.int16.as_datatype_enum
                   for node in nodes) >= 4 * layers
        assert (sum(node.op == "Cast" for node in nodes)
                == sum(node.op == "Cast" for node in before))
    features = request_features(6, np.random.default_rng(5))
    expected = run_in_batches(unrewritten, features, task.extra_serving_inputs)
    got = run_in_batches(served, features, task.extra_serving_inputs)
    for reference, answer in zip(expected, got):
        assert sorted(answer) == sorted(reference)
        for name, value in reference.items():
            np.testing.assert_array_equal(answer[name], value)
