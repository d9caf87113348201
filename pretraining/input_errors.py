"""The one error of bad pre-training input, shown as one line `error: <file>: <problem>`."""


class InputError(ValueError):
    """Input files missing, unreadable, or not matching the model's flags."""
