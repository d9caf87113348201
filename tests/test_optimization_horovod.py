"""create_train_op with real Horovod allreduce: two ranks over Gloo on this machine.

Checks what the single-process tests can only simulate: the allreduce inside the
accumulation ``tf.cond`` runs and matches across ranks, two ranks averaging their
halves equal one process on the whole batch, and an Inf on ONE rank makes BOTH skip
(the finite check is global because it looks at allreduced gradients).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.test_optimization_train_op import INIT, Model, make_batches

pytestmark = pytest.mark.horovod

RANKS = 2
WORKER = r'''
import sys
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

sys.path.insert(0, sys.argv[1])
from optimization import create_train_op

hvd.init()
rank, work = hvd.rank(), sys.argv[2]
data = np.load(work + "/data.npz")
init = dict(np.load(work + "/init.npz"))
for mode in ("post", "per_micro_batch"):
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        ids = tf.compat.v1.placeholder(tf.int32, [None])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        poison = tf.compat.v1.placeholder_with_default(1.0, [])
        v = {n: tf.compat.v1.get_variable(n, initializer=init[n]) for n in init}
        h = x + tf.gather(v["embeddings/word_embeddings"], ids)
        h = tf.tanh(tf.matmul(h, v["dense/kernel"]) + v["dense/bias"])
        loss = tf.reduce_mean(tf.square(tf.matmul(h, v["output/kernel"]) - y)) * poison
        train_op, extras = create_train_op(
            loss, "lamb", 0.01, 100, 0, num_accumulation_steps=2, loss_scale="dynamic",
            allreduce_fn=lambda g: hvd.allreduce(g, op=hvd.Average),
            allreduce_post_accumulation=(mode == "post"))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            half = len(data["x"][0]) // hvd.size()
            rows = slice(rank * half, (rank + 1) * half)
            for i in range(len(data["x"])):
                bad = np.inf if (i == 2 and rank == 0) else 1.0  # only rank 0 overflows
                sess.run(train_op, {x: data["x"][i][rows], ids: data["ids"][i][rows],
                                    y: data["y"][i][rows], poison: bad})
            variables = tf.compat.v1.global_variables()
            state = dict(zip([w.op.name for w in variables], sess.run(variables)))
    np.savez(f"{work}/{mode}_rank{rank}.npz", **state)
'''


def run_ranks(worker_source, work_dir):
    """Runs `worker_source` as RANKS Horovod ranks over Gloo: argv = (repo, work_dir)."""
    (work_dir / "worker.py").write_text(worker_source)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [sys.executable, "-m", "horovod.runner.launch", "-np", str(RANKS),
               "-H", f"localhost:{RANKS}", "--gloo",
               sys.executable, str(work_dir / "worker.py"), repo, str(work_dir)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_two_ranks_match_one_process_and_skip_together(tmp_path):
    pytest.importorskip("horovod.tensorflow")
    batches = make_batches(6, 8)
    np.savez(tmp_path / "data.npz", **{k: np.stack([b[k] for b in batches]) for k in batches[0]})
    np.savez(tmp_path / "init.npz", **INIT)
    run_ranks(WORKER, tmp_path)

    reference = Model(num_accumulation_steps=2, loss_scale="dynamic")
    try:
        for i, batch in enumerate(batches):
            reference.step(batch, poison=np.inf if i == 2 else 1.0)
        expected = reference.state()
    finally:
        reference.close()
    assert expected["loss_scale/skipped_steps"] == 1

    for mode in ("post", "per_micro_batch"):
        states = [dict(np.load(tmp_path / f"{mode}_rank{r}.npz")) for r in range(RANKS)]
        for name, value in states[0].items():
            np.testing.assert_array_equal(states[1][name], value, err_msg=f"{mode} {name}")
        ours = states[0]
        # 3 windows, one skipped: 2 updates (a skipped step does not advance global_step)
        assert ours["loss_scale/skipped_steps"] == 1 and ours["global_step"] == 2, mode
        assert ours["loss_scale/loss_scale"] == expected["loss_scale/loss_scale"], mode
        for name in INIT:
            np.testing.assert_allclose(ours[name], expected[name], rtol=0, atol=1e-5,
                                       err_msg=f"{mode} {name}")


COMPRESSION_WORKER = r'''
import sys
import numpy as np
import tensorflow as tf

sys.path.insert(0, sys.argv[1])
from runtime.distributed import Workers
from training.settings import gradient_compression

workers = Workers(use_horovod=True)
grads = np.load(sys.argv[2] + "/grads.npy")[workers.rank]
results = {}
with tf.Graph().as_default():
    for precision, amp_dtype in (("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", None)):
        allreduce = workers.allreduce_fn(gradient_compression(amp_dtype is not None, amp_dtype))
        results[precision] = allreduce(tf.constant(grads))
    with tf.compat.v1.Session() as sess:
        values = sess.run(results)
np.savez(f"{sys.argv[2]}/reduced_rank{workers.rank}.npz", **values)
'''


def test_bfloat16_gradients_are_allreduced_exactly_not_through_float16(tmp_path):
    """Unscaled bf16/fp32 gradients must not go through a float16 wire format (an element
    of 1e-6 would lose ~6%, one below ~3e-8 would vanish); loss-scaled fp16 ones may."""
    pytest.importorskip("horovod.tensorflow")
    rng = np.random.RandomState(7)
    magnitudes = np.array([1e-4, 1e-6, 3e-7, 5e-8, 1e-9], np.float32)
    grads = (magnitudes[None, :, None] * (1.0 + rng.uniform(size=(RANKS, 5, 8)))
             ).astype(np.float32).reshape(RANKS, 40)
    np.save(tmp_path / "grads.npy", grads)
    run_ranks(COMPRESSION_WORKER, tmp_path)

    exact = grads.astype(np.float64).mean(axis=0)
    for rank in range(RANKS):
        reduced = dict(np.load(tmp_path / f"reduced_rank{rank}.npz"))
        for precision in ("bf16", "fp32"):
            np.testing.assert_allclose(reduced[precision], exact, rtol=1e-6, atol=0,
                                       err_msg=precision)
        # The float16 wire really is lossy on these values, so the check above can fail.
        fp16 = reduced["fp16"]
        assert np.abs(fp16 - exact).max() / np.abs(exact).max() < 1e-2  # large ones survive
        assert not np.allclose(fp16, exact, rtol=1e-3, atol=0)
        assert (fp16[-8:] == 0).all()  # 1e-9..2e-9: flushed to zero
