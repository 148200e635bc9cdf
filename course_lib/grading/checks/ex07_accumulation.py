"""Checks for exercise 07: gradient accumulation that equals one big batch per group.

The learner defines ``train_accumulated(model, loader, optimizer, device, microbatches=4)`` (returning
``{"loss", "steps", "group_sizes"}`` like the reference :func:`course_lib.train.train_accumulated`) and
``train_accumulated_weighted(model, loader, optimizer, device, class_weights, microbatches=4)``.

The ground truth is simple: with plain SGD, each optimizer step must move the weights exactly as one step on
the concatenation of the group's micro-batches would. The checks run both on shapes the notebook does not show
(36 to 39 samples in micro-batches of 5, three per group: the last group holds two micro-batches, the second of
them short, and 1 to 3 targets per group are -100) and compare the weights. Two more epochs hold padding: one
with a single real target and then a group of padding only, one without any real target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed
from course_lib.grading.checks.common import CountingSGD
from course_lib.train.accumulate import train_accumulated as reference_train_accumulated

LR = 0.3
MICRO, ACCUM, CLASSES = 5, 3, 3
WEIGHTED_N = 37  # micro-batches 5,5,5 | 5,5,5 | 5,2


def _n(seed: int) -> int:
    """36 to 39 samples: 8 micro-batches of 5 (the last short), so the last group has fewer micro-batches."""
    return 36 + seed % 4


def _model(seed: int) -> nn.Module:
    torch.manual_seed(5 + seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, CLASSES))


def _data(seed: int, n: int) -> TensorDataset:
    """``n`` samples, 1 to 3 targets of each group set to -100 (padding: not a target, not counted).

    How many per group follows the seed's base-3 digits, so neighbouring seeds always differ in the first group's
    count and group_sizes recorded in another run seldom fit this one; where is drawn afresh in every run. A
    group's first sample always keeps its target (a group without one has no mean to take), and the last group keeps
    only that one: a mean over a single target, where a guard like ``max(count, 2)`` gives another answer.
    """
    g = torch.Generator().manual_seed(9 + seed)  # inputs differ in every grading run
    y = torch.randint(0, CLASSES, (n,), generator=g)
    group = MICRO * ACCUM
    for index, start in enumerate(range(0, n, group)):
        maybe = torch.arange(start + 1, min(start + group, n))
        y[maybe[torch.randperm(len(maybe), generator=g)[: 1 + seed // 3**index % 3]]] = -100
    y[(n - 1) // group * group + 1:] = -100
    return TensorDataset(torch.randn(n, 6, generator=g), y)


def _loader(data: TensorDataset, batch: int = MICRO) -> DataLoader:
    return DataLoader(data, batch_size=batch, shuffle=False)


def _big_batch_run(seed: int, data: TensorDataset, groups_of: int,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   weights: torch.Tensor | None = None) -> tuple[nn.Module, float]:
    """The definition: one SGD step per group on all of the group's samples at once.

    Also returns the epoch's loss as train_accumulated reports it: the summed (weighted) per-target losses,
    each taken before its group's step, over the summed (weighted) target count.
    """
    model = _model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = data.tensors
    total, count = 0.0, 0.0
    for start in range(0, len(x), groups_of):
        xs, ys = x[start : start + groups_of], y[start : start + groups_of]
        opt.zero_grad()
        out = model(xs)
        loss_fn(out, ys).backward()
        opt.step()
        total += float(F.cross_entropy(out.detach(), ys, weight=weights, reduction="sum"))
        real = ys[ys != -100]
        count += float(weights[real].sum()) if weights is not None else len(real)
    return model, total / max(count, 1e-12)


def _naive_run(seed: int, data: TensorDataset) -> nn.Module:
    """The outdated recipe: each micro-batch's mean loss divided by the number of micro-batches."""
    model = _model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    batches = list(_loader(data))
    for start in range(0, len(batches), ACCUM):
        opt.zero_grad()
        for x, y in batches[start : start + ACCUM]:
            (F.cross_entropy(model(x), y) / ACCUM).backward()
        opt.step()
    return model


