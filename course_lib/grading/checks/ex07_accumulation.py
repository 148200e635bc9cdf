"""Checks for exercise 07: gradient accumulation that equals one big batch per group.

The learner defines ``train_accumulated(model, loader, optimizer, device, microbatches=4)`` (returning
``{"loss", "steps", "group_sizes"}`` like the reference :func:`course_lib.train.train_accumulated`) and
``train_accumulated_weighted(model, loader, optimizer, device, class_weights, microbatches=4)``.

The ground truth is simple: with plain SGD, each optimizer step must move the weights exactly as one step on
the concatenation of the group's micro-batches would. The checks run both on shapes the notebook does not show
(41 samples in micro-batches of 5, three per group: groups of 15, 15 and 11 samples) and compare the weights.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from course_lib.grading.api import CheckFailed, check_for, need
from course_lib.train.accumulate import train_accumulated as reference_train_accumulated

LR = 0.3
N, MICRO, ACCUM, CLASSES = 41, 5, 3, 3


def _model() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, CLASSES))


def _data(n: int = N) -> TensorDataset:
    g = torch.Generator().manual_seed(9)
    return TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, CLASSES, (n,), generator=g))


def _loader(data: TensorDataset, batch: int = MICRO) -> DataLoader:
    return DataLoader(data, batch_size=batch, shuffle=False)


def _big_batch_run(data: TensorDataset, groups_of: int, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> nn.Module:
    """The definition: one SGD step per group on all of the group's samples at once."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = data.tensors
    for start in range(0, len(x), groups_of):
        opt.zero_grad()
        loss_fn(model(x[start : start + groups_of]), y[start : start + groups_of]).backward()
        opt.step()
    return model


def _naive_run(data: TensorDataset) -> nn.Module:
    """The outdated recipe: each micro-batch's mean loss divided by the number of micro-batches."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    batches = list(_loader(data))
    for start in range(0, len(batches), ACCUM):
        opt.zero_grad()
        for x, y in batches[start : start + ACCUM]:
            (F.cross_entropy(model(x), y) / ACCUM).backward()
        opt.step()
    return model


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


class _CountingSGD(torch.optim.SGD):
    """SGD that counts its steps."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, lr=lr)
        self.steps_taken = 0

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        self.steps_taken += 1
        return super().step(closure)


@check_for("07", "groups of 15/15/11: one step each", points=1)
def group_sizes(ns: dict[str, Any]) -> None:
    fn = need(ns, "train_accumulated", "define `train_accumulated(model, loader, optimizer, device, microbatches=4)`")
    data = _data()
    model = _model()
    opt = _CountingSGD(model.parameters(), lr=LR)
    result = fn(model, _loader(data), opt, torch.device("cpu"), microbatches=ACCUM)
    expected = reference_train_accumulated(_model(), _loader(data), torch.optim.SGD(_model().parameters(), lr=LR), "cpu", ACCUM)
    if opt.steps_taken != expected["steps"]:
        raise CheckFailed(
            f"{N} samples in micro-batches of {MICRO} with microbatches={ACCUM} make {expected['steps']} groups, "
            "so optimizer.step() should run once per group, including the short last one",
            hint="step (and zero the gradients) only at group boundaries, and once more after the loop if a partial "
            "group is left",
            expected=expected["steps"],
            got=opt.steps_taken,
        )
    if not isinstance(result, dict) or result.get("group_sizes") != expected["group_sizes"] or result.get("steps") != expected["steps"]:
        raise CheckFailed(
            "train_accumulated should return {'loss': ..., 'steps': ..., 'group_sizes': [samples per step]}",
            hint="count the samples of each group (targets != -100) as you go",
            expected={"steps": expected["steps"], "group_sizes": expected["group_sizes"]},
            got=result if not isinstance(result, dict) else {k: result.get(k) for k in ("steps", "group_sizes")},
        )


@check_for("07", "each step equals one big batch", points=2)
def equals_big_batch(ns: dict[str, Any]) -> None:
    fn = need(ns, "train_accumulated", "define `train_accumulated(model, loader, optimizer, device, microbatches=4)`")
    data = _data()
    model = _model()
    fn(model, _loader(data), torch.optim.SGD(model.parameters(), lr=LR), torch.device("cpu"), microbatches=ACCUM)
    truth = _big_batch_run(data, MICRO * ACCUM, F.cross_entropy)
    diff = _max_diff(model, truth)
    if diff > 1e-5:
        naive = _max_diff(model, _naive_run(data)) < 1e-6
        hint = (
            "you divide each micro-batch mean by the number of micro-batches: the last group (11 samples, its last "
            "micro-batch only 1) is over-weighted. Sum the per-sample losses and divide by the samples in the group"
            if naive
            else "use cross_entropy(..., reduction='sum') / (samples in the whole group) for every micro-batch, and "
            "zero the gradients only after each optimizer step"
        )
        raise CheckFailed(
            "after one epoch the weights differ from training with one big batch per group",
            hint=hint,
            expected="max |weight difference| < 1e-5",
            got=f"{diff:.3g}",
        )


@check_for("07", "class-weighted: divide by the summed weights", points=2)
def weighted(ns: dict[str, Any]) -> None:
    fn = need(
        ns,
        "train_accumulated_weighted",
        "define `train_accumulated_weighted(model, loader, optimizer, device, class_weights, microbatches=4)`",
    )
    weights = torch.tensor([0.2, 1.0, 3.5])
    data = _data(37)  # micro-batches 5,5,5 | 5,5,5 | 5,2 -> groups of 15, 15, 7
    model = _model()
    fn(model, _loader(data), torch.optim.SGD(model.parameters(), lr=LR), torch.device("cpu"), weights, microbatches=ACCUM)
    truth = _big_batch_run(data, MICRO * ACCUM, lambda out, y: F.cross_entropy(out, y, weight=weights))
    diff = _max_diff(model, truth)
    if diff > 1e-5:
        by_count = _big_batch_run(
            data, MICRO * ACCUM, lambda out, y: F.cross_entropy(out, y, weight=weights, reduction="sum") / len(y)
        )
        hint = (
            "you divide by the number of samples; a weighted mean divides by the sum of the weights of the selected "
            "samples: class_weights[y].sum() over the group"
            if _max_diff(model, by_count) < 1e-6
            else "per micro-batch use cross_entropy(out, y, weight=class_weights, reduction='sum') and divide by "
            "class_weights[y] summed over the whole group"
        )
        raise CheckFailed(
            "with class weights, the accumulated step differs from one weighted big batch per group",
            hint=hint,
            expected="max |weight difference| < 1e-5",
            got=f"{diff:.3g}",
        )
