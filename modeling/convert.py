"""Converts between HuggingFace BERT folders and Google-format TensorFlow checkpoints.

    bert-convert-checkpoint hf2tf --hf_dir DIR --output_dir OUT
        DIR holds config.json, vocab.txt and model.safetensors (or pytorch_model.bin);
        OUT gets bert_model.ckpt.{index,data-*}, bert_config.json and vocab.txt.
    bert-convert-checkpoint tf2hf --tf_checkpoint CKPT --bert_config_file CFG \
        --vocab_file VOCAB --output_dir OUT
        OUT gets model.safetensors, config.json and vocab.txt, loadable by
        transformers.BertModel / BertForPreTraining.

Only the mapping of names and layouts lives here: HuggingFace stores Linear weights as
[out, in] and Google as [in, out], and names LayerNorm parameters weight/bias (or gamma/beta
in old files) where Google has gamma/beta. Output folders are written under a temporary name
and renamed when complete.
"""
import json
import os
import re
import shutil
import sys

import numpy as np

from modeling.config import BertConfig

CHECKPOINT_NAME = "bert_model.ckpt"


class ConversionError(ValueError):
    """An input folder or checkpoint cannot be converted."""


# (HF key template, Google name template, transpose). HF keys are matched with any `bert.`
# prefix removed and old LayerNorm names (gamma/beta) renamed to weight/bias. A placeholder
# stands for the same value on both sides, with HF's dots written as Google's slashes.
_PLACEHOLDERS = {"n": r"\d+", "qkv": r"query|key|value",
                 "dense_block": r"attention\.output|intermediate|output",
                 "norm_block": r"attention\.output|output"}
_RULES = [
    ("embeddings.word_embeddings.weight", "bert/embeddings/word_embeddings", False),
    ("embeddings.position_embeddings.weight", "bert/embeddings/position_embeddings", False),
    ("embeddings.token_type_embeddings.weight", "bert/embeddings/token_type_embeddings", False),
    ("embeddings.LayerNorm.weight", "bert/embeddings/LayerNorm/gamma", False),
    ("embeddings.LayerNorm.bias", "bert/embeddings/LayerNorm/beta", False),
    ("encoder.layer.{n}.attention.self.{qkv}.weight",
     "bert/encoder/layer_{n}/attention/self/{qkv}/kernel", True),
    ("encoder.layer.{n}.attention.self.{qkv}.bias",
     "bert/encoder/layer_{n}/attention/self/{qkv}/bias", False),
    ("encoder.layer.{n}.{dense_block}.dense.weight",
     "bert/encoder/layer_{n}/{dense_block}/dense/kernel", True),
    ("encoder.layer.{n}.{dense_block}.dense.bias",
     "bert/encoder/layer_{n}/{dense_block}/dense/bias", False),
    ("encoder.layer.{n}.{norm_block}.LayerNorm.weight",
     "bert/encoder/layer_{n}/{norm_block}/LayerNorm/gamma", False),
    ("encoder.layer.{n}.{norm_block}.LayerNorm.bias",
     "bert/encoder/layer_{n}/{norm_block}/LayerNorm/beta", False),
    ("pooler.dense.weight", "bert/pooler/dense/kernel", True),
    ("pooler.dense.bias", "bert/pooler/dense/bias", False),
    ("cls.predictions.transform.dense.weight", "cls/predictions/transform/dense/kernel", True),
    ("cls.predictions.transform.dense.bias", "cls/predictions/transform/dense/bias", False),
    ("cls.predictions.transform.LayerNorm.weight", "cls/predictions/transform/LayerNorm/gamma", False),
    ("cls.predictions.transform.LayerNorm.bias", "cls/predictions/transform/LayerNorm/beta", False),
    ("cls.predictions.bias", "cls/predictions/output_bias", False),
    ("cls.seq_relationship.weight", "cls/seq_relationship/output_weights", False),
    ("cls.seq_relationship.bias", "cls/seq_relationship/output_bias", False),
    # Fine-tuned heads: sequence classification and SQuAD span prediction.
    ("classifier.weight", "output_weights", False),
    ("classifier.bias", "output_bias", False),
    ("qa_outputs.weight", "cls/squad/output_weights", False),
    ("qa_outputs.bias", "cls/squad/output_bias", False),
]
# HF keys with no Google counterpart: buffers and the decoder tied to the word embeddings.
_IGNORED = re.compile(r"(position_ids|cls\.predictions\.decoder\.(weight|bias))$")


def _template_regex(template, separator):
    """'encoder.layer.{n}.x' -> a regex with a named group per placeholder."""
    parts = re.split(r"\{(\w+)\}", template)
    regex = ""
    for index, part in enumerate(parts):
        if index % 2:
            alternatives = _PLACEHOLDERS[part]
            if separator == "/":
                alternatives = alternatives.replace("\\.", "/")
            regex += f"(?P<{part}>{alternatives})"
        else:
            regex += re.escape(part)
    return re.compile(regex + "$")