def _micro_sizes(data: TensorDataset) -> list[list[int]]:
    """Samples per micro-batch, group by group (for messages)."""
    sizes = [len(y) for _, y in _loader(data)]
    return [sizes[i : i + ACCUM] for i in range(0, len(sizes), ACCUM)]


def _max_diff(a: Any, b: nn.Module) -> float:
    """Largest weight difference; ``a`` is a module or a list of its parameters (as observed)."""
    params = list(a.parameters()) if isinstance(a, nn.Module) else list(a)
    return max((p - q).abs().max().item() for p, q in zip(params, b.parameters()))


def _as_result(result: Any) -> Any:
    if not isinstance(result, dict):
        return one_line(result)
    loss = result.get("loss")
    loss = float(loss) if isinstance(loss, (int, float)) or (isinstance(loss, torch.Tensor) and loss.numel() == 1) \
        else one_line(loss)
    sizes = result.get("group_sizes")
    return {"loss": loss, "steps": one_line(result.get("steps")),
            "group_sizes": [int(s) for s in sizes] if isinstance(sizes, (list, tuple)) and all(
                isinstance(s, (int, torch.Tensor)) for s in sizes) else one_line(sizes)}


def _trained(ns: dict[str, Any], seed: int, weighted: bool) -> dict[str, Any]:
    """The learner's epoch: optimizer steps taken, what it returned, and the weights afterwards."""
    if weighted:
        fn = need(ns, "train_accumulated_weighted", "define `train_accumulated_weighted(model, loader, optimizer, "
                  "device, class_weights, microbatches=4)`")
        data, extra = _data(seed, WEIGHTED_N), (_WEIGHTS.clone(),)
    else:
        fn = need(ns, "train_accumulated",
                  "define `train_accumulated(model, loader, optimizer, device, microbatches=4)`")
        data, extra = _data(seed, _n(seed)), ()
    model = _model(seed).eval()  # left in eval mode by an earlier evaluation: an epoch of training sets train mode
    for p in model.parameters():  # gradients left from earlier work: the first step must not include them
        p.grad = torch.full_like(p, 0.25)
    modes: list[bool] = []
    model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    opt = CountingSGD(model.parameters(), lr=LR)
    result = call(fn, model, _loader(data), opt, torch.device("cpu"), *extra, microbatches=ACCUM)
    return {"steps_taken": opt.steps_taken, "result": _as_result(result),
            "weights": [p.detach() for p in model.parameters()], "eval_forwards": modes.count(False)}


_WEIGHTS = torch.tensor([0.2, 1.0, 3.5])


@check_for("07", "one step per group, the short last group included; group_sizes count real targets", points=1,
           parts=("07.1",))
def group_sizes(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _trained, seed, False)
    data = _data(seed, _n(seed))
    model = _model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    expected = reference_train_accumulated(model, _loader(data), optimizer, "cpu", ACCUM)
    if seen["steps_taken"] != expected["steps"]:
        raise CheckFailed(
            f"{_n(seed)} samples in micro-batches of {MICRO} with microbatches={ACCUM} make {expected['steps']} "
            f"groups, the last of {_micro_sizes(data)[-1]}: optimizer.step() should run once per group, "
            "including the short last one",
            hint="step (and zero the gradients) only at group boundaries, and once more after the loop if a partial "
            "group is left",
            expected=expected["steps"],
            got=seen["steps_taken"],
        )
    result = seen["result"]
    if not isinstance(result, dict) or result.get("group_sizes") != expected["group_sizes"] or \
            result.get("steps") != repr(expected["steps"]):
        raise CheckFailed(
            "train_accumulated should return {'loss': ..., 'steps': ..., 'group_sizes': [targets per step]}",
            hint="count the real targets of each group (targets != -100: padding is not a sample) as you go",
            expected={"steps": expected["steps"], "group_sizes": expected["group_sizes"]},
            got=result if not isinstance(result, dict) else {k: result.get(k) for k in ("steps", "group_sizes")},
        )


