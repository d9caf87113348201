"""Answers and labels from a fine-tuned model, from a checkpoint or an exported SavedModel.

The same task objects that trained the model turn raw text into features and outputs back
into answers, so serving and evaluation can never disagree on pre- or post-processing.

Requests cost what they hold: the runners take a batch at its own length (the SavedModel's
`serving_default` accepts any length, `finetuning.serving_graph`), `run_in_batches` pads each
batch only to its longest request, and batches requests of similar lengths together (in
order of length; answers come back in the order asked). A SavedModel exported before that
(a fixed-length `serving_default`) is fed at its one length, as then.
"""
import collections
import json
import os

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError

from finetuning import glue_data, squad_data, squad_postprocess
from finetuning.export import (SEQUENCE_INPUTS, TASK_FILE, check_checkpoint_serves,
                               read_export_metadata)
from finetuning.frozen_session import FREEZE_LIMIT_BYTES, SessionCall, freeze
from finetuning.model_fn import make_model_fn
from finetuning.tasks import ClassifierTask, SquadTask
from modeling.checkpoints import (CheckpointError, check_not_damaged, first_non_finite_variable,
                                  resolve_checkpoint)
from training.model_memory import check_model_fits
from training.settings import TrainingSettings
from training.vocab_fit import check_vocab_fits

tf1 = tf.compat.v1


def task_from_metadata(metadata):
    max_seq_length = metadata["max_seq_length"]
    if metadata["task"] == "squad":
        return SquadTask(max_seq_length=max_seq_length, doc_stride=metadata["doc_stride"],
                         max_query_length=metadata["max_query_length"],
                         n_best_size=metadata["n_best_size"],
                         max_answer_length=metadata["max_answer_length"],
                         version_2_with_negative=metadata["version_2_with_negative"],
                         null_score_diff_threshold=metadata["null_score_diff_threshold"],
                         do_lower_case=metadata["do_lower_case"])
    return ClassifierTask(metadata["task"], None, max_seq_length)


