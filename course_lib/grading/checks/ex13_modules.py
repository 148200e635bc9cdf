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
import torch.nn.functional as F
from torch import nn

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed

LINEARS = 3  # layers of every StackMLP the checks build


def _sizes(seed: int) -> list[int]:
    """Three Linear layers, widths different in every grading run (and from the ones the notebook shows)."""
    return [5 + seed % 4, 9 + seed % 3, 7 + seed % 5, 3 + seed % 2]


def _head_sizes(seed: int) -> dict[str, int]:
    return {"colour": 4 + seed % 3, "shape": 6, "size": 2 + seed % 4}


def _batch(seed: int) -> int:
    """Rows of the inputs the checks feed in: different in every grading run."""
    return 16 + seed % 17


def _check_shape(out: Any, want: tuple[int, ...]) -> None:
    """The output must have come from this run's inputs (widths and batch change from run to run)."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        raise CheckFailed("the output does not have the shape these inputs give",
                          hint="return the last layer's output ([batch, sizes[-1]]; a dict of heads for MultiHead)",
                          expected=want, got=tuple(out.shape) if isinstance(out, torch.Tensor) else out)


def _stack(ns: dict[str, Any], seed: int, p: float = 0.0) -> nn.Module:
    cls = need(ns, "StackMLP", "define `class StackMLP(nn.Module)` taking `sizes` (a list of widths) and `p`")
    torch.manual_seed(0)
    return call(cls, _sizes(seed), p=p)


def _multi(ns: dict[str, Any], seed: int, p: float = 0.0) -> nn.Module:
    cls = need(ns, "MultiHead", "define `class MultiHead(nn.Module)` taking `d_in, d_hidden, heads, p`")
    torch.manual_seed(0)
    return call(cls, 6, 10, _head_sizes(seed), p=p)


def _x(seed: int, batch: int, d_in: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 10_000 + batch * 100 + d_in)
    return torch.randn(batch, d_in, generator=g, dtype=dtype)


def _flat(out: Any) -> Any:
    if isinstance(out, dict):
        return {str(k): v.detach() for k, v in out.items() if isinstance(v, torch.Tensor)}
    return out.detach() if isinstance(out, torch.Tensor) else one_line(out)


def _stack_seen(ns: dict[str, Any], seed: int) -> dict[str, Any]:
    model = _stack(ns, seed)
    linears = [[m.weight.detach(), m.bias.detach() if m.bias is not None else None]
               for m in model.modules() if isinstance(m, nn.Linear)]
    return {"numel": sum(p.numel() for p in model.parameters()), "linears": linears,
            "out": _flat(model.eval()(_x(seed, 4, _sizes(seed)[0])))}


def _reference_forward(linears: list[list[torch.Tensor]], x: torch.Tensor) -> torch.Tensor:
    """Linear layers with ReLU between them and nothing after the last (dropout is off in eval mode)."""
    for i, (weight, bias) in enumerate(linears):
        x = torch.nn.functional.linear(x, weight, bias)
        if i < len(linears) - 1:
            x = torch.relu(x)
    return x


@check_for("13", "every layer is registered", points=1, parts=("13.1", "13.2"))
def layers_registered(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    sizes = _sizes(seed)
    seen = observe(ns, _stack_seen, seed)
    expected = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
    got = seen["numel"]
    if got != expected:
        raise CheckFailed(
            f"StackMLP({sizes}) should own {len(sizes) - 1} Linear layers, but parameters() sees {got} numbers",
            hint="layers kept in a plain Python list are invisible to parameters(); keep them in nn.ModuleList",
            expected=expected,
            got=got,
        )
    out = seen["out"]
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (4, sizes[-1]):
        raise CheckFailed(
            "forward should map [batch, sizes[0]] to [batch, sizes[-1]]",
            hint="apply every layer in order (an activation between layers, none after the last)",
            expected=(4, sizes[-1]),
            got=tuple(out.shape) if isinstance(out, torch.Tensor) else out,
        )


@check_for("13", "forward: ReLU between layers, none after the last", points=1, parts=("13.1", "13.2"))
def forward_values(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    sizes = _sizes(seed)
    seen = observe(ns, _stack_seen, seed)
    out, linears = seen["out"], seen["linears"]
    shapes = [tuple(w.shape) for w, _ in linears]
    if shapes != [(b, a) for a, b in zip(sizes[:-1], sizes[1:])] or not isinstance(out, torch.Tensor):
        raise CheckFailed("StackMLP should hold one Linear per pair of consecutive sizes, in order",
                          expected=[(b, a) for a, b in zip(sizes[:-1], sizes[1:])], got=shapes)
    want = _reference_forward(linears, _x(seed, 4, sizes[0]))
    if out.shape != want.shape or not torch.allclose(out, want, atol=1e-5):
        hint = ("the output has no negative numbers: a ReLU after the last layer cuts off the logits"
                if (out >= 0).all() and (want < 0).any() else
                "Linear, then ReLU (and dropout) between layers, and the last Linear's output returned as it is")
        raise CheckFailed("in eval mode, StackMLP's output differs from Linear -> ReLU -> ... -> Linear",
                          hint=hint, expected=want[0].tolist(), got=out[0].tolist())


def _train_outputs(ns: dict[str, Any], seed: int) -> Any:
    model = _stack(ns, seed, p=0.5)
    model.train()
    torch.manual_seed(1)
    with torch.no_grad():
        return _flat(model(_x(seed, _batch(seed), _sizes(seed)[0])))


@check_for("13", "no dropout after the last layer", points=1, parts=("13.1", "13.2"))
def no_final_dropout(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    out = observe(ns, _train_outputs, seed)
    if not isinstance(out, torch.Tensor):
        raise CheckFailed("StackMLP.forward should return a tensor", got=out)
    _check_shape(out, (_batch(seed), _sizes(seed)[-1]))
    zeros = float((out == 0).float().mean())
    if zeros > 0.25:  # a Linear layer's output is practically never exactly 0; dropout(0.5) zeroes half
        raise CheckFailed(
            f"in train mode {zeros:.0%} of the outputs are exactly 0: dropout (or a ReLU) is applied to the final "
            "output, which randomly erases logits",
            hint="apply dropout between layers only, never to the last Linear's output",
            expected="(almost) no exact zeros", got=f"{zeros:.0%} zeros")
def _state_and_to(ns: dict[str, Any], seed: int) -> dict[str, Any]:
    model = _stack(ns, seed)
    keys = [k for k in model.state_dict() if k.endswith("weight")]
    model.to(torch.float64)  # .to(dtype) walks the same tree as .to(device)
    left_behind = [n for n, p in model.named_parameters() if p.dtype != torch.float64]
    out = model.eval()(_x(seed, _batch(seed), _sizes(seed)[0], torch.float64))
    return {"keys": keys, "left_behind": left_behind, "out": _flat(out),
            "out_dtype": str(out.dtype) if isinstance(out, torch.Tensor) else one_line(out)}


@check_for("13", "state_dict and .to() see the layers", points=1, parts=("13.1", "13.2"))
def state_and_to(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _state_and_to, seed)
    _check_shape(seen["out"], (_batch(seed), _sizes(seed)[-1]))
    keys = seen["keys"]
    if len(keys) != LINEARS:
        raise CheckFailed(
            "state_dict() should hold one weight per Linear layer: a checkpoint would lose the others",
            hint="registered submodules (nn.ModuleList) are saved; list elements are not",
            expected=f"{LINEARS} '...weight' keys",
            got=keys,
        )
    if seen["left_behind"] or seen["out_dtype"] != "torch.float64":
        raise CheckFailed(
            "model.to(...) did not move every layer: unregistered layers stay where they were",
            hint="store the layers in nn.ModuleList so .to(device) reaches them",
            expected="all parameters float64 after model.to(torch.float64)",
            got=seen["left_behind"] or f"output dtype {seen['out_dtype']}",
        )


class _Hidden(nn.Module):  # a plain list hides two layers; one frozen layer still counts
    def __init__(self, width: int) -> None:
        super().__init__()
        self.seen = nn.Linear(3, width)
        self.frozen = nn.Linear(width, 2)
        self.frozen.requires_grad_(False)
        self.hidden = [nn.Linear(width, width), nn.Linear(width, width)]


class _Tied(nn.Module):  # BatchNorm's buffers are not parameters; a weight shared by two modules is one parameter
    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norm = nn.BatchNorm1d(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight


def _count_models(seed: int) -> list[nn.Module]:
    return [_Hidden(4 + seed % 6), nn.Sequential(nn.Embedding(11 + seed % 13, 3), nn.LayerNorm(3)),
            _Tied(7 + seed % 5, 3 + seed % 4)]


def _count_hint(model: nn.Module, got: str) -> str:
    """The hint for a wrong count: what the count matches."""
    if got == repr(sum(t.numel() for t in model.state_dict().values())):
        return ("state_dict() also holds buffers (BatchNorm's running statistics: not parameters) and lists a weight "
                "shared by two modules under both names: sum(p.numel() for p in model.parameters())")
    if got == repr(sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))):
        return ("a weight shared by two modules (an embedding tied to the output layer) is one parameter: count it "
                "once, as model.parameters() does")
    return "sum(p.numel() for p in model.parameters())"


def _counts(ns: dict[str, Any], seed: int) -> list[Any]:
    count = need(ns, "count_registered", "define `count_registered(model) -> int`")
    return [one_line(call(count, model)) for model in _count_models(seed)]


@check_for("13", "count_registered", points=1, parts=("13.3",))
def counts(ns: dict[str, Any]) -> None:
    for model, got in zip(_count_models(run_seed(ns)), observe(ns, _counts, run_seed(ns))):
        expected = sum(p.numel() for p in model.parameters())
        if got != repr(expected):
            raise CheckFailed(
                "count_registered should add up the elements of every registered parameter (frozen ones too), "
                "each once, and nothing hidden in plain lists or buffers",
                hint=_count_hint(model, got),
                expected=expected,
                got=got,
            )


def _heads(ns: dict[str, Any], seed: int) -> dict[str, Any]:
    model = _multi(ns, seed)
    out = model.eval()(_x(seed, 3, 6))
    return {"out": _flat(out) if isinstance(out, dict) else type(out).__name__, "keys": sorted(model.state_dict()),
            "state": {k: v.detach() for k, v in model.state_dict().items()}}


def _trunk_then_heads(state: dict[str, Any], seed: int) -> dict[str, torch.Tensor] | None:
    """What the task's MultiHead computes in eval mode from these weights: each head of ReLU(trunk Linear(x))
    (dropout is the identity in eval mode); None when the trunk's Linear cannot be told from the names."""
    trunk = [k for k, v in state.items() if not k.startswith("heads.") and k.endswith("weight")
             and isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[1] == 6]
    if len(trunk) != 1 or trunk[0][: -len("weight")] + "bias" not in state:
        return None
    features = F.relu(F.linear(_x(seed, 3, 6), state[trunk[0]], state[trunk[0][: -len("weight")] + "bias"]))
    return {name: F.linear(features, state[f"heads.{name}.weight"], state.get(f"heads.{name}.bias"))
            for name in _head_sizes(seed) if f"heads.{name}.weight" in state}