@check_for("07", "each step equals one big batch", points=2, parts=("07.1",))
def equals_big_batch(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _trained, seed, False)
    data = _data(seed, _n(seed))
    if seen.get("eval_forwards"):
        raise CheckFailed(f"{seen['eval_forwards']} forward pass(es) ran with the model in eval mode: an epoch of "
                          "training runs in training mode (dropout and batch norm behave differently in eval mode)",
                          hint="call model.train() at the start: the model may arrive in eval mode",
                          expected="every forward in training mode", got=f"{seen['eval_forwards']} in eval mode")
    truth, loss = _big_batch_run(seed, data, MICRO * ACCUM, F.cross_entropy)
    diff = _max_diff(seen["weights"], truth)
    if diff > 1e-5:
        naive = _max_diff(seen["weights"], _naive_run(seed, data)) < 1e-6
        hint = (
            "you divide each micro-batch mean by the number of micro-batches: micro-batches with fewer real "
            f"targets weigh as much as full ones, and the last group (micro-batches of {_micro_sizes(data)[-1]} "
            "samples) gets too small a gradient. Sum the per-target losses and divide by the real targets in the "
            "group"
            if naive
            else "use cross_entropy(..., reduction='sum') / (real targets in the whole group: y != -100) for every "
            "micro-batch, and zero the gradients only after each optimizer step"
        )
        raise CheckFailed(
            "after one epoch the weights differ from training with one big batch per group",
            hint=hint,
            expected="max |weight difference| < 1e-5",
            got=f"{diff:.3g}",
        )
    _check_loss(seen["result"], loss, "the summed per-target losses over the number of real targets")


def _check_loss(result: Any, expected: float, what: str) -> None:
    got = result.get("loss") if isinstance(result, dict) else result
    if not isinstance(got, float) or abs(got - expected) > 1e-5 * max(1.0, abs(expected)):
        raise CheckFailed(
            "the returned 'loss' is not the epoch's mean loss", hint=f"report {what} (each taken before its step)",
            expected=expected, got=got)


@check_for("07", "class-weighted: divide by the summed weights", points=2, parts=("07.2",))
def weighted(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _trained, seed, True)
    weights = _WEIGHTS
    data = _data(seed, WEIGHTED_N)

    def weighted_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, y, weight=weights)

    if seen.get("eval_forwards"):
        raise CheckFailed(f"{seen['eval_forwards']} forward pass(es) ran with the model in eval mode",
                          hint="call model.train() at the start: the model may arrive in eval mode",
                          expected="every forward in training mode", got=f"{seen['eval_forwards']} in eval mode")
    truth, loss = _big_batch_run(seed, data, MICRO * ACCUM, weighted_loss, weights)
    diff = _max_diff(seen["weights"], truth)
    if diff > 1e-5:
        by_count, _ = _big_batch_run(
            seed, data, MICRO * ACCUM, lambda out, y: F.cross_entropy(out, y, weight=weights, reduction="sum") / len(y)
        )
        hint = (
            "you divide by the number of samples; a weighted mean divides by the sum of the weights of the selected "
            "samples: class_weights[y[y != -100]].sum() over the group"
            if _max_diff(seen["weights"], by_count) < 1e-6
            else "per micro-batch use cross_entropy(out, y, weight=class_weights, reduction='sum') and divide by "
            "class_weights[y] summed over the whole group"
        )
        raise CheckFailed(
            "with class weights, the accumulated step differs from one weighted big batch per group",
            hint=hint,
            expected="max |weight difference| < 1e-5",
            got=f"{diff:.3g}",
        )
    _check_loss(seen["result"], loss, "the summed weighted losses over the summed weights of the targets")
    sizes = [int((data.tensors[1][start:start + MICRO * ACCUM] != -100).sum())
             for start in range(0, WEIGHTED_N, MICRO * ACCUM)]
    got = seen["result"].get("group_sizes") if isinstance(seen["result"], dict) else None
    if got != sizes:
        raise CheckFailed("with class weights, 'group_sizes' should still count the real targets of each group",
                          hint="the weights change the loss's denominator, not what group_sizes counts: the targets "
                               "!= -100 of each group", expected=sizes, got=got)


