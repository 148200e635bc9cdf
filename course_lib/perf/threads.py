"""CPU threads: how many a training process should use, and what happens when there are too many.

PyTorch runs one operation on several *intra-op* threads (``torch.set_num_threads``; OpenMP underneath, and MKL's
own pool for some math, set by ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` before the process starts). A parallel
region ends only when its *slowest* thread does: if one thread shares its core with another busy process (a
DataLoader worker decoding images, a second training run, the browser), the whole operation waits for it. That is
*oversubscription*: more runnable threads than cores. DataLoader workers set themselves to one thread each, so the
rule of thumb is: the training process takes the cores that the workers and the other busy processes leave.

* :func:`intra_op_threads` -- that rule (exercise 16 writes it).
* :func:`thread_settings` -- what this process uses now, and the environment variables that set it.
* :class:`DecodingDataset` -- images that cost CPU time to produce (a stand-in for JPEG decoding).
* :func:`with_threads` -- a contender for ``compare()`` that runs with a given thread count.

:class:`course_lib.perf.busy.BusyCores` occupies cores with spinning processes, to measure beside them.

Lesson 12 ("CPU threads and oversubscription") measures it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["intra_op_threads", "thread_settings", "DecodingDataset", "with_threads"]

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "COURSE_THREADS")


def intra_op_threads(cores: int, workers: int = 0, busy: int = 0) -> int:
    """Intra-op threads for the training process: the cores left by ``workers`` (one thread each) and ``busy``
    other processes, never fewer than one.

    >>> intra_op_threads(8, workers=2, busy=1)
    5
    >>> intra_op_threads(2, workers=4)
    1

    Taught in lesson 12 (``notebooks/12_techniques.ipynb``).
    """
    for name, value in (("cores", cores), ("workers", workers), ("busy", busy)):
        if not isinstance(value, int) or value < (1 if name == "cores" else 0):
            raise ValueError(f"intra_op_threads: {name}={value!r} must be a whole number >= {int(name == 'cores')}.")
    return max(1, cores - workers - busy)


def thread_settings() -> dict[str, str | int]:
    """This process's thread counts and the environment variables that set them before start-up.

    Taught in lesson 12 (``notebooks/12_techniques.ipynb``).
    """
    settings: dict[str, str | int] = {
        "cores (os.cpu_count)": os.cpu_count() or 1,
        "torch.get_num_threads()": torch.get_num_threads(),
        "torch.get_num_interop_threads()": torch.get_num_interop_threads(),
    }
    for name in THREAD_ENV:
        settings[name] = os.environ.get(name, "(not set)")
    return settings


class DecodingDataset(torch.utils.data.Dataset):
    """Images that cost CPU time to produce, like JPEG decoding: each item runs a few blur passes over a
    ``3 x size x size`` image (seeded by its index). In a DataLoader worker this keeps one core busy.

    Taught in lesson 12 (``notebooks/12_techniques.ipynb``).
    """

    def __init__(self, n: int = 256, size: int = 64, passes: int = 6, num_classes: int = 10) -> None:
        self.n, self.size, self.passes, self.num_classes = n, size, passes, num_classes

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        image = torch.rand(1, 3, self.size, self.size, generator=generator)
        for _ in range(self.passes):  # the "decode": a 3x3 box blur, repeated
            image = torch.nn.functional.avg_pool2d(image, 3, stride=1, padding=1)
        return image[0], index % self.num_classes


def with_threads(n: int, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run with ``n`` intra-op threads (for contenders of :func:`course_lib.perf.compare.compare`, which
    restores the thread count when it is done).

    Taught in lesson 12 (``notebooks/12_techniques.ipynb``).
    """

    def run() -> Any:
        torch.set_num_threads(n)
        return fn()

    return run
