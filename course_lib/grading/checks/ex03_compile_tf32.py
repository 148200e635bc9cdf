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


def _uniform(seed: int, n: int) -> list[float]:
    """``n`` numbers in [0, 1) drawn from ``seed`` (not from the global random state)."""
    return torch.rand(n, generator=torch.Generator().manual_seed(seed)).tolist()


def _steady_times(seed: int) -> tuple[list[float], int]:
    """This run's step times and warm-up: slow warm-up steps, a steady state, and a late hiccup."""
    warmup, steady = 2 + seed % 3, 5 + seed % 4
    u = _uniform(seed, warmup + steady + 1)
    times = [round(9.0 * (warmup - i) * (1 + u[i]), 6) for i in range(warmup)]
    times += [round(0.2 * (0.9 + 0.2 * u[warmup + i]), 6) for i in range(steady)]
    return times + [round(1.5 + u[-1], 6)], warmup


def _outcome(fn: Any, *args: Any) -> str:
    """What ``fn(*args)`` did: its value (repr) or the name of the exception it raised."""
    try:
        return one_line(fn(*args))
    except Exception as exc:
        return type(exc).__name__


def _number_or_outcome(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` as a float when it is a number, else :func:`_outcome`'s text."""
    try:
        value = fn(*args)
    except Exception as exc:
        return type(exc).__name__
    return float(value) if isinstance(value, (int, float)) else one_line(value)


def _steady(ns: dict[str, Any], times: list[float], warmup: int) -> dict[str, Any]:
    fn = need(ns, "steady_state", "define `steady_state(times, warmup)` in the exercise cell")
    got = call(fn, list(times), warmup)
    return {"got": got if isinstance(got, (int, float)) else one_line(got),
            "bad": [_outcome(fn, list(times), bad) for bad in (-1, len(times), len(times) + 3)],
            "no_warmup": _number_or_outcome(fn, list(times), 0)}  # the edge of the allowed range: every step counts


@check_for("03", "steady state drops the warm-up", parts=("03.1",))
def steady_state_check(ns: dict[str, Any]) -> None:
    times, warmup = _steady_times(run_seed(ns))
    seen = observe(ns, _steady, times, warmup)
    expected = statistics.median(times[warmup:])
    got = seen["got"]
    if not _close(got, expected):
        hint = "use the median of the steps after the first `warmup` ones (a late hiccup should not move it)"
        if _close(got, statistics.mean(times)) or _close(got, statistics.median(times)):
            hint = "drop the first `warmup` steps: they include compilation and cache warm-up"
        elif _close(got, statistics.mean(times[warmup:])):
            hint = f"the mean is pulled by the late {times[-1]:.2f} s hiccup: use the median"
        raise CheckFailed(f"steady-state step time is off (warmup={warmup}, {len(times)} times)", hint=hint,
                          expected=expected, got=got)
    for bad, outcome in zip((-1, len(times), len(times) + 3), seen["bad"]):
        if outcome != "ValueError":
            raise CheckFailed(f"steady_state(times, warmup={bad}) with {len(times)} times should raise ValueError",
                              hint="nothing would be left to measure (or warmup is negative)", expected="ValueError",
                              got=outcome)
    if not _close(seen.get("no_warmup"), statistics.median(times)):
        raise CheckFailed(f"steady_state(times, warmup=0) should be the median of all {len(times)} times",
                          hint="warmup may be 0 (no step dropped): only a negative warmup, or one that leaves no step, "
                               "is refused", expected=statistics.median(times), got=seen.get("no_warmup"))


def _speedup_times(seed: int) -> tuple[list[float], list[float], int]:
    """This run's eager and compiled step times (warm-up steps first) and the warm-up."""
    warmup, n = 1 + seed % 2, 6 + seed % 3
    u = _uniform(seed + 1, 2 * n)
    eager = [round((0.5 if i < warmup else 0.3) * (0.95 + 0.1 * u[i]), 6) for i in range(n)]
    compiled = [round((40.0 if i < warmup else 0.1 * (1 + 0.5 * (seed % 4))) * (0.95 + 0.1 * u[n + i]), 6)
                for i in range(n)]
    return eager, compiled, warmup


def _speedup(ns: dict[str, Any], eager: list[float], compiled: list[float], warmup: int) -> Any:
    fn = need(ns, "speedup", "define `speedup(baseline_times, new_times, warmup)` in the exercise cell")
    got = call(fn, list(eager), list(compiled), warmup)
    return got if isinstance(got, (int, float)) else one_line(got)


@check_for("03", "speedup is a ratio of steady states", parts=("03.1", "03.2"))
def speedup_check(ns: dict[str, Any]) -> None:
    eager, compiled, warmup = _speedup_times(run_seed(ns))
    got = observe(ns, _speedup, eager, compiled, warmup)
    expected = statistics.median(eager[warmup:]) / statistics.median(compiled[warmup:])
    if not _close(got, expected):
        hint = "baseline time divided by new time, both measured after the warm-up steps"
        if isinstance(got, (int, float)) and got < 1 < expected:
            hint = "the ratio is upside down, or the compile step is still in the average"
        raise CheckFailed(f"speedup is off (warmup={warmup})", hint=hint, expected=expected, got=got)


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


@check_for("03", "graph break removed: one graph", parts=("03.3",))
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
    x = _break_inputs(run_seed(ns))[0][0]
    out = seen["outputs"][0]
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        raise CheckFailed("soft_normalize_one_graph should return a tensor shaped like x", expected=tuple(x.shape),
                          got=tuple(out.shape) if isinstance(out, torch.Tensor) else out)


@check_for("03", "graph break removed: same values as before", parts=("03.3",))
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
    u = torch.rand(7, generator=g).tolist()
    eager = 0.02 + 0.01 * u[0]
    cases = [(8.0 + 20 * u[1], eager, eager * (0.8 + 0.1 * u[2])),  # compiled call a large share of eager's
             (3.0 + 5 * u[3], eager, eager * (0.3 + 0.2 * u[4])),
             (12.0, eager, eager * (1.05 + 0.1 * u[5])),  # compiled slower: never pays off
             (12.0, eager, eager),  # no gain: never pays off (and no division by zero)
             (eager * 0.9, eager, eager * 0.5),  # the first call was already cheap: 1 call
             # a first call no slower than a steady compiled one (a cache hit, or noise): still 1 call, not 0
             (eager * 0.5 * (0.6 + 0.4 * u[6]), eager, eager * 0.5)]
    return cases


def _break_even(ns: dict[str, Any]) -> list[Any]:
    fn = need(ns, "break_even_calls", "define `break_even_calls(first_call_s, eager_s, compiled_s)` in the "
              "exercise cell")
    out = []
    for case in _break_even_cases(run_seed(ns)):
        got = call(fn, *case)
        out.append(got if got is None or isinstance(got, (int, float)) else one_line(got))
    return out


@check_for("03", "break-even call count from measured times", parts=("03.4",))
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
            if answer < 1:
                hint = "n counts calls: at least 1 (n >= 1), even when the first call is already as cheap as a " \
                       "steady one"
            raise CheckFailed(f"break-even call count is off ({case})", hint=hint, expected=expected, got=answer)


_PRECISIONS = ("highest", "high", "medium")


def _tf32_calls(seed: int) -> tuple[str, list[bool]]:
    """This run's starting precision and sequence of ``set_tf32`` arguments (both values, in a seeded order)."""
    calls = [u < 0.5 for u in _uniform(seed + 2, 3 + seed % 3)]
    if all(calls) or not any(calls):
        calls[-1] = not calls[-1]
    return _PRECISIONS[seed % 3], calls


def _tf32(ns: dict[str, Any], start: str, calls: list[bool]) -> list[list[str]]:
    """For each call: what ``set_tf32`` returned and the precision afterwards."""
    fn = need(ns, "set_tf32", "define `set_tf32(enabled)` in the exercise cell")
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(start)
        seen = []
        for enabled in calls:
            returned = one_line(call(fn, enabled))
            seen.append([returned, torch.get_float32_matmul_precision()])
        return seen
    finally:
        torch.set_float32_matmul_precision(before)


@check_for("03", "TF32 toggled through matmul precision", parts=("03.5",))
def tf32_toggle(ns: dict[str, Any]) -> None:
    start, calls = _tf32_calls(run_seed(ns))
    seen = observe(ns, _tf32, start, calls)
    if len(seen) != len(calls):
        raise CheckFailed("the observations do not match this run's calls", expected=len(calls), got=len(seen))
    state = start
    for i, (enabled, (returned, now)) in enumerate(zip(calls, seen)):
        where = f"call {i + 1} of {calls} starting from {start!r}"
        if enabled and now != "high":
            raise CheckFailed(f"set_tf32(True) should allow TF32 for float32 matmuls ({where})",
                              hint="torch.set_float32_matmul_precision('high')", expected="high", got=now)
        if not enabled and now != "highest":
            raise CheckFailed(f"set_tf32(False) should restore full float32 matmuls ({where})",
                              hint="torch.set_float32_matmul_precision('highest')", expected="highest", got=now)
        if returned != repr(state):
            raise CheckFailed(f"return the previous precision so the caller can restore it ({where})",
                              hint="read torch.get_float32_matmul_precision() before changing it",
                              expected=repr(state), got=returned)
        state = now


def _step_times(seed: int) -> tuple[list[float], float]:
    """This run's step times (a compilation first, a recompilation at a seeded step, a step just under 3x the
    median at the end) and a large factor that only the compilation exceeds."""
    n, spike = 9 + seed % 4, 2 + seed % 5
    u = _uniform(seed + 3, n + 3)
    base = 0.1 * (1 + u[0])
    times = [round(base * (0.9 + 0.2 * u[1 + i]), 6) for i in range(n)]
    times[0] = round(base * (80 + 40 * u[-1]), 6)
    times[spike] = round(base * (10 + 4 * u[-2]), 6)
    times[-1] = round(base * (2.0 + 0.5 * u[-3]), 6)
    return times, round(30.0 + 20 * u[-3], 3)


def _expected_slow(times: list[float], factor: float) -> list[int]:
    limit = factor * statistics.median(times)
    return [i for i, t in enumerate(times) if t > limit]


def _slow(ns: dict[str, Any], times: list[float], factor: float) -> list[Any]:
    fn = need(ns, "slow_steps", "define `slow_steps(times, factor=3.0)` in the exercise cell")
    as_list = lambda got: list(got) if isinstance(got, (list, tuple)) else one_line(got)  # noqa: E731
    return [as_list(call(fn, list(times))), as_list(call(fn, list(times), factor=factor)),
            as_list(call(fn, list(_AT_THE_LIMIT)))]


# A step exactly factor x the median is not slower than that: "slower than", strictly.
_AT_THE_LIMIT = (0.25, 0.25, 0.75, 0.25, 0.25, 1.5)


@check_for("03", "slow steps found relative to the median", parts=("03.6",))
def slow_steps_check(ns: dict[str, Any]) -> None:
    times, factor = _step_times(run_seed(ns))
    got, got_factor, got_at_limit = observe(ns, _slow, times, factor)
    expected = _expected_slow(times, 3.0)
    if got != expected:
        raise CheckFailed("the slow steps (compilation, recompilation) are the ones over factor x the median",
                          hint="compare with the median, not the mean: the stalls themselves inflate the mean",
                          expected=expected, got=got)
    expected = _expected_slow(times, factor)
    if got_factor != expected:
        raise CheckFailed(f"honour the factor argument (factor={factor})", expected=expected, got=got_factor)
    expected = _expected_slow(list(_AT_THE_LIMIT), 3.0)
    if got_at_limit != expected:
        raise CheckFailed(f"slow_steps({list(_AT_THE_LIMIT)}): a step exactly 3 x the median is not slower than that",
                          hint="slower than factor x the median: t > limit, not t >= limit", expected=expected,
                          got=got_at_limit)


def _recompile_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def _batches(seed: int) -> list[list[tuple[int, ...]]]:
    """This run's input shapes: one batch size repeated, then batch sizes that change, for a seeded number of
    input ranks (a batch of vectors, of sequences, ...): each new rank is one more graph."""
    b, c = 2 + seed % 5, 8 + seed % 3
    changing = [(size,) + (2,) * extra + (5,) for extra in range(1 + seed % 3) for size in (b, c)]
    return [[(b, 5)] * 3, changing]


def _inputs(shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(len(shapes))
    return [torch.randn(*shape, generator=g) for shape in shapes]


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


def _compile_counts(ns: dict[str, Any], batches: list[list[tuple[int, ...]]]) -> list[Any]:
    fn = need(ns, "count_compiles", "define `count_compiles(model, inputs)` in the exercise cell")
    model = _recompile_model()
    # Each batch pattern is counted twice in a row, with no reset in between: the second count must not
    # depend on what the first one left in dynamo's cache.
    counts = [one_line(call(fn, model, _inputs(shapes))) for shapes in batches for _ in range(2)]
    torch._dynamo.reset()
    return counts


@check_for("03", "recompilations counted when the batch changes", parts=("03.7",))
def recompile_count(ns: dict[str, Any]) -> None:
    batches = _batches(run_seed(ns))
    counts = observe(ns, _compile_counts, batches)
    for i, shapes in enumerate(batches):
        sizes = ", ".join("x".join(map(str, shape)) for shape in shapes)
        expected = _reference_compiles(_recompile_model(), _inputs(shapes))
        first, again = counts[2 * i], counts[2 * i + 1]
        if first != repr(expected):
            hint = "compile with a backend that counts its calls (one call = one graph compiled)"
            raise CheckFailed(f"compiled graphs for input shapes {sizes} differ", hint=hint, expected=expected,
                              got=first)
        if again != repr(expected):
            raise CheckFailed(f"counting input shapes {sizes} a second time gave another number: graphs cached by the "
                              "first call were not compiled again", hint="start count_compiles with "
                              "torch._dynamo.reset() so every count starts from an empty cache",
                              expected=expected, got=again)