_HF_TO_GOOGLE = [(_template_regex(hf, "."), google, t) for hf, google, t in _RULES]
_GOOGLE_TO_HF = [(_template_regex(google, "/"), hf, t) for hf, google, t in _RULES]


def _normalise_hf_key(hf_key):
    key = hf_key[len("bert."):] if hf_key.startswith("bert.") else hf_key
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight",
                  re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))


def hf_to_google_name(hf_key):
    """(google_name, transpose) for a HuggingFace state-dict key; None if it has no twin."""
    key = _normalise_hf_key(hf_key)
    if _IGNORED.search(key):
        return None
    for regex, template, transpose in _HF_TO_GOOGLE:
        match = regex.match(key)
        if match:
            values = {k: v.replace(".", "/") for k, v in match.groupdict().items()}
            return template.format(**values), transpose
    raise ConversionError(f"no Google BERT name for HuggingFace weight {hf_key!r}")


def google_to_hf_name(google_name):
    """(hf_key, transpose) for a Google variable name (encoder keys with the `bert.` prefix
    of HF's BertForPreTraining); None for names outside the model."""
    for regex, template, transpose in _GOOGLE_TO_HF:
        match = regex.match(google_name)
        if match:
            values = {k: v.replace("/", ".") for k, v in match.groupdict().items()}
            key = template.format(**values)
            if key.startswith(("embeddings", "encoder", "pooler")):
                key = "bert." + key
            return key, transpose
    return None


# --------------------------------------------------------------------------- readers/writers
def read_hf_weights(hf_dir):
    """{key: float32 numpy array} from model.safetensors or pytorch_model.bin."""
    safetensors_path = os.path.join(hf_dir, "model.safetensors")
    torch_path = os.path.join(hf_dir, "pytorch_model.bin")
    if os.path.isfile(safetensors_path):
        from safetensors.numpy import load_file
        try:
            weights = load_file(safetensors_path)
        except Exception as err:  # safetensors raises its own error types
            raise ConversionError(f"{safetensors_path}: unreadable safetensors file: {err}") from None
    elif os.path.isfile(torch_path):
        try:
            import torch
        except ImportError:
            raise ConversionError(f"{torch_path}: reading pytorch_model.bin needs torch "
                                  "(pip install torch), or convert it to safetensors") from None
        state = torch.load(torch_path, map_location="cpu", weights_only=True)
        weights = {k: v.float().numpy() for k, v in state.items()}
    else:
        raise ConversionError(f"{hf_dir}: no model.safetensors or pytorch_model.bin")
    return {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}


def config_from_hf(hf_config_path):
    """A BertConfig from HuggingFace's config.json (same keys plus extras)."""
    try:
        with open(hf_config_path, encoding="utf-8") as reader:
            values = json.load(reader)
    except FileNotFoundError:
        raise ConversionError(f"{hf_config_path}: missing") from None
    except json.JSONDecodeError as err:
        raise ConversionError(f"{hf_config_path}: invalid JSON: {err.msg}") from None
    if values.get("model_type", "bert") != "bert":
        raise ConversionError(f"{hf_config_path}: model_type {values['model_type']!r} is not bert")
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size", "hidden_act", "hidden_dropout_prob",
            "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
            "initializer_range", "layer_norm_eps")
    return BertConfig.from_dict({k: values[k] for k in keep if k in values}, source=hf_config_path)


def config_to_hf(config, architecture="BertForPreTraining", num_labels=None):
    """HuggingFace's config.json for `config`; `num_labels` for a classifier's head (1: a
    regression such as STS-B, which HF then trains and scores as one)."""
    values = {k: v for k, v in config.to_dict().items()}
    values.update({"architectures": [architecture], "model_type": "bert",
                   "layer_norm_eps": config.layer_norm_eps, "pad_token_id": 0,
                   "position_embedding_type": "absolute"})
    if num_labels is not None:
        values["id2label"] = {str(index): f"LABEL_{index}" for index in range(num_labels)}
        values["label2id"] = {f"LABEL_{index}": index for index in range(num_labels)}
    return values


def hf_architecture(weights):
    """The HuggingFace model class whose keys `weights` (HF names) hold: the heads decide.
    A fine-tuned classifier or SQuAD model must name its task's class (and a classifier its
    number of labels), or AutoModel and HF's pipelines build another model around it."""
    if "cls.predictions.bias" in weights:
        return "BertForPreTraining"
    if "classifier.weight" in weights:
        return "BertForSequenceClassification"
    if "qa_outputs.weight" in weights:
        return "BertForQuestionAnswering"
    return "BertModel"


