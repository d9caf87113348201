"""The team of threads our kernels share (finetuning/kernels/team.h) and the serving session
that runs them one at a time (finetuning/frozen_session.py): the team computes what
TensorFlow's Shard computes, to the bit, alone and with ops of other threads beside it; the
serving session has one inter-op thread where our ops are in its graph."""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import tensorflow as tf

from finetuning.frozen_session import session_config
from finetuning.packed_dense import pack_kernel

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# one of each op's parallel loops: a dense layer's panels (with its GELU), an attention's
# (sequence, head)s, a layer norm's rows; shapes of a short SQuAD request's layer
OUTPUTS = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    from finetuning import custom_ops
    from finetuning.packed_dense import pack_kernel

    def outputs():
        kernels = custom_ops.library()
        rng = np.random.default_rng(3)
        x = rng.standard_normal((170, 384)).astype(np.float32)
        weight = rng.standard_normal((384, 1536)).astype(np.float32) / 20
        bias = rng.standard_normal(1536).astype(np.float32)
        found = {}
        for isa in ("avx512", "avx2", "generic"):
            found["dense_" + isa] = kernels.bert_dense(
                x, pack_kernel(weight), bias, activation="gelu", isa=isa).numpy()
        mask = np.zeros((3, 80), np.int32)
        for sequence, length in enumerate((80, 57, 33)):
            mask[sequence, :length] = 1
        q, k, v = (rng.standard_normal((170, 384)).astype(np.float32) for _ in range(3))
        found["attention"] = kernels.bert_packed_attention(
            q, k, v, mask, num_heads=12, scale=0.125, isa="avx2").numpy()
        gamma, beta = rng.standard_normal(384).astype(np.float32), np.zeros(384, np.float32)
        found["layer_norm"] = kernels.bert_add_layer_norm(
            x, q, gamma, beta, epsilon=1e-12, isa="avx2")[0].numpy()
        return found
""")


def _outputs_here(kernels):
    namespace = {}
    exec(OUTPUTS, namespace)  # pylint: disable=exec-used
    return namespace["outputs"]()


def test_the_team_computes_what_tensorflows_shard_computes(kernels, tmp_path):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: no team (its helpers are threads - 1)")
    saved = tmp_path / "shard.npz"
    script = OUTPUTS + f"\nnp.savez({str(saved)!r}, **outputs())\n"
    env = dict(os.environ, BERT_TEAM="0", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=600)
    on_shard = np.load(saved)
    on_team = _outputs_here(kernels)
    assert sorted(on_team) == sorted(on_shard.files)
    for name, values in on_team.items():
        np.testing.assert_array_equal(values, on_shard[name], err_msg=name)


def test_ops_of_several_threads_at_once_each_get_their_own_answer(kernels):
    """Four threads calling the dense op at once (one holds the team, the others go to
    Shard): each call's answer is the one it has alone."""
    rng = np.random.default_rng(5)
    weight = pack_kernel(rng.standard_normal((384, 384)).astype(np.float32))
    bias = np.zeros(384, np.float32)
    inputs = [rng.standard_normal((64 + 16 * i, 384)).astype(np.float32) for i in range(4)]
    alone = [kernels.bert_dense(x, weight, bias, isa="avx2").numpy() for x in inputs]
    wrong = []

    def call_many(index):
        for _ in range(30):
            got = kernels.bert_dense(inputs[index], weight, bias, isa="avx2").numpy()
            if not np.array_equal(got, alone[index]):
                wrong.append(index)

    threads = [threading.Thread(target=call_many, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not wrong and not any(thread.is_alive() for thread in threads)


def test_the_serving_session_runs_its_ops_one_at_a_time_where_ours_are_in_it(monkeypatch):
    monkeypatch.delenv("TF_NUM_INTEROP_THREADS", raising=False)
    pools = session_config(our_ops=12).session_inter_op_thread_pool
    assert [pool.num_threads for pool in pools] == [1]
    assert not session_config(our_ops=0).session_inter_op_thread_pool
    monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "4")  # the user's stands
    assert not session_config(our_ops=12).session_inter_op_thread_pool
    session = tf.compat.v1.Session(graph=tf.Graph(), config=session_config(our_ops=1))
    session.close()
