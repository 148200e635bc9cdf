"""Checks for exercise 03: steady-state timing, a graph break removed, break-even, TF32, the recompilation stall."""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch
import torch.nn.functional as F

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed


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


def reference_soft_normalize(x: torch.Tensor, bias: torch.Tensor, max_rms: float = 1.0) -> torch.Tensor:
    """The values exercise 03.3 must reproduce: ``x + silu(x + bias)``, the activation scaled to RMS ``max_rms``
    when its RMS is larger (the notebook's ``soft_normalize``, which computes them with a graph break)."""
    h = F.silu(x + bias)
    rms = h.pow(2).mean().sqrt()
    return x + h * torch.clamp(max_rms / rms, max=1.0)


def _break_inputs(seed: int) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """Inputs for this run: one whose activation RMS is over the limit, one under it, one with another limit."""
    g = torch.Generator().manual_seed(seed)
    rows, cols = 5 + seed % 7, 6 + seed % 5
    x, bias = torch.randn(rows, cols, generator=g), torch.randn(cols, generator=g)
    return [(4.0 * x, bias, 1.0), (0.2 * x, 0.1 * bias, 1.0), (4.0 * x, bias, 2.5)]


def _graph_break(ns: dict[str, Any]) -> dict[str, Any]:
    fn = need(ns, "soft_normalize_one_graph", "define `soft_normalize_one_graph(x, bias, max_rms=1.0)` in the "
              "exercise cell")
    from course_lib.perf.fusion import graph_report

    inputs = _break_inputs(run_seed(ns))
    x, bias, _ = inputs[0]
    report = graph_report(fn, x, bias)
    outputs = []
    for x, bias, limit in inputs:
        with torch.no_grad():
            out = call(fn, x, bias, limit)
        outputs.append(out.detach() if isinstance(out, torch.Tensor) else one_line(out))
    return {"graphs": report.graphs, "breaks": report.breaks, "reasons": report.reasons, "outputs": outputs}


@check_for("03", "graph break removed: one graph")
def one_graph(ns: dict[str, Any]) -> None:
    seen = observe(ns, _graph_break)
    if seen["graphs"] != 1 or seen["breaks"] != 0:
        hint = ("keep the decision in a tensor: no .item(), no `if` on a tensor's value; "
                "torch.where(cond, a, b) or torch.clamp turn the branch into arithmetic")
        if seen["graphs"] == 0:
            hint = "Dynamo captured no graph at all: the work must be done with torch operations on the tensors"
        raise CheckFailed("torch._dynamo.explain still finds more than one graph", hint=hint,
                          expected="1 graph, 0 breaks",
                          got=f"{seen['graphs']} graph(s), {seen['breaks']} break(s): {'; '.join(seen['reasons'])}")


@check_for("03", "graph break removed: same values as before")
def same_values(ns: dict[str, Any]) -> None:
    seen = observe(ns, _graph_break)
    for (x, bias, limit), got in zip(_break_inputs(run_seed(ns)), seen["outputs"]):
        expected = reference_soft_normalize(x, bias, limit)
        h = F.silu(x + bias)
        rms = float(h.pow(2).mean().sqrt())
        case = f"max_rms={limit}, activation RMS {rms:.2f} ({'over' if rms > limit else 'under'} the limit)"
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            raise CheckFailed(f"soft_normalize_one_graph should return a tensor shaped like x ({case})",
                              expected=tuple(expected.shape), got=tuple(got.shape) if isinstance(got, torch.Tensor)
                              else got)
        if not torch.allclose(got.float(), expected, rtol=1e-4, atol=1e-5):
            hint = ("scale only when the RMS is over max_rms, and then to exactly max_rms; leave it unchanged "
                    "otherwise" if rms > limit or limit != 1.0 else
                    "under the limit the activation must stay unchanged (scale by 1)")
            raise CheckFailed(f"the values differ from soft_normalize's ({case})", hint=hint,
                              expected="max |difference| <= 1e-5",
                              got=f"max |difference| {float((got.float() - expected).abs().max()):.3g}")


def _break_even_cases(seed: int) -> list[tuple[float, float, float]]:
    """(first call, eager call, compiled call) seconds: compile pays off, compile never pays off, first call cheap."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(6, generator=g).tolist()
    eager = 0.02 + 0.01 * u[0]
    cases = [(8.0 + 20 * u[1], eager, eager * (0.8 + 0.1 * u[2])),  # compiled call a large share of eager's
             (3.0 + 5 * u[3], eager, eager * (0.3 + 0.2 * u[4])),
             (12.0, eager, eager * (1.05 + 0.1 * u[5])),  # compiled slower: never pays off
             (12.0, eager, eager),  # no gain: never pays off (and no division by zero)
             (eager * 0.9, eager, eager * 0.5)]  # the first call was already cheap: 1 call
    return cases


def _break_even(ns: dict[str, Any]) -> list[Any]:
    fn = need(ns, "break_even_calls", "define `break_even_calls(first_call_s, eager_s, compiled_s)` in the "
              "exercise cell")
    out = []
    for case in _break_even_cases(run_seed(ns)):
        got = call(fn, *case)
        out.append(got if got is None or isinstance(got, (int, float)) else one_line(got))
    return out


@check_for("03", "break-even call count from measured times")
def break_even(ns: dict[str, Any]) -> None:
    from course_lib.perf.fusion import break_even_calls

    got = observe(ns, _break_even)
    for (first, eager, compiled), answer in zip(_break_even_cases(run_seed(ns)), got):
        expected = break_even_calls(first, eager, compiled)
        case = f"first call {first:.3g} s, eager {eager * 1e3:.3g} ms, compiled {compiled * 1e3:.3g} ms"
        if expected is None:
            if answer is not None:
                raise CheckFailed(f"the compiled call is not faster ({case}): compiling never pays off",
                                  hint="return None when compiled_s >= eager_s", expected=None, got=answer)
            continue
        if isinstance(answer, bool) or not isinstance(answer, int):
            raise CheckFailed(f"a number of calls is a whole number ({case})",
                              hint="the first n that is enough: math.ceil, not a fraction", expected=expected,
                              got=answer)
        if answer != expected:
            hint = ("n calls compiled cost first_call_s + (n - 1) * compiled_s (the first call also does the "
                    "work); eager costs n * eager_s: find the smallest whole n where compiled is no more")
            raise CheckFailed(f"break-even call count is off ({case})", hint=hint, expected=expected, got=answer)


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
