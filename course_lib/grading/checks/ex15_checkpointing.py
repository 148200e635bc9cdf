"""Checks for exercise 15: activation checkpointing, and counting what it saves.

The learner writes ``count_saved_bytes(fn, exclude=())`` (the bytes of the distinct storages autograd saves while
``fn()`` runs, storages of ``exclude`` skipped) and ``checkpointed_forward(blocks, x, which)`` (blocks in order,
those whose index is in ``which`` under ``torch.utils.checkpoint``). Sizes, the chosen blocks and the dropout seed
come from the grading run's seed; the grader recomputes outputs, gradients and byte counts with the course's
reference (:mod:`course_lib.perf.checkpointing`) and compares.
"""

from __future__ import annotations

from typing import Any

import torch

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed
from course_lib.perf.checkpointing import block_stack, checkpointed_forward, count_saved_bytes

DROPOUT = 0.2


def _case(ns: Any) -> dict[str, Any]:
    """Sizes, blocks to checkpoint and seeds for this grading run (the same in the child and in the grader)."""
    seed = run_seed(ns)
    n_blocks = 3 + seed % 2
    which = sorted({0, 2 + seed % (n_blocks - 2)})  # block 0 always: its input does not require grad
    return {"n_blocks": n_blocks, "d": 16 + 8 * (seed % 3), "batch": 8 + seed % 5, "which": which,
            "seed": 1000 + seed % 997}


def _inputs(case: dict[str, Any]) -> tuple[torch.nn.ModuleList, torch.Tensor]:
    blocks = block_stack(case["n_blocks"], case["d"], p=DROPOUT, seed=case["seed"])
    x = torch.randn(case["batch"], case["d"], generator=torch.Generator().manual_seed(case["seed"]))
    return blocks, x


def _forward_and_grads(forward: Any, case: dict[str, Any], which: list[int]) -> dict[str, Any]:
    blocks, x = _inputs(case)
    torch.manual_seed(case["seed"])  # dropout masks: the same for every implementation
    out = call(forward, blocks, x, list(which))
    if not isinstance(out, torch.Tensor):
        return {"out": one_line(out), "grads": []}
    out.pow(2).mean().backward()
    grads = [None if p.grad is None else p.grad.detach().clone() for p in blocks.parameters()]
    return {"out": out.detach(), "grads": grads}


def _learner_run(ns: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    forward = need(ns, "checkpointed_forward", "define `checkpointed_forward(blocks, x, which)`")
    return _forward_and_grads(forward, case, case["which"])


def _learner_saved(ns: dict[str, Any], case: dict[str, Any]) -> int:
    forward = need(ns, "checkpointed_forward", "define `checkpointed_forward(blocks, x, which)`")
    blocks, x = _inputs(case)
    return count_saved_bytes(lambda: call(forward, blocks, x, list(case["which"])), exclude=list(blocks.parameters()))


def _reference(case: dict[str, Any]) -> dict[str, Any]:
    """The plain model's output and gradients: computed once per case in the grader (two checks use them)."""
    key = tuple(sorted((k, str(v)) for k, v in case.items()))
    if key not in _REFERENCES:
        _REFERENCES.clear()
        _REFERENCES[key] = _forward_and_grads(checkpointed_forward, case, [])
    return _REFERENCES[key]


_REFERENCES: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}


def _reference_saved(case: dict[str, Any], which: list[int]) -> int:
    blocks, x = _inputs(case)
    return count_saved_bytes(lambda: checkpointed_forward(blocks, x, which), exclude=list(blocks.parameters()))


