"""Parsed flags -> the job's options (`training.options.RunOptions`): what a command hands its
job, so that no library function reads absl's flag object. A value counts as chosen (`given`)
when the command line set it, as absl tells (`using_default_value`)."""


def options_from_flags(flag_values, options_class):
    """`options_class` holding the values of its options' flags in `flag_values`."""
    names = options_class.names()
    given = frozenset(name for name in names if not flag_values[name].using_default_value)
    return options_class(**{name: flag_values[name].value for name in names}, given=given)
