"""Fusion evidence and graph breaks: eager op counts, kernel parsing, explain summaries, break-even (no Inductor)."""

from __future__ import annotations

import pytest
import torch

from course_lib.perf.fusion import (
    PointwiseChain,
    break_even_calls,
    clipped_gelu_residual,
    clipped_gelu_residual_fixed,
    compile_and_capture,
    eager_ops,
    graph_report,
    kernel_names,
    kernel_sources,
)

# The shape of a module Inductor generates on a CPU (abridged): each kernel is bound to a name, its C++ in r'''.
GENERATED = """
from torch._inductor.async_compile import AsyncCompile
async_compile = AsyncCompile()
cpp_fused_add_gelu_mean_mul_0 = async_compile.cpp_pybinding(['const float*', 'float*'], r'''
#include <cpp_prefix.h>
extern "C"  void  kernel(const float* in_ptr0, float* out_ptr0)
{
    out_ptr0[0] = in_ptr0[0];
}
''')
cpp_fused_tanh_1 = async_compile.cpp_pybinding(['float*'], r'''
extern "C"  void  kernel(float* in_out_ptr0) {}
''')
async_compile.wait(globals())
"""


def test_kernel_names_and_sources_are_read_from_generated_code() -> None:
    assert kernel_names(GENERATED) == ["cpp_fused_add_gelu_mean_mul_0", "cpp_fused_tanh_1"]
    sources = kernel_sources(GENERATED)
    assert list(sources) == kernel_names(GENERATED)
    assert sources["cpp_fused_add_gelu_mean_mul_0"].startswith("#include") and "in_ptr0[0]" in sources[
        "cpp_fused_add_gelu_mean_mul_0"]
    assert kernel_names("def call(args):\n    pass\n") == []


def test_pointwise_chain_runs_thirteen_eager_operations() -> None:
    chain = PointwiseChain(8)
    ops = eager_ops(chain, torch.randn(4, 8))
    assert len(ops) == 13 and ops[:2] == ["aten.add", "aten.gelu"] and ops[-1] == "aten.tanh"
    with pytest.raises(ValueError, match="channels"):
        PointwiseChain(0)


def test_graph_break_found_and_fixed_with_the_same_values() -> None:
    x, bias = 3 * torch.randn(6, 5), torch.randn(5)
    broken = graph_report(clipped_gelu_residual, x, bias)
    fixed = graph_report(clipped_gelu_residual_fixed, x, bias)
    assert (broken.graphs, broken.breaks) == (2, 1) and "item()" in broken.reasons[0]
    assert (fixed.graphs, fixed.breaks, fixed.reasons) == (1, 0, []) and "no break" in fixed.summary()
    for scale in (3.0, 0.1):  # peak over the limit (scaled) and under it (unchanged)
        x = scale * torch.randn(6, 5)
        torch.testing.assert_close(clipped_gelu_residual_fixed(x, bias), clipped_gelu_residual(x, bias))


def test_compile_and_capture_with_a_backend_that_generates_no_code() -> None:
    torch._dynamo.reset()
    chain = PointwiseChain(4).requires_grad_(False)
    x = torch.randn(3, 4)
    capture = compile_and_capture(chain, x, backend="eager")
    assert capture.code == [] and capture.kernels == [] and capture.first_call_s > 0
    torch.testing.assert_close(capture.compiled(x), chain(x))
    torch._dynamo.reset()


def test_break_even_calls() -> None:
    # 10 s cold call, 30 ms eager, 22.5 ms compiled: 10 - 0.0225 + 0.0225 n <= 0.03 n -> n >= 1330.3
    assert break_even_calls(10.0, 0.03, 0.0225) == 1331
    assert break_even_calls(10.0, 0.02, 0.03) is None and break_even_calls(10.0, 0.02, 0.02) is None
    assert break_even_calls(0.01, 0.02, 0.015) == 1
    with pytest.raises(ValueError, match="eager_s"):
        break_even_calls(1.0, 0.0, 0.01)
