"""Every numeric flag of every command is range-checked when the command line is parsed: a bad
value stops the command in one line naming the flag and the range, before anything is written."""
import math
import os
import subprocess
import sys

import pytest
from absl import flags

from cli.flag_ranges import numeric_flags, register_ranges
from training.option_ranges import RANGES, Range

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CONFIG = os.path.join(REPO, "modeling", "configs", "bert_tiny_config.json")


def commands():
    from cli.bert_prep import COMMAND as BERT_PREP
    from cli.create_pretraining_data import COMMAND as CREATE_PRETRAINING_DATA
    from cli.demo import COMMAND as DEMO
    from cli.extract_features import COMMAND as EXTRACT_FEATURES
    from cli.finetune import GLUE, SQUAD
    from cli.inference import COMMAND as INFERENCE
    from cli.preflight import COMMAND as PREFLIGHT
    from cli.pretrain import COMMAND as PRETRAIN
    return [BERT_PREP, CREATE_PRETRAINING_DATA, DEMO, EXTRACT_FEATURES, GLUE, SQUAD, INFERENCE,
            PREFLIGHT, PRETRAIN]


def test_every_numeric_flag_of_every_command_has_a_range():
    for command in commands():
        values = flags.FlagValues()
        command.define_flags(values)
        names = numeric_flags(values)
        assert names, command.name
        missing = [name for name in names if name not in RANGES]
        assert not missing, (command.name, missing)
        register_ranges(values)  # and each registers


def test_a_range_allows_what_it_says():
    assert Range(low=0, low_open=True).allows(1e-9) and not Range(low=0, low_open=True).allows(0)
    assert Range(low=2, also=(0,)).allows(0) and not Range(low=2, also=(0,)).allows(1)
    assert Range(low=0, high=1, high_open=True).allows(0)
    assert not Range(low=0, high=1, high_open=True).allows(1)
    for bad in (math.nan, math.inf, -math.inf):
        assert not Range().allows(bad) and not Range(low=0).allows(bad)
    assert Range(low=1).allows(None)
    assert Range(low=0, high=1, low_open=True).describe() == "in (0, 1]"
    assert Range(low=2, also=(0,)).describe() == "0, or >= 2"


def run(script, *args, cwd):
    return subprocess.run([sys.executable, os.path.join(REPO, script), *args],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


# (script, flags that make a valid command line apart from the value tried, flag, bad value)
BAD_VALUES = [
    ("run_pretraining.py", ["--bert_config_file=" + TINY_CONFIG], "train_batch_size", "0"),
    ("run_pretraining.py", ["--bert_config_file=" + TINY_CONFIG], "num_accumulation_steps",
     "-2"),
    ("run_pretraining.py", ["--bert_config_file=" + TINY_CONFIG], "save_checkpoints_steps", "0"),
    ("run_pretraining.py", ["--bert_config_file=" + TINY_CONFIG], "learning_rate", "nan"),
    ("run_classifier.py", ["--task_name=SST-2", "--do_train", "--data_dir=x", "--vocab_file=x",
                           "--bert_config_file=" + TINY_CONFIG], "learning_rate", "-1"),
    ("run_classifier.py", ["--task_name=SST-2", "--do_train", "--data_dir=x", "--vocab_file=x",
                           "--bert_config_file=" + TINY_CONFIG], "num_train_epochs", "0"),
    ("run_classifier.py", ["--task_name=SST-2", "--do_train", "--data_dir=x", "--vocab_file=x",
                           "--bert_config_file=" + TINY_CONFIG], "save_checkpoints_steps", "0"),
    ("run_squad.py", ["--do_train", "--train_file=x", "--vocab_file=x",
                      "--bert_config_file=" + TINY_CONFIG], "train_batch_size", "-8"),
    ("run_squad.py", ["--do_train", "--train_file=x", "--vocab_file=x",
                      "--bert_config_file=" + TINY_CONFIG], "warmup_proportion", "1.5"),
    ("create_pretraining_data.py", ["--input_file=x", "--vocab_file=x", "--output_file=out/r"],
     "dupe_factor", "0"),
    ("bertPrep.py", ["--action=sharding", "--dataset=wikicorpus_en", "--working_dir=out"],
     "n_training_shards", "0"),
    # records longer than the largest position table a config may hold fit no model (and
    # took 5.5 GB of memory for 0.15 MB of text)
    ("create_pretraining_data.py", ["--input_file=x", "--vocab_file=x", "--output_file=out/r"],
     "max_seq_length", "100000"),
    ("bertPrep.py", ["--action=create_tfrecord_files", "--dataset=wikicorpus_en",
                     "--working_dir=out"], "max_seq_length", "100000"),
    ("run_pretraining.py", ["--bert_config_file=" + TINY_CONFIG], "max_seq_length", "40000"),
]


@pytest.mark.parametrize("script,valid,flag,value", BAD_VALUES,
                         ids=[f"{row[0]}-{row[2]}={row[3]}" for row in BAD_VALUES])
def test_a_value_out_of_range_stops_the_command_in_one_line_before_writing(
        script, valid, flag, value, tmp_path):
    if script.startswith("run_"):
        valid = [*valid, f"--output_dir={tmp_path / 'out'}"]
    result = run(script, *valid, f"--{flag}={value}", cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: flag --{flag}="), lines
    assert f"must be {RANGES[flag].describe()}" in lines[0]
    assert os.listdir(tmp_path) == []  # nothing written: no output folder, no log file
