"""The errors the data layer raises, so callers can catch them by name.

They are raised *before* any work starts (no half-built loader, no half-downloaded file), and their message
always says which value was wrong, why, and what to do instead.
"""

from __future__ import annotations


class DatasetUnavailable(RuntimeError):
    """A dataset is not on disk and cannot be fetched (offline, or downloads disabled).

    The message explains exactly how to provide it: where to copy which archive, or which offline dataset to
    use instead.
    """


class LoaderConfigError(ValueError):
    """An argument of :func:`course_lib.data.make_loader` is invalid (the message names the argument).

    Taught in lesson 02 (``notebooks/02_dataloader.ipynb``).
    """


class DataError(ValueError):
    """A dataset on disk is damaged or inconsistent (a missing/extra class folder, a truncated file...).

    The message names the file or folder and says how to repair it (``python -m course_lib data prepare``).
    """
