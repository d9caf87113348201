"""Every size of a BERT config has a range, checked where the file is read (one line naming
the file, the field, the value and the range); a model inside its ranges but beyond what the
machine holds is refused before anything is allocated (one line with the memory it needs and
the memory there is); and no records are made longer than the largest position table a
config may hold (`--max_seq_length` beyond it is refused as the command line is parsed)."""
import json
import math
import os

import pytest
import tensorflow as tf

from modeling import BertConfig, BertModel, ConfigError, masked_lm_output, named_config
from modeling import next_sentence_output
from modeling.config import MAX_POSITION_EMBEDDINGS, SIZE_LIMITS
from runtime.devices import GpuInfo
from runtime.memory import cgroup_limit_bytes, usable_memory_bytes
from training.model_memory import check_model_fits
from training.option_ranges import RANGES

tf1 = tf.compat.v1
GIB = 2**30


def write_config(folder, name="bert_config.json", **changes):
    path = folder / name
    path.write_text(json.dumps(dict(named_config("tiny").to_dict(), **changes)))
    return str(path)


def one_line_error(path):
    with pytest.raises(ConfigError) as info:
        BertConfig.from_json_file(path)
    message = str(info.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("key", sorted(SIZE_LIMITS))
def test_a_size_beyond_its_range_is_one_line_naming_file_field_value_and_range(tmp_path, key):
    low, high, why = SIZE_LIMITS[key]
    for value in (high + 1, 10**12, 0):
        path = write_config(tmp_path, **{key: value})
        assert one_line_error(path) == (f"{path}: {key}: {value} is out of range: must be in "
                                        f"[{low}, {high}] ({why})")


def test_the_issue_s_vocab_size_is_one_line_not_an_int32_overflow(tmp_path):
    path = write_config(tmp_path, vocab_size=10**12)
    assert one_line_error(path) == (f"{path}: vocab_size: 1000000000000 is out of range: must "
                                    "be in [1, 2147483647] (token ids are int32)")


@pytest.mark.parametrize("key, value", [("initializer_range", math.nan),
                                        ("initializer_range", math.inf),
                                        ("initializer_range", 0.0),
                                        ("layer_norm_eps", math.nan),
                                        ("hidden_dropout_prob", math.nan)])
def test_a_rate_that_is_not_a_finite_number_in_range_names_the_field(tmp_path, key, value):
    path = write_config(tmp_path, **{key: value})  # json writes NaN and Infinity; Python reads
    assert one_line_error(path).startswith(f"{path}: {key}: ")


@pytest.mark.parametrize("changes", [
    {},                                                                  # BERT-large
    {"vocab_size": 250002, "max_position_embeddings": 514, "type_vocab_size": 1},  # XLM-R large
    {"max_position_embeddings": 4096},                                   # Longformer, BigBird
    {"max_position_embeddings": 8192, "vocab_size": 50368},              # ModernBERT
    {"max_position_embeddings": MAX_POSITION_EMBEDDINGS, "type_vocab_size": 16},
])
def test_real_large_configs_load(tmp_path, changes):
    path = tmp_path / "large.json"
    values = json.loads(open(os.path.join(os.path.dirname(__file__), "..", "modeling",
                                          "configs", "bert_large_config.json")).read())
    path.write_text(json.dumps(dict(values, **changes)))
    config = BertConfig.from_json_file(str(path))
    assert config.num_hidden_layers == 24 and config.hidden_size == 1024


def test_the_parameter_count_is_that_of_the_built_pre_training_graph():
    """Counted from the sizes, compared with the variables BertModel and the heads create
    (uneven sizes, so that no two terms can stand in for each other)."""
    config = named_config("tiny").replace(vocab_size=101, hidden_size=48, num_attention_heads=3,
                                          intermediate_size=80, num_hidden_layers=3,
                                          max_position_embeddings=40, type_vocab_size=3)
    batch, seq = 2, 8
    with tf.Graph().as_default():
        ids = tf1.placeholder(tf.int32, [batch, seq])
        model = BertModel(config, True, ids)
        masked_lm_output(config, model.get_sequence_output(), model.get_embedding_table(),
                         tf.zeros([batch, 2], tf.int32), tf.zeros([batch, 2], tf.int32),
                         tf.ones([batch, 2]), "float32")
        next_sentence_output(config, model.get_pooled_output(), tf.zeros([batch], tf.int32))
        built = sum(v.shape.num_elements() for v in tf1.trainable_variables())
    assert config.parameter_count() == built
    assert config.training_bytes() == 16 * built


def test_a_model_beyond_the_machine_is_one_line_with_both_figures():
    config = named_config("tiny").replace(vocab_size=10**9)
    needed = config.parameter_count() * 16
    with pytest.raises(ConfigError) as info:
        check_model_fits(config, "big.json", ram_bytes=8 * GIB)
    message = str(info.value)
    assert "\n" not in message and message.startswith("big.json: the model has ")
    assert f"{config.parameter_count():,} parameters" in message
    assert "vocab_size 1000000000 x hidden_size 64 (word embeddings)" in message
    assert f"{needed / 2**30:.1f} GiB to train" in message
    assert "this machine's 8.0 GiB of RAM" in message
    # weights only when not training (4 bytes a parameter)
    with pytest.raises(ConfigError, match=rf"{config.parameter_count() * 4 / 2**30:.1f} GiB "
                                          r"for its weights"):
        check_model_fits(config, "big.json", training=False, ram_bytes=8 * GIB)
    # BERT-large trains in 64 GiB; on a GPU, each GPU the process uses holds the model
    large = named_config("large")
    check_model_fits(large, "large.json", ram_bytes=64 * GIB)
    wide = large.replace(vocab_size=10**7)  # 10.3 billion parameters, 153 GiB to train
    gpus = [GpuInfo(0, "NVIDIA A100-SXM4-80GB", (8, 0), 80 * GIB),
            GpuInfo(1, "NVIDIA A100-PCIE-40GB", (8, 0), 40 * GIB)]
    with pytest.raises(ConfigError, match=r"more than GPU 1's 40\.0 GiB \(NVIDIA A100-PCIE-40GB"):
        check_model_fits(wide, "wide.json", gpus, ram_bytes=1024 * GIB)
    check_model_fits(large, "large.json", gpus, ram_bytes=1 * GIB)  # GPUs hold it, not RAM


def test_usable_memory_is_the_smaller_of_the_machine_and_its_cgroup(tmp_path):
    assert usable_memory_bytes(physical=64 * GIB, limit=8 * GIB) == 8 * GIB
    assert usable_memory_bytes(physical=8 * GIB, limit=64 * GIB) == 8 * GIB
    files = {"v2_none": "max\n", "v1_none": "9223372036854771712\n", "v2": "1073741824\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert cgroup_limit_bytes([str(tmp_path / "v2_none"), str(tmp_path / "v1_none")]) is None
    assert cgroup_limit_bytes([str(tmp_path / "absent"), str(tmp_path / "v2")]) == GIB
    assert usable_memory_bytes() > 0


def test_pre_training_refuses_a_model_beyond_the_machine_before_building_it(tmp_path, capsys):
    """4 trillion parameters: refused in one line at start-up (it used to allocate for 37 s
    and 4.5 GB before a traceback), before its input is even looked at."""
    from pretraining.options import PretrainingOptions
    from pretraining.runner import main
    path = write_config(tmp_path, vocab_size=10**9, hidden_size=4096, num_attention_heads=4)
    options = PretrainingOptions.of(bert_config_file=path, input_files_dir="missing",
                                    output_dir=str(tmp_path / "out"), do_train=True)
    assert main(options) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {path}: the model has 4,") and "TiB to train" in lines[0]
    assert not (tmp_path / "out").exists()  # nothing left behind


def test_fine_tuning_refuses_a_model_beyond_the_machine_before_building_it(tmp_path):
    from finetuning.driver import run as finetune
    from finetuning.options import ClassifierOptions
    from finetuning.tasks import ClassifierTask
    path = write_config(tmp_path, vocab_size=10**9, hidden_size=4096, num_attention_heads=4)
    options = ClassifierOptions.of(task_name="sst-2", data_dir=str(tmp_path), vocab_file="none",
                                   bert_config_file=path, output_dir=str(tmp_path / "out"),
                                   do_train=True)
    with pytest.raises(ConfigError, match=rf"^{path}: the model has 4,.* TiB to train"):
        finetune(ClassifierTask("sst-2", str(tmp_path), 128), options)
    assert not (tmp_path / "out").exists()  # nothing left behind


def test_max_seq_length_is_bounded_by_the_largest_position_table():
    """The flag range every command checks is the config's own bound: records longer than
    any config's position table can never be read."""
    assert RANGES["max_seq_length"].high == MAX_POSITION_EMBEDDINGS
    assert RANGES["max_seq_length"].allows(MAX_POSITION_EMBEDDINGS)
    assert not RANGES["max_seq_length"].allows(MAX_POSITION_EMBEDDINGS + 1)
    assert RANGES["vocab_size"].high == SIZE_LIMITS["vocab_size"][1]
