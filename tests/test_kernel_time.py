"""The kernel-share instrument (course_lib/perf/kernel_time.py): its arithmetic on profiler rows, and no claim on a
CPU. Its CUDA path runs where gpu-check runs lesson 05 on a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from course_lib.perf.kernel_time import OVERHEAD_SHARE, KernelShare, device_seconds_of, kernel_share


def test_device_time_adds_the_self_columns_in_microseconds() -> None:
    rows = [SimpleNamespace(self_device_time_total=1500.0), SimpleNamespace(self_device_time_total=500.0),
            SimpleNamespace(self_device_time_total=0.0), SimpleNamespace()]  # a CPU-only row has none
    assert device_seconds_of(rows) == pytest.approx(2e-3)


def test_share_and_the_overhead_threshold() -> None:
    idle = KernelShare(wall_s=1e-3, kernel_s=0.2e-3)
    busy = KernelShare(wall_s=1e-3, kernel_s=0.95e-3)
    overlapped = KernelShare(wall_s=1e-3, kernel_s=1.5e-3)  # kernels on two streams at once
    assert idle.share == pytest.approx(0.2) and idle.overhead_bound
    assert not busy.overhead_bound and overlapped.share == 1.0
    assert KernelShare(1.0, OVERHEAD_SHARE).overhead_bound is False
    with pytest.raises(ValueError, match="wall_s=0"):
        KernelShare(wall_s=0, kernel_s=0)


def test_a_cpu_has_no_kernel_share() -> None:
    calls = []
    assert kernel_share({"step": lambda: calls.append(1)}, "cpu") is None
    assert calls == []  # nothing was run for nothing
