"""LAMBOptimizer and AdamWeightDecayOptimizer against independent references.

References: tensorflow_addons' LAMB (an independent implementation, run eagerly) and
float64 NumPy transcriptions of the equations written here from the papers (LAMB:
You et al. 2019, Algorithm 2, with NVIDIA's global-norm pre-normalisation and NVIDIA's
trust ratio on every variable; Google BERT's AdamWeightDecay with its clip to global
norm 1).
"""
import functools
import re

import numpy as np
import pytest
import tensorflow as tf

from optimization import OPTIMIZER_SLOT_SUFFIXES, AdamWeightDecayOptimizer, LAMBOptimizer

STEPS = 10
LR = 0.05
WD = 0.01
B1, B2, EPS = 0.9, 0.999, 1e-6
EXCLUDED = ("LayerNorm", "layer_norm", "bias")

# name -> initial value; a decayed+adapted kernel, a bias, a LayerNorm gain, a
# zero-initialised kernel (trust ratio 1 on the first step) and a zero kernel whose
# gradient is always zero (||w|| = ||u|| = 0 forever: the ratio must stay 1, not NaN).
_rng = np.random.RandomState(0)
INITIAL = {
    "encoder/dense/kernel": _rng.normal(size=(4, 3)).astype(np.float32),
    "encoder/dense/bias": (0.1 * _rng.normal(size=(3,))).astype(np.float32),
    "encoder/LayerNorm/gamma": (1.0 + 0.1 * _rng.normal(size=(3,))).astype(np.float32),
    "head/kernel": np.zeros((3, 2), np.float32),
    "head/unused_kernel": np.zeros((2, 2), np.float32),
}


def _gradients():
    """STEPS dicts of float32 gradients; the global norm alternates above and below 1."""
    rng = np.random.RandomState(1)
    steps = []
    for t in range(STEPS):
        size = 3.0 if t % 2 == 0 else 0.02
        grads = {n: (size * rng.normal(size=v.shape)).astype(np.float32)
                 for n, v in INITIAL.items()}
        grads["head/unused_kernel"][...] = 0.0
        steps.append(grads)
    norms = [np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in s.values())) for s in steps]
    assert max(norms) > 1.0 > min(norms)
    return steps


GRADS = _gradients()


def run_graph_optimizer(make_optimizer):
    """Applies GRADS with a v1 optimizer in a graph; returns the weights after each step."""
    with tf.Graph().as_default():
        variables = {n: tf.compat.v1.get_variable(n, initializer=v) for n, v in INITIAL.items()}
        feeds = {n: tf.compat.v1.placeholder(tf.float32, v.shape) for n, v in INITIAL.items()}
        global_step = tf.compat.v1.train.get_or_create_global_step()
        optimizer = make_optimizer()
        train_op = optimizer.apply_gradients(
            [(feeds[n], variables[n]) for n in INITIAL], global_step=global_step)
        history = []
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for grads in GRADS:
                sess.run(train_op, {feeds[n]: g for n, g in grads.items()})
                history.append(sess.run(variables))
            assert sess.run(global_step) == STEPS
            names = [v.op.name for v in tf.compat.v1.global_variables()]
    return history, names


def decays(name):
    return not any(re.search(p, name) for p in EXCLUDED)


def clip_to_unit_norm(g):
    norm = np.sqrt(sum(np.sum(x ** 2) for x in g.values()))
    return {n: x / max(norm, 1.0) for n, x in g.items()}


def numpy_lamb(pre_normalize, adapt_all=True):
    """NVLAMB in float64: optional clip of all gradients to global norm 1, then LAMB with
    the trust ratio on every variable (NVIDIA) or only on the decayed ones (tfa)."""
    w = {n: v.astype(np.float64) for n, v in INITIAL.items()}
    m = {n: np.zeros_like(v) for n, v in w.items()}
    v = {n: np.zeros_like(x) for n, x in w.items()}
    history = []
    for t, grads in enumerate(GRADS, start=1):
        g = {n: x.astype(np.float64) for n, x in grads.items()}
        if pre_normalize:
            g = clip_to_unit_norm(g)
        for n in w:
            m[n] = B1 * m[n] + (1 - B1) * g[n]
            v[n] = B2 * v[n] + (1 - B2) * g[n] ** 2
            m_hat = m[n] / (1 - B1 ** t)
            v_hat = v[n] / (1 - B2 ** t)
            u = m_hat / (np.sqrt(v_hat) + EPS)
            if decays(n):
                u = u + WD * w[n]
            ratio = 1.0
            w_norm, u_norm = np.linalg.norm(w[n]), np.linalg.norm(u)
            if (adapt_all or decays(n)) and w_norm > 0 and u_norm > 0:
                ratio = w_norm / u_norm
            w[n] = w[n] - LR * ratio * u
        history.append(dict(w))
    return history