@check_for("13", "ModuleDict of heads", points=1, parts=("13.4", "13.5"))
def multi_head(ns: dict[str, Any]) -> None:
    heads = _head_sizes(run_seed(ns))
    seen = observe(ns, _heads, run_seed(ns))
    out = seen["out"]
    if not isinstance(out, dict) or set(out) != set(heads):
        raise CheckFailed(
            "MultiHead.forward should return a dict with one entry per head name",
            hint="return {name: head(features) for name, head in self.heads.items()}",
            expected=sorted(heads),
            got=sorted(out) if isinstance(out, dict) else out,
        )
    shapes = {k: tuple(v.shape) for k, v in out.items()}
    want = {k: (3, n) for k, n in heads.items()}
    if shapes != want:
        raise CheckFailed("each head should output [batch, n_outputs of that head]", expected=want, got=shapes)
    missing = [f"heads.{name}.weight" for name in heads if f"heads.{name}.weight" not in seen["keys"]]
    if missing:
        raise CheckFailed(
            "the heads should be registered in an nn.ModuleDict attribute called `heads`",
            hint="self.heads = nn.ModuleDict({name: nn.Linear(d_hidden, n) for name, n in heads.items()})",
            expected=missing,
            got=seen["keys"],
        )
    want_out = _trunk_then_heads(seen.get("state") or {}, run_seed(ns))
    if want_out is not None and set(want_out) == set(out) and any(
            not torch.allclose(out[k], want_out[k], atol=1e-5) for k in want_out):
        raise CheckFailed("each head's output should be head(Dropout(ReLU(Linear(x)))): the trunk in that order",
                          hint="self.trunk = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Dropout(p)); "
                               "every head reads the trunk's output", expected="the trunk Linear -> ReLU -> Dropout",
                          got="other outputs from the same weights")


