"""The course's one wall clock: every figure the library times (a step, a round, a latency) reads :func:`now`.

``wall`` is ``time.perf_counter`` (monotonic, the finest resolution Python offers). A test substitutes one
deterministic clock for all of them with ``monkeypatch.setattr(clock, "wall", fake)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

wall: Callable[[], float] = time.perf_counter


def now() -> float:
    """Seconds on the course's wall clock (``time.perf_counter``, or the clock a test substituted)."""
    return wall()
