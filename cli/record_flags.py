"""Record-creation settings that no run can read, refused as the command line is parsed, by
every command that writes pre-training records (`create_pretraining_data.py`, and
`bertPrep.py` for its `create_tfrecord_files` action): before a log file, a folder or a
shard exists, where the same settings used to be written in full, metadata included, and
refused by the first `run_pretraining.py` on them. The check itself is the library's, one
for every writer (`data_prep.instances.pretraining_data_options.unreadable_records`, which
`PretrainingDataOptions.validate` applies again for callers without a command line).
"""
from absl import flags

CHECKED = ("max_seq_length", "max_predictions_per_seq", "masking")


def register_record_checks(flag_values, action=None):
    """A validator of CHECKED on `flag_values`; `action` (bertPrep.py's): only when
    --action is that one (the other actions write no records)."""
    names = list(CHECKED) + (["action"] if action else [])

    def check(values):
        if action and values["action"] != action:
            return True
        from data_prep.instances.pretraining_data_options import unreadable_records
        unreadable = unreadable_records(*(values[name] for name in CHECKED))
        if unreadable:  # absl puts the flags' values before it
            raise flags.ValidationError(unreadable)
        return True

    flags.register_multi_flags_validator(names, check, flag_values=flag_values)
