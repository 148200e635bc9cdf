"""Precision comparison: rows side by side from one initialisation."""

from __future__ import annotations

import pytest
import torch

from course_lib.perf.precision import compare_precisions, format_rows


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def make_batches():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(2)]


def test_compare_precisions_rows() -> None:
    rows = compare_precisions(make_model, make_batches, device="cpu", steps=3)
    assert [r["precision"] for r in rows] == ["fp32", "bf16"]
    for r in rows:
        assert r["step_ms"] > 0 and torch.isfinite(torch.tensor(r["final_loss"]))
        assert 0.0 <= r["eval_acc"] <= 1.0
    assert rows[0]["step_time_vs_fp32"] == pytest.approx(1.0)
    assert rows[0]["final_loss"] != rows[1]["final_loss"]  # bf16 rounding changes the trajectory
    assert "bf16" in format_rows(rows)


def test_fp16_on_cpu_is_refused_before_work() -> None:
    with pytest.raises(ValueError, match="fp16"):
        compare_precisions(make_model, make_batches, device="cpu", steps=3, precisions=("fp32", "fp16"))
