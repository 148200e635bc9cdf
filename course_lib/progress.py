"""Progress bars that a killed process cannot hang: every module of the course imports ``tqdm`` from here.

tqdm's default write lock pairs a thread lock with a ``multiprocessing.RLock``: a semaphore that the parent and every
process forked from it share. A forked training run that is killed (``SIGKILL``, the OOM killer, a fault-injection
test, lesson 04's kill-and-resume) while it holds that semaphore leaves it held for ever, and the next bar created
in the parent -- or in any later fork -- blocks for ever in ``tqdm.__new__``.

So the course gives tqdm a lock that belongs to one process only: no semaphore shared across processes, and a
fresh lock in every forked child (a thread of the parent may have held the old one at the moment of the fork). Bars
of different processes may then interleave on a terminal; the course draws a bar on rank 0 only, so nothing is lost.
"""

from __future__ import annotations

import os

from tqdm import std
from tqdm.auto import tqdm

__all__ = ["process_local_lock", "tqdm"]


def process_local_lock() -> None:
    """Give every tqdm class a lock of this process alone (called at import and in every forked child)."""
    std.TqdmDefaultWriteLock.mp_lock = None  # ``create_mp_lock`` makes none while the attribute exists
    std.TqdmDefaultWriteLock.th_lock = std.TRLock()
    lock = std.TqdmDefaultWriteLock()
    for cls in {std.tqdm, tqdm}:
        cls.set_lock(lock)


process_local_lock()
if hasattr(os, "register_at_fork"):  # not on Windows, which cannot fork
    os.register_at_fork(after_in_child=process_local_lock)