# ------------------------------------------------------------------ groups and epochs of padding only
def _padding_data(seed: int, empty: bool) -> TensorDataset:
    """Two groups (micro-batches 5,5,5 | 5): the first holds one real target (where, and its class, drawn per run),
    the second padding only; with ``empty``, one group of two micro-batches and no real target at all."""
    g = torch.Generator().manual_seed(41 + seed)
    n = 2 * MICRO if empty else (ACCUM + 1) * MICRO
    y = torch.full((n,), -100)
    if not empty:
        y[int(torch.randint(0, MICRO * ACCUM, (1,), generator=g))] = int(torch.randint(0, CLASSES, (1,), generator=g))
    return TensorDataset(torch.randn(n, 6, generator=g), y)


def _padded(ns: dict[str, Any], seed: int, weighted: bool) -> dict[str, Any]:
    """The learner's epoch on each padding data set: its result (or the error it raised) and the weights after."""
    name = "train_accumulated_weighted" if weighted else "train_accumulated"
    fn = need(ns, name, f"define `{name}(model, loader, optimizer, device, "
                        f"{'class_weights, ' if weighted else ''}microbatches=4)`")
    out = {}
    for empty in (False, True):
        model = _model(seed)
        opt = CountingSGD(model.parameters(), lr=LR)
        extra = (_WEIGHTS.clone(),) if weighted else ()
        try:
            result = _as_result(fn(model, _loader(_padding_data(seed, empty)), opt, torch.device("cpu"), *extra,
                                   microbatches=ACCUM))
        except Exception as exc:  # data here: the check says which epoch and why
            result = f"raised {type(exc).__name__}: {exc}"[:200]
        out["empty" if empty else "one"] = {"result": result, "weights": [p.detach() for p in model.parameters()]}
    return out


def _padding_truth(seed: int, empty: bool) -> tuple[nn.Module, float]:
    """One SGD step on the single real target (the padding-only group adds nothing), and that target's loss."""
    model = _model(seed)
    if empty:
        return model, 0.0
    x, y = _padding_data(seed, empty).tensors
    keep = y != -100
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss = F.cross_entropy(model(x[keep]), y[keep])
    loss.backward()
    opt.step()
    return model, float(loss.detach())


def _check_padding(ns: dict[str, Any], weighted: bool) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _padded, seed, weighted)
    for key, what in (("one", "an epoch of one real target and then a group of padding only (every target -100)"),
                      ("empty", "an epoch without a single real target")):
        got, (truth, loss) = seen[key], _padding_truth(seed, key == "empty")
        if not isinstance(got["result"], dict):
            raise CheckFailed(f"{what}: {got['result']}",
                              hint="a group of padding only has a count of 0: guard the division (its loss sum is "
                                   "0, so it adds no gradient), and return loss 0.0 when the epoch has no targets",
                              expected=f"loss {loss:.6g}", got=got["result"])
        if not all(bool(torch.isfinite(w).all()) for w in got["weights"]):
            raise CheckFailed(f"{what}: the weights are NaN after the epoch",
                              hint="a group of padding only has a loss sum of 0 and a count of 0: 0/0 is NaN, and "
                                   "one NaN gradient makes every weight NaN at the step. Divide by max(count, 1) or "
                                   "skip the division when the count is 0",
                              expected="finite weights", got="NaN")
        diff = _max_diff(got["weights"], truth)
        if diff > 1e-5:
            raise CheckFailed(f"{what}: the weights differ from one step on the real target alone",
                              hint="a group of padding only adds nothing to the gradients",
                              expected="max |weight difference| < 1e-5", got=f"{diff:.3g}")
        _check_loss(got["result"], loss, "0.0 for an epoch without targets (nothing was measured)" if key == "empty"
                    else "the single target's loss: the epoch's summed losses over its one real target")


@check_for("07", "a group of padding only adds no gradient; no targets at all: a zero loss", points=1,
           parts=("07.1",))
def padding_only(ns: dict[str, Any]) -> None:
    _check_padding(ns, weighted=False)


@check_for("07", "class-weighted: a group of padding only adds no gradient; no targets at all: a zero loss", points=1,
           parts=("07.2",))
def padding_only_weighted(ns: dict[str, Any]) -> None:
    _check_padding(ns, weighted=True)
