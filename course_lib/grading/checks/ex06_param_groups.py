"""Checks for exercise 06: AdamW parameter groups with weight decay on matrices only.

The learner defines ``param_groups(model, wd)`` returning a list of dicts with ``"params"`` and ``"weight_decay"``.
The checks use models the notebook does not show (an embedding, a 1-D convolution, LayerNorm, BatchNorm, a bare
1-D parameter, tied weights and a frozen layer) and compare, parameter by parameter, with the reference
:func:`course_lib.train.param_groups`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, run_seed
from course_lib.train.optim import param_groups as reference_param_groups


def _wd(ns: dict[str, Any]) -> float:
    """The weight decay asked for: different in every grading run (0.011 .. 0.107)."""
    return round(0.011 + (run_seed(ns) % 97) / 1000, 3)


class _Mixed(nn.Module):
    """Every kind of parameter: 2-D (embedding, linear), 3-D (conv), 1-D (biases, norms, a temperature)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(13, 6)
        self.conv = nn.Conv1d(6, 6, kernel_size=3, padding=1)
        self.norm = nn.LayerNorm(6)
        self.bn = nn.BatchNorm1d(6)
        self.frozen = nn.Linear(6, 6)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(6, 13)
        self.head.weight = self.embed.weight  # tied: one tensor, must appear once
        self.temperature = nn.Parameter(torch.ones(1))


def _models() -> list[nn.Module]:
    return [_Mixed(), nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 2, bias=False))]


def _names(model: nn.Module) -> dict[int, str]:
    """id -> the first name of each parameter tensor (a tied tensor has two names; named_parameters uses the first)."""
    names: dict[int, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), n)
    return names


def _assignment(groups: Any, names: dict[int, str]) -> dict[str, list[float]]:
    """Parameter name -> the weight decays of every group it appears in."""
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) and "params" in g for g in groups):
        raise CheckFailed(
            "param_groups should return a list of dicts, each with 'params' and 'weight_decay'",
            hint="[{'params': decay, 'weight_decay': wd}, {'params': no_decay, 'weight_decay': 0.0}]",
            got=type(groups).__name__,
        )
    seen: dict[str, list[float]] = {}
    for g in groups:
        for p in g["params"]:
            seen.setdefault(names.get(id(p), "<not in model>"), []).append(float(g.get("weight_decay", -1.0)))
    return seen


def _model(which: int) -> nn.Module:
    torch.manual_seed(0)
    return _models()[which]


def _learner(ns: dict[str, Any], which: int, wd: float) -> dict[str, Any]:
    """Parameter name -> decays of the groups the learner put it in, and the decays AdamW ends up with."""
    fn = need(ns, "param_groups", "define `param_groups(model, wd)` returning a list of AdamW parameter groups")
    model = _model(which)
    groups = call(fn, model, wd)
    assignment = _assignment(groups, _names(model))
    try:
        opt = torch.optim.AdamW(groups, lr=1e-3)
        adamw = sorted({float(g["weight_decay"]) for g in opt.param_groups if g["params"]})
    except Exception as exc:
        adamw = f"AdamW rejected the groups: {type(exc).__name__}: {exc}"
    return {"assignment": assignment, "adamw": adamw}


def _expected(which: int, wd: float) -> dict[str, list[float]]:
    model = _model(which)
    return _assignment(reference_param_groups(model, wd), _names(model))


@check_for("06", "decay only for >= 2-D parameters", points=2, parts=("06.1",))
def decay_split(ns: dict[str, Any]) -> None:
    wd = _wd(ns)
    for which in range(len(_models())):
        model = _model(which)
        got, expected = observe(ns, _learner, which, wd)["assignment"], _expected(which, wd)
        wrong = {n: got.get(n) for n, wds in expected.items() if got.get(n, [None])[:1] != wds}
        if wrong:
            name = next(iter(wrong))
            p = dict(model.named_parameters())[name]
            hint = (
                f"{name} has {p.dim()} dimension(s): "
                + ("matrices and kernels (dim >= 2) get weight_decay=wd" if p.dim() >= 2 else
                   "biases, norm scales and other 1-D tensors get weight_decay=0.0")
            )
            raise CheckFailed(
                f"some parameters of a {type(model).__name__} got the wrong weight decay (wd={wd})",
                hint=hint,
                expected={n: expected[n] for n in wrong},
                got=wrong,
            )


@check_for("06", "frozen parameters left out", points=1, parts=("06.1",))
def frozen_excluded(ns: dict[str, Any]) -> None:
    wd = _wd(ns)
    got = observe(ns, _learner, 0, wd)["assignment"]
    decays = {d for wds in got.values() for d in wds}
    if not decays <= {wd, 0.0}:
        raise CheckFailed(f"the groups should use weight_decay={wd} (the wd passed in) or 0.0",
                          expected=sorted({wd, 0.0}), got=sorted(decays))
    frozen = [n for n, p in _model(0).named_parameters() if not p.requires_grad]
    included = [n for n in frozen if n in got]
    if included:
        raise CheckFailed(
            "frozen parameters (requires_grad=False) were put in an optimizer group: the optimizer would carry "
            "state for weights that never change",
            hint="skip parameters whose requires_grad is False",
            expected="none of " + ", ".join(frozen),
            got=included,
        )


@check_for("06", "each parameter exactly once, AdamW accepts it", points=1, parts=("06.1",))
def once_each(ns: dict[str, Any]) -> None:
    wd = _wd(ns)
    seen = observe(ns, _learner, 0, wd)
    got = seen["assignment"]
    twice = {n: wds for n, wds in got.items() if len(wds) > 1}
    foreign = [n for n in got if n == "<not in model>"]
    missing = [n for n, p in _model(0).named_parameters() if p.requires_grad and n not in got]
    if twice or foreign or missing:
        raise CheckFailed(
            "every trainable parameter must be in exactly one group (tied weights are one tensor)",
            hint="loop over model.named_parameters() once (it skips the second name of a tied tensor)",
            expected="each trainable parameter once",
            got={"in several groups": twice, "missing": missing, "not from this model": len(foreign)},
        )
    if seen["adamw"] != sorted({wd, 0.0}):
        raise CheckFailed(
            "AdamW should see two decay values: wd for matrices and 0.0 for the rest",
            hint="set 'weight_decay' explicitly in both groups (AdamW's default is 0.01, not 0)",
            expected=sorted({wd, 0.0}),
            got=seen["adamw"],
        )
