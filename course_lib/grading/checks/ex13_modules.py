"""Checks for exercise 13: modules are trees (registration, containers, train/eval, pure forward).

The learner defines ``StackMLP(sizes, p)`` (layers in an ``nn.ModuleList``), ``count_registered(model)``
and ``MultiHead(d_in, d_hidden, heads, p)`` (heads in an ``nn.ModuleDict``). Every check builds its own
sizes, different from the ones the notebook uses, and inspects behaviour: what ``parameters()``,
``state_dict()`` and ``.to()`` see, and what ``train()``/``eval()`` change.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import torch
from torch import nn

from course_lib.grading.api import CheckFailed, check_for, need

SIZES = [5, 9, 7, 3]  # three Linear layers; the notebook shows other sizes
HEADS = {"colour": 4, "shape": 6, "size": 2}


def _stack(ns: dict[str, Any], p: float = 0.0) -> nn.Module:
    cls = need(ns, "StackMLP", "define `class StackMLP(nn.Module)` taking `sizes` (a list of widths) and `p`")
    torch.manual_seed(0)
    return cls(SIZES, p=p)


def _multi(ns: dict[str, Any], p: float = 0.0) -> nn.Module:
    cls = need(ns, "MultiHead", "define `class MultiHead(nn.Module)` taking `d_in, d_hidden, heads, p`")
    torch.manual_seed(0)
    return cls(6, 10, dict(HEADS), p=p)


def _linear_count(model: nn.Module) -> int:
    return sum(isinstance(m, nn.Linear) for m in model.modules())


@check_for("13", "every layer is registered", points=1)
def layers_registered(ns: dict[str, Any]) -> None:
    model = _stack(ns)
    expected = sum(a * b + b for a, b in zip(SIZES[:-1], SIZES[1:]))
    got = sum(p.numel() for p in model.parameters())
    if got != expected:
        raise CheckFailed(
            f"StackMLP({SIZES}) should own {len(SIZES) - 1} Linear layers, but parameters() sees {got} numbers",
            hint="layers kept in a plain Python list are invisible to parameters(); keep them in nn.ModuleList",
            expected=expected,
            got=got,
        )
    x = torch.randn(4, SIZES[0])
    out = model.eval()(x)
    if tuple(out.shape) != (4, SIZES[-1]):
        raise CheckFailed(
            "forward should map [batch, sizes[0]] to [batch, sizes[-1]]",
            hint="apply every layer in order (an activation between layers, none after the last)",
            expected=(4, SIZES[-1]),
            got=tuple(out.shape),
        )


@check_for("13", "state_dict and .to() see the layers", points=1)
def state_and_to(ns: dict[str, Any]) -> None:
    model = _stack(ns)
    keys = [k for k in model.state_dict() if k.endswith("weight")]
    if len(keys) != len(SIZES) - 1:
        raise CheckFailed(
            "state_dict() should hold one weight per Linear layer: a checkpoint would lose the others",
            hint="registered submodules (nn.ModuleList) are saved; list elements are not",
            expected=f"{len(SIZES) - 1} '...weight' keys",
            got=keys,
        )
    model.to(torch.float64)  # .to(dtype) walks the same tree as .to(device)
    left_behind = [n for n, p in model.named_parameters() if p.dtype != torch.float64]
    out = model.eval()(torch.randn(2, SIZES[0], dtype=torch.float64))
    if left_behind or out.dtype != torch.float64:
        raise CheckFailed(
            "model.to(...) did not move every layer: unregistered layers stay where they were",
            hint="store the layers in nn.ModuleList so .to(device) reaches them",
            expected="all parameters float64 after model.to(torch.float64)",
            got=left_behind or f"output dtype {out.dtype}",
        )


@check_for("13", "count_registered", points=1)
def counts(ns: dict[str, Any]) -> None:
    count = need(ns, "count_registered", "define `count_registered(model) -> int`")

    class Hidden(nn.Module):  # a plain list hides two layers; one frozen layer still counts
        def __init__(self) -> None:
            super().__init__()
            self.seen = nn.Linear(3, 4)
            self.frozen = nn.Linear(4, 2)
            self.frozen.requires_grad_(False)
            self.hidden = [nn.Linear(4, 4), nn.Linear(4, 4)]

    for model in (Hidden(), nn.Sequential(nn.Embedding(11, 3), nn.LayerNorm(3))):
        expected = sum(p.numel() for p in model.parameters())
        got = count(model)
        if got != expected:
            raise CheckFailed(
                "count_registered should add up the elements of every registered parameter (frozen ones too), "
                "and nothing hidden in plain lists",
                hint="sum(p.numel() for p in model.parameters())",
                expected=expected,
                got=got,
            )


@check_for("13", "ModuleDict of heads", points=1)
def multi_head(ns: dict[str, Any]) -> None:
    model = _multi(ns)
    out = model.eval()(torch.randn(3, 6))
    if not isinstance(out, dict) or set(out) != set(HEADS):
        raise CheckFailed(
            "MultiHead.forward should return a dict with one entry per head name",
            hint="return {name: head(features) for name, head in self.heads.items()}",
            expected=sorted(HEADS),
            got=sorted(out) if isinstance(out, dict) else type(out).__name__,
        )
    shapes = {k: tuple(v.shape) for k, v in out.items()}
    want = {k: (3, n) for k, n in HEADS.items()}
    if shapes != want:
        raise CheckFailed("each head should output [batch, n_outputs of that head]", expected=want, got=shapes)
    keys = set(model.state_dict())
    missing = [f"heads.{name}.weight" for name in HEADS if f"heads.{name}.weight" not in keys]
    if missing:
        raise CheckFailed(
            "the heads should be registered in an nn.ModuleDict attribute called `heads`",
            hint="self.heads = nn.ModuleDict({name: nn.Linear(d_hidden, n) for name, n in heads.items()})",
            expected=missing,
            got=sorted(keys),
        )


@check_for("13", "train()/eval() toggle dropout", points=1)
def dropout_modes(ns: dict[str, Any]) -> None:
    for model, d_in in ((_stack(ns, p=0.5), SIZES[0]), (_multi(ns, p=0.5), 6)):
        x = torch.randn(16, d_in)
        flat = lambda o: torch.cat([v.flatten() for v in o.values()]) if isinstance(o, dict) else o  # noqa: E731
        model.train()
        with torch.no_grad():
            a, b = flat(model(x)), flat(model(x))
        if torch.equal(a, b):
            raise CheckFailed(
                f"{type(model).__name__} in train() mode gave identical outputs twice with p=0.5: is dropout used?",
                hint="add an nn.Dropout(p) module (registered) and apply it in forward",
            )
        model.eval()
        with torch.no_grad():
            a, b = flat(model(x)), flat(model(x))
        if not torch.equal(a, b):
            raise CheckFailed(
                f"{type(model).__name__} in eval() mode should be deterministic",
                hint="use nn.Dropout (a module that follows model.eval()), not F.dropout(x, p) with training=True",
            )


@check_for("13", "forward is pure", points=1)
def forward_pure(ns: dict[str, Any]) -> None:
    for model, d_in in ((_stack(ns, p=0.2), SIZES[0]), (_multi(ns, p=0.2), 6)):
        model.eval()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        attrs = set(vars(model))
        x = torch.randn(2, d_in)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), torch.no_grad():
            model(x)
            model(x)
        after = model.state_dict()
        changed = [k for k in before if not torch.equal(before[k], after[k])]
        if printed.getvalue() or changed or set(vars(model)) != attrs or model.training:
            raise CheckFailed(
                f"{type(model).__name__}.forward should only compute: no printing, no stored state, no mode changes",
                hint="keep I/O, logging and device moves outside forward so the module runs anywhere",
                got={"printed": printed.getvalue()[:60], "changed": changed, "new attributes": sorted(set(vars(model)) - attrs)},
            )
