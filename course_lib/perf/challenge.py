"""The capstone challenge: a slow training function to make fast without changing what it computes.

:func:`train_original` trains a small classifier on uint8 images for one epoch with gradient accumulation. Its
data and model are right, but its loop wastes most of its time the way real scripts do, and it averages the
accumulated loss with the outdated ``loss / accum`` recipe:

* a collate function that converts and normalises every sample channel by channel in Python;
* the dataset's channel statistics recomputed for every micro-batch (they never change);
* labels rebuilt from Python ints, one ``int(...)`` per sample;
* a ``.item()`` per micro-batch to add up a logged loss;
* ``mean / accum`` per micro-batch: each micro-batch's mean (over its labelled samples: cross-entropy leaves
  target ``-100`` out) weighs the same whatever its number of labelled samples, and a short last group of fewer
  micro-batches is still divided by ``accum``.

The objective (what a correct, fast version computes): one SGD-with-momentum step per group of ``accum``
micro-batches, each step on the mean loss over the *labelled* samples of its group, and one loss per step (the
group's mean before its step). The grader's reference, its timing harness and its judge live in
:mod:`course_lib.grading.challenge_judge`: this module is the exercise's material only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from course_lib.train.loss import IGNORE_INDEX

__all__ = [
    "IGNORE",
    "channel_stats",
    "SPEED_THRESHOLD",
    "ChallengeConfig",
    "PerSampleCollate",
    "challenge_data",
    "challenge_model",
    "train_original",
]

IGNORE = IGNORE_INDEX  # target of an unlabelled sample: no loss, not counted (the course's one -100)
# How many times faster than the original a submission must be. The reference reaches 5-10x on a 2-core laptop,
# quiet or with two busy cores (docs/grading.md has the figures); 2.5x leaves room for noise and slower machines.
SPEED_THRESHOLD = 2.5
CHANNELS, SIZE, CLASSES = 3, 16, 10


@dataclass(frozen=True)
class ChallengeConfig:
    """What one epoch of the challenge does: ``accum`` micro-batches of ``micro_batch`` samples per SGD step."""

    micro_batch: int = 16
    accum: int = 4
    lr: float = 0.05
    momentum: float = 0.9

    def __post_init__(self) -> None:
        if self.micro_batch < 1 or self.accum < 1:
            raise ValueError(f"micro_batch={self.micro_batch} and accum={self.accum} must be >= 1.")
        if not (self.lr > 0 and 0 <= self.momentum < 1):
            raise ValueError(f"lr={self.lr} must be > 0 and momentum={self.momentum} in [0, 1).")


def challenge_data(seed: int = 0, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images uint8 [n, 3, 16, 16], labels int64 [n])``, the same for the same ``seed`` on every machine.

    Every 17th sample is unlabelled (``-100``). By default ``n`` is 194 to 238, so the last group is short
    and its last micro-batch partial; two consecutive samples are never both unlabelled, so no group is empty.
    """
    n = 194 + seed % 45 if n is None else n
    if n < 1:
        raise ValueError(f"n={n} must be >= 1 samples.")
    g = torch.Generator().manual_seed(1000 + seed)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    # Images carry a little signal about their label, so the loss actually falls.
    images = torch.randint(0, 200, (n, CHANNELS, SIZE, SIZE), generator=g)
    rows = torch.arange(SIZE)
    images[:, 0] += (rows.view(1, SIZE, 1) == labels.view(n, 1, 1)).to(images.dtype) * 55
    labels[5::17] = IGNORE
    return images.to(torch.uint8), labels


def challenge_model(seed: int = 0) -> nn.Module:
    """The classifier every contender trains, with weights fixed by ``seed`` (the global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Flatten(), nn.Linear(CHANNELS * SIZE * SIZE, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def channel_stats(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation of a uint8 image batch ``[N, C, H, W]`` (as float32)."""
    as_float = images.float()
    return as_float.mean(dim=(0, 2, 3)), as_float.std(dim=(0, 2, 3))


class PerSampleCollate:
    """The original's ``collate_fn``: builds a batch from indices, one sample and one channel at a time.

    Module scope, so a DataLoader with workers could pickle it. It recomputes the dataset's statistics on every
    call, although they never change.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __call__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        mean, std = channel_stats(self.images)
        samples = []
        for i in indices:
            x = self.images[i].float()
            for c in range(x.shape[0]):
                x[c] = (x[c] - mean[c]) / std[c]
            samples.append(x)
        return torch.stack(samples), torch.tensor([int(self.labels[i]) for i in indices])


def train_original(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, cfg: ChallengeConfig) -> list[float]:
    """One epoch, slowly, with the outdated ``loss / accum`` normalisation: the challenge's starting point."""
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    loader = DataLoader(range(len(labels)), batch_size=cfg.micro_batch, shuffle=False, num_workers=0,
                        collate_fn=PerSampleCollate(images, labels))
    model.train()
    losses, logged = [], 0.0
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) / cfg.accum
        loss.backward()
        logged += loss.item()
        if (i + 1) % cfg.accum == 0 or i + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
            losses.append(logged)
            logged = 0.0
    return losses
