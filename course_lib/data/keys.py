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
from collections.abc import Callable
from typing import Any, TypeVar

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
    """Run ``fn()``; when ``aug_seed`` is given, with the CPU generator temporarily seeded with it.

    torchvision's random transforms draw from torch's global CPU generator. Saving its state, seeding it with
    ``aug_seed``, and restoring the state afterwards (even if ``fn`` raises) makes every draw inside ``fn`` a pure
    function of ``aug_seed`` while the caller's random stream is left exactly as it was.

    This is what ``torch.random.fork_rng(devices=[])`` + ``torch.manual_seed`` do, done directly on
    ``torch.default_generator``: ``torch.manual_seed`` also re-seeds every accelerator backend, which costs far
    more per sample than the augmentation itself.
    """
    if aug_seed is None:
        return fn()
    generator = torch.default_generator
    saved = generator.get_state()
    try:
        generator.manual_seed(aug_seed % (2**63))
        return fn()
    finally:
        generator.set_state(saved)
