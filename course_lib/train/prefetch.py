"""Overlap the next batch's host-to-device copy with this step's compute: a side-stream prefetcher.

``x.to("cuda", non_blocking=True)`` from pinned memory queues the copy on the *current* stream and returns at
once: the host is free to go on (that is all ``non_blocking`` buys), but on the GPU the copy still runs in line with
the kernels of the same stream, so it does not overlap them. To overlap, the copy goes on a second stream:

1. ``with torch.cuda.stream(side):`` -- issue the next batch's copy there, while the default stream computes;
2. ``current.wait_stream(side)`` -- before using the batch, the compute stream waits for the copy (on the GPU;
   the host does not block);
3. ``tensor.record_stream(current)`` -- tell the caching allocator the batch is used on the compute stream, so
   its memory is not handed out again while a kernel may still read it.

Without CUDA there is nothing to overlap: :class:`Prefetcher` then yields the batches moved with a plain ``.to``,
so the same training loop runs everywhere. Lesson 12 ("Overlapping copies with compute: a side-stream prefetcher").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

__all__ = ["Prefetcher", "move"]


def move(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """``batch`` (a tensor, or a list/tuple/dict of them) moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):
        return type(batch)(move(b, device, non_blocking) for b in batch)
    if isinstance(batch, dict):
        return {k: move(v, device, non_blocking) for k, v in batch.items()}
    return batch


def _record(batch: Any, stream: Any) -> None:
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, (list, tuple)):
        for b in batch:
            _record(b, stream)
    elif isinstance(batch, dict):
        for b in batch.values():
            _record(b, stream)


class Prefetcher:
    """Iterate over ``loader``'s batches on ``device``, the next one copied on a side stream while this one is used.

    On a CUDA device the copy of batch ``i + 1`` is issued on a side stream before batch ``i`` is handed out (use
    a loader with ``pin_memory=True`` so the copy is truly asynchronous). On any other device (the CPU fallback)
    batches are moved with a plain ``.to(device)``, one at a time: same batches, same order, no stream.

    Taught in lesson 12 (``notebooks/12_techniques.ipynb``).
    """

    def __init__(self, loader: Iterable[Any], device: torch.device | str) -> None:
        self.loader = loader
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"Prefetcher(device={str(device)!r}): CUDA is not available on this machine; pass the "
                             "device the model is on (course_lib.device.pick_device('auto') chooses one).")
        self.uses_side_stream = self.device.type == "cuda"

    def __iter__(self) -> Iterator[Any]:
        if not self.uses_side_stream:
            for batch in self.loader:
                yield move(batch, self.device)
            return
        side = torch.cuda.Stream(device=self.device)
        it = iter(self.loader)
        pending = self._issue(it, side)
        while pending is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(side)  # the compute stream waits for the copy, on the GPU
            _record(pending, current)  # the batch is used on `current`: keep its memory until that is done
            ready = pending
            pending = self._issue(it, side)  # the next copy overlaps this step's compute
            yield ready

    def _issue(self, it: Iterator[Any], side: Any) -> Any | None:
        try:
            batch = next(it)
        except StopIteration:
            return None
        with torch.cuda.stream(side):
            return move(batch, self.device, non_blocking=True)
