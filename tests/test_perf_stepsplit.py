"""The step split attributes slow data to data wait and a heavy model to compute."""

from __future__ import annotations

import pytest
import torch

from course_lib import clock as course_clock
from course_lib.data import make_loader
from course_lib.perf.stepsplit import Split, plot_splits, time_split
from course_lib.perf.synthetic import SyntheticImages


def tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 10))


class ClockedSamples(SyntheticImages):
    """Each sample advances a fake clock by 50 ms: a batch of 4 waits 200 ms for data."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__(n=64, shape=(3, 4, 4))
        self.clock = clock

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        self.clock[0] += 0.050
        return super().__getitem__(key)


class ClockedModel(torch.nn.Module):
    """A forward pass that advances the fake clock by 100 ms."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self.clock, self.net = clock, tiny_model()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock[0] += 0.100
        return self.net(x)


def test_slow_data_is_input_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(course_clock, "wall", lambda: clock[0])
    loader = make_loader(ClockedSamples(clock), batch_size=4, train=True)
    split = time_split(ClockedModel(clock), loader, device="cpu", steps=3)
    assert split.steps == 3
    assert split.data_s == pytest.approx([0.2] * 3) and split.compute_s == pytest.approx([0.1] * 3)
    assert split.fractions == pytest.approx({"data": 2 / 3, "transfer": 0.0, "compute": 1 / 3})
    assert split.per_step_ms == pytest.approx({"data": 200.0, "transfer": 0.0, "compute": 100.0})
    assert split.verdict().startswith("input-bound: the model waited for data 67% of the time (200.0 of 300.0 ms")


def test_heavy_model_is_compute_bound() -> None:
    data = SyntheticImages(n=64, shape=(256,))
    loader = make_loader(data, batch_size=32, train=True)
    heavy = torch.nn.Sequential(*[torch.nn.Linear(256 if i == 0 else 512, 512) for i in range(3)],
                                torch.nn.Linear(512, 10))
    split = time_split(heavy, loader, device="cpu", steps=2)
    assert split.fractions["compute"] > split.fractions["data"]
    assert split.verdict().startswith("compute-bound")


def test_verdict_and_plot_from_numbers() -> None:
    split = Split(data_s=[0.01] * 3, transfer_s=[0.001] * 3, compute_s=[0.1] * 3)
    assert "more workers will not help" in split.verdict()
    fig = plot_splits({"slow data": Split([0.1], [0.0], [0.02]), "compute": split})
    assert len(fig.axes[0].patches) == 6
