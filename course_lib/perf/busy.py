"""Keep some cores busy on purpose, to measure what a training process does beside other busy processes.

A learner's laptop is rarely idle; lesson 12 ("CPU threads and oversubscription") measures thread counts with and
without a competing process. The spinning processes import nothing but the standard library (this module does not
import torch), so they start in a fraction of a second under ``spawn``.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from types import TracebackType

__all__ = ["BusyCores", "spin", "spinning_pids"]

# The processes BusyCores runs stand in for *other programs*: the measurement protocol leaves their CPU time out of
# the work it measures (course_lib.perf.compare counts its own child processes, such as DataLoader workers).
_SPINNING: set[int] = set()


def spinning_pids() -> frozenset[int]:
    """The process ids of the spinning processes running now (empty outside a ``BusyCores`` block)."""
    return frozenset(_SPINNING)


def spin(seconds: float) -> None:
    """Keep one core busy for ``seconds`` (pure Python arithmetic, no torch): a stand-in for another busy process."""
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        for i in range(10_000):
            x += i * i


class BusyCores:
    """``with BusyCores(n):`` -- ``n`` processes spin (one core each) until the block ends (at most ``max_s``).

    The processes are started with ``spawn`` (the start method that works everywhere) and terminated on exit,
    also when the block raises.

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """

    def __init__(self, n: int, max_s: float = 120.0) -> None:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"BusyCores: n={n!r} must be a whole number >= 0.")
        self.n, self.max_s = n, max_s
        self.processes: list[mp.process.BaseProcess] = []

    def __enter__(self) -> BusyCores:
        ctx = mp.get_context("spawn")
        self.processes = [ctx.Process(target=spin, args=(self.max_s,), daemon=True) for _ in range(self.n)]
        for p in self.processes:
            p.start()
            _SPINNING.add(p.pid)
        time.sleep(0.3 if self.n else 0.0)  # let them get going before anything is measured
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for p in self.processes:
            p.terminate()
        for p in self.processes:
            p.join(timeout=5)
            _SPINNING.discard(p.pid)
        self.processes = []
