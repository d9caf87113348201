"""One serving process of bench/serving_real.py: one side serves real requests for a while.

    python bench/serving_real_child.py ours|hf MODEL TASK MODE BATCH PASSES REQUESTS OUT.json
        [--reply_fd FD]

REQUESTS (JSON, written by bench/serving_real.py) holds the dev inputs in their order: for
MODE `model`, each request's token ids (ours' tokenization, so both sides get the same ids;
a SQuAD question with its paragraph is its first window); for MODE `text`, the raw sentences.
Batches of BATCH consecutive requests are served in that order, PASSES times over all of them
(after three warm-up batches), so both sides serve exactly the same requests (a time limit
would let the faster side reach further into the data, where the lengths differ), each side
in its best ordinary practice:

* ours (MODEL a SavedModel exported by run_classifier.py / run_squad.py), as `inference.py`
  serves: `model` feeds `finetuning.inference.run_in_batches` (each batch padded to its
  longest request) through `SavedModelRunner` (the `serving_default` signature); `text` is
  `finetuning.inference.classify`, tokenization and labels included; the runner warmed up
  first (`SavedModelRunner.warm_up`), as a server does;
* HuggingFace (MODEL a folder of the same weights): each batch padded to its longest (with
  NumPy for `model`, the cheapest way in; its fast tokenizer with `padding=True` for `text`),
  torch's inference mode, SDPA attention; `text` takes the argmax label.

BENCH_PRECISION=bf16 serves both in bfloat16: ours with `SavedModelRunner(precision="bf16")`
(oneDNN's automatic mixed precision, weights folded to bfloat16), HuggingFace's model moved to
torch.bfloat16 (`model.to(torch.bfloat16)`, its usual way to serve in bf16). BENCH_PRECISION=int8:
ours with `SavedModelRunner(precision="int8")` (finetuning/int8_dense.py), HuggingFace's Linear
layers through PyTorch's dynamic quantization (`serving_child.hf_in_precision`).

With --reply_fd (bench/serving_real.py passes it), the batches are served in the chunks the
parent asks for, in turn with the other side (bench/lockstep.py); without, all at once.
Writes the latency of every timed call, the requests served, and the first batch's outputs.
"""
import json
import os
import sys
import time
import types

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRECISION = os.environ.get("BENCH_PRECISION", "fp32")
sys.path.insert(0, REPO)  # first: bench/data_prep.py must not hide the package
sys.path.insert(1, os.path.join(REPO, "bench"))

from lockstep import serve_commands  # noqa: E402


def _features(requests, seq):
    """Our feature objects of tokenized requests (ids, segments), padded to `seq`."""
    features = []
    for index, (ids, segments) in enumerate(requests):
        pad = seq - len(ids)
        features.append(types.SimpleNamespace(
            input_ids=np.array(ids + [0] * pad, np.int32),
            input_mask=np.array([1] * len(ids) + [0] * pad, np.int32),
            segment_ids=np.array(segments + [0] * pad, np.int32),
            unique_id=index, example_index=index))
    return features


def ours(model, task, mode):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from finetuning.inference import SavedModelRunner, classify, load_saved_model, run_in_batches
    if mode == "text":
        from data_prep.wordpiece.tokenization import FullTokenizer
        loaded_task, runner, vocab, lower = load_saved_model(model, precision=PRECISION)
        runner.warm_up()  # as a server does before it takes requests
        tokenizer = FullTokenizer(vocab, lower)

        def serve_text(batch):
            answers = classify(loaded_task, runner, tokenizer, [{"text": t} for t in batch])
            return {"labels": np.array([a["label"] for a in answers])}
        return serve_text
    runner = SavedModelRunner(model, PRECISION)
    runner.warm_up()
    extra = ("unique_ids",) if task == "squad" else ()
    keys = ("start_logits", "end_logits") if task == "squad" else ("probabilities",)

    def serve(batch):
        features = _features(batch, max(len(ids) for ids, _ in batch))
        results = run_in_batches(runner, features, extra, batch_size=len(batch))
        return {key: [r[key][:len(ids)].tolist() if task == "squad" else r[key].tolist()
                      for r, (ids, _) in zip(results, batch)] for key in keys}
    return serve


def hf(model, task, mode):
    import torch
    import transformers
    from serving_child import hf_in_precision, load_hf_model
    net = hf_in_precision(load_hf_model(model, task), PRECISION)
    tokenizer = transformers.BertTokenizerFast(os.path.join(model, "vocab.txt"),
                                               do_lower_case=True)

    def run(encoded):
        with torch.inference_mode():
            return net(**encoded)

    if mode == "text":
        def serve_text(batch):
            encoded = tokenizer(list(batch), padding=True, truncation=True, max_length=128,
                                return_tensors="pt")
            logits = run(encoded).logits
            return {"labels": logits.argmax(-1).numpy().astype(str)}
        return serve_text

    def serve(batch):
        longest = max(len(ids) for ids, _ in batch)
        ids = np.zeros((len(batch), longest), np.int64)
        segments, mask = np.zeros_like(ids), np.zeros_like(ids)
        for row, (tokens, types_) in enumerate(batch):
            ids[row, :len(tokens)], segments[row, :len(tokens)] = tokens, types_
            mask[row, :len(tokens)] = 1
        encoded = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(segments),
                   "attention_mask": torch.from_numpy(mask)}
        out = run(encoded)
        if task == "squad":
            lengths = encoded["attention_mask"].sum(-1).tolist()
            return {"start_logits": [row[:n].float().tolist()
                                     for row, n in zip(out.start_logits, lengths)],
                    "end_logits": [row[:n].float().tolist()
                                   for row, n in zip(out.end_logits, lengths)]}
        return {"probabilities": torch.softmax(out.logits.float(), -1).tolist()}
    return serve


def main():
    side, model, task, mode, batch, passes, requests_path, out_path = sys.argv[1:9]
    reply_fd = int(sys.argv[10]) if sys.argv[9:10] == ["--reply_fd"] else None
    batch, passes = int(batch), int(passes)
    with open(requests_path, encoding="utf-8") as reader:
        requests = json.load(reader)
    batches = [requests[i:i + batch] for i in range(0, len(requests), batch)]
    schedule = batches * passes
    started = time.perf_counter()
    serve = (ours if side == "ours" else hf)(model, task, mode)
    loaded = time.perf_counter()
    first = serve(batches[0])
    for warm in batches[1:3]:
        serve(warm)
    latencies, sizes = [], []

    def serve_items(start, stop):
        timed = []
        for chosen in schedule[start:stop]:
            t0 = time.perf_counter()
            serve(chosen)
            timed.append(time.perf_counter() - t0)
            sizes.append(len(chosen))
        latencies.extend(timed)
        return timed

    if reply_fd is None:
        serve_items(0, len(schedule))
    else:
        serve_commands(reply_fd, serve_items)
    with open(out_path, "w", encoding="utf-8") as writer:
        json.dump({"latencies": latencies, "sizes": sizes, "load_seconds": loaded - started,
                   "outputs": {k: (v.tolist() if hasattr(v, "tolist") else v)
                               for k, v in first.items()}}, writer)


if __name__ == "__main__":
    main()
