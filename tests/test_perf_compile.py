"""Compile helpers: recompilation counting, fallback, mode checking, TF32 status (fast backends only)."""

from __future__ import annotations

import pytest
import torch

from course_lib.perf.compile import (
    RecompileCounter,
    compile_or_eager,
    demonstrate_recompile,
    enable_tf32,
    measure_compile,
    tf32_status,
    warm_compile,
)


def test_counter_sees_a_shape_change() -> None:
    torch._dynamo.reset()
    counter = RecompileCounter("eager")
    fn = torch.compile(torch.nn.Linear(8, 2), backend=counter, dynamic=False)
    fn(torch.randn(4, 8))
    fn(torch.randn(4, 8))
    assert counter.compiles == 1
    fn(torch.randn(5, 8))
    assert counter.compiles == 2 and counter.recompiles == 1
    assert counter.shapes[-1][0][0] == 5 or any(5 in s for s in counter.shapes[-1])
    torch._dynamo.reset()


def test_demonstrate_recompile_static_vs_dynamic() -> None:
    rows = demonstrate_recompile(batch_sizes=(8, 8, 3), variants=("static", "dynamic", "padded"))
    by = {v: [r for r in rows if r["variant"] == v] for v in ("static", "dynamic", "padded")}
    assert by["static"][-1]["recompiled"] and by["static"][-1]["compiles"] == 2
    assert not any(r["recompiled"] for r in by["dynamic"] + by["padded"])


def test_warm_compile_falls_back_with_reason() -> None:
    def broken_backend(gm, example_inputs):
        raise RuntimeError("no compiler here")

    model = torch.nn.Linear(4, 2)
    compiled = torch.compile(model, backend=broken_backend)
    used, reason, _ = warm_compile(compiled, torch.randn(1, 4))
    assert used is model and reason and "no compiler here" in reason
    torch._dynamo.reset()


# torch's own function, taken at import (before any test runs a grader check that spies on torch.compile).
TORCH_COMPILE = torch.compile


def test_torch_compile_takes_the_mode_by_keyword_only() -> None:
    # Everything after the model is keyword-only (since torch.compile appeared in 2.0): a positional mode is a
    # TypeError, not a value that lands in another parameter.
    with pytest.raises(TypeError, match="positional"):
        TORCH_COMPILE(torch.nn.Linear(2, 2), "max-autotune")  # type: ignore[call-overload]
    assert callable(TORCH_COMPILE(torch.nn.Linear(2, 2), mode="max-autotune"))


def test_mode_is_keyword_only_and_checked() -> None:
    with pytest.raises(TypeError):
        compile_or_eager(torch.nn.Linear(2, 2), "max-autotune")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="mode"):
        compile_or_eager(torch.nn.Linear(2, 2), mode="fastest")


def test_measure_compile_reports_both_sides() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    result = measure_compile(model, lambda: (torch.randn(4, 8), torch.randint(0, 3, (4,))), steps=2, backend="eager")
    for key in ("eager_step_s", "compiled_step_s", "cold_first_step_s", "speedup"):
        assert result[key] > 0
    verdict = result["verdict"]
    assert (verdict.a, verdict.b) == ("compiled", "eager") and verdict.rounds >= 1
    assert result["speedup"] == verdict.ratio
    assert result["break_even_steps"] is None or verdict.outcome == "faster"
    torch._dynamo.reset()


def test_tf32_is_a_noop_with_explanation_without_ampere() -> None:
    status = tf32_status()
    if not status["available"]:
        assert "Ampere" in status["explanation"]
        before = torch.get_float32_matmul_precision()
        assert enable_tf32().startswith("TF32 not enabled")
        assert torch.get_float32_matmul_precision() == before
