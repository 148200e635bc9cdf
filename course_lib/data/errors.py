"""The two errors the data layer raises, so callers can catch them by name.

Both are raised *before* any work starts (no half-built loader, no half-downloaded file), and their message
always says which value was wrong, why, and what to do instead.
"""

from __future__ import annotations


class DatasetUnavailable(RuntimeError):
    """A dataset is not on disk and cannot be fetched (offline, or downloads disabled).

    The message explains exactly how to provide it: where to copy which archive, or which offline dataset to
    use instead.
    """


class LoaderConfigError(ValueError):
    """An argument of :func:`course_lib.data.make_loader` is invalid (the message names the argument)."""
