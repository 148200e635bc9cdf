"""Smoke vs full mode, and where the course keeps generated data.

One environment variable, ``COURSE_MODE``, shrinks every dataset, step count and
sweep of the course:

* ``full`` (the default) is what a learner runs: each notebook finishes in a few
  minutes on a 2-core laptop CPU.
* ``smoke`` is for CI and for checking that a notebook is wired correctly: the
  same code paths on tiny sizes, in seconds.

``COURSE_DATA_DIR`` moves the data cache (default: ``~/.cache/course_lib``), so an
instructor can pre-generate data once for a whole room of laptops.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

MODES = ("full", "smoke")


class SettingError(ValueError):
    """An environment variable of the course holds a value it cannot use; the message names it and what to set.

    Every command reports it as one ``error:`` line (exit code 2) before doing any work.
    """


def mode() -> str:
    """Return the active mode, ``"full"`` or ``"smoke"`` (read on every call)."""
    value = os.environ.get("COURSE_MODE", "full").strip().lower() or "full"
    if value not in MODES:
        raise SettingError(
            f"COURSE_MODE={value!r} is not a mode; use one of {MODES} "
            "(e.g. `export COURSE_MODE=smoke` for a quick wiring check)."
        )
    return value


def is_smoke() -> bool:
    """True when ``COURSE_MODE=smoke``."""
    return mode() == "smoke"


def is_unattended() -> bool:
    """True when ``COURSE_UNATTENDED`` is set (``1``, ``true``, ``yes``): tests, nbval and the site build run the
    notebooks and nobody is there to answer a question or to keep a progress journal."""
    return os.environ.get("COURSE_UNATTENDED", "").strip().lower() in ("1", "true", "yes")


def by_mode(smoke: T, full: T) -> T:
    """Pick a size for the current mode: ``steps = by_mode(smoke=20, full=600)``."""
    return smoke if is_smoke() else full


def data_dir() -> Path:
    """Root of the data cache (``COURSE_DATA_DIR`` or ``~/.cache/course_lib``); a file there: :class:`SettingError`."""
    root = os.environ.get("COURSE_DATA_DIR")
    path = Path(root).expanduser() if root else Path.home() / ".cache" / "course_lib"
    if path.exists() and not path.is_dir():  # checked here, once, before anything is generated into it
        named = f"COURSE_DATA_DIR={root}" if root else f"the data folder {path} (COURSE_DATA_DIR is unset)"
        raise SettingError(f"{named} is a file, not a folder; point COURSE_DATA_DIR at a folder (it is created if "
                           f"missing), or move that file away.")
    return path


def data_dir_hint(filename: object) -> str:
    """A sentence naming the data folder and how to choose another, when a failed file is in it; else ``""``."""
    if not filename:
        return ""
    try:
        root = os.path.abspath(data_dir())
    except SettingError:
        return ""
    path = os.path.abspath(os.fsdecode(filename))  # type: ignore[arg-type]
    if path == root or path.startswith(root + os.sep):
        return (f" The data folder is {root}: COURSE_DATA_DIR=<a writable folder> chooses another, then "
                "`python -m course_lib data prepare` writes the data there.")
    return ""