class SavedModelRunner:
    """Calls the `serving_default` signature of an exported SavedModel (`name`: its path).

    The SavedModel is loaded into a graph session of its own and its variables are frozen
    into constants (`freeze`): what a serving call then runs is the pruned graph of that one
    signature, with no variable reads. Measured on a 2-core Zen 5 (all-MiniLM-L6-v2
    classifier, median of alternating fresh processes): 15-20% less time a call at batch 1
    and about 10% at batch 32 than `tf.saved_model.load`'s signature function, the same
    outputs (bench/README.md, "Serving real requests")."""

    def __init__(self, path, precision="fp32"):
        if precision not in SERVING_PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(SERVING_PRECISIONS)}, got "
                             f"{precision!r}")
        check_precision_serves(precision)
        self.name, self.precision = path, precision
        variables = os.path.join(path, "variables", "variables")
        if tf.io.gfile.exists(variables + ".index"):
            check_not_damaged(variables)
            non_finite = first_non_finite_variable(variables)
            if non_finite is not None:
                raise CheckpointError(f"{path}: variable {non_finite} holds a NaN or an infinity (the "
                                      "export of a diverged run's weights?): it answers NaN; "
                                      "export a good checkpoint")
        graph = tf.Graph()
        session = tf1.Session(graph=graph)
        try:
            with graph.as_default():
                meta = tf1.saved_model.loader.load(session, [tf1.saved_model.SERVING], path)
            signature = meta.signature_def["serving_default"]
        except (tf.errors.OpError, OSError, ValueError, DecodeError, KeyError,
                RuntimeError) as err:
            session.close()
            raise CheckpointError(f"{path}: damaged or not a SavedModel "
                                  f"({err.__class__.__name__})") from None
        self._inputs = {name: info.name for name, info in signature.inputs.items()}
        self._outputs = {name: info.name for name, info in signature.outputs.items()}
        length = signature.inputs["input_ids"].tensor_shape.dim[1].size
        # the one length an older export takes, None when any length goes
        self.fixed_length = None if length < 0 else int(length)
        weights = sum(tf.io.gfile.stat(name).length
                      for name in tf.io.gfile.glob(variables + ".data-*"))
        variants = []
        if weights <= FREEZE_LIMIT_BYTES:
            self._session, variants = freeze(session, list(self._outputs.values()), precision)
        elif precision != "fp32":
            raise ValueError(f"{path}: serving precision {precision} needs frozen weights, "
                             f"and this model's {weights / 1024 ** 3:.1f} GiB are more than "
                             f"{FREEZE_LIMIT_BYTES / 1024 ** 3:.1f} GiB: serve it in fp32")
        else:
            self._session = session
        self._call = SessionCall(self._session, self._inputs, self._outputs, variants)

    def __call__(self, inputs):
        return self._call(inputs)

    def warm_up(self):
        """Runs each of the graph's variants once, on [PAD] tokens, for a server to call
        before it takes requests. A variant's first run is when Grappler optimizes its graph
        (~1.5 s for all-MiniLM on 2 cores); the frozen graph has up to three
        (`frozen_session.freeze`), so without this the first call of each size pays it,
        mid-stream (a 1.6 s call among 30 ms ones, measured). The graph as it was runs on one
        token: its float32 weights are then cached in the blocking of the rows it serves
        (`weight_blocking`). A batch job pays the same either way and need not."""
        length = self.fixed_length or 8
        calls = [(1, 1)]  # (batch, real tokens a request): one token, then each variant's least
        for rows, _ in self._call.variants:
            batch = -(-rows.start // length)
            calls.append((batch, -(-rows.start // batch)))
        for batch, real in calls:
            inputs = {name: np.zeros([batch, length] if name in SEQUENCE_INPUTS else [batch],
                                     np.int32) for name in self._inputs}
            inputs["input_mask"][:, :real] = 1
            self._call(inputs)


# fp32: the model as exported; bf16: oneDNN's automatic mixed precision run once on the
# frozen graph (bf16_graph: matmuls in bfloat16, float32 accumulation, the float32 weights
# folded to bfloat16 constants), for CPUs with native bfloat16; int8:
# the encoder's dense layers on oneDNN's int8 matmul, the rest float32 (int8_dense).
SERVING_PRECISIONS = ("fp32", "bf16", "int8")


def serving_precision(choice="auto"):
    """The precision `choice` (auto|fp32|bf16|int8) serves in on this machine. auto: bf16 where
    the CPU multiplies bfloat16 natively (AVX512_BF16, AMX) and no GPU serves, fp32
    elsewhere. On a Zen 5 (AVX512_BF16) bf16 served all-MiniLM's real dev requests faster
    than fp32 at every batch, with the same SST-2 labels and SQuAD F1 within 0.5 of fp32's
    (bench/serving_precision.py, bench/serving_real.py --precision bf16); a CPU without it
    emulates bfloat16 (no faster than fp32, further from it), so fp32 stays its default.
    auto never picks int8: it changes answers more than bf16 does (a quarter of a weak SQuAD
    model's answers, as PyTorch's int8 does; bench/serving_precision.py), so a user chooses it
    for a model whose accuracy they have checked in it."""
    from modeling.core import cpu_has_native_bfloat16
    if choice != "auto":
        if choice not in SERVING_PRECISIONS:
            raise ValueError(f"precision must be auto or one of {', '.join(SERVING_PRECISIONS)}"
                             f", got {choice!r}")
        check_precision_serves(choice)
        return choice
    if cpu_has_native_bfloat16() and not tf.config.list_physical_devices("GPU"):
        return "bf16"
    return "fp32"


def check_precision_serves(precision):
    """Raises ValueError (one line, naming the setting) where this process cannot serve in
    `precision`, before any model loads: bf16 with oneDNN capped below bfloat16 (Grappler's
    rewrite would ask oneDNN for a kernel it no longer has, and TensorFlow aborts the
    process), int8 with neither our int8 kernels nor oneDNN's int8 matmul
    (`int8_dense.int8_unavailable`)."""
    from modeling.core import onednn_capped_below_bfloat16, onednn_isa_cap
    if precision == "bf16" and onednn_capped_below_bfloat16():
        raise ValueError("--precision=bf16: oneDNN is capped below bfloat16 here "
                         f"(ONEDNN_MAX_CPU_ISA={onednn_isa_cap()}): serve in fp32, or unset it")
    if precision == "int8":
        from finetuning.int8_dense import int8_unavailable
        reason = int8_unavailable()
        if reason:
            raise ValueError(f"--precision=int8: {reason}")


class CheckpointRunner:
    """Builds the task's PREDICT graph and restores a fine-tuned checkpoint into it, once
    `check_checkpoint_serves` found all of the graph's variables there and finite (`name`:
    the checkpoint's prefix)."""

    fixed_length = None  # any length (at most the model's max_seq_length)

    def __init__(self, task, config, checkpoint, max_seq_length, compute_type="float32"):
        self._graph = tf.Graph()
        with self._graph.as_default():
            self._inputs = {name: tf1.placeholder(tf.int32, [None, None], name)
                            for name in SEQUENCE_INPUTS}
            for name in task.extra_serving_inputs:
                self._inputs[name] = tf1.placeholder(tf.int32, [None], name)
            settings = TrainingSettings(bert_config=config, compute_type=compute_type)
            spec = make_model_fn(task, settings)(dict(self._inputs), None,
                                                 tf.estimator.ModeKeys.PREDICT)
            self._outputs = spec.predictions
            self._session = tf1.Session(graph=self._graph)
            prefix = self.name = resolve_checkpoint(checkpoint)
            trainable = {v.op.name for v in tf1.trainable_variables()}
            check_checkpoint_serves(
                prefix, task, {v.op.name: v.op.name in trainable for v in tf1.global_variables()},
                f"fine-tune it first ({_finetuning_command(task)} --do_train), then pass "
                "that checkpoint or its SavedModel (--saved_model)",
                "refusing to answer with it: pass an earlier checkpoint")
            tf1.train.Saver().restore(self._session, prefix)
        self._call = SessionCall(self._session,
                                 {name: tensor.name for name, tensor in self._inputs.items()},
                                 {name: tensor.name for name, tensor in self._outputs.items()})

    def __call__(self, inputs):
        return self._call(inputs)


def _finetuning_command(task):
    """The command that fine-tunes a model of `task`, for messages."""
    if isinstance(task, SquadTask):
        return "bert-squad"
    return f"bert-glue --task_name={task.name}"


class NonFiniteOutputError(ValueError):
    """The model gave a NaN or an infinity for query `query_index` (its position in the
    items asked): printed, it would be invalid JSON and a meaningless answer."""

    def __init__(self, query_index, output):
        self.query_index = query_index
        super().__init__(f"the model's {output} came out NaN or infinite (an overflow inside "
                         "the model?): no answer given")


# Serving input name -> attribute of the task's feature objects.
_FEATURE_ATTRIBUTE = {"unique_ids": "unique_id"}


def request_length(feature):
    """The tokens a feature holds ([CLS] ... [SEP], without padding)."""
    return max(1, int(np.count_nonzero(feature.input_mask)))


def run_in_batches(runner, features, extra_inputs=(), batch_size=32):
    """Runs `features` (objects with input_ids/input_mask/segment_ids) through `runner`;
    returns one dict of numpy arrays per feature, in their order. Where the runner takes any
    length (`runner.fixed_length` None), requests are batched in order of length and each
    batch is cut to its longest request (outputs per position, SQuAD's logits, then hold that
    many). Raises NonFiniteOutputError for the first feature with a NaN or infinite output
    (its query: the feature's `example_index`, SQuAD's windows, or its position)."""
    dynamic = getattr(runner, "fixed_length", None) is None
    lengths = [request_length(f) for f in features] if dynamic else None
    order = (sorted(range(len(features)), key=lengths.__getitem__) if dynamic
             else list(range(len(features))))
    results, broken = [None] * len(features), []
    for start in range(0, len(order), batch_size):
        chosen = order[start:start + batch_size]
        batch = [features[i] for i in chosen]
        cut = max(lengths[i] for i in chosen) if dynamic else None
        inputs = {name: np.array([getattr(f, name)[:cut] for f in batch], np.int32)
                  for name in SEQUENCE_INPUTS}
        for name in extra_inputs:  # SQuAD's unique_ids
            inputs[name] = np.array([getattr(f, _FEATURE_ATTRIBUTE[name]) for f in batch],
                                    np.int32)
        outputs = runner(inputs)
        for name, value in outputs.items():
            if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
                bad = np.flatnonzero(~np.isfinite(value.reshape(len(batch), -1)).all(1))
                broken.extend((chosen[position], name) for position in bad)
        for position, index in enumerate(chosen):
            results[index] = {k: v[position] for k, v in outputs.items()}
    if broken:  # the first in the order asked, whichever batch found it
        index, name = min(broken)
        raise NonFiniteOutputError(getattr(features[index], "example_index", index), name)
    return results


def query_fields(task):
    """(fields a query needs, what to call the model in messages) for `task`'s model."""
    if isinstance(task, SquadTask):
        return ("question", "context"), "a SQuAD model"
    return ("text",), f"a {task.name} classifier"


def check_query(task, item, where, spell=repr):
    """Raises ValueError(`where: ...`) when `item` is not a query `task`'s model can answer.

    Why: a classifier query sent to a SQuAD model used to fail with `error: 'context'`, and an
    empty question or context was answered ("empty", probability 1.0), a confident answer to
    nothing.  `spell` names a field in the message the way the user wrote it (`--context`
    on the command line, `'context'` in a JSON lines file).
    """
    fields, model = query_fields(task)
    if not isinstance(item, dict):
        raise ValueError(f"{where}: not a JSON object; {model} needs "
                         f"{' and '.join(map(spell, fields))}")
    missing = [f for f in fields if not isinstance(item.get(f), str)]
    if missing:
        raise ValueError(f"{where}: {model} needs {' and '.join(map(spell, fields))} "
                         f"(missing {', '.join(map(spell, missing))})")
    empty = [f for f in fields if not item[f].strip()]
    if empty:
        raise ValueError(f"{where}: {' and '.join(map(spell, empty))} is empty; {model} "
                         "has nothing to answer from")
    for field in QUERY_FIELDS:
        problem = not_unicode_text(item.get(field))
        if problem:
            raise ValueError(f"{where}: {spell(field)} {problem}")


# Every text field a query may have (what `check_query` checks).
QUERY_FIELDS = ("question", "context", "text", "text_b")


def not_unicode_text(value):
    """What makes the string `value` not text the tokenizer and a UTF-8 stdout can take
    (`is not ... text (...)`), or None: a lone surrogate, which is how Python holds a
    command-line byte that is not UTF-8 (`\\udcff` for the byte 0xff) or what a JSON
    `\\ud800` escape gives. Why: such a query ended in a TypeError traceback from the
    tokenizer."""
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        code, where = ord(value[err.start]), f"at character {err.start + 1}"
        if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: an undecodable byte
            return f"is not UTF-8 text (byte 0x{code - 0xDC00:02x} {where})"
        return f"is not Unicode text (lone surrogate \\u{code:04x} {where})"
    return None


def count_windows(features):
    """{example index: number of max_seq_length windows its context was split into}."""
    return collections.Counter(feature.example_index for feature in features)


def describe_windows(task, example, windows):
    """One line saying how a long context was split, so a slow answer has a reason."""
    return (f"question {example.qas_id}: the context of {len(example.doc_tokens)} words is "
            f"split into {windows} windows (max_seq_length={task.max_seq_length}, "
            f"doc_stride={task.doc_stride}), one model run each")


def answer_questions(task, runner, tokenizer, items, note=None):
    """items: dicts with `question`, `context` (and optional `id`). Returns dicts with the
    answer text, its probability among the n-best and its logits.

    `note(line)`, if given, is told about every context split into more than one window.
    """
    paragraphs = [{"context": item["context"],
                   "qas": [{"id": str(item.get("id", index)), "question": item["question"]}]}
                  for index, item in enumerate(items)]
    examples, _ = squad_data.parse_squad_examples({"data": [{"paragraphs": paragraphs}]},
                                                  is_training=False, source="<input>")
    features = task.make_features(examples, tokenizer, is_training=False)
    if note is not None:
        for index, windows in sorted(count_windows(features).items()):
            if windows > 1:
                note(describe_windows(task, examples[index], windows))
    raw = run_in_batches(runner, features, task.extra_serving_inputs)
    results = [squad_postprocess.RawResult(int(r["unique_ids"]), r["start_logits"],
                                           r["end_logits"]) for r in raw]
    predictions, nbest, _ = squad_postprocess.write_predictions(
        examples, features, results, task.n_best_size, task.max_answer_length,
        task.do_lower_case, None, None, None, task.version_2_with_negative,
        task.null_score_diff_threshold)
    answers = []
    for example in examples:
        best = nbest[example.qas_id][0]
        answers.append({"id": example.qas_id, "answer": predictions[example.qas_id],
                        "probability": float(best["probability"]),
                        "start_logit": float(best["start_logit"]),
                        "end_logit": float(best["end_logit"])})
    return answers


def classify(task, runner, tokenizer, items):
    """items: dicts with `text` (and optional `text_b`). Returns label and probabilities
    (or the predicted score for regression)."""
    placeholder = 0.0 if task.is_regression else task.labels[0]
    examples = [glue_data.InputExample(str(index), item["text"], item.get("text_b"), placeholder)
                for index, item in enumerate(items)]
    features = task.make_features(examples, tokenizer)
    outputs = run_in_batches(runner, features)
    if task.is_regression:
        return [{"score": float(o["predictions"])} for o in outputs]
    return [{"label": task.labels[int(np.argmax(o["probabilities"]))],
             "probabilities": {label: float(p) for label, p in
                               zip(task.labels, o["probabilities"])}} for o in outputs]


def predict(task, runner, tokenizer, items, note=None):
    """Dispatches on the task: SQuAD answers or classifier labels (`note`: see
    `answer_questions`)."""
    if isinstance(task, SquadTask):
        return answer_questions(task, runner, tokenizer, items, note)
    return classify(task, runner, tokenizer, items)


def load_saved_model(path, tokenizer=None, precision="fp32"):
    """(task, runner, vocab_file, do_lower_case) of a SavedModel exported by the driver,
    served in `precision` (SERVING_PRECISIONS).
    `tokenizer`: the one the caller will use (e.g. of a --vocab_file given instead of the
    SavedModel's own), checked against the vocab_size the export recorded (exports made
    before it was recorded: not checked) before the model is loaded."""
    metadata, vocab = read_export_metadata(path)
    if tokenizer is not None and "vocab_size" in metadata:
        check_vocab_fits(tokenizer, metadata["vocab_size"],
                         os.path.join(path, "assets.extra", TASK_FILE))
    return (task_from_metadata(metadata), SavedModelRunner(path, precision), vocab,
            metadata["do_lower_case"])


def read_query_file(path):
    """[(`file:line`, query dict)] of a JSON-lines file, blank lines skipped; a line that is
    not UTF-8 or not JSON raises ValueError naming the file and line (read as bytes and
    decoded line by line: decoding the whole file named neither)."""
    queries = []
    with open(path, "rb") as reader:
        for number, raw in enumerate(reader, 1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}:{number}: not UTF-8 text (byte 0x{raw[err.start]:02x} "
                                 f"at byte {err.start + 1} of the line)") from None
            if not line.strip():
                continue
            try:
                queries.append((f"{path}:{number}", json.loads(line)))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not JSON ({err.msg})") from None
    return queries


def load_checkpoint_model(init_checkpoint, bert_config_file, task_name, max_seq_length,
                          do_lower_case, doc_stride, max_query_length, version_2_with_negative,
                          tokenizer=None):
    """(task, CheckpointRunner) for a fine-tuned checkpoint, with the settings a SavedModel
    would carry in its metadata given explicitly. `tokenizer`: the one the caller will use,
    whose vocabulary must fit the config's vocab_size (checked before the graph is built)."""
    from modeling import BertConfig
    metadata = {"task": task_name.lower(), "max_seq_length": max_seq_length,
                "do_lower_case": do_lower_case, "doc_stride": doc_stride,
                "max_query_length": max_query_length, "n_best_size": 20,
                "max_answer_length": 30, "version_2_with_negative": version_2_with_negative,
                "null_score_diff_threshold": 0.0}
    task = task_from_metadata(metadata)
    config = BertConfig.from_json_file(bert_config_file)
    check_model_fits(config, bert_config_file, training=False)  # before any weight is built
    if tokenizer is not None:
        check_vocab_fits(tokenizer, config.vocab_size, bert_config_file)
    return task, CheckpointRunner(task, config, init_checkpoint, max_seq_length)
