"""``ResumableSampler``: a shuffling, sharding sampler whose order is a pure function of ``(seed, epoch)``.

Three properties make exact resumption possible:

1. **Order from (seed, epoch) alone.** Each epoch's permutation comes from ``torch.randperm`` with a private
   ``torch.Generator`` seeded with ``seed + epoch``; nothing depends on how many random numbers were drawn
   before, so after a restart ``set_epoch(e)`` reproduces epoch ``e``'s order exactly.
2. **A start position.** ``set_position(k)`` makes the next ``__iter__`` skip the first ``k`` samples of this
   rank's shard, i.e. the ones the interrupted run already trained on. The position then resets, so later
   epochs start at 0. (The sampler cannot know how far training got by itself: with workers, the DataLoader
   reads the sampler ahead of the training loop. The loop counts consumed samples and stores them.)
3. **Augmentation seeds.** With ``yield_seeds=True`` it yields ``(index, aug_seed)`` where ``aug_seed`` is a
   pure function of ``(seed, epoch, position in the epoch)``; datasets with ``accepts_aug_seed = True`` seed
   their augmentation with it, so the *pixels* are reproduced too, whatever worker decodes them.

Sharding follows ``torch.utils.data.DistributedSampler``: the epoch order is padded (by repeating its start) or
cut (``drop_last=True``) to a multiple of ``world_size``, and rank ``r`` takes positions ``r, r + world_size,
...``. With ``pad=False`` (used for validation) nothing is repeated and shards may differ in length by one, so
every sample is evaluated exactly once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

_MASK64 = (1 << 64) - 1


def aug_seed_for(seed: int, epoch: int, position: int) -> int:
    """A well-mixed 63-bit seed from ``(seed, epoch, position)`` (SplitMix64 finaliser, applied in turn).

    Nearby inputs give unrelated outputs, so consecutive samples get independent augmentations.
    """
    x = 0
    for value in (seed, epoch, position):
        x = (x ^ (value & _MASK64)) + 0x9E3779B97F4A7C15 & _MASK64
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
        x ^= x >> 31
    return x >> 1


class ResumableSampler(Sampler):
    """Deterministic, resumable, shardable sampler (see the module docstring for the why).

    ``n``: dataset length. ``shuffle``: a fresh permutation per epoch (train) or ``0..n-1`` (validation).
    ``rank``/``world_size``: which shard this process reads. ``drop_last``: cut the order to a multiple of
    ``world_size`` instead of padding it. ``yield_seeds``: yield ``(index, aug_seed)`` instead of ``index``.
    ``pad``: set False to shard without repeating samples (uneven shards; for evaluation).

    Taught in lesson 02 (``notebooks/02_dataloader.ipynb``).
    """

    def __init__(
        self,
        n: int,
        *,
        shuffle: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        yield_seeds: bool = True,
        pad: bool = True,
    ) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"ResumableSampler: n={n!r} must be a positive int (the dataset length).")
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"ResumableSampler: world_size={world_size!r} must be an int >= 1.")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"ResumableSampler: rank={rank!r} must be an int in [0, world_size={world_size}).")
        if drop_last and n < world_size:
            raise ValueError(f"ResumableSampler: drop_last=True with n={n} < world_size={world_size} leaves "
                             "every rank empty; use drop_last=False.")
        self.n, self.shuffle, self.seed = n, bool(shuffle), int(seed)
        self.rank, self.world_size = rank, world_size
        self.drop_last, self.yield_seeds, self.pad = bool(drop_last), bool(yield_seeds), bool(pad)
        self.epoch = 0
        self.position = 0

    # --- sizes ---------------------------------------------------------------------------------------------
    @property
    def total_size(self) -> int:
        """Length of the epoch order after padding/cutting to a multiple of ``world_size``."""
        if self.drop_last:
            return (self.n // self.world_size) * self.world_size
        if self.pad:
            return math.ceil(self.n / self.world_size) * self.world_size
        return self.n

    @property
    def shard_size(self) -> int:
        """Samples this rank reads in a full epoch."""
        return len(range(self.rank, self.total_size, self.world_size))

    def __len__(self) -> int:
        """Samples the next ``__iter__`` will yield: this rank's shard minus the start position."""
        return self.shard_size - self.position

    # --- control -------------------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next ``__iter__`` yields.

        Moving to a *different* epoch resets the start position to 0; calling it again with the current epoch
        keeps a position set by :meth:`set_position` or :meth:`load_state_dict`, so the usual loop
        ``sampler.set_epoch(epoch)`` works unchanged after a resume.
        """
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"ResumableSampler.set_epoch: epoch={epoch!r} must be an int >= 0.")
        if epoch != self.epoch:
            self.position = 0
        self.epoch = epoch

    def set_position(self, samples_already_consumed: int) -> None:
        """Start the next ``__iter__`` after the first ``samples_already_consumed`` samples of this shard."""
        k = samples_already_consumed
        if not isinstance(k, int) or not 0 <= k <= self.shard_size:
            raise ValueError(f"ResumableSampler.set_position: {k!r} must be an int in [0, {self.shard_size}] "
                             f"(samples of this rank's shard already consumed in epoch {self.epoch}).")
        self.position = k

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to restore this sampler (store the *consumed* count as ``position``)."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "n": self.n,
                "shuffle": self.shuffle, "rank": self.rank, "world_size": self.world_size,
                "drop_last": self.drop_last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``epoch``/``position`` (and ``seed``), refusing a state made for a different dataset size."""
        for key in ("n", "world_size", "shuffle", "drop_last"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"ResumableSampler.load_state_dict: saved {key}={state[key]!r} but this sampler "
                                 f"has {key}={getattr(self, key)!r}; resume with the same data and world size.")
        self.seed = int(state.get("seed", self.seed))
        self.epoch = int(state["epoch"])
        self.set_position(int(state.get("position", 0)))

    # --- iteration -----------------------------------------------------------------------------------------
    def epoch_order(self, epoch: int | None = None) -> torch.Tensor:
        """The full (padded/cut) order of ``epoch`` across all ranks, as a LongTensor."""
        epoch = self.epoch if epoch is None else epoch
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.n, generator=generator)
        else:
            order = torch.arange(self.n)
        total = self.total_size
        if total > self.n:  # pad by repeating the start of the order, as DistributedSampler does
            order = order.repeat(math.ceil(total / self.n))
        return order[:total]

    def __iter__(self) -> Iterator[Any]:
        # Read (and reset) the start position now, when the DataLoader asks for an iterator, not lazily at the
        # first ``next()``: the position applies to exactly this pass.
        start, self.position = self.position, 0
        return self._generate(start)

    def _generate(self, start: int) -> Iterator[Any]:
        order = self.epoch_order().tolist()
        positions = range(self.rank + start * self.world_size, self.total_size, self.world_size)
        if not self.yield_seeds:
            for p in positions:
                yield order[p]
        else:
            for p in positions:
                yield order[p], aug_seed_for(self.seed, self.epoch, p)

    def __repr__(self) -> str:
        return (f"ResumableSampler(n={self.n}, shuffle={self.shuffle}, seed={self.seed}, rank={self.rank}, "
                f"world_size={self.world_size}, epoch={self.epoch}, position={self.position})")
