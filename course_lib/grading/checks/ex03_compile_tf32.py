"""Checks for exercise 03: steady-state timing, compile with ``mode=``, TF32, and the recompilation stall."""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch

from course_lib.grading.api import CheckFailed, check_for, need


def _close(a: Any, b: float) -> bool:
    return isinstance(a, (int, float)) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@check_for("03", "steady state drops the warm-up")
def steady_state_check(ns: dict[str, Any]) -> None:
    fn = need(ns, "steady_state", "define `steady_state(times, warmup)` in the exercise cell")
    times = [9.0, 2.0, 0.21, 0.2, 0.23, 0.19, 0.2, 1.5]
    expected = statistics.median(times[2:])
    got = fn(times, 2)
    if not _close(got, expected):
        hint = "use the median of the steps after the first `warmup` ones (a late hiccup should not move it)"
        if _close(got, statistics.mean(times)) or _close(got, statistics.median(times)):
            hint = "drop the first `warmup` steps: they include compilation and cache warm-up"
        elif _close(got, statistics.mean(times[2:])):
            hint = "the mean is pulled by the late 1.5 s hiccup: use the median"
        raise CheckFailed("steady-state step time is off", hint=hint, expected=expected, got=got)
    for bad in (-1, len(times), len(times) + 3):
        try:
            fn(times, bad)
        except ValueError:
            continue
        raise CheckFailed(f"steady_state(times, warmup={bad}) with {len(times)} times should raise ValueError",
                          hint="nothing would be left to measure (or warmup is negative)")


@check_for("03", "speedup is a ratio of steady states")
def speedup_check(ns: dict[str, Any]) -> None:
    fn = need(ns, "speedup", "define `speedup(baseline_times, new_times, warmup)` in the exercise cell")
    eager = [0.5, 0.31, 0.3, 0.3, 0.29, 0.3]
    compiled = [40.0, 0.12, 0.1, 0.1, 0.11, 0.1]
    expected = statistics.median(eager[1:]) / statistics.median(compiled[1:])
    got = fn(eager, compiled, 1)
    if not _close(got, expected):
        hint = "baseline time divided by new time, both measured after the warm-up steps"
        if isinstance(got, (int, float)) and got < 1:
            hint = "the ratio is upside down, or the compile step is still in the average"
        raise CheckFailed("speedup is off", hint=hint, expected=expected, got=got)


@check_for("03", "compile passes mode by keyword")
def compile_keyword(ns: dict[str, Any]) -> None:
    fn = need(ns, "compile_model", "define `compile_model(model, mode='default', backend='inductor')`")
    original = torch.compile
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append((args, dict(kwargs)))
        kwargs["backend"] = "eager"  # the check only needs a working graph, not fast kernels
        kwargs.pop("mode", None)
        return original(args[0], **kwargs)

    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU())
    torch.compile = spy  # type: ignore[assignment]
    try:
        compiled = fn(model, mode="max-autotune", backend="eager")
    finally:
        torch.compile = original  # type: ignore[assignment]
    if not seen:
        raise CheckFailed("call torch.compile inside compile_model")
    args, kwargs = seen[-1]
    if len(args) > 1:
        raise CheckFailed("torch.compile's second positional parameter is `fullgraph`, not the mode",
                          hint="torch.compile(model, mode=mode, backend=backend)",
                          expected="torch.compile(model, mode='max-autotune', ...)", got=f"positional {args[1:]!r}")
    if kwargs.get("mode") != "max-autotune" or kwargs.get("backend") != "eager":
        raise CheckFailed("pass both mode and backend on to torch.compile",
                          expected={"mode": "max-autotune", "backend": "eager"}, got=kwargs)
    torch._dynamo.reset()
    x = torch.randn(3, 6)
    if not torch.allclose(compiled(x), model(x)):
        raise CheckFailed("the compiled model should compute what the model computes")


@check_for("03", "TF32 toggled through matmul precision")
def tf32_toggle(ns: dict[str, Any]) -> None:
    fn = need(ns, "set_tf32", "define `set_tf32(enabled)` in the exercise cell")
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        previous = fn(True)
        now = torch.get_float32_matmul_precision()
        if now != "high":
            raise CheckFailed("set_tf32(True) should allow TF32 for float32 matmuls",
                              hint="torch.set_float32_matmul_precision('high')", expected="high", got=now)
        if previous != "highest":
            raise CheckFailed("return the previous precision so the caller can restore it",
                              expected="highest", got=previous)
        previous = fn(False)
        now = torch.get_float32_matmul_precision()
        if now != "highest" or previous != "high":
            raise CheckFailed("set_tf32(False) should restore full float32 matmuls and return the previous setting",
                              expected=("highest", "high"), got=(now, previous))
    finally:
        torch.set_float32_matmul_precision(before)


@check_for("03", "slow steps found relative to the median")
def slow_steps_check(ns: dict[str, Any]) -> None:
    fn = need(ns, "slow_steps", "define `slow_steps(times, factor=3.0)` in the exercise cell")
    times = [7.0, 0.1, 0.11, 0.1, 0.1, 2.5, 0.1, 0.12, 0.1, 0.31]
    median = statistics.median(times)
    expected = [i for i, t in enumerate(times) if t > 3.0 * median]
    got = fn(times)
    if list(got) != expected:
        raise CheckFailed("the slow steps (compilation, recompilation) are the ones over factor x the median",
                          hint="compare with the median, not the mean: the stalls themselves inflate the mean",
                          expected=expected, got=got)
    got = fn(times, factor=50.0)
    if list(got) != [0]:
        raise CheckFailed("honour the factor argument", expected=[0], got=got)


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


@check_for("03", "recompilations counted when the batch changes")
def recompile_count(ns: dict[str, Any]) -> None:
    fn = need(ns, "count_compiles", "define `count_compiles(model, inputs)` in the exercise cell")
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    for sizes in ([4, 4, 4], [4, 4, 9, 9, 2]):
        inputs = [torch.randn(b, 5) for b in sizes]
        expected = _reference_compiles(model, inputs)
        got = fn(model, inputs)
        torch._dynamo.reset()
        if got != expected:
            hint = "compile with a backend that counts its calls (one call = one graph compiled)"
            if got == 0:
                hint = "start from torch._dynamo.reset(): graphs cached by an earlier call are not compiled again"
            raise CheckFailed(f"compiled graphs for batch sizes {sizes} differ", hint=hint, expected=expected, got=got)