def numpy_adam_weight_decay(clip=True):
    """Google BERT's AdamWeightDecay in float64: gradients clipped to global norm 1 (as
    Google's create_optimizer does), no bias correction, decoupled decay."""
    w = {n: v.astype(np.float64) for n, v in INITIAL.items()}
    m = {n: np.zeros_like(v) for n, v in w.items()}
    v = {n: np.zeros_like(x) for n, x in w.items()}
    history = []
    for grads in GRADS:
        clipped = {n: x.astype(np.float64) for n, x in grads.items()}
        if clip:
            clipped = clip_to_unit_norm(clipped)
        for n in w:
            g = clipped[n]
            m[n] = B1 * m[n] + (1 - B1) * g
            v[n] = B2 * v[n] + (1 - B2) * g ** 2
            u = m[n] / (np.sqrt(v[n]) + EPS)
            if decays(n):
                u = u + WD * w[n]
            w[n] = w[n] - LR * u
        history.append(dict(w))
    return history


def assert_close_relative(actual_history, expected_history, tol):
    for step, (actual, expected) in enumerate(zip(actual_history, expected_history), 1):
        for n in INITIAL:
            diff = np.linalg.norm(actual[n] - expected[n])
            scale = max(np.linalg.norm(expected[n]), 1e-12)
            assert np.all(np.isfinite(actual[n])), (step, n)
            assert diff / scale <= tol or diff <= tol, (step, n, diff / scale)


def test_lamb_without_pre_normalization_matches_tfa_lamb():
    tfa = pytest.importorskip("tensorflow_addons")
    ours, _ = run_graph_optimizer(lambda: LAMBOptimizer(
        LR, weight_decay_rate=WD, beta_1=B1, beta_2=B2, epsilon=EPS,
        exclude_from_weight_decay=list(EXCLUDED), exclude_from_layer_adaptation=list(EXCLUDED),
        clip_norm=None))

    variables = {n: tf.Variable(v, name=n) for n, v in INITIAL.items()}
    reference = tfa.optimizers.LAMB(
        learning_rate=LR, beta_1=B1, beta_2=B2, epsilon=EPS, weight_decay=WD,
        exclude_from_weight_decay=list(EXCLUDED))  # layer adaptation: same list
    theirs = []
    for grads in GRADS:
        reference.apply_gradients([(tf.constant(grads[n]), variables[n]) for n in INITIAL])
        theirs.append({n: v.numpy() for n, v in variables.items()})

    for step, (a, b) in enumerate(zip(ours, theirs), 1):
        for n in INITIAL:
            np.testing.assert_allclose(a[n], b[n], rtol=0, atol=1e-6, err_msg=f"{n} step {step}")
    # The updates are far larger than the tolerance, so agreement is not trivial.
    assert np.abs(ours[-1]["encoder/dense/kernel"] - INITIAL["encoder/dense/kernel"]).max() > 0.1


def test_lamb_with_pre_normalization_matches_numpy_nvlamb():
    ours, names = run_graph_optimizer(lambda: LAMBOptimizer(LR, weight_decay_rate=WD))
    assert_close_relative(ours, numpy_lamb(pre_normalize=True), 1e-6)
    # Without the clipping the trajectory is different: the test can tell them apart.
    unclipped = numpy_lamb(pre_normalize=False)
    assert not np.allclose(ours[-1]["encoder/dense/bias"], unclipped[-1]["encoder/dense/bias"],
                           atol=1e-4)
    # The never-updated zero variable stays exactly zero (ratio 1, no NaN).
    assert not ours[-1]["head/unused_kernel"].any()
    assert "LAMB/lamb_step" in names
    assert "encoder/dense/kernel/lamb_m" in names and "encoder/dense/kernel/lamb_v" in names


