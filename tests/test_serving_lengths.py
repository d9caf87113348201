"""A SavedModel serves a batch at its own length: `serving_default` takes any length up to
max_seq_length, `serving_fixed_length` exactly max_seq_length (for Triton's dynamic batcher),
both from one set of weights, and a request's outputs do not depend on how far its batch is
padded; `run_in_batches` batches requests by length, cuts each batch to its longest, and
answers in the order asked (finetuning/serving_graph.py, finetuning/inference.py)."""
import numpy as np
import pytest
import tensorflow as tf

from finetuning.inference import SavedModelRunner, run_in_batches
from serving_models import LENGTH, request_features, summation_order_tolerance


def test_both_signatures_share_the_weights_and_pad_nothing_into_the_answer(exported):
    task, path = exported
    loaded = tf.saved_model.load(path)
    default, fixed = (loaded.signatures[name] for name in ("serving_default",
                                                            "serving_fixed_length"))
    assert default.structured_input_signature[1]["input_ids"].shape.as_list() == [None, None]
    assert fixed.structured_input_signature[1]["input_ids"].shape.as_list() == [None, LENGTH]
    for name, spec in fixed.structured_outputs.items():  # static for Triton's config dims
        assert None not in spec.shape.as_list()[1:], (name, spec.shape)
    rng = np.random.default_rng(0)
    batch = request_features(4, rng)
    full = {name: tf.constant(np.stack([getattr(f, name) for f in batch]))
            for name in ("input_ids", "input_mask", "segment_ids")}
    extra = {"unique_ids": tf.constant([f.unique_id for f in batch], tf.int32)} \
        if task.extra_serving_inputs else {}
    reference = fixed(**full, **extra)
    cut = max(int(f.input_mask.sum()) for f in batch)
    trimmed = default(**{k: v[:, :cut] for k, v in full.items()}, **extra)
    for name, value in reference.items():
        value, got = value.numpy(), trimmed[name].numpy()
        if value.ndim == 2 and value.shape[1] == LENGTH:  # per position: the real ones
            value = value[:, :cut]
        np.testing.assert_allclose(got, value, rtol=0, atol=summation_order_tolerance(value),
                                   err_msg=name)


def test_requests_are_batched_by_length_and_answered_in_order(exported):
    task, path = exported
    runner = SavedModelRunner(path)
    assert runner.fixed_length is None
    seen = []

    def recording(inputs):
        seen.append(inputs["input_ids"].shape)
        return runner(inputs)

    recording.fixed_length = None
    features = request_features(10, np.random.default_rng(1))
    got = run_in_batches(recording, features, task.extra_serving_inputs, batch_size=4)
    # batches of similar length, each cut to its longest request
    lengths = sorted(int(f.input_mask.sum()) for f in features)
    assert [shape[1] for shape in seen] == [lengths[3], lengths[7], lengths[9]]
    # each answer is the one of its request alone, at the full length, in the order asked
    loaded = tf.saved_model.load(path).signatures["serving_fixed_length"]
    for index, feature in enumerate(features):
        inputs = {name: tf.constant(getattr(feature, name)[None])
                  for name in ("input_ids", "input_mask", "segment_ids")}
        if task.extra_serving_inputs:
            inputs["unique_ids"] = tf.constant([feature.unique_id], tf.int32)
        alone = loaded(**inputs)
        for name, value in alone.items():
            value = value.numpy()[0]
            answer = got[index][name]
            if value.ndim == 1 and value.shape[0] == LENGTH:
                value = value[:answer.shape[0]]
            np.testing.assert_allclose(answer, value, rtol=0, atol=summation_order_tolerance(value),
                                       err_msg=f"request {index} {name}")


def test_an_export_of_one_length_is_fed_at_that_length():
    """A SavedModel exported before (serving_default of one length) gets full-length batches."""
    widths = []

    def old(inputs):
        widths.append(inputs["input_ids"].shape[1])
        return {"probabilities": np.zeros((len(inputs["input_ids"]), 2), np.float32)}

    old.fixed_length = LENGTH
    features = request_features(5, np.random.default_rng(2))
    assert len(run_in_batches(old, features, batch_size=2)) == 5
    assert widths == [LENGTH] * 3


def test_bf16_serving_computes_in_bfloat16_and_stays_near_fp32(exported):
    """`precision="bf16"` rewrites the frozen graph's matmuls to bfloat16 (oneDNN's automatic
    mixed precision): its outputs move off fp32's, by no more than bfloat16's rounding
    (2^-8 relative, a few roundings deep in this 2-layer model) of the outputs' scale."""
    from modeling.core import cpu_has_native_bfloat16
    task, path = exported
    features = request_features(6, np.random.default_rng(3))
    fp32 = run_in_batches(SavedModelRunner(path), features, task.extra_serving_inputs)
    bf16 = run_in_batches(SavedModelRunner(path, "bf16"), features, task.extra_serving_inputs)
    worst = 0.0
    for reference, got in zip(fp32, bf16):
        for name, value in reference.items():
            if not np.issubdtype(value.dtype, np.floating):
                np.testing.assert_array_equal(got[name], value)
                continue
            assert got[name].dtype == value.dtype, name
            scale = max(1.0, float(np.abs(value).max()))
            difference = float(np.abs(got[name] - value).max())
            assert difference <= 16 * 2.0 ** -8 * scale, (name, difference, scale)
            worst = max(worst, difference)
    if cpu_has_native_bfloat16():  # where oneDNN multiplies bf16, the rewrite took effect
        assert worst > 0.0


def test_an_unknown_serving_precision_is_refused(exported):
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, int8, got 'int4'"):
        SavedModelRunner(exported[1], "int4")


def test_a_served_call_is_one_callable_not_session_run(exported, monkeypatch):
    """A runner's call goes through its session's handle-based callable, not `Session.run`,
    whose per-call parsing of feeds and fetches cost ~0.4 ms of a 4 ms batch-1 request; it
    answers what `Session.run` answers, for each set of inputs given."""
    task, path = exported
    runner = SavedModelRunner(path)
    batch = request_features(3, np.random.default_rng(4))
    inputs = {name: np.stack([getattr(f, name) for f in batch])
              for name in ("input_ids", "input_mask", "segment_ids")}
    if task.extra_serving_inputs:
        inputs["unique_ids"] = np.array([f.unique_id for f in batch], np.int32)
    graph = runner._session.graph
    feeds = {graph.get_tensor_by_name(runner._inputs[name]): value
             for name, value in inputs.items()}
    reference = runner._session.run(runner._outputs, feeds)

    def refused(*args, **kwargs):
        raise AssertionError("Session.run called while serving")

    monkeypatch.setattr(tf.compat.v1.Session, "run", refused)
    for _ in range(2):  # the callable is made once, then reused
        got = runner(inputs)
        assert sorted(got) == sorted(reference)
        for name, value in reference.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
