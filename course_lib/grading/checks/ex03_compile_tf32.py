"""Checks for exercise 03: steady-state timing, compile with ``mode=``, TF32, and the recompilation stall."""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line


def _close(a: Any, b: float) -> bool:
    return isinstance(a, (int, float)) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


_TIMES = [9.0, 2.0, 0.21, 0.2, 0.23, 0.19, 0.2, 1.5]


def _outcome(fn: Any, *args: Any) -> str:
    """What ``fn(*args)`` did: its value (repr) or the name of the exception it raised."""
    try:
        return one_line(fn(*args))
    except Exception as exc:
        return type(exc).__name__


def _steady(ns: dict[str, Any]) -> dict[str, Any]:
    fn = need(ns, "steady_state", "define `steady_state(times, warmup)` in the exercise cell")
    got = call(fn, list(_TIMES), 2)
    return {"got": got if isinstance(got, (int, float)) else one_line(got),
            "bad": [_outcome(fn, list(_TIMES), bad) for bad in (-1, len(_TIMES), len(_TIMES) + 3)]}


@check_for("03", "steady state drops the warm-up")
def steady_state_check(ns: dict[str, Any]) -> None:
    seen = observe(ns, _steady)
    times = _TIMES
    expected = statistics.median(times[2:])
    got = seen["got"]
    if not _close(got, expected):
        hint = "use the median of the steps after the first `warmup` ones (a late hiccup should not move it)"
        if _close(got, statistics.mean(times)) or _close(got, statistics.median(times)):
            hint = "drop the first `warmup` steps: they include compilation and cache warm-up"
        elif _close(got, statistics.mean(times[2:])):
            hint = "the mean is pulled by the late 1.5 s hiccup: use the median"
        raise CheckFailed("steady-state step time is off", hint=hint, expected=expected, got=got)
    for bad, outcome in zip((-1, len(times), len(times) + 3), seen["bad"]):
        if outcome != "ValueError":
            raise CheckFailed(f"steady_state(times, warmup={bad}) with {len(times)} times should raise ValueError",
                              hint="nothing would be left to measure (or warmup is negative)", expected="ValueError",
                              got=outcome)


_EAGER = [0.5, 0.31, 0.3, 0.3, 0.29, 0.3]
_COMPILED = [40.0, 0.12, 0.1, 0.1, 0.11, 0.1]


def _speedup(ns: dict[str, Any]) -> Any:
    fn = need(ns, "speedup", "define `speedup(baseline_times, new_times, warmup)` in the exercise cell")
    got = call(fn, list(_EAGER), list(_COMPILED), 1)
    return got if isinstance(got, (int, float)) else one_line(got)


@check_for("03", "speedup is a ratio of steady states")
def speedup_check(ns: dict[str, Any]) -> None:
    got = observe(ns, _speedup)
    expected = statistics.median(_EAGER[1:]) / statistics.median(_COMPILED[1:])
    if not _close(got, expected):
        hint = "baseline time divided by new time, both measured after the warm-up steps"
        if isinstance(got, (int, float)) and got < 1:
            hint = "the ratio is upside down, or the compile step is still in the average"
        raise CheckFailed("speedup is off", hint=hint, expected=expected, got=got)


def _compile_call(ns: dict[str, Any]) -> dict[str, Any]:
    fn = need(ns, "compile_model", "define `compile_model(model, mode='default', backend='inductor')`")
    original = torch.compile
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append((args, dict(kwargs)))
        kwargs["backend"] = "eager"  # the check only needs a working graph, not fast kernels
        kwargs.pop("mode", None)
        return original(args[0], **kwargs)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU())
    torch.compile = spy  # type: ignore[assignment]
    try:
        compiled = call(fn, model, mode="max-autotune", backend="eager")
    finally:
        torch.compile = original  # type: ignore[assignment]
    if not seen:
        return {"called": False}
    args, kwargs = seen[-1]
    torch._dynamo.reset()
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        outputs = [compiled(x), model(x)] if callable(compiled) else None
    return {"called": True, "positional": [one_line(a) for a in args[1:]],
            "kwargs": {k: one_line(v) for k, v in kwargs.items()}, "outputs": outputs}


@check_for("03", "compile passes mode by keyword")
def compile_keyword(ns: dict[str, Any]) -> None:
    seen = observe(ns, _compile_call)
    if not seen["called"]:
        raise CheckFailed("call torch.compile inside compile_model")
    if seen["positional"]:
        raise CheckFailed("torch.compile takes only the model positionally: mode, backend and every other option are "
                          "keyword-only, so torch.compile(model, 'max-autotune') is a TypeError",
                          hint="torch.compile(model, mode=mode, backend=backend)",
                          expected="torch.compile(model, mode='max-autotune', ...)",
                          got=f"positional {seen['positional']}")
    kwargs = seen["kwargs"]
    if kwargs.get("mode") != repr("max-autotune") or kwargs.get("backend") != repr("eager"):
        raise CheckFailed("pass both mode and backend on to torch.compile",
                          expected={"mode": "max-autotune", "backend": "eager"}, got=kwargs)
    outputs = seen["outputs"]
    if not (isinstance(outputs, list) and all(isinstance(o, torch.Tensor) for o in outputs)
            and outputs[0].shape == outputs[1].shape and torch.allclose(outputs[0], outputs[1])):
        raise CheckFailed("the compiled model should compute what the model computes (return torch.compile's result)")


