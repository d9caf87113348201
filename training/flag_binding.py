"""Defining absl flags on a chosen `FlagValues` (tests define them on a fresh one)."""
from absl import flags


def bind(flag_values):
    """An object whose DEFINE_* methods define on `flag_values` instead of the global FLAGS."""
    class _Bound:
        def __getattr__(self, name):
            define = getattr(flags, name)
            return lambda *args, **kwargs: define(*args, flag_values=flag_values, **kwargs)
    return _Bound()
