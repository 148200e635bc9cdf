"""An endless stream of micro-batches that knows where it is in the data.

Training runs for a number of *steps*, not epochs, so the loop needs batches epoch after epoch. To resume
exactly, it must also know how far into the current epoch it got: ``(epoch, samples consumed)``. That count is
kept here, in the training process, because the DataLoader's workers read the sampler *ahead* of training
(the sampler itself cannot know which of the batches it produced were actually trained on).

On resume, :class:`~course_lib.data.ResumableSampler` (order a pure function of seed and epoch) is told the
epoch and the start position, and the stream continues with exactly the samples the interrupted run would have
seen next. A loader without one (a plain ``shuffle=True`` DataLoader) cannot be repositioned: the stream warns
once and restarts the epoch instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from course_lib.data.sampler import ResumableSampler
from course_lib.train.accumulate import take_group


def find_resumable_sampler(loader: Any) -> Any | None:
    """The loader's ``ResumableSampler`` (at ``loader.sampler`` or ``loader.batch_sampler.sampler``), or ``None``."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    for candidate in (getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None)):
        if isinstance(candidate, ResumableSampler):
            return candidate
    return None


class BatchStream:
    """Yield groups of micro-batches from ``loader``, epoch after epoch, counting what was consumed.

    A group never spans two epochs: the last group of an epoch may be shorter than ``accum`` (the accumulation
    code weights it correctly), so the data order does not depend on ``accum``'s divisibility.
    """

    def __init__(self, loader: Iterable[Sequence[torch.Tensor]]) -> None:
        self.loader = loader
        self.sampler = find_resumable_sampler(loader)
        self.epoch = 0
        self.position = 0  # samples (of this rank's shard) consumed in the current epoch
        self.samples = 0  # samples handed out by this stream, all epochs: the log reads throughput from it
        self._iterator: Iterator[Sequence[torch.Tensor]] | None = None
        self._warned = False

    @property
    def exact(self) -> bool:
        """Whether :meth:`load_state_dict` can restore the exact data position."""
        return self.sampler is not None

    def warn_if_inexact(self) -> None:
        """Warn (once) that this loader cannot be repositioned on resume."""
        if not self.exact and not self._warned:
            self._warned = True
            warnings.warn(
                "the training loader has no ResumableSampler (build it with course_lib.data.make_loader): a resumed "
                "run restarts the current epoch instead of continuing it, so it will not match an uninterrupted run.",
                stacklevel=3,
            )

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "samples_in_epoch": self.position, "exact": self.exact}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["samples_in_epoch"]) if self.exact else 0
        self._iterator = None
        self.warn_if_inexact()

    def _start_epoch(self) -> None:
        if self.sampler is not None:
            self.sampler.set_epoch(self.epoch)
            self.sampler.set_position(self.position)
        elif hasattr(getattr(self.loader, "sampler", None), "set_epoch"):
            self.loader.sampler.set_epoch(self.epoch)  # e.g. a DistributedSampler
        # Creating a DataLoader iterator may draw a seed from the global torch RNG. Fork it, so that the stream
        # of random numbers the *model* uses (dropout) does not depend on when epochs happen to start.
        with torch.random.fork_rng(devices=[]):
            self._iterator = iter(self.loader)

    def next_group(self, accum: int) -> list[Sequence[torch.Tensor]]:
        """Up to ``accum`` micro-batches: fewer only at the end of an epoch."""
        empty_epochs = 0
        while True:
            if self._iterator is None:
                self._start_epoch()
            assert self._iterator is not None
            group = take_group(self._iterator, accum)
            samples = sum(len(batch[0]) for batch in group)
            self.position += samples
            self.samples += samples
            if len(group) == accum:
                return group
            # The epoch ended. Its last group may be incomplete; a group never spans two epochs.
            epoch_was_empty = not group and self.position == 0
            self._iterator = None
            self.epoch += 1
            self.position = 0
            if group:
                return group
            if epoch_was_empty:
                empty_epochs += 1
                if empty_epochs > 1:
                    raise RuntimeError("the training loader yields no batches; check the dataset size and batch size.")
