"""bench/serving.py's fixed-shape table served in lockstep: a tiny exported classifier served
by bench/serving_child.py as inference.py serves it (`ours`) and as it was served before issue
40 (`before`), both processes up at once, making the calls the parent asks for in turn
(bench/lockstep.py). Each side makes exactly the calls sized by its probe, the two answer
alike, and every chunk has its ratio. (Speed is the benchmark's business, not a test's.)"""
import importlib.util
import os
import shutil
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _serving_bench():
    bench = os.path.join(REPO, "bench")
    if bench not in sys.path:
        sys.path.append(bench)  # after the packages: bench/data_prep.py must not hide one
    spec = importlib.util.spec_from_file_location("bench_serving",
                                                  os.path.join(bench, "serving.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("exported", ["classifier"], indirect=True)
def test_both_sides_make_the_calls_asked_in_turn_and_answer_alike(exported, tmp_path):
    from serving_models import LENGTH
    _, saved_model = exported
    model = str(tmp_path / "model")
    shutil.copytree(saved_model, model)
    vocab = os.path.join(model, "assets.extra", "vocab.txt")
    if not os.path.exists(vocab):  # the tiny export carries none; the child counts its rows
        os.makedirs(os.path.dirname(vocab), exist_ok=True)
        with open(vocab, "w", encoding="utf-8") as writer:
            writer.write("".join(f"t{index}\n" for index in range(101)))
    serving = _serving_bench()
    config = ("classifier", LENGTH, 2)
    chunks = 3
    results, ratios = serving.serve_in_lockstep({config[:2]: (model, None)}, config,
                                                ("ours", "before"), 0.001, chunks, "before",
                                                str(tmp_path))
    assert len(ratios) == chunks and all(ratio > 0 for ratio in ratios)
    for side in ("ours", "before"):
        # the probe's call is dropped; a chunk has at least one call
        assert len(results[side]["latencies"]) == chunks
        assert all(seconds > 0 for seconds in results[side]["latencies"])
    ours = np.array(results["ours"]["outputs"]["probabilities"])
    assert ours.shape == (2, 2)
    np.testing.assert_allclose(ours, results["before"]["outputs"]["probabilities"], atol=1e-5)