def write_tf_checkpoint(variables, checkpoint_prefix):
    """Saves {name: numpy array} as a TF1 checkpoint with exactly those variable names."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        tf_vars = [tf1.get_variable(name, shape=value.shape, dtype=tf.float32,
                                    initializer=tf1.zeros_initializer())
                   for name, value in variables.items()]
        saver = tf1.train.Saver(tf_vars)
        with tf1.Session() as session:
            for variable, value in zip(tf_vars, variables.values()):
                session.run(variable.initializer, {variable.initial_value: value})
            saver.save(session, checkpoint_prefix, write_meta_graph=False,
                       write_state=False)


def read_tf_checkpoint(checkpoint):
    """{name: numpy array} of every model variable (optimizer slots and counters skipped)."""
    import tensorflow as tf
    from modeling.checkpoints import is_model_variable, resolve_checkpoint
    prefix = resolve_checkpoint(checkpoint)
    reader = tf.train.load_checkpoint(prefix)
    names = sorted(reader.get_variable_to_shape_map())
    return {name: reader.get_tensor(name) for name in names if is_model_variable(name)}


def _replace_dir(tmp_dir, output_dir):
    if os.path.isdir(output_dir):
        shutil.rmtree(output_dir)
    os.replace(tmp_dir, output_dir)


def hf_to_tf(hf_dir, output_dir):
    """HuggingFace folder -> Google checkpoint folder. Returns the checkpoint prefix."""
    config = config_from_hf(os.path.join(hf_dir, "config.json"))
    vocab = os.path.join(hf_dir, "vocab.txt")
    if not os.path.isfile(vocab):
        raise ConversionError(f"{hf_dir}: no vocab.txt")
    variables = {}
    for key, value in read_hf_weights(hf_dir).items():
        mapped = hf_to_google_name(key)
        if mapped is None:
            continue
        name, transpose = mapped
        variables[name] = value.T.copy() if transpose else value
    expected = config.vocab_size, config.hidden_size
    table = variables.get("bert/embeddings/word_embeddings")
    if table is None or tuple(table.shape) != expected:
        raise ConversionError(f"{hf_dir}: word embeddings {None if table is None else table.shape} "
                              f"do not match config {expected}")
    tmp_dir = f"{output_dir.rstrip('/')}.tmp-{os.getpid()}"
    os.makedirs(tmp_dir, exist_ok=True)
    write_tf_checkpoint(variables, os.path.join(tmp_dir, CHECKPOINT_NAME))
    config.to_json_file(os.path.join(tmp_dir, "bert_config.json"))
    shutil.copyfile(vocab, os.path.join(tmp_dir, "vocab.txt"))
    _replace_dir(tmp_dir, output_dir)
    return os.path.join(output_dir, CHECKPOINT_NAME)


def tf_to_hf(tf_checkpoint, bert_config_file, vocab_file, output_dir):
    """Google checkpoint -> HuggingFace folder (safetensors), loadable by the HF class its heads
    call for (`hf_architecture`: BertForPreTraining, BertForSequenceClassification,
    BertForQuestionAnswering or BertModel). Returns output_dir."""
    from safetensors.numpy import save_file
    config = BertConfig.from_json_file(bert_config_file)
    weights = {}
    for name, value in read_tf_checkpoint(tf_checkpoint).items():
        mapped = google_to_hf_name(name)
        if mapped is None:
            continue
        key, transpose = mapped
        weights[key] = np.ascontiguousarray(value.T if transpose else value)
    if "cls.predictions.bias" in weights:  # HF's decoder is tied to the word embeddings
        weights["cls.predictions.decoder.weight"] = weights["bert.embeddings.word_embeddings.weight"]
        weights["cls.predictions.decoder.bias"] = weights["cls.predictions.bias"]
    architecture = hf_architecture(weights)
    if architecture == "BertModel":  # plain encoder: HF expects keys without the prefix
        weights = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in weights.items()}
    num_labels = (weights["classifier.weight"].shape[0]
                  if architecture == "BertForSequenceClassification" else None)
    tmp_dir = f"{output_dir.rstrip('/')}.tmp-{os.getpid()}"
    os.makedirs(tmp_dir, exist_ok=True)
    save_file(weights, os.path.join(tmp_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp_dir, "config.json"), "w", encoding="utf-8") as writer:
        json.dump(config_to_hf(config, architecture, num_labels), writer, indent=2,
                  sort_keys=True)
    shutil.copyfile(vocab_file, os.path.join(tmp_dir, "vocab.txt"))
    _replace_dir(tmp_dir, output_dir)
    return output_dir


if __name__ == "__main__":  # the library imports no command; its command line is elsewhere
    sys.exit("error: the converter's command is `bert-convert-checkpoint` or "
             "`python -m cli.convert_checkpoint` (modeling.convert is its library)")
