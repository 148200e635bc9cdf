"""How much of a call's wall time the GPU spent running kernels: the instrument that tells overhead-bound work.

A GPU runs kernels the host queues for it. When each kernel is shorter than the host's time to issue the next one
(Python, the dispatcher, the launch), the GPU finishes early and waits: the call is **overhead-bound**, and no
faster arithmetic (bf16, TF32, a bigger GPU) shortens it. Only the profiler sees this: CUDA events time the stream
from first to last kernel, gaps included, and wall time includes everything. :func:`kernel_share` runs a call a few
times under ``torch.profiler`` with CUDA activity, adds up the device time of every kernel and copy it ran
(``self_device_time_total``, the same column lesson 07 sorts by), and divides by the call's wall time, measured
without the profiler by the comparison that timed it (the profiler's own overhead would inflate wall time).

A share under :data:`OVERHEAD_SHARE` means the GPU sat idle most of the call: the explanation may say
"overhead-bound". Above it the kernels set the time. On a CPU there is no separate device to sit idle: the function
returns ``None`` and the explanations do not use the word.

Taught in lesson 05 (``notebooks/05_mixed_precision.ipynb``); lesson 07 reads the same column in its profiler table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from course_lib import clock
from course_lib.device import synchronize

OVERHEAD_SHARE = 0.5  # kernels busy under half the call: the host, not the GPU, sets the time


@dataclass(frozen=True)
class KernelShare:
    """Per call: ``wall_s`` (seconds, measured without the profiler when a comparison gave it) and ``kernel_s``
    (seconds of kernels and copies the profiler saw)."""

    wall_s: float
    kernel_s: float

    def __post_init__(self) -> None:
        if not self.wall_s > 0 or self.kernel_s < 0:
            raise ValueError(f"KernelShare: wall_s={self.wall_s!r} must be > 0 and kernel_s={self.kernel_s!r} >= 0.")

    @property
    def share(self) -> float:
        """Kernel time over wall time, at most 1 (kernels on several streams can overlap)."""
        return min(1.0, self.kernel_s / self.wall_s)

    @property
    def overhead_bound(self) -> bool:
        """The GPU ran kernels for under :data:`OVERHEAD_SHARE` of the call."""
        return self.share < OVERHEAD_SHARE


def device_seconds_of(averages: Iterable[Any]) -> float:
    """Seconds of device time in a profiler's ``key_averages()``: the sum of each row's ``self_device_time_total``
    (microseconds; self times add up without counting a kernel twice)."""
    return sum(float(getattr(row, "self_device_time_total", 0.0) or 0.0) for row in averages) / 1e6


def kernel_share(fns: Mapping[str, Callable[[], Any]], device: torch.device | str, *,
                 wall_s: Mapping[str, float] | None = None, calls: int = 3) -> dict[str, KernelShare] | None:
    """``{name: KernelShare}`` for each call in ``fns`` on a CUDA device; ``None`` elsewhere (see the module
    docstring). ``wall_s`` gives each call's wall seconds as a comparison measured them (for example
    ``{name: comparison[name].median_s}``); without it the profiled wall time is used, which the profiler inflates.

    Taught in lesson 05 (``notebooks/05_mixed_precision.ipynb``).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    if not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls={calls!r} must be a whole number >= 1.")
    out = {}
    for name, fn in fns.items():
        fn()  # warm: the first call's allocations and autotuning are not the call
        synchronize(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = clock.now()
            for _ in range(calls):
                fn()
            synchronize(device)
            profiled_wall = (clock.now() - t0) / calls
        kernels = device_seconds_of(prof.key_averages()) / calls
        wall = wall_s[name] if wall_s and name in wall_s else profiled_wall
        out[name] = KernelShare(wall_s=wall, kernel_s=kernels)
    return out


__all__ = ["OVERHEAD_SHARE", "KernelShare", "device_seconds_of", "kernel_share"]
