"""Host-to-GPU copies of a batch: from pinned memory with ``non_blocking=True``, against from pageable memory.

A batch a DataLoader prepares lives in host memory; the model reads it from the GPU's. From *pageable* memory
(what ``torch.empty`` gives) the CUDA driver cannot let the GPU read the pages directly, since the operating system
may move them: it first copies the batch into a pinned staging buffer of its own, then the GPU's copy engine reads
that, and the host waits throughout. From *pinned* (page-locked) memory, which ``pin_memory=True`` gives, the copy
engine reads the batch directly, and ``non_blocking=True`` lets the host go on queuing work meanwhile.

:func:`copy_contenders` builds both copies of the same bytes, sized by :func:`course_lib.perf.sizing.copy_batch`
so the copy, not the call, sets the time; the lesson times them with :func:`course_lib.perf.compare.compare` and
explains the verdict with :func:`copy_texts`. Where there is no host-to-device copy (a CPU; an Apple GPU, which
shares the host's memory) nothing is timed and :func:`copy_not_run` says why.

Taught in lesson 02 (``notebooks/02_dataloader.ipynb``); the expectation it is checked against on a GPU is
``02-pinned-copy`` (:mod:`course_lib.perf.expectations`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_lib.perf.device_facts import DeviceFacts
from course_lib.perf.sizing import COPY_IMAGE_SIZE, copy_work

PINNED, PAGEABLE = "pinned + non_blocking", "pageable"  # the contenders' names: expectation 02-pinned-copy's


def copy_contenders(batch: int, device: torch.device | str, *,
                    image_size: int = COPY_IMAGE_SIZE) -> dict[str, Callable[[], None]]:
    """``{PINNED: ..., PAGEABLE: ...}``: each call copies the same ``batch`` float32 images of 3 x ``image_size``
    x ``image_size`` into one buffer on ``device`` (a CUDA GPU), from pinned memory with ``non_blocking=True`` or
    from pageable memory. The buffers are filled once here, so no call pays for touching new pages.

    Taught in lesson 02 (``notebooks/02_dataloader.ipynb``).
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"copy_contenders: device {device} is not a CUDA GPU; pinned memory only speeds up copies "
                         "to one (copy_not_run says why nothing is timed elsewhere).")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"copy_contenders: batch={batch!r} must be a whole number of images >= 1.")
    pageable = torch.ones(batch, 3, image_size, image_size)
    pinned = pageable.pin_memory()
    target = torch.empty(pageable.shape, device=device)

    def from_pinned() -> None:
        target.copy_(pinned, non_blocking=True)

    def from_pageable() -> None:
        target.copy_(pageable)

    return {PINNED: from_pinned, PAGEABLE: from_pageable}


def _size_text(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:,.2f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:,.1f} MiB"


def copy_texts(facts: DeviceFacts, *, batch: int) -> dict[str, str]:
    """The three explanations of lesson 02's ``PINNED`` vs ``PAGEABLE`` verdict on a CUDA GPU, for a copy of
    ``batch`` images (:func:`copy_contenders`), for ``lesson.explain(verdict, **copy_texts(facts, batch=...))``:
    the winner the hardware predicts explained, the other outcomes named as a miss of expectation
    ``02-pinned-copy`` with what to look at.

    Taught in lesson 02 (``notebooks/02_dataloader.ipynb``).
    """
    if facts.kind != "cuda":
        raise ValueError(f"copy_texts: {facts.name} is a {facts.kind}, not a CUDA GPU: use copy_not_run(facts).")
    gpu = f"this GPU ({facts.name.replace('{', '{{').replace('}', '}}')})"
    size = _size_text(copy_work(batch).bytes)
    look = ("The profiler's memcpy rows (HtoD, Pinned against Pageable, lesson 07) show each copy's own rate; "
            "run the cell again before believing a repeat.")
    return {
        "faster": f"Each call copied the same {size} to {gpu}. From pinned (page-locked) memory the GPU's copy "
                  "engine read the batch directly; from pageable memory the driver first copied it into a pinned "
                  "staging buffer of its own, a second pass over the bytes on the host, and the call waited for "
                  "both. That is what the DataLoader's `pin_memory=True` buys, and `non_blocking=True` adds that "
                  "the host does not wait for the copy: it can prepare the next batch and queue the next kernels.",
        "slower": f"The pageable copy of {size} beat the pinned one on {gpu}, against what the hardware predicts "
                  "(expectation 02-pinned-copy: a pinned copy skips the driver's staging copy). Pinned memory on the "
                  f"far socket of a two-socket host, or a bus shared with other transfers, can do this. {look}",
        "too_close": f"The pinned and pageable copies of {size} took the same time on {gpu}, which expectation "
                     "02-pinned-copy does not predict: the driver's staging copy kept pace with the bus, so the bus "
                     f"set both times. `non_blocking=True` still frees the host while the copy runs. {look}",
    }


def copy_not_run(facts: DeviceFacts) -> str:
    """Why lesson 02 times no pinned copy on this device (a CPU, an Apple GPU): the sentence it shows instead of a
    verdict; ``""`` on a CUDA GPU, where the copy is timed.

    Taught in lesson 02 (``notebooks/02_dataloader.ipynb``).
    """
    if facts.kind == "cuda":
        return ""
    if facts.kind == "mps":
        return ("Not timed here: this Apple GPU shares the host's memory, so a batch needs no copy over a bus and "
                "pinning has nothing to speed up (pinned memory is a CUDA mechanism). On an NVIDIA GPU this cell "
                "times a copy from pinned memory with non_blocking=True against one from pageable memory.")
    return ("Not timed here: on this CPU the model reads its batches from the same memory the loader writes them "
            "to, so there is no host-to-device copy for pinned memory or non_blocking to speed up (the DataLoader "
            "skips pinning too). On an NVIDIA GPU this cell times a copy from pinned memory with non_blocking=True "
            "against one from pageable memory.")


__all__ = ["PINNED", "PAGEABLE", "copy_contenders", "copy_texts", "copy_not_run"]
