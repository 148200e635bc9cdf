"""The learning-rate schedule: linear warm-up, then a cosine down to 10% of the peak.

The rate is a pure function of the step number. Nothing about the schedule needs saving in a checkpoint:
a resumed run that knows its step gets exactly the rate the uninterrupted run used (a scheduler object with
internal state is one more thing to forget to restore).

    lr
    ^      ___
    |     /   ``--.__
    |    /           ``--.__
    |   /                   ``-- 0.1 * lr
    +--+-----------------------+--> step
    0  warmup                  steps
"""

from __future__ import annotations

import math
from typing import Protocol

FINAL_FRACTION = 0.1  # the cosine ends at 10% of the peak rather than 0: the last steps still learn


class _HasSchedule(Protocol):
    lr: float
    warmup: int
    steps: int


def lr_at(step: int, cfg: _HasSchedule) -> float:
    """Learning rate for optimizer step ``step`` (0-based) of a run configured by ``cfg``.

    * ``step < warmup``: ``lr * step / warmup`` (0 at step 0, so the first update only primes AdamW's moments).
    * ``warmup <= step <= steps``: cosine from ``lr`` down to ``0.1 * lr``; steps past the end stay at ``0.1 * lr``.

    Taught in lesson 04 (``notebooks/04_template.ipynb``).
    """
    if step < 0:
        raise ValueError(f"step={step} must be >= 0.")
    if step < cfg.warmup:
        return cfg.lr * step / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))  # 1 -> 0
    return cfg.lr * (FINAL_FRACTION + (1.0 - FINAL_FRACTION) * cosine)