def test_lamb_adapts_layernorm_and_bias_by_default_like_nvidia():
    """NVIDIA's TF LAMB applies the trust ratio to every variable; tfa's leaves the
    LayerNorm gain and the bias out. The default is NVIDIA's; the other is an option."""
    ours, _ = run_graph_optimizer(lambda: LAMBOptimizer(LR, weight_decay_rate=WD))
    tfa_style = numpy_lamb(pre_normalize=True, adapt_all=False)
    for name in ("encoder/dense/bias", "encoder/LayerNorm/gamma"):
        assert not np.allclose(ours[-1][name], tfa_style[-1][name], atol=1e-4), name
    from optimization.decoupled_weight_decay import DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY
    excluded, _ = run_graph_optimizer(lambda: LAMBOptimizer(
        LR, weight_decay_rate=WD,
        exclude_from_layer_adaptation=DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY))
    assert_close_relative(excluded, tfa_style, 1e-6)


def test_adam_weight_decay_matches_numpy():
    ours, names = run_graph_optimizer(lambda: AdamWeightDecayOptimizer(
        LR, weight_decay_rate=WD, beta_1=B1, beta_2=B2, epsilon=EPS))
    assert_close_relative(ours, numpy_adam_weight_decay(), 1e-6)
    assert "encoder/dense/kernel/adam_m" in names and "head/kernel/adam_v" in names
    # The clip to global norm 1 acts (half the steps have norm 3x): unclipped differs.
    unclipped = numpy_adam_weight_decay(clip=False)
    assert not np.allclose(ours[-1]["encoder/dense/kernel"],
                           unclipped[-1]["encoder/dense/kernel"], atol=1e-4)


@pytest.mark.oracle
def test_adamw_matches_torch_adamw_and_googles_adam_does_not():
    """--optimizer_type=adamw is torch's AdamW (bias-corrected moments, decoupled decay)
    after the same clip to global norm 1, to float32 rounding; Google's AdamWeightDecay
    (no bias correction) takes other, larger steps from the same gradients."""
    torch = pytest.importorskip("torch", reason="oracle package torch not installed "
                                "(bash scripts/install.sh --oracles)")
    from optimization import make_optimizer
    ours, names = run_graph_optimizer(lambda: make_optimizer("adamw", LR, WD))
    params = {n: torch.nn.Parameter(torch.tensor(v, dtype=torch.float64))
              for n, v in INITIAL.items()}
    reference = torch.optim.AdamW(
        [{"params": [p for n, p in params.items() if decays(n)], "weight_decay": WD},
         {"params": [p for n, p in params.items() if not decays(n)], "weight_decay": 0.0}],
        lr=LR, betas=(B1, B2), eps=EPS)
    theirs = []
    for grads in GRADS:
        for n, p in params.items():
            p.grad = torch.tensor(grads[n], dtype=torch.float64)
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        reference.step()
        theirs.append({n: p.detach().numpy().copy() for n, p in params.items()})
    assert_close_relative(ours, theirs, 1e-5)
    assert "AdamWeightDecay/adam_step" in names
    assert all(n.endswith(OPTIMIZER_SLOT_SUFFIXES) for n in names
               if n not in INITIAL and n != "global_step")
    google, _ = run_graph_optimizer(lambda: make_optimizer("adam", LR, WD))
    first_step = {n: np.linalg.norm(google[0][n] - INITIAL[n]) /
                  max(np.linalg.norm(theirs[0][n] - INITIAL[n]), 1e-12)
                  for n in ("encoder/dense/kernel", "head/kernel")}
    assert all(ratio > 2.5 for ratio in first_step.values()), first_step  # 0.1/sqrt(0.001)


def test_slot_names_are_covered_by_the_exported_suffixes():
    _, names = run_graph_optimizer(lambda: LAMBOptimizer(LR))
    model = set(INITIAL) | {"global_step"}
    state = [n for n in names if n not in model]
    assert len(state) == 2 * len(INITIAL) + 1
    assert all(n.endswith(OPTIMIZER_SLOT_SUFFIXES) for n in state), state
    assert not any(n.endswith(OPTIMIZER_SLOT_SUFFIXES) for n in model)


