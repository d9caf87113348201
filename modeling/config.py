"""`BertConfig`: the hyper-parameters of a BERT encoder, read from and written to Google's JSON.

The JSON keys are exactly those of Google's released `bert_config.json` files, so a config
from a Google checkpoint loads unchanged and ours load in Google's code. Every problem with a
config file is reported as one line naming the file and the key, because a shape error deep
inside a TensorFlow graph a minute into a run says neither.
"""
import copy
import json
import os

ACTIVATIONS = ("gelu", "gelu_new", "relu", "tanh", "linear")


class ConfigError(ValueError):
    """A BERT config is unreadable or describes an impossible model."""


# key -> (type, default). A key without a default must be present in a config file.
_SCHEMA = {
    "vocab_size": (int, None),
    "hidden_size": (int, 768),
    "num_hidden_layers": (int, 12),
    "num_attention_heads": (int, 12),
    "intermediate_size": (int, 3072),
    "hidden_act": (str, "gelu"),
    "hidden_dropout_prob": (float, 0.1),
    "attention_probs_dropout_prob": (float, 0.1),
    "max_position_embeddings": (int, 512),
    "type_vocab_size": (int, 16),
    "initializer_range": (float, 0.02),
}
# Keys that must appear in a JSON file (Google's files always carry all of them except
# that some omit nothing; we only insist on the ones whose defaults could silently mislead).
_REQUIRED_IN_FILE = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size")


class BertConfig:
    """Configuration of a `BertModel` (Google's field names and defaults).

    Extra keys found in a JSON file (HuggingFace adds e.g. `layer_norm_eps`, `model_type`)
    are kept in `extra` and written back, so a round trip loses nothing.
    """

    def __init__(self, vocab_size, hidden_size=768, num_hidden_layers=12,
                 num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                 max_position_embeddings=512, type_vocab_size=16, initializer_range=0.02,
                 layer_norm_eps=1e-12, source="<BertConfig>", **extra):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.extra = extra
        self.validate(source)

    # ---------------------------------------------------------------- validation
    def validate(self, source="<BertConfig>"):
        """Raises `ConfigError("<source>: <key>: <problem>")` for an impossible model."""
        def fail(key, problem):
            raise ConfigError(f"{source}: {key}: {problem}")

        for key, (kind, _) in _SCHEMA.items():
            value = getattr(self, key)
            if kind is int:
                if isinstance(value, bool) or not isinstance(value, int):
                    fail(key, f"must be an integer, got {value!r}")
                if value <= 0:
                    fail(key, f"must be positive, got {value}")
            elif kind is float:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    fail(key, f"must be a number, got {value!r}")
            elif not isinstance(value, kind):
                fail(key, f"must be a {kind.__name__}, got {value!r}")
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, key) < 1.0:
                fail(key, f"must be in [0, 1), got {getattr(self, key)}")
        if self.initializer_range <= 0:
            fail("initializer_range", f"must be positive, got {self.initializer_range}")
        if self.hidden_act not in ACTIVATIONS:
            fail("hidden_act", f"unknown activation {self.hidden_act!r}; "
                               f"choose one of {', '.join(ACTIVATIONS)}")
        if self.hidden_size % self.num_attention_heads:
            fail("num_attention_heads",
                 f"hidden_size {self.hidden_size} is not divisible by "
                 f"num_attention_heads {self.num_attention_heads}")
        if not isinstance(self.layer_norm_eps, (int, float)) or self.layer_norm_eps <= 0:
            fail("layer_norm_eps", f"must be a positive number, got {self.layer_norm_eps!r}")

    # ---------------------------------------------------------------- (de)serialisation
    @classmethod
    def from_dict(cls, json_object, source="<dict>"):
        if not isinstance(json_object, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(json_object).__name__}")
        values = dict(json_object)
        return cls(source=source, **values)

    @classmethod
    def from_json_file(cls, json_file):
        """Reads a config file; every failure names the file (and the key)."""
        try:
            with open(json_file, "r", encoding="utf-8") as reader:
                text = reader.read()
        except FileNotFoundError:
            raise ConfigError(f"{json_file}: no such config file") from None
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"{json_file}: cannot read config: {err}") from None
        try:
            values = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{json_file}: invalid JSON at line {err.lineno} "
                              f"column {err.colno}: {err.msg}") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{json_file}: expected a JSON object")
        for key in _REQUIRED_IN_FILE:
            if key not in values:
                raise ConfigError(f"{json_file}: {key}: missing")
        return cls.from_dict(values, source=json_file)

    def to_dict(self):
        output = {key: getattr(self, key) for key in _SCHEMA}
        if self.layer_norm_eps != 1e-12:
            output["layer_norm_eps"] = self.layer_norm_eps
        output.update(copy.deepcopy(self.extra))
        return output

    def to_json_string(self):
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def to_json_file(self, json_file):
        """Writes atomically: a crash never leaves a half-written config behind."""
        tmp = f"{json_file}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as writer:
            writer.write(self.to_json_string())
        os.replace(tmp, json_file)

    def replace(self, **changes):
        """A copy with some fields changed (e.g. dropout off for inference)."""
        values = self.to_dict()
        values.update(changes)
        return BertConfig(**values)

    @property
    def head_size(self):
        return self.hidden_size // self.num_attention_heads

    def __eq__(self, other):
        return isinstance(other, BertConfig) and self.to_dict() == other.to_dict()

    def __repr__(self):
        return f"BertConfig({self.to_dict()})"


CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def named_config(name):
    """The shipped config `name` (`base`, `large`, `mini`, `tiny`), e.g. for scripts' `bert_model`
    arg."""
    path = os.path.join(CONFIG_DIR, f"bert_{name}_config.json")
    if not os.path.isfile(path):
        shipped = sorted(f[5:-12] for f in os.listdir(CONFIG_DIR) if f.endswith("_config.json"))
        raise ConfigError(f"{path}: no shipped config named {name!r} (have: {', '.join(shipped)})")
    return BertConfig.from_json_file(path)
