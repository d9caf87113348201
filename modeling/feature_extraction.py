"""Per-token contextual embeddings from a BERT checkpoint, in Google's JSON-lines format.

Input: one example a line, `text_a` or `text_a ||| text_b`. Output: one JSON object a line,
    {"linex_index": i, "features": [{"token": "[CLS]",
                                     "layers": [{"index": -1, "values": [..]}, ...]}, ...]}
with values rounded to 6 decimals, exactly as Google's `extract_features.py` writes them, so
tools built for that format read ours.
"""
import collections
import json
import os

import numpy as np
import tensorflow as tf

from modeling.bert_model import BertModel
from modeling.checkpoints import init_from_checkpoint

tf1 = tf.compat.v1

InputExample = collections.namedtuple("InputExample", "unique_id text_a text_b")
InputFeatures = collections.namedtuple("InputFeatures",
                                       "unique_id tokens input_ids input_mask input_type_ids")


def read_examples(input_file):
    """Reads `text_a [||| text_b]` lines (UTF-8); blank lines are skipped, ids stay line-based."""
    examples = []
    with open(input_file, "r", encoding="utf-8") as reader:
        for unique_id, line in enumerate(reader):
            line = line.strip()
            if not line:
                continue
            text_a, _, text_b = line.partition(" ||| ")
            examples.append(InputExample(unique_id, text_a, text_b or None))
    return examples


def truncate_pair(tokens_a, tokens_b, max_length):
    """Pops tokens from the longer sequence until the pair fits (in place)."""
    while len(tokens_a) + len(tokens_b) > max_length:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        longer.pop()


def convert_examples_to_features(examples, seq_length, tokenizer):
    """[CLS] a [SEP] (b [SEP]) -> padded id arrays of length `seq_length`."""
    features = []
    for example in examples:
        tokens_a = tokenizer.tokenize(example.text_a)
        tokens_b = tokenizer.tokenize(example.text_b) if example.text_b else []
        if example.text_b:
            truncate_pair(tokens_a, tokens_b, seq_length - 3)
        else:
            tokens_a = tokens_a[:seq_length - 2]
        tokens = ["[CLS]"] + tokens_a + ["[SEP]"]
        type_ids = [0] * len(tokens)
        if tokens_b:
            tokens += tokens_b + ["[SEP]"]
            type_ids += [1] * (len(tokens_b) + 1)
        ids = tokenizer.convert_tokens_to_ids(tokens)
        pad = seq_length - len(ids)
        features.append(InputFeatures(example.unique_id, tokens, ids + [0] * pad,
                                      [1] * len(ids) + [0] * pad, type_ids + [0] * pad))
    return features


def extract_features(config, init_checkpoint, tokenizer, input_file, output_file, layers,
                     max_seq_length=128, batch_size=32, compute_type="float32"):
    """Writes the JSON lines for `input_file` to `output_file` (atomically). Returns the count."""
    examples = read_examples(input_file)
    features = convert_examples_to_features(examples, max_seq_length, tokenizer)
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int32, [None, max_seq_length], "input_ids")
        mask = tf1.placeholder(tf.int32, [None, max_seq_length], "input_mask")
        types = tf1.placeholder(tf.int32, [None, max_seq_length], "input_type_ids")
        model = BertModel(config, False, ids, mask, types, compute_type=compute_type)
        init_from_checkpoint(init_checkpoint)
        all_layers = model.get_all_encoder_layers()
        for index in layers:
            if not -len(all_layers) <= index < len(all_layers):
                raise ValueError(f"--layers: {index} is outside the model's "
                                 f"{len(all_layers)} layers")
        fetch = [all_layers[index] for index in layers]
        tmp_path = f"{output_file}.tmp-{os.getpid()}"
        try:
            with tf1.Session() as session, open(tmp_path, "w", encoding="utf-8") as writer:
                session.run(tf1.global_variables_initializer())
                for start in range(0, len(features), batch_size):
                    batch = features[start:start + batch_size]
                    values = session.run(fetch, {
                        ids: np.array([f.input_ids for f in batch]),
                        mask: np.array([f.input_mask for f in batch]),
                        types: np.array([f.input_type_ids for f in batch])})
                    for row, feature in enumerate(batch):
                        writer.write(json.dumps(_feature_json(feature, layers, values, row)) + "\n")
            os.replace(tmp_path, output_file)
        finally:
            if os.path.exists(tmp_path):
                os.remove(tmp_path)
    return len(features)


def _feature_json(feature, layers, values, row):
    """One output line: every token with the requested layers' values at its position."""
    tokens = []
    for position, token in enumerate(feature.tokens):
        token_layers = [
            collections.OrderedDict([
                ("index", layer),
                ("values", [round(float(x), 6) for x in layer_values[row, position]])])
            for layer, layer_values in zip(layers, values)]
        tokens.append(collections.OrderedDict([("token", token), ("layers", token_layers)]))
    return collections.OrderedDict([("linex_index", feature.unique_id), ("features", tokens)])
