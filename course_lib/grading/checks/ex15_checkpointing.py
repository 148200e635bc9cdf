"""Checks for exercise 15: activation checkpointing, and counting what it saves.

The learner writes ``count_saved_bytes(fn, exclude=())`` (the bytes of the distinct storages autograd saves while
``fn()`` runs, storages of ``exclude`` skipped), ``checkpointed_forward(blocks, x, which)`` (blocks in order,
those whose index is in ``which`` under ``torch.utils.checkpoint``) and ``blocks_to_checkpoint(plain, checkpointed,
budget)`` (a part the lesson did not show: the fewest blocks to checkpoint to fit a memory budget). Sizes, the
chosen blocks, the dropout seed and the stacks planned for come from the grading run's seed; the grader recomputes
outputs, gradients and byte counts with the course's reference (:mod:`course_lib.perf.checkpointing`), and the plans
with the rule written out below, and compares.
"""

from __future__ import annotations

import random
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


# ---------------------------------------------------------------- 15.3: a checkpointing plan under a budget
def _plan_case(rng: random.Random, n: int, k: int) -> dict[str, Any]:
    """A stack of ``n`` blocks where exactly ``k`` must be checkpointed (the budget is met with equality), with a
    tie in savings at the margin, the block that saves least first in the stack and keeping the most bytes plainly,
    and the two blocks that save most out of index order."""
    distinct = sorted(rng.sample(range(3, 60), n - 1), reverse=True)
    savings_by_rank = [s * 256 for s in distinct[:k] + [distinct[k - 1]] + distinct[k:]][:n]
    positions = [0, *rng.sample(range(1, n), n - 1)][::-1]  # rank n-1 (least saving) at index 0
    if k >= 2 and positions[0] < positions[1]:
        positions[0], positions[1] = positions[1], positions[0]
    savings = [0] * n
    for rank, position in enumerate(positions):
        savings[position] = savings_by_rank[rank]
    checkpointed = [rng.choice((1, 2, 4)) * 512 for _ in range(n)]
    checkpointed[0] = 64 * 1024  # a block that keeps much either way: the most bytes, the least saved
    plain = [c + s for c, s in zip(checkpointed, savings)]
    return {"plain": plain, "checkpointed": checkpointed, "budget": sum(plain) - sum(savings_by_rank[:k])}


def _plan_cases(seed: int) -> dict[str, dict[str, Any]]:
    rng = random.Random(seed)
    cases = {f"{k} block(s) needed": _plan_case(rng, rng.randint(5, 8), k) for k in (1, 2, 3)}
    fits = _plan_case(rng, 6, 2)
    cases["the plain stack fits"] = dict(fits, budget=sum(fits["plain"]) + rng.randint(0, 4096))
    short = _plan_case(rng, 5, 2)
    cases["nothing fits"] = dict(short, budget=sum(short["checkpointed"]) - rng.randint(1, 50_000))
    # Near misses: checkpointing every block meets the budget exactly (it fits: <=, not <), and blocks that keep
    # much even when checkpointed (subtracting a block's plain bytes instead of its saving stops too early).
    exact = _plan_case(rng, 5, 2)
    cases["every block is needed, exactly"] = dict(exact, budget=sum(exact["checkpointed"]))
    heavy = _plan_case(rng, 6, 3)
    kept = [32 * 1024 * rng.randint(1, 3) for _ in heavy["plain"]]
    cases["checkpointed blocks still keep much"] = {
        "plain": [p + k for p, k in zip(heavy["plain"], kept)],
        "checkpointed": [c + k for c, k in zip(heavy["checkpointed"], kept)],
        "budget": heavy["budget"] + sum(kept)}
    return cases


