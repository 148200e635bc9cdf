"""Instruments several exercises' checks share (not a checks module: it registers nothing)."""

from __future__ import annotations

from typing import Any

import torch


class CountingSGD(torch.optim.SGD):
    """SGD that counts the calls that reach ``step`` (a GradScaler skips the call on an overflowing step)."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, lr=lr)
        self.steps_taken = 0

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        self.steps_taken += 1
        return super().step(closure)
