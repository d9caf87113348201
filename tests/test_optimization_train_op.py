"""create_train_op: accumulation, overflow skipping, loss scaling, allreduce, checkpoints.

The model is a tiny embedding + MLP whose loss is a mean over the batch, built in a
fresh graph with fixed initial values so that several graphs can be compared.
"""
import os

import numpy as np
import pytest
import tensorflow as tf

from optimization import DynamicLossScale, create_train_op, is_training_state

BATCH = 8
rng = np.random.RandomState(0)
INIT = {
    "embeddings/word_embeddings": (0.5 * rng.normal(size=(10, 4))).astype(np.float32),
    "dense/kernel": rng.normal(size=(4, 5)).astype(np.float32),
    "dense/bias": np.zeros(5, np.float32),
    "output/kernel": rng.normal(size=(5, 1)).astype(np.float32),
}
MODEL_VARIABLES = set(INIT) | {"global_step"}


def make_batches(n, size):
    data = np.random.RandomState(n * 100 + size)
    return [dict(x=data.normal(size=(size, 4)).astype(np.float32),
                 ids=data.randint(0, 10, size=(size,)).astype(np.int32),
                 y=data.normal(size=(size, 1)).astype(np.float32)) for _ in range(n)]


class Model:
    """Builds the model, its training op and a session in a new graph."""

    def __init__(self, make_counter=False, make_loss_scale=None, **train_op_kwargs):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.x = tf.compat.v1.placeholder(tf.float32, [None, 4])
            self.ids = tf.compat.v1.placeholder(tf.int32, [None])
            self.y = tf.compat.v1.placeholder(tf.float32, [None, 1])
            # Multiplied into the loss: feed inf or nan to inject a non-finite gradient.
            self.poison = tf.compat.v1.placeholder_with_default(1.0, [])
            self.vars = {n: tf.compat.v1.get_variable(n, initializer=v) for n, v in INIT.items()}
            hidden = self.x + tf.gather(self.vars["embeddings/word_embeddings"], self.ids)
            hidden = tf.tanh(tf.matmul(hidden, self.vars["dense/kernel"]) + self.vars["dense/bias"])
            prediction = tf.matmul(hidden, self.vars["output/kernel"])
            loss = tf.reduce_mean(tf.square(prediction - self.y)) * self.poison
            if make_counter:
                self.calls = tf.compat.v1.Variable(0, dtype=tf.int64, trainable=False,
                                                   name="allreduce_calls")
                train_op_kwargs["allreduce_fn"] = self.counting_allreduce
            if make_loss_scale is not None:  # loss-scale objects own variables of this graph
                train_op_kwargs["loss_scale"] = make_loss_scale()
            kwargs = dict(optimizer_type="lamb", init_lr=0.01, num_train_steps=100,
                          num_warmup_steps=0)
            kwargs.update(train_op_kwargs)
            self.train_op, self.extras = create_train_op(loss, **kwargs)
            self.saver = tf.compat.v1.train.Saver()
            self.sess = tf.compat.v1.Session(graph=self.graph)
            self.sess.run(tf.compat.v1.global_variables_initializer())

    def counting_allreduce(self, grad):
        """A stand-in for hvd.allreduce: counts its executions and multiplies by 3."""
        with tf.control_dependencies([self.calls.assign_add(1)]):
            return 3.0 * tf.identity(grad)

    def step(self, batch, poison=1.0):
        feed = {self.x: batch["x"], self.ids: batch["ids"], self.y: batch["y"], self.poison: poison}
        return self.sess.run([self.train_op, self.extras], feed)[1]

    def weights(self):
        return self.sess.run(self.vars)

    def state(self):
        """Every global variable's value, by checkpoint name."""
        with self.graph.as_default():
            variables = tf.compat.v1.global_variables()
        return dict(zip([v.op.name for v in variables], self.sess.run(variables)))

    def close(self):
        self.sess.close()


@pytest.fixture
def models():
    created = []
    yield lambda **kwargs: created.append(Model(**kwargs)) or created[-1]
    for model in created:
        model.close()


def concat(batches):
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


