"""Memory helpers: exact counts on a known model, the 16-bytes arithmetic, peak measurement."""

from __future__ import annotations

import psutil
import pytest
import torch

from course_lib.perf.memory import (
    PeakMemory,
    count_parameters,
    host_rss_mb,
    peak_memory,
    stored_bytes,
    training_memory_estimate,
)


def known_model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(10, 5), torch.nn.BatchNorm1d(5))
    for p in model[0].parameters():
        p.requires_grad_(False)  # frozen: 55 parameters
    return model


def test_count_parameters_trainable_and_all() -> None:
    model = known_model()
    assert count_parameters(model) == 10  # BatchNorm weight + bias
    assert count_parameters(model, trainable_only=False) == 65


def test_stored_bytes_counts_frozen_params_and_buffers_once() -> None:
    model = known_model()
    # 65 fp32 params + running_mean/var (10 fp32) + num_batches_tracked (1 int64)
    assert stored_bytes(model) == 65 * 4 + 10 * 4 + 8
    tied = torch.nn.Module()
    tied.a = torch.nn.Linear(4, 4, bias=False)
    tied.b = torch.nn.Linear(4, 4, bias=False)
    tied.b.weight = tied.a.weight
    assert stored_bytes(tied) == 16 * 4
    assert stored_bytes(torch.nn.Linear(4, 4).to(torch.bfloat16)) == 20 * 2


def test_training_memory_estimate_is_16_bytes_per_param_for_adamw() -> None:
    for mixed in (True, False):
        est = training_memory_estimate(1000, "adamw", mixed_precision=mixed)
        assert est["bytes_per_param"] == 16 and est["total_bytes"] == 16000
    assert training_memory_estimate(10, "sgd", mixed_precision=False)["bytes_per_param"] == 8
    with pytest.raises(ValueError, match="optimizer"):
        training_memory_estimate(10, "lion")


def test_peak_memory_on_cpu_sees_a_large_allocation() -> None:
    holder = []
    pm = peak_memory(lambda: holder.append(torch.ones(64 * 2**20 // 4)) or 7)  # 64 MiB, touched
    assert pm.result == 7
    assert pm.delta_mb > 32
    assert "RSS" in pm.what and "not comparable" in pm.what
    assert host_rss_mb() == pytest.approx(psutil.Process().memory_info().rss / 2**20, rel=0.05)
    with PeakMemory("cpu") as small:
        pass
    assert small.peak_mb >= small.start_mb