# ---------------------------------------------------------------- 15.1: the counter
def _counter_cases(seed: int) -> dict[str, tuple[Any, list[torch.Tensor]]]:
    """name -> (fn, exclude): each case catches one way of counting wrong."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(7 + seed % 5, 3, generator=g, requires_grad=True)
    linear = torch.nn.Linear(6, 4 + seed % 3)
    torch.nn.init.normal_(linear.weight, generator=g)
    xs = torch.randn(5, 6, generator=g, requires_grad=True)
    blocks = block_stack(2, 8, p=0.0, seed=seed)
    xb = torch.randn(3, 8, generator=g)
    big = torch.randn(10 + seed % 7, 4, generator=g, requires_grad=True)
    start = 1 + seed % 3
    return {
        "a * a (one tensor, saved twice)": (lambda: a * a, []),
        "a float64 exp (bytes, not elements)": (lambda: a.double().exp(), []),
        "Linear with its parameters excluded": (lambda: linear(xs).relu(), list(linear.parameters())),
        "two residual blocks, parameters excluded": (lambda: blocks[1](blocks[0](xb)), list(blocks.parameters())),
        # sin saves its input: a view of three rows, whose whole storage stays alive for backward
        f"sin of a slice big[{start}:{start + 3}] (the whole storage is kept)": (
            lambda: big[start : start + 3].sin(), []),
    }


FIRST = "a * a (one tensor, saved twice)"
AGAIN = "the first case, counted again"


def _learner_counts(ns: dict[str, Any], seed: int) -> dict[str, Any]:
    counter = need(ns, "count_saved_bytes", "define `count_saved_bytes(fn, exclude=())`")
    cases = _counter_cases(seed)
    got = {name: call(counter, fn, exclude) for name, (fn, exclude) in cases.items()}
    fn, exclude = cases[FIRST]
    got[AGAIN] = call(counter, fn, exclude)  # a counter that keeps state between calls answers differently
    return got


def _miscounts(fn: Any, exclude: list[torch.Tensor]) -> dict[str, int]:
    """What each known way of counting wrong gives for ``fn``: the value names the mistake."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    storages: dict[int, tuple[int, int]] = {}
    views: dict[int, int] = {}
    every: dict[int, int] = {}
    per_save = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal per_save
        storage = t.untyped_storage()
        every[storage.data_ptr()] = storage.nbytes()
        if storage.data_ptr() not in skip:
            storages[storage.data_ptr()] = (storage.nbytes(), storage.nbytes() // t.element_size())
            views[storage.data_ptr()] = t.numel() * t.element_size()
            per_save += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return {"elements": sum(n for _, n in storages.values()), "per save": per_save,
            "exclude ignored": sum(every.values()), "views": sum(views.values())}


_MISCOUNT_HINTS = {
    "elements": "count bytes (untyped_storage().nbytes()), not elements (numel())",
    "per save": "a tensor saved by two operations (or twice by one) is one piece of memory: remember each "
                "storage's data_ptr() and count it once",
    "exclude ignored": "skip the storages of the tensors in `exclude` (the weights are the model's state, not "
                       "activations)",
    "views": "a saved tensor can be a view (a slice) of a larger storage, and backward keeps the whole storage "
             "alive: count t.untyped_storage().nbytes(), not the view's numel() * element_size()",
}


def _counter_hint(fn: Any, exclude: list[torch.Tensor], value: Any, want: int, got: dict[str, Any]) -> str:
    """The hint for a wrong count, chosen by what the value matches (not by which case it was)."""
    first = got.get(FIRST)
    if AGAIN in got and got[AGAIN] != first:
        return (f"count_saved_bytes gave {first} the first time and {got[AGAIN]} when called again on the same "
                "function: start from nothing on every call (a new dict or set inside the function, not a global "
                "or a default argument)")
    for mistake, miscount in _miscounts(fn, exclude).items():
        if miscount != want and value == miscount:
            return _MISCOUNT_HINTS[mistake]
    return ("count every storage saved for backward once, in bytes (untyped_storage().nbytes()), except those of "
            "`exclude`")


@check_for("15", "count_saved_bytes: distinct saved storages, in bytes", points=1, parts=("15.1",))
def counter_counts(ns: Any) -> None:
    seed = run_seed(ns) % 1000
    got = observe(ns, _learner_counts, seed)
    cases = _counter_cases(seed)
    for name, (fn, exclude) in [*cases.items(), (AGAIN, cases[FIRST])]:
        want = count_saved_bytes(fn, exclude)
        value = got.get(name) if isinstance(got, dict) else got
        if value != want:
            raise CheckFailed(f"count_saved_bytes is wrong for {name}",
                              hint=_counter_hint(fn, exclude, value, want, got if isinstance(got, dict) else {}),
                              expected=want, got=value)


# ---------------------------------------------------------------- 15.2: checkpointing
@check_for("15", "checkpointed forward: same outputs as the plain model", points=1, parts=("15.2",))
def same_outputs(ns: Any) -> None:
    case = _case(ns)
    got = observe(ns, _learner_run, case)["out"]
    want = _reference(case)["out"]
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or not torch.allclose(got, want, atol=1e-5):
        raise CheckFailed(
            f"checkpointed_forward(blocks, x, which={case['which']}) does not give the plain model's output",
            hint="apply every block once, in order; checkpoint(block, x, use_reentrant=False) returns what "
                 "block(x) returns",
            expected=f"shape {tuple(want.shape)}, first values {want.flatten()[:3].tolist()}",
            got=f"shape {tuple(got.shape)}, first values {got.flatten()[:3].tolist()}"
            if isinstance(got, torch.Tensor) else got)


@check_for("15", "checkpointed forward: same gradients, dropout included", points=1, parts=("15.2",))
def same_gradients(ns: Any) -> None:
    case = _case(ns)
    got = observe(ns, _learner_run, case)["grads"]
    want = _reference(case)["grads"]
    if len(got) != len(want):
        raise CheckFailed("no gradients to compare: the output was not a tensor", got=got)
    missing = [i for i, g in enumerate(got) if g is None]
    if missing:
        raise CheckFailed(
            f"{len(missing)} parameters got no gradient (block 0's input does not require grad)",
            hint="use checkpoint(..., use_reentrant=False): the old reentrant variant gives no gradients to a "
                 "block whose inputs do not require grad, and torch.no_grad() gives none at all",
            expected="a gradient for every parameter", got=f"None for {len(missing)} of {len(got)}")
    worst = max(float((g - w).abs().max()) for g, w in zip(got, want))
    if worst > 1e-5:
        raise CheckFailed(
            "the gradients differ from the plain model's although the outputs agree: the recomputation in backward "
            "used other dropout masks",
            hint="keep preserve_rng_state=True (the default): the checkpoint then replays the forward's random "
                 "state when it recomputes the block",
            expected="largest difference below 1e-05", got=f"largest difference {worst:.2e}")


@check_for("15", "checkpointed forward: saves only what the chosen blocks keep", points=1, parts=("15.2",))
def saved_bytes(ns: Any) -> None:
    case = _case(ns)
    got = observe(ns, _learner_saved, case)
    want = _reference_saved(case, case["which"])
    plain = _reference_saved(case, [])
    if got != want:
        hint = ("nothing was saved less than without checkpointing: are the chosen blocks wrapped in checkpoint()?"
                if got >= plain else
                "checkpoint exactly the blocks whose index is in `which`, the others run as usual")
        raise CheckFailed(f"with which={case['which']} the forward saved {got} bytes for backward "
                          f"(plain model: {plain})", hint=hint, expected=want, got=got)
