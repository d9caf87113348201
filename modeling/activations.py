"""Activation functions selected by `BertConfig.hidden_act`.

`gelu` is the exact form x·Φ(x) (what HuggingFace computes for `gelu`); `gelu_new` is the
tanh approximation that Google's original `modeling.py` uses. They differ by up to ~1e-3
per unit, which compounds to a few 1e-3 at the last layer of a 6-layer model, so matching
a reference to 1e-5 needs the right one.
"""
import math

import tensorflow as tf


def gelu(x):
    """Exact GELU: 0.5·x·(1 + erf(x/√2)). `tf.compat.v1.nn` has no gelu; erf is exact."""
    return 0.5 * x * (1.0 + tf.math.erf(x / tf.cast(math.sqrt(2.0), x.dtype)))


def gelu_new(x):
    """Tanh-approximated GELU used by Google's BERT release."""
    cdf = 0.5 * (1.0 + tf.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))
    return x * cdf


_BY_NAME = {
    "gelu": gelu,
    "gelu_new": gelu_new,
    "relu": tf.nn.relu,
    "tanh": tf.tanh,
    "linear": None,
}


def get_activation(name):
    """Maps a config's `hidden_act` string to a function (None for `linear`)."""
    if callable(name):
        return name
    key = str(name).lower()
    if key not in _BY_NAME:
        raise ValueError(f"unsupported activation {name!r}; choose one of {', '.join(_BY_NAME)}")
    return _BY_NAME[key]
