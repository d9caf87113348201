"""`BertConfig`: the hyper-parameters of a BERT encoder, read from and written to Google's JSON.

The JSON keys are exactly those of Google's released `bert_config.json` files, so a config
from a Google checkpoint loads unchanged and ours load in Google's code. Every problem with a
config file is reported as one line naming the file and the key, because a shape error deep
inside a TensorFlow graph a minute into a run says neither.

Every size has a range (`SIZE_LIMITS`), so a typo such as `"vocab_size": 1000000000000`
is refused where the file is read, in one line with the value and the range, instead of an
int32 overflow traceback from deep inside the graph. The ranges are far wider than any real
encoder (BERT-large's 24 x 1024, XLM-R's 250,002 tokens, Longformer's 4,096 positions,
ModernBERT's 8,192): a size inside its range can still be more than a machine holds, which
`parameter_count` and `training_bytes` let the jobs say before they allocate
(`training.model_memory`).
"""
import copy
import json
import math
import os

ACTIVATIONS = ("gelu", "gelu_new", "relu", "tanh", "linear")


class ConfigError(ValueError):
    """A BERT config is unreadable or describes an impossible model."""


# The largest position table a config may hold, and so the longest sequence any record may
# have (`training.option_ranges` bounds --max_seq_length by it). BERT attends every position
# to every other: the attention scores of ONE head for ONE sequence of this length take
# 32768**2 x 4 bytes = 4 GiB, and a layer keeps one such matrix per head for the backward
# pass, so a longer table would not train on any accelerator made, while records for it cost
# gigabytes of padding (`create_pretraining_data --max_seq_length=100000` took 5.5 GB of
# memory for 0.15 MB of text).
MAX_POSITION_EMBEDDINGS = 32768
# key -> (smallest, largest, why the largest): far beyond every published encoder (see the
# module docstring); what lies beyond is a typo or another kind of model.
SIZE_LIMITS = {
    "vocab_size": (1, 2**31 - 1, "token ids are int32"),
    "hidden_size": (1, 65536, "3x the widest published transformer, 18,432"),
    "num_hidden_layers": (1, 1024, "8x the deepest published transformer, 118"),
    "num_attention_heads": (1, 65536, "at most hidden_size"),
    "intermediate_size": (1, 262144, "4x the largest hidden_size"),
    "max_position_embeddings": (1, MAX_POSITION_EMBEDDINGS,
                                "longer attention does not fit any accelerator"),
    "type_vocab_size": (1, 1024, "BERT uses 2 segment types, Google's configs 2 or 16"),
}
# Bytes a parameter takes while training: float32 weight, gradient, and the optimizer's two
# moments (LAMB, Adam); activations and gradient accumulators come on top.
TRAINING_BYTES_PER_PARAMETER = 16
WEIGHT_BYTES_PER_PARAMETER = 4

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
        # where the sizes came from (the file), for messages that compare them with
        # something else (`training.vocab_fit`); not a field: never written, never compared
        self.source = source
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
            elif kind is float:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    fail(key, f"must be a number, got {value!r}")
                if not math.isfinite(value):
                    fail(key, f"must be a finite number, got {value!r}")
            elif not isinstance(value, kind):
                fail(key, f"must be a {kind.__name__}, got {value!r}")
        for key, (low, high, why) in SIZE_LIMITS.items():
            if not low <= getattr(self, key) <= high:
                fail(key, f"{getattr(self, key)} is out of range: must be in [{low}, {high}] "
                          f"({why})")
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, key) < 1.0:
                fail(key, f"must be in [0, 1), got {getattr(self, key)}")
        if not 0 < self.initializer_range <= 1:
            fail("initializer_range", f"{self.initializer_range} is out of range: must be in "
                                      "(0, 1] (the standard deviation of initial weights)")
        if self.hidden_act not in ACTIVATIONS:
            fail("hidden_act", f"unknown activation {self.hidden_act!r}; "
                               f"choose one of {', '.join(ACTIVATIONS)}")
        if self.hidden_size % self.num_attention_heads:
            fail("num_attention_heads",
                 f"hidden_size {self.hidden_size} is not divisible by "
                 f"num_attention_heads {self.num_attention_heads}")
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            fail("layer_norm_eps", f"must be a number in (0, 1), got {self.layer_norm_eps!r}")

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
        return BertConfig(source=self.source, **values)

    def parameter_count(self):
        """Parameters of the pre-training model (encoder, pooler, masked-LM and next-sentence
        heads; the masked-LM decoder shares the word embeddings), counted from the sizes as
        `BertModel` and the heads create them. A fine-tuned model differs by a few heads'
        worth (a classifier instead of the two pre-training heads)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        embeddings = (v + self.type_vocab_size + self.max_position_embeddings) * h + 2 * h
        layer = (4 * (h * h + h)      # query, key, value, attention output
                 + 2 * h              # attention LayerNorm
                 + h * i + i          # intermediate
                 + i * h + h          # output
                 + 2 * h)             # output LayerNorm
        pooler = h * h + h
        masked_lm = h * h + h + 2 * h + v   # transform dense, LayerNorm, output bias
        next_sentence = 2 * h + 2
        return (embeddings + self.num_hidden_layers * layer + pooler + masked_lm
                + next_sentence)

    def training_bytes(self):
        """Memory the weights and the optimizer's state take while training (a lower bound:
        `TRAINING_BYTES_PER_PARAMETER` a parameter, activations not counted)."""
        return self.parameter_count() * TRAINING_BYTES_PER_PARAMETER

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
