"""Every numeric flag of a command checked against its range as the command line is parsed
(the ranges: `training.option_ranges`, one table for all commands). A value outside its range
is refused in one line before anything is read or written:
`error: flag --learning_rate=-1.0: must be > 0 (--help lists the flags)`.
"""
from absl import flags

from training.option_ranges import RANGES

NUMERIC_TYPES = ("int", "float")


def numeric_flags(flag_values):
    """Names of the numeric flags a command defined (its grouped flags; absl's own aside)."""
    return [name for name in flag_values
            if flag_values[name].name == name and getattr(flag_values[name], "help_group", None)
            and flag_values[name].flag_type() in NUMERIC_TYPES]


def register_ranges(flag_values):
    """A validator on each numeric flag of `flag_values`; raises KeyError for one not in
    RANGES (a new flag must state its range here)."""
    for name in numeric_flags(flag_values):
        allowed = RANGES[name]
        flags.register_validator(name, allowed.allows, message=f"must be {allowed.describe()}",
                                 flag_values=flag_values)