def _flatten(out: Any) -> torch.Tensor:
    return torch.cat([v.flatten() for v in out.values()]) if isinstance(out, dict) else out


def _modes(ns: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    seen = []
    for model, d_in in ((_stack(ns, seed, p=0.5), _sizes(seed)[0]), (_multi(ns, seed, p=0.5), 6)):
        x = _x(seed, _batch(seed), d_in)
        model.train()
        with torch.no_grad():
            train = [_flatten(model(x)).detach(), _flatten(model(x)).detach()]
        model.eval()
        with torch.no_grad():
            evals = [_flatten(model(x)).detach(), _flatten(model(x)).detach()]
        seen.append({"name": type(model).__name__, "train": train, "eval": evals})
    return seen


@check_for("13", "train()/eval() toggle dropout", points=1, parts=("13.1", "13.2", "13.4", "13.5"))
def dropout_modes(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    for seen, width in zip(observe(ns, _modes, seed), (_sizes(seed)[-1], sum(_head_sizes(seed).values()))):
        for out in seen["train"] + seen["eval"]:
            _check_shape(out.reshape(-1) if isinstance(out, torch.Tensor) else out, (_batch(seed) * width,))
        if torch.equal(*seen["train"]):
            raise CheckFailed(
                f"{seen['name']} in train() mode gave identical outputs twice with p=0.5: is dropout used?",
                hint="add an nn.Dropout(p) module (registered) and apply it in forward",
            )
        if not torch.equal(*seen["eval"]):
            raise CheckFailed(
                f"{seen['name']} in eval() mode should be deterministic",
                hint="use nn.Dropout (a module that follows model.eval()), not F.dropout(x, p) with training=True",
            )


def _purity(ns: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    seen = []
    for model, d_in in ((_stack(ns, seed, p=0.2), _sizes(seed)[0]), (_multi(ns, seed, p=0.2), 6)):
        model.eval()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        attrs = set(vars(model))
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), torch.no_grad():
            model(_x(seed, 2, d_in))
            out = _flatten(model(_x(seed, _batch(seed), d_in)))
        after = model.state_dict()
        seen.append({"name": type(model).__name__, "printed": printed.getvalue()[:60], "out": _flat(out),
                     "changed": [k for k in before if k not in after or not torch.equal(before[k], after[k])],
                     "new attributes": sorted(set(vars(model)) - attrs), "training": model.training})
    return seen


@check_for("13", "forward is pure", points=1, parts=("13.1", "13.2", "13.4", "13.5"))
def forward_pure(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    for seen, width in zip(observe(ns, _purity, seed), (_sizes(seed)[-1], sum(_head_sizes(seed).values()))):
        _check_shape(seen["out"], (_batch(seed) * width,) if seen["name"] == "MultiHead" else (_batch(seed), width))
        if seen["printed"] or seen["changed"] or seen["new attributes"] or seen["training"]:
            raise CheckFailed(
                f"{seen['name']}.forward should only compute: no printing, no stored state, no mode changes",
                hint="keep I/O, logging and device moves outside forward so the module runs anywhere",
                got={k: seen[k] for k in ("printed", "changed", "new attributes")},
            )
