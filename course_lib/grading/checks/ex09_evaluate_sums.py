"""Checks for exercise 09: evaluation that accumulates sums, not batch means.

The learner defines ``evaluate(model, loader, device) -> {"loss": float, "acc": float}``. The checks use
data sizes the notebook does not show (23 samples in batches of 10, so the last batch has 3), targets equal
to ``-100`` that must be ignored, and a model with dropout that records the conditions it was called under.
The expected values come from the reference :func:`course_lib.train.evaluate` on the whole set in one batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed
from course_lib.train.evaluate import evaluate as reference_evaluate
from course_lib.train.loss import IGNORE_INDEX, mean_cross_entropy


class _Recorder(nn.Module):
    """A small classifier with dropout that notes, on each call, whether autograd and training mode were on."""

    def __init__(self, seed: int, d_in: int = 5, n_classes: int = 4) -> None:
        super().__init__()
        torch.manual_seed(3 + seed)  # weights and data differ in every grading run
        self.lin = nn.Linear(d_in, n_classes)
        self.drop = nn.Dropout(0.5)
        self.calls: list[tuple[bool, bool]] = []  # (grad enabled, training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append((torch.is_grad_enabled(), self.training))
        return self.lin(self.drop(x))


def _data(seed: int, n: int = 23, ignored: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11 + seed)
    x = torch.randn(n, 5, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    if ignored:
        y[torch.randperm(n, generator=g)[:ignored]] = IGNORE_INDEX
    return x, y


def _truth(model: _Recorder, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """The reference evaluation of the whole set in one batch (it restores the model's mode afterwards)."""
    result = reference_evaluate(model, [(x, y)], "cpu")
    model.calls.clear()  # the learner's calls are what the other checks inspect
    return result


def _mean_of_batch_means(model: _Recorder, x: torch.Tensor, y: torch.Tensor, batch: int) -> float:
    with torch.no_grad():
        means = [mean_cross_entropy(model.lin(x[i : i + batch]), y[i : i + batch]).item()
                 for i in range(0, len(x), batch)]
    return sum(means) / len(means)


def _evaluate(
    ns: dict[str, Any], seed: int, n: int, ignored: int, batch: int, start_training: bool = False
) -> dict[str, Any]:
    """The learner's evaluate on a fresh recorder: its result, how the model was called, its mode afterwards."""
    evaluate = need(ns, "evaluate", "define `evaluate(model, loader, device)` returning {'loss': ..., 'acc': ...}")
    model = _Recorder(seed)
    model.train(start_training)
    x, y = _data(seed, n, ignored)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=False)
    result = call(evaluate, model, loader, torch.device("cpu"))
    if isinstance(result, dict) and {"loss", "acc"} <= set(result) and all(
            isinstance(result[k], (int, float, torch.Tensor)) for k in ("loss", "acc")):
        shown: Any = {"loss": float(result["loss"]), "acc": float(result["acc"])}
    else:
        shown = one_line(result)
    return {"result": shown, "calls": [list(c) for c in model.calls], "training_after": model.training}


def _result(seen: dict[str, Any]) -> dict[str, float]:
    if not isinstance(seen["result"], dict):
        raise CheckFailed("evaluate should return a dict with 'loss' and 'acc'",
                          expected="{'loss': float, 'acc': float}", got=seen["result"])
    return seen["result"]


def _close(a: dict[str, float], b: dict[str, float]) -> bool:
    return abs(a["loss"] - b["loss"]) < 1e-5 and abs(a["acc"] - b["acc"]) < 1e-6


@check_for("09", "uneven last batch: sums, not batch means", points=2, parts=("09.1",))
def uneven_last_batch(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    got = _result(observe(ns, _evaluate, seed, 23, 0, 10))
    model = _Recorder(seed)
    x, y = _data(seed, 23)
    expected = _truth(model, x, y)
    if not _close(got, expected):
        biased = _mean_of_batch_means(model, x, y, 10)
        hint = (
            "that is the mean of the three batch means: the last batch (3 samples) weighs as much as a full one. "
            "Add cross_entropy(..., reduction='sum') and the number of correct predictions, divide once at the end"
            if abs(got["loss"] - biased) < 1e-5
            else "accumulate the summed loss, the correct count and the sample count over all batches; divide at the "
            "end"
        )
        raise CheckFailed(
            "evaluate over 23 samples in batches of 10/10/3 does not match the loss and accuracy of the whole set",
            hint=hint,
            expected=expected,
            got=got,
        )


@check_for("09", "batch-size invariant, ignores -100", points=1, parts=("09.1",))
def invariant_and_ignored(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    x, y = _data(seed, 17, ignored=5)
    expected = _truth(_Recorder(seed), x, y)
    for batch in (1, 4, 17):
        got = _result(observe(ns, _evaluate, seed, 17, 5, batch))
        if not _close(got, expected):
            raise CheckFailed(
                f"with 5 of 17 targets equal to -100 (padding) and batch_size={batch}, the result is not the average "
                "over the 12 real targets",
                hint="count only targets != -100 (for the loss, the number of correct predictions and the count); "
                "cross_entropy ignores -100 by default, your counts must too",
                expected=expected,
                got=got,
            )


@check_for("09", "eval mode + inference_mode, mode restored", points=1, parts=("09.1",))
def modes(ns: dict[str, Any]) -> None:
    n = 4 * (2 + run_seed(ns) % 4) - 1  # 2 to 5 batches of up to 4, a different count in every grading run
    for start_training in (True, False):
        seen = observe(ns, _evaluate, run_seed(ns), n, 0, 4, start_training)
        _result(seen)
        if len(seen["calls"]) != -(-n // 4):
            raise CheckFailed(f"evaluate should call the model once per batch ({n} samples in batches of 4)",
                              expected=-(-n // 4), got=len(seen["calls"]))
        if any(grad for grad, _ in seen["calls"]):
            raise CheckFailed(
                "the model ran with autograd on: evaluation stores activations for a backward that never comes",
                hint="decorate evaluate with @torch.inference_mode() or torch.no_grad() (or use either as a `with` "
                     "block)",
            )
        if any(training for _, training in seen["calls"]):
            raise CheckFailed(
                "the model ran in training mode: dropout was active during evaluation",
                hint="call model.eval() before the loop",
            )
        if seen["training_after"] != start_training:
            raise CheckFailed(
                "evaluate should leave the model in the mode it found it in",
                hint="remember `was_training = model.training` and call model.train(was_training) at the end",
                expected="training" if start_training else "eval",
                got="training" if seen["training_after"] else "eval",
            )
