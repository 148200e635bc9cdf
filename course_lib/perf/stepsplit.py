"""Where does a training step's time go? Data wait, host-to-device transfer, compute.

Before optimising anything, find the bottleneck. Each step is split into three synchronised intervals:

* **data wait** -- time blocked in ``next(iterator)``: the loader had no batch ready. Workers, cheaper transforms
  or caching decoded data help here; a faster GPU does not.
* **transfer** -- ``.to(device)`` of the batch, until the device has it (pinned memory + ``non_blocking`` make it
  asynchronous; on the CPU it is a no-op copy).
* **compute** -- forward, loss, backward and optimizer step, until the device has finished (we synchronise, or a
  GPU's queued kernels would be charged to the *next* step's data wait).

The synchronisations make the step slightly slower than an unmeasured one: the split is a diagnosis, not the
speed you will train at. :meth:`Split.verdict` turns the fractions into the next thing to try.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from course_lib.device import autocast, resolve_amp_dtype, synchronize
from course_lib.perf.timing import now, to_device
from course_lib.train.loss import mean_cross_entropy

# A share of the step above this is "the bottleneck".
BOUND_FRACTION = 0.3


@dataclass
class Split:
    """Per-step seconds for each phase, and the fractions and verdict computed from them."""

    data_s: list[float] = field(default_factory=list)
    transfer_s: list[float] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    device: str = "cpu"

    @property
    def steps(self) -> int:
        return len(self.compute_s)

    @property
    def total_s(self) -> float:
        return sum(self.data_s) + sum(self.transfer_s) + sum(self.compute_s)

    @property
    def fractions(self) -> dict[str, float]:
        """Share of the measured time spent in each phase (sums to 1)."""
        total = self.total_s or 1.0
        return {"data": sum(self.data_s) / total, "transfer": sum(self.transfer_s) / total,
                "compute": sum(self.compute_s) / total}

    @property
    def per_step_ms(self) -> dict[str, float]:
        """Mean milliseconds per step in each phase (means, so the three add up to the step time)."""
        n = max(1, self.steps)
        return {"data": 1000 * sum(self.data_s) / n, "transfer": 1000 * sum(self.transfer_s) / n,
                "compute": 1000 * sum(self.compute_s) / n}

    @property
    def median_step_ms(self) -> float:
        return 1000 * statistics.median(d + t + c for d, t, c in zip(self.data_s, self.transfer_s, self.compute_s))

    def verdict(self) -> str:
        """An actionable sentence computed from the measured fractions."""
        f = self.fractions
        ms = self.per_step_ms
        step = sum(ms.values())
        if f["data"] >= BOUND_FRACTION and f["data"] >= f["compute"]:
            return (f"input-bound: the model waited for data {f['data']:.0%} of the time "
                    f"({ms['data']:.1f} of {step:.1f} ms per step) -> more DataLoader workers, cheaper transforms, "
                    "decode once and cache; a faster device or compile will not help until this is fixed.")
        if f["transfer"] >= BOUND_FRACTION:
            return (f"transfer-bound: copying batches to {self.device} took {f['transfer']:.0%} of the time "
                    f"({ms['transfer']:.1f} ms per step) -> pin_memory=True with non_blocking copies, send uint8 "
                    "and normalise on the device, or keep the dataset on the device.")
        secondary = ""
        if f["data"] >= 0.1:
            secondary = f" (data wait is still {f['data']:.0%}: watch it once compute gets faster)"
        return (f"compute-bound: forward+backward+step took {f['compute']:.0%} of the time "
                f"({ms['compute']:.1f} of {step:.1f} ms per step){secondary} -> a bigger/faster device, mixed "
                "precision, torch.compile, a smaller model; more workers will not help.")

    def __str__(self) -> str:
        ms = self.per_step_ms
        return (f"{self.steps} steps on {self.device}: data {ms['data']:.1f} ms, transfer {ms['transfer']:.1f} ms, "
                f"compute {ms['compute']:.1f} ms per step\n{self.verdict()}")


def _cycle(loader: Any) -> Iterator[Any]:
    while True:
        produced = False
        for batch in loader:
            produced = True
            yield batch
        if not produced:
            raise ValueError("the loader produced no batch (empty dataset, or drop_last with too few samples).")


def time_split(
    model: torch.nn.Module,
    loader: Any,
    *,
    device: torch.device | str,
    steps: int,
    optimizer: torch.optim.Optimizer | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    amp_dtype: str | torch.dtype | None = None,
    warmup: int = 1,
) -> Split:
    """Run ``warmup + steps`` training steps and time data wait, transfer and compute of the last ``steps``.

    ``loader`` is any iterable of ``(x, y)`` or ``(x, y, lengths)`` batches (restarted if it runs out).
    ``optimizer`` defaults to AdamW(lr=1e-3); ``loss_fn(output, y)`` to cross-entropy ignoring -100.
    The warm-up steps (worker start-up, allocator growth) run but are not recorded.

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be an int >= 1.")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be an int >= 0.")
    device = torch.device(device)
    amp = resolve_amp_dtype(amp_dtype, device)
    model = model.to(device).train()
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = loss_fn or mean_cross_entropy
    pinned = bool(getattr(loader, "pin_memory", False))
    split = Split(device=str(device))
    it = _cycle(loader)
    synchronize(device)
    for i in range(warmup + steps):
        t0 = now()
        batch = next(it)
        t1 = now()
        x, y = to_device(tuple(batch[:2]), device, non_blocking=pinned)
        synchronize(device)
        t2 = now()
        with autocast(device, amp):
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        t3 = now()
        if i >= warmup:
            split.data_s.append(t1 - t0)
            split.transfer_s.append(t2 - t1)
            split.compute_s.append(t3 - t2)
    return split


def plot_splits(splits: dict[str, Split], ax: Any = None, title: str = "Where a training step's time goes") -> Any:
    """Horizontal stacked bars (ms per step: data, transfer, compute), one per named split; returns the Figure.

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    import matplotlib.pyplot as plt

    if not splits:
        raise ValueError("plot_splits needs at least one {name: Split}.")
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 0.6 * len(splits) + 1.5))
    else:
        fig = ax.figure
    names = list(splits)
    left = [0.0] * len(names)
    for phase, color in (("data", "tab:red"), ("transfer", "tab:orange"), ("compute", "tab:blue")):
        widths = [splits[n].per_step_ms[phase] for n in names]
        ax.barh(names, widths, left=left, color=color, label=phase)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("milliseconds per step")
    ax.set_title(title)
    ax.legend(loc="lower right")
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


__all__ = ["Split", "time_split", "plot_splits"]
