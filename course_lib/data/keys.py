"""Dataset keys: ``dataset[i]`` or ``dataset[(i, aug_seed)]``.

Random augmentation normally draws from the *global* torch RNG of whichever process runs ``__getitem__``. That
makes the pixels a sample gets depend on which worker loaded it and on everything that worker drew before, so a
run resumed from a checkpoint, or the same run with a different ``num_workers``, sees different images.

The fix used throughout the course: the sampler hands out ``(index, aug_seed)`` pairs, and the dataset seeds a
*private* RNG scope with ``aug_seed`` around the augmentation. The augmentation becomes a pure function of the
key, whichever process evaluates it, and the caller's global RNG is left exactly as it was.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, TypeVar

import torch

T = TypeVar("T")


def split_key(key: Any, length: int) -> tuple[int, int | None]:
    """Return ``(index, aug_seed or None)`` for an ``int`` or ``(index, aug_seed)`` key, checking the range."""
    if isinstance(key, (tuple, list)):
        if len(key) != 2:
            raise TypeError(f"a dataset key tuple must be (index, aug_seed), got {key!r}")
        index, aug_seed = key
        aug_seed = int(aug_seed)
    else:
        index, aug_seed = key, None
    if isinstance(index, torch.Tensor) and index.numel() == 1:
        index = index.item()
    if not isinstance(index, numbers.Integral):
        raise TypeError(f"a dataset index must be an int (or an (index, aug_seed) tuple), got {key!r}")
    index = int(index)
    if index < 0:
        index += length
    if not 0 <= index < length:
        raise IndexError(f"index {key!r} is out of range for a dataset of {length} samples")
    return index, aug_seed


def with_seed(fn: Callable[[], T], aug_seed: int | None) -> T:
    """Run ``fn()``; when ``aug_seed`` is given, inside a forked CPU RNG seeded with it.

    ``torch.random.fork_rng(devices=[])`` saves the CPU generator's state and restores it on exit, so the
    caller's random stream is not disturbed; ``manual_seed`` inside makes every ``torch.rand*`` call that the
    torchvision transforms make a pure function of ``aug_seed``.
    """
    if aug_seed is None:
        return fn()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(aug_seed % (2**63))
        return fn()