@pytest.mark.parametrize("optimizer_type", ["lamb", "adam", "adamw"])
def test_accumulating_4_micro_batches_equals_one_large_batch(models, optimizer_type):
    accumulated = models(optimizer_type=optimizer_type, num_accumulation_steps=4,
                         loss_scale="dynamic")  # scaling by 2^15 is exact: same result
    large = models(optimizer_type=optimizer_type)
    micro = make_batches(8, BATCH // 4)
    for window in (micro[:4], micro[4:]):
        before = accumulated.weights()
        for i, batch in enumerate(window):
            extras = accumulated.step(batch)
            assert extras["is_optimizer_step"] == (i == 3)
            if i < 3:  # nothing is applied inside the window
                for n, v in accumulated.weights().items():
                    np.testing.assert_array_equal(v, before[n])
        large_extras = large.step(concat(window))
        assert extras["global_step"] == large_extras["global_step"]
        np.testing.assert_allclose(extras["global_norm"], large_extras["global_norm"], rtol=1e-5)
        ours, reference = accumulated.weights(), large.weights()
        for n in INIT:
            np.testing.assert_allclose(ours[n], reference[n], rtol=0, atol=1e-5, err_msg=n)
            assert np.abs(ours[n] - INIT[n]).max() > 1e-4, n  # really trained
    assert extras["global_step"] == 2
    state = accumulated.state()
    assert state["gradient_accumulation/local_step"] == 0
    assert not state["dense/kernel/accum"].any()


def test_single_step_has_no_accumulation_buffers(models):
    names = models().state().keys()
    assert not [n for n in names if "accum" in n]


@pytest.mark.faults
def test_non_finite_gradients_skip_the_step_and_halve_the_loss_scale(models):
    model = models(make_loss_scale=lambda: DynamicLossScale(2.0 ** 10, growth_interval=3))
    batches = make_batches(6, BATCH)
    first = model.step(batches[0])
    assert first["is_finite"] and first["loss_scale"] == 1024.0
    before = model.state()

    skipped = model.step(batches[1], poison=np.inf)
    after = model.state()
    assert not skipped["is_finite"] and skipped["skipped_steps"] == 1
    for n in INIT:
        np.testing.assert_array_equal(after[n], before[n])
        assert np.all(np.isfinite(after[n]))
        np.testing.assert_array_equal(after[n + "/lamb_m"], before[n + "/lamb_m"])
    assert after["loss_scale/loss_scale"] == 512.0
    assert after["LAMB/lamb_step"] == 1  # Adam's bias correction ignores skipped steps
    assert after["global_step"] == 1  # as NVIDIA's: a skipped step is not an update
    assert skipped["consecutive_skips"] == 1

    steps = [model.step(b) for b in batches[2:6]]
    assert [x["loss_scale"] for x in steps] == [512.0, 512.0, 512.0, 1024.0]  # 3 clean: x2
    assert [x["consecutive_skips"] for x in steps] == [0, 0, 0, 0]
    state = model.state()
    assert state["loss_scale/skipped_steps"] == 1 and state["LAMB/lamb_step"] == 5
    assert state["global_step"] == 5 == state["LAMB/lamb_step"]


def test_nan_inside_an_accumulation_window_drops_the_whole_window(models):
    model = models(num_accumulation_steps=2, loss_scale="dynamic")
    batches = make_batches(4, BATCH)
    model.step(batches[0], poison=np.nan)
    mid = model.state()
    assert np.isnan(mid["dense/kernel/accum"]).any()
    extras = model.step(batches[1])
    state = model.state()
    assert extras["is_optimizer_step"] and not extras["is_finite"]
    for n in INIT:
        np.testing.assert_array_equal(state[n], INIT[n])
        assert not state[n + "/accum"].any()  # zeroed, NaN gone
    assert state["gradient_accumulation/local_step"] == 0
    assert state["loss_scale/skipped_steps"] == 1
    assert state["loss_scale/loss_scale"] == 2.0 ** 31  # NVIDIA's initial 2**32, halved
    assert state["global_step"] == 0
    # The next window trains normally.
    model.step(batches[2])
    extras = model.step(batches[3])
    assert extras["is_finite"]
    assert np.abs(model.weights()["dense/kernel"] - INIT["dense/kernel"]).max() > 0


def test_fixed_scale_also_skips_non_finite_steps(models):
    model = models(loss_scale=None)
    extras = model.step(make_batches(1, BATCH)[0], poison=np.inf)
    assert not extras["is_finite"] and extras["skipped_steps"] == 1 and extras["loss_scale"] == 1.0
    for n, v in model.weights().items():
        np.testing.assert_array_equal(v, INIT[n])


@pytest.mark.parametrize("post_accumulation", [True, False])
def test_allreduce_fn_runs_per_micro_batch_or_once_per_optimizer_step(models, post_accumulation):
    plain = models(num_accumulation_steps=2)
    reduced = models(num_accumulation_steps=2, make_counter=True,
                     allreduce_post_accumulation=post_accumulation)
    batches = make_batches(4, BATCH)
    for i, batch in enumerate(batches):
        expected, extras = plain.step(batch), reduced.step(batch)
        if i == 1:  # first optimizer step: same weights, so the factor shows exactly once
            np.testing.assert_allclose(extras["global_norm"], 3.0 * expected["global_norm"],
                                       rtol=1e-5)
    calls = reduced.sess.run(reduced.calls)
    num_vars = len(INIT)
    assert calls == (2 * num_vars if post_accumulation else 4 * num_vars)


def test_saver_restores_the_complete_training_state(models, tmp_path):
    batches = make_batches(8, BATCH)
    kwargs = dict(num_accumulation_steps=2,
                  make_loss_scale=lambda: DynamicLossScale(2.0 ** 8, growth_interval=3))
    original = models(**kwargs)
    original.step(batches[0])
    original.step(batches[1])                  # applied
    original.step(batches[2], poison=np.inf)
    original.step(batches[3])                  # skipped: scale halved
    original.step(batches[4])                  # mid-window: buffers hold one micro-batch
    saved = original.state()
    with original.graph.as_default():
        path = original.saver.save(original.sess, os.path.join(str(tmp_path), "model.ckpt"))

    assert saved["gradient_accumulation/local_step"] == 1 and saved["dense/kernel/accum"].any()
    assert saved["loss_scale/skipped_steps"] == 1 and saved["loss_scale/loss_scale"] == 128.0
    assert saved["loss_scale/good_steps"] == 0 and saved["global_step"] == 1
    assert saved["LAMB/lamb_step"] == 1 and saved["dense/kernel/lamb_v"].any()
    # Training state is recognisable by name; model variables are not.
    assert all(is_training_state(n) != (n in MODEL_VARIABLES) for n in saved), sorted(saved)

    restored = models(**kwargs)
    with restored.graph.as_default():
        restored.saver.restore(restored.sess, path)
    assert restored.state().keys() == saved.keys()
    for n, value in restored.state().items():
        np.testing.assert_array_equal(value, saved[n], err_msg=n)

    for batch in batches[5:]:
        original.step(batch)
        restored.step(batch)
    final, resumed = original.state(), restored.state()
    assert final["global_step"] == 3
    for n in final:
        np.testing.assert_array_equal(resumed[n], final[n], err_msg=n)


@pytest.mark.parametrize("optimizer_type", ["lamb", "adam", "adamw"])
def test_project_checkpoint_loader_skips_all_training_state(models, optimizer_type):
    """modeling.checkpoints (weights-only --init_checkpoint) must skip what we create."""
    checkpoints = pytest.importorskip("modeling.checkpoints")
    names = models(optimizer_type=optimizer_type, num_accumulation_steps=2,
                   loss_scale="dynamic").state().keys()
    for name in names:
        assert checkpoints.is_model_variable(name) == (name in INIT), name
        assert is_training_state(name) == (name not in MODEL_VARIABLES), name


def test_one_global_norm_per_step_serves_check_clip_and_log(models):
    """The finite check, the optimizer's clip to norm 1 and the logged norm share one
    computation: one L2Loss per variable in the graph, not one per use."""
    for optimizer_type in ("lamb", "adam"):
        model = models(optimizer_type=optimizer_type, num_accumulation_steps=2,
                       loss_scale="dynamic")
        graph_def = model.graph.as_graph_def()  # tf.cond branches live in its functions
        nodes = list(graph_def.node) + [n for f in graph_def.library.function
                                        for n in f.node_def]
        l2_losses = [n for n in nodes if n.op == "L2Loss"]
        assert len(l2_losses) == len(INIT), (optimizer_type, len(l2_losses))
        batches = make_batches(2, BATCH)
        model.step(batches[0])
        extras = model.step(batches[1])
        assert extras["is_optimizer_step"] and extras["global_norm"] > 0


def test_accumulation_counter_restored_past_a_smaller_window_does_not_stall(models, tmp_path):
    """A checkpoint taken mid-window with 4 micro-batches per step, resumed with 2: the
    counter (3) is already past the new window; the next micro-batch must step, averaging
    what the buffers really hold, instead of never reaching equality."""
    batches = make_batches(6, BATCH)
    wide = models(num_accumulation_steps=4)
    for batch in batches[:3]:
        wide.step(batch)
    with wide.graph.as_default():
        path = wide.saver.save(wide.sess, os.path.join(str(tmp_path), "model.ckpt"))
    narrow = models(num_accumulation_steps=2)
    with narrow.graph.as_default():
        narrow.saver.restore(narrow.sess, path)
    extras = narrow.step(batches[3])
    assert extras["is_optimizer_step"] and extras["global_step"] == 1
    state = narrow.state()
    assert state["gradient_accumulation/local_step"] == 0
    # The update equals one step on the four micro-batches' mean (== their concatenation).
    reference = models()
    reference.step(concat(batches[:4]))
    for n in INIT:
        np.testing.assert_allclose(state[n], reference.weights()[n], rtol=0, atol=1e-5)
    narrow.step(batches[4])
    assert narrow.step(batches[5])["global_step"] == 2  # and windows of 2 from then on


def _horovod_fp16_average_over_8_ranks(grad):
    """What Horovod's Average with Compression.fp16 does to a gradient on 8 ranks holding
    the same values: cast to float16, sum the 8 in float16, divide, cast back."""
    wire = tf.cast(grad, tf.float16)
    total = wire * tf.constant(8.0, tf.float16)  # float16 sum of the 8 ranks' values
    return tf.cast(total / tf.constant(8.0, tf.float16), grad.dtype)


@pytest.mark.parametrize("post_accumulation", [True, False])
def test_float16_allreduce_carries_the_window_mean_not_a_sum(models, post_accumulation):
    """N = 512 micro-batches on 8 emulated ranks, gradients near float16's reach: the wire
    carries what NVIDIA's does (the gradient of loss / N, whose window sum is the mean), so
    the allreduce stays finite and the step applies. Allreducing the sum of 512 micro-batch
    gradients overflowed float16 there and skipped every step."""
    n = 512
    batch = make_batches(1, BATCH)[0]
    scale = 1.0
    # A loss scale that puts the largest gradient element of one micro-batch at ~4,000: its
    # 8-rank float16 sum is ~32,000 < 65,504, but 512 of them summed are not.
    probe = models(num_accumulation_steps=1, loss_scale=1.0)
    probe_norm = probe.step(batch)["global_norm"]
    scale = 4000.0 / probe_norm
    model = models(num_accumulation_steps=n, loss_scale=scale,
                   allreduce_fn=_horovod_fp16_average_over_8_ranks,
                   allreduce_post_accumulation=post_accumulation)
    reference = models(num_accumulation_steps=n, loss_scale=scale)
    for _ in range(n):
        extras = model.step(batch)
        expected = reference.step(batch)
    assert extras["is_optimizer_step"] and extras["is_finite"], extras
    assert extras["global_step"] == 1 and extras["skipped_steps"] == 0
    # float16 on the wire rounds the window mean to 11 bits, no more
    np.testing.assert_allclose(extras["global_norm"], expected["global_norm"], rtol=2e-3)
