"""`UsageError`: settings that cannot work together, reported by a command in one line (no
traceback). It lives on the ground floor because every floor raises it: a resume check
(`resilience.data_order`), the device count (`runtime.towers`), a driver's flag checks."""


class UsageError(ValueError):
    """Flags that cannot work together."""
