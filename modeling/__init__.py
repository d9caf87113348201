"""Google-compatible BERT in TensorFlow graph mode: config, encoder, pre-training heads.

The names below are loaded when first used, so that `modeling.config` (the config's fields
and their ranges, which commands check while parsing their flags: `training.option_ranges`)
can be read without importing TensorFlow, which a command may import only once its console
is prepared (`cli.command`).
"""
import importlib

_WHERE = {
    "BertConfig": "modeling.config",
    "ConfigError": "modeling.config",
    "named_config": "modeling.config",
    "BertModel": "modeling.bert_model",
    "PackedRows": "modeling.bert_model",
    "gather_indexes": "modeling.core",
    "masked_lm_output": "modeling.pretraining_heads",
    "next_sentence_output": "modeling.pretraining_heads",
}

__all__ = list(_WHERE)


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module 'modeling' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
