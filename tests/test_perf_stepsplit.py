"""The step split attributes slow data to data wait and a heavy model to compute."""

from __future__ import annotations

import torch

from course_lib.data import make_loader
from course_lib.perf.stepsplit import Split, plot_splits, time_split
from course_lib.perf.synthetic import SyntheticImages


def tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 10))


def test_sleeping_dataset_is_input_bound() -> None:
    data = SyntheticImages(n=64, shape=(3, 4, 4), sleep_s=0.05)
    loader = make_loader(data, batch_size=4, train=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy machine, a thread per core stalls even this tiny model's step
    try:
        split = time_split(tiny_model(), loader, device="cpu", steps=3)
    finally:
        torch.set_num_threads(threads)
    assert split.steps == 3
    assert split.fractions["data"] > 0.5
    assert sum(split.fractions.values()) == __import__("pytest").approx(1.0)
    assert split.verdict().startswith("input-bound")


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