def test_lamb_exclusion_rules():
    from optimization import make_optimizer
    with tf.Graph().as_default():
        kernel = tf.compat.v1.get_variable("attention/self/query/kernel", [2])
        bias = tf.compat.v1.get_variable("attention/self/query/bias", [2])
        gamma = tf.compat.v1.get_variable("attention/output/LayerNorm/gamma", [2])
        nvidia = make_optimizer("lamb", LR)                  # run_pretraining.py's default
        weights_only = make_optimizer("lamb", LR, lamb_layer_adaptation="weights")
        assert nvidia.uses_weight_decay(kernel) and nvidia.uses_layer_adaptation(kernel)
        assert weights_only.uses_layer_adaptation(kernel)
        for var in (bias, gamma):
            assert not nvidia.uses_weight_decay(var) and nvidia.uses_layer_adaptation(var)
            assert not weights_only.uses_weight_decay(var)
            assert not weights_only.uses_layer_adaptation(var)
        with pytest.raises(ValueError):
            make_optimizer("lamb", LR, lamb_layer_adaptation="none")


@pytest.mark.parametrize("optimizer_class", [
    LAMBOptimizer, AdamWeightDecayOptimizer,
    functools.partial(AdamWeightDecayOptimizer, bias_correction=True)],
    ids=["lamb", "adam", "adamw"])
def test_fused_update_is_one_xla_function_per_shape_and_equals_the_op_by_op_update(
        optimizer_class):
    """The default update is compiled by XLA (one function per distinct variable shape and
    flags, not per variable) and follows the same trajectory as the same equations built
    op by op, to float32 rounding."""
    fused, _ = run_graph_optimizer(lambda: optimizer_class(LR, weight_decay_rate=WD,
                                                           fused=True))
    op_by_op, _ = run_graph_optimizer(lambda: optimizer_class(LR, weight_decay_rate=WD,
                                                              fused=False))
    for step, (a, b) in enumerate(zip(fused, op_by_op), 1):
        for n in INITIAL:
            np.testing.assert_allclose(a[n], b[n], rtol=1e-6, atol=1e-7,
                                       err_msg=f"{n} step {step}")
    with tf.Graph().as_default() as graph:
        variables = [tf.compat.v1.get_variable(n, initializer=v) for n, v in INITIAL.items()]
        optimizer_class(LR, fused=True).apply_gradients([(tf.ones_like(v), v)
                                                         for v in variables])
        library = graph.as_graph_def().library.function
        compiled = [f for f in library if f.attr["_XlaMustCompile"].b]
        element_wise = {op.type for op in graph.get_operations()
                        if op.type in ("Sqrt", "RealDiv", "Square", "Mul")
                        and op.outputs[0].shape.rank}  # scalars (the clip factor) aside
    # Five variables, four distinct (shape, decay, adaptation) kinds: (4, 3) and (3, 2)
    # decayed kernels, (3,) biases/gains excluded from decay, and (2, 2).
    assert len(compiled) == 4, [f.signature.name for f in library]
    assert not element_wise, element_wise  # the update's arithmetic is inside the functions


def test_the_update_is_fused_by_default_everywhere(monkeypatch):
    """Fused on CPUs as on GPUs (XLA's compiler lines go to the log file, test_console);
    BERT_FUSED_OPTIMIZER=0 keeps the op-by-op update; fused=... decides over both."""
    monkeypatch.delenv("BERT_FUSED_OPTIMIZER", raising=False)
    assert LAMBOptimizer(LR).fused and AdamWeightDecayOptimizer(LR).fused
    monkeypatch.setenv("BERT_FUSED_OPTIMIZER", "0")
    assert not LAMBOptimizer(LR).fused and not AdamWeightDecayOptimizer(LR).fused
    assert LAMBOptimizer(LR, fused=True).fused
    monkeypatch.setenv("BERT_FUSED_OPTIMIZER", "1")
    assert LAMBOptimizer(LR).fused and not LAMBOptimizer(LR, fused=False).fused
