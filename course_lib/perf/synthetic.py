"""Tiny synthetic datasets for measuring instruments and their tests.

They live in the library, at module scope, so DataLoader workers can import them under the ``spawn`` start
method (Windows, macOS). ``sleep_s`` simulates a slow ``__getitem__`` (JPEG decode, heavy augmentation), which
makes an input-bound pipeline on demand.
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset


class SyntheticImages(Dataset):
    """``n`` random images ``shape`` with integer labels; sample ``i`` is the same every time (seeded by ``i``).

    ``sleep_s`` seconds are spent in every ``__getitem__`` (sleeping, like waiting on a disk), and ``work`` extra
    elementwise passes over the image burn CPU (like decoding). Accepts ``int`` or ``(index, aug_seed)`` keys.
    """

    def __init__(
        self, n: int = 256, shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10,
        sleep_s: float = 0.0, work: int = 0,
    ) -> None:
        if n < 1:
            raise ValueError(f"n={n} must be >= 1 samples.")
        if sleep_s < 0 or work < 0:
            raise ValueError(f"sleep_s={sleep_s} and work={work} must be >= 0.")
        self.n, self.shape, self.num_classes, self.sleep_s, self.work = n, tuple(shape), num_classes, sleep_s, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        index = int(key[0] if isinstance(key, (tuple, list)) else key)
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} samples")
        g = torch.Generator().manual_seed(index)
        x = torch.randn(self.shape, generator=g)
        for _ in range(self.work):
            x = torch.tanh(x * 1.01)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return x, index % self.num_classes