def plan(plain: list[int], checkpointed: list[int], budget: int) -> list[int] | int:
    """The expected plan, or the bytes by which checkpointing every block misses the budget."""
    if sum(checkpointed) > budget:
        return sum(checkpointed) - budget
    total, chosen = sum(plain), []
    for i in sorted(range(len(plain)), key=lambda i: (-(plain[i] - checkpointed[i]), i)):
        if total <= budget:
            break
        total -= plain[i] - checkpointed[i]
        chosen.append(i)
    return sorted(chosen)


def _learner_plans(ns: dict[str, Any], seed: int) -> dict[str, Any]:
    choose = need(ns, "blocks_to_checkpoint", "define `blocks_to_checkpoint(plain, checkpointed, budget)`")
    answers: dict[str, Any] = {}
    for name, case in _plan_cases(seed).items():
        try:
            answers[name] = {"plan": call(choose, list(case["plain"]), list(case["checkpointed"]), case["budget"])}
        except ValueError as exc:  # the answer asked for when nothing fits: recorded, not a crash
            answers[name] = {"raised": "ValueError", "message": str(exc)[:300]}
    return answers


def _plan_hint(case: dict[str, Any], got: Any, want: list[int]) -> str:
    """The likely mistake, from what the wrong plan matches."""
    plain, checkpointed = case["plain"], case["checkpointed"]
    if not isinstance(got, list):
        return "return a list of block indices (an empty list when the plain stack fits)"
    if sorted(got) == want:
        return "return the indices sorted, lowest first"
    if len(got) == len(want) + 1 and set(want) <= set(got):
        return "stop as soon as the total is at most the budget (<=, not <)"
    if sorted(got) == list(range(len(got))):
        return "the first blocks are not the ones that save most: order the blocks by plain[i] - checkpointed[i]"
    by_plain = sorted(range(len(plain)), key=lambda i: (-plain[i], i))
    if sorted(got) == sorted(by_plain[:len(got)]):
        return "a block that keeps many bytes plainly may keep many checkpointed too: order by what it saves"
    savings = sorted((plain[i] - checkpointed[i] for i in got), reverse=True)
    if len(got) == len(want) and savings == sorted((plain[i] - checkpointed[i] for i in want), reverse=True):
        return "on a tie in savings, take the lower index"
    return "checkpoint the blocks that save most (plain[i] - checkpointed[i]) first, until the total fits"


@check_for("15", "blocks_to_checkpoint: the fewest blocks, those that save most", points=1, parts=("15.3",))
def plans_fit(ns: Any) -> None:
    got = observe(ns, _learner_plans, run_seed(ns))
    for name, case in _plan_cases(run_seed(ns)).items():
        want = plan(case["plain"], case["checkpointed"], case["budget"])
        if isinstance(want, int):
            continue
        answer = got.get(name, {}) if isinstance(got, dict) else {}
        value = answer.get("plan", f"raised ValueError: {answer.get('message')}" if "raised" in answer else None)
        if value != want:
            raise CheckFailed(f"blocks_to_checkpoint is wrong for a stack where {name} "
                              f"(budget {case['budget']} bytes)", hint=_plan_hint(case, value, want),
                              expected=want, got=value)


@check_for("15", "blocks_to_checkpoint: ValueError when even every block does not fit", points=1, parts=("15.3",))
def plan_refuses(ns: Any) -> None:
    got = observe(ns, _learner_plans, run_seed(ns))
    case = _plan_cases(run_seed(ns))["nothing fits"]
    missing = plan(case["plain"], case["checkpointed"], case["budget"])
    answer = got.get("nothing fits", {}) if isinstance(got, dict) else {}
    if answer.get("raised") != "ValueError":
        raise CheckFailed(f"with every block checkpointed the stack keeps {sum(case['checkpointed'])} bytes, more "
                          f"than the budget of {case['budget']}: no plan fits", hint="raise ValueError",
                          expected="ValueError", got=answer.get("plan"))
    if str(missing) not in answer.get("message", ""):
        raise CheckFailed("the ValueError should say by how many bytes the budget is missed",
                          hint="sum(checkpointed) - budget", expected=f"a message containing {missing}",
                          got=answer.get("message"))
