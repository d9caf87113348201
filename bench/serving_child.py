"""One serving process of bench/serving.py: loads one model on one side and times calls.

    python bench/serving_child.py ours|before|hf MODEL TASK SEQ BATCH SECONDS OUT.json
        [--reply_fd FD]

`ours`: MODEL is a SavedModel exported by run_classifier.py / run_squad.py, called as
`inference.py` calls it (`finetuning.inference.SavedModelRunner`: the `serving_default`
signature in a session of its own, weights frozen, NumPy in and out). `before`: the same
SavedModel called as inference.py called it before issue 40 (`tf.saved_model.load`'s
`serving_default` function, eager tensors in and out), for the before/after figures. `hf`: MODEL is a HuggingFace folder of
the same weights, run as `BertForSequenceClassification` / `BertForQuestionAnswering` (torch,
eval, inference_mode), NumPy in and out. TASK is `classifier` or `squad`.

Both sides get the same inputs (a fixed seed), warm up for three calls (the first traces
the graph), then call until SECONDS have passed (at least 5 calls); with --reply_fd
(bench/serving.py passes it), they make the calls the parent asks for, in turn with the other
side (bench/lockstep.py: `serve START STOP` makes STOP - START calls). The JSON written holds
the latency of every timed call, the load and first-call seconds, and the outputs of the
first batch (for bench/serving.py to check both sides compute the same thing).
"""
import json
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # first: bench/data_prep.py must not hide the package
sys.path.insert(1, os.path.join(REPO, "bench"))

from lockstep import serve_commands  # noqa: E402


def inputs(batch, seq, vocab_size, seed=0):
    rng = np.random.default_rng(seed)
    # past the special tokens (a real vocabulary's first thousand; a tiny one's first half)
    ids = rng.integers(min(1000, vocab_size // 2), vocab_size, size=(batch, seq)).astype(np.int32)
    ids[:, 0] = min(101, vocab_size - 1)  # [CLS] (a tiny vocabulary: its last)
    segments = np.zeros((batch, seq), np.int32)
    segments[:, seq // 4:] = 1  # a question and a context, as SQuAD features
    return {"input_ids": ids, "input_mask": np.ones((batch, seq), np.int32),
            "segment_ids": segments}


def ours(model, task):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from finetuning.inference import SavedModelRunner
    runner = SavedModelRunner(model)
    runner.warm_up()  # as a server does before it takes requests

    def call(features):
        features = dict(features)
        if task == "squad":
            features["unique_ids"] = np.arange(len(features["input_ids"]), dtype=np.int32)
            out = runner(features)
            return {"start_logits": out["start_logits"], "end_logits": out["end_logits"]}
        return {"probabilities": runner(features)["probabilities"]}
    return call


def before(model, task):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    signature = tf.saved_model.load(model).signatures["serving_default"]

    def call(features):
        features = {k: tf.constant(v, tf.int32) for k, v in features.items()}
        if task == "squad":
            features["unique_ids"] = tf.range(features["input_ids"].shape[0], dtype=tf.int32)
            out = signature(**features)
            return {"start_logits": out["start_logits"].numpy(),
                    "end_logits": out["end_logits"].numpy()}
        return {"probabilities": signature(**features)["probabilities"].numpy()}
    return call


def load_hf_model(model, task):
    """HuggingFace's BertForQuestionAnswering / BertForSequenceClassification (2 labels) with
    the weights of the folder `model` (modeling.convert.tf_to_hf's), in eval mode; every
    weight must be there."""
    import torch
    import transformers
    from safetensors.numpy import load_file
    config = transformers.BertConfig.from_pretrained(model)
    if task == "squad":
        net = transformers.BertForQuestionAnswering(config)
    else:
        config.num_labels = 2
        net = transformers.BertForSequenceClassification(config)
    heads = ("classifier.", "qa_outputs.")
    weights = {(k if k.startswith(heads) or k.startswith("bert.") else "bert." + k):
               torch.from_numpy(v) for k, v in load_file(os.path.join(model,
                                                                      "model.safetensors")).items()}
    net.load_state_dict(weights, strict=False)
    missing = set(net.state_dict()) - set(weights) - {"bert.embeddings.position_ids"}
    if missing:
        raise SystemExit(f"{model}: weights missing for {sorted(missing)[:5]}")
    return net.eval()


def hf_in_precision(net, precision):
    """HuggingFace's model `net` served in `precision` (fp32, bf16, int8) as its documentation
    serves a BERT on CPU: bf16 is the model moved to torch.bfloat16; int8 is PyTorch's dynamic
    quantization of the Linear layers (int8 weights, activations quantized per call, fbgemm)."""
    import torch
    if precision == "bf16":
        return net.to(torch.bfloat16)
    if precision == "int8":
        return torch.ao.quantization.quantize_dynamic(net, {torch.nn.Linear}, dtype=torch.qint8)
    return net


def hf(model, task):
    import torch
    net = load_hf_model(model, task)

    def call(features):
        with torch.inference_mode():
            out = net(input_ids=torch.from_numpy(features["input_ids"].astype(np.int64)),
                      attention_mask=torch.from_numpy(features["input_mask"].astype(np.int64)),
                      token_type_ids=torch.from_numpy(features["segment_ids"].astype(np.int64)))
        if task == "squad":
            return {"start_logits": out.start_logits.numpy(),
                    "end_logits": out.end_logits.numpy()}
        return {"probabilities": torch.softmax(out.logits, -1).numpy()}
    return call


def main():
    side, model, task, seq, batch, seconds, out_path = sys.argv[1:8]
    reply_fd = int(sys.argv[9]) if sys.argv[8:9] == ["--reply_fd"] else None
    seq, batch, seconds = int(seq), int(batch), float(seconds)
    with open(os.path.join(model if side == "hf" else os.path.join(model, "assets.extra"),
                           "vocab.txt"), encoding="utf-8") as reader:
        vocab_size = sum(1 for _ in reader)
    features = inputs(batch, seq, vocab_size)
    started = time.perf_counter()
    call = {"ours": ours, "before": before, "hf": hf}[side](model, task)
    loaded = time.perf_counter()
    first = call(features)
    first_call = time.perf_counter() - loaded
    for _ in range(2):
        call(features)
    latencies = []

    def serve_calls(start, stop):
        timed = []
        for _ in range(start, stop):
            t0 = time.perf_counter()
            call(features)
            timed.append(time.perf_counter() - t0)
        latencies.extend(timed)
        return timed

    if reply_fd is None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or len(latencies) < 5:
            serve_calls(0, 1)
    else:
        serve_commands(reply_fd, serve_calls)
    with open(out_path, "w", encoding="utf-8") as writer:
        json.dump({"latencies": latencies, "load_seconds": loaded - started,
                   "first_call_seconds": first_call,
                   "outputs": {k: v.tolist() for k, v in first.items()}}, writer)


if __name__ == "__main__":
    main()