def _tf32(ns: dict[str, Any]) -> list[Any]:
    fn = need(ns, "set_tf32", "define `set_tf32(enabled)` in the exercise cell")
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        first = one_line(call(fn, True))
        after_first = torch.get_float32_matmul_precision()
        second = one_line(call(fn, False))
        return [first, after_first, second, torch.get_float32_matmul_precision()]
    finally:
        torch.set_float32_matmul_precision(before)


@check_for("03", "TF32 toggled through matmul precision")
def tf32_toggle(ns: dict[str, Any]) -> None:
    previous, now, previous2, now2 = observe(ns, _tf32)
    if now != "high":
        raise CheckFailed("set_tf32(True) should allow TF32 for float32 matmuls",
                          hint="torch.set_float32_matmul_precision('high')", expected="high", got=now)
    if previous != repr("highest"):
        raise CheckFailed("return the previous precision so the caller can restore it",
                          expected=repr("highest"), got=previous)
    if now2 != "highest" or previous2 != repr("high"):
        raise CheckFailed("set_tf32(False) should restore full float32 matmuls and return the previous setting",
                          expected=("highest", repr("high")), got=(now2, previous2))


_STEP_TIMES = [7.0, 0.1, 0.11, 0.1, 0.1, 2.5, 0.1, 0.12, 0.1, 0.31]


def _slow(ns: dict[str, Any]) -> list[Any]:
    fn = need(ns, "slow_steps", "define `slow_steps(times, factor=3.0)` in the exercise cell")
    as_list = lambda got: list(got) if isinstance(got, (list, tuple)) else one_line(got)  # noqa: E731
    return [as_list(call(fn, list(_STEP_TIMES))), as_list(call(fn, list(_STEP_TIMES), factor=50.0))]


@check_for("03", "slow steps found relative to the median")
def slow_steps_check(ns: dict[str, Any]) -> None:
    got, got_factor = observe(ns, _slow)
    median = statistics.median(_STEP_TIMES)
    expected = [i for i, t in enumerate(_STEP_TIMES) if t > 3.0 * median]
    if got != expected:
        raise CheckFailed("the slow steps (compilation, recompilation) are the ones over factor x the median",
                          hint="compare with the median, not the mean: the stalls themselves inflate the mean",
                          expected=expected, got=got)
    if got_factor != [0]:
        raise CheckFailed("honour the factor argument", expected=[0], got=got_factor)


def _recompile_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


_BATCHES = ([4, 4, 4], [4, 4, 9, 9, 2])


def _inputs(sizes: list[int]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(len(sizes))
    return [torch.randn(b, 5, generator=g) for b in sizes]


def _reference_compiles(model: torch.nn.Module, inputs: list[torch.Tensor]) -> int:
    torch._dynamo.reset()
    graphs = 0

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        nonlocal graphs
        graphs += 1
        return gm.forward

    compiled = torch.compile(model, backend=counting_backend)
    for x in inputs:
        compiled(x)
    torch._dynamo.reset()
    return graphs


def _compile_counts(ns: dict[str, Any]) -> list[Any]:
    fn = need(ns, "count_compiles", "define `count_compiles(model, inputs)` in the exercise cell")
    model = _recompile_model()
    # Each batch pattern is counted twice in a row, with no reset in between: the second count must not
    # depend on what the first one left in dynamo's cache.
    counts = [one_line(call(fn, model, _inputs(sizes))) for sizes in _BATCHES for _ in range(2)]
    torch._dynamo.reset()
    return counts


@check_for("03", "recompilations counted when the batch changes")
def recompile_count(ns: dict[str, Any]) -> None:
    counts = observe(ns, _compile_counts)
    for i, sizes in enumerate(_BATCHES):
        expected = _reference_compiles(_recompile_model(), _inputs(sizes))
        first, again = counts[2 * i], counts[2 * i + 1]
        if first != repr(expected):
            hint = "compile with a backend that counts its calls (one call = one graph compiled)"
            raise CheckFailed(f"compiled graphs for batch sizes {sizes} differ", hint=hint, expected=expected,
                              got=first)
        if again != repr(expected):
            raise CheckFailed(f"counting batch sizes {sizes} a second time gave another number: graphs cached by the "
                              "first call were not compiled again", hint="start count_compiles with "
                              "torch._dynamo.reset() so every count starts from an empty cache",
                              expected=expected, got=again)
