"""Fusion made visible, graph breaks found and fixed, and when compiling pays for itself.

Where ``torch.compile`` wins on a CPU: not in a matmul-bound model (eager already calls the same optimised matmul
library), but in chains of *pointwise* work -- bias, activation, gate, residual, normalisation -- on a tensor too
big for the caches. Eager runs each operation as its own kernel: every one reads its input from memory and writes
a fresh tensor back. Inductor fuses the chain into one generated loop that reads the input once and writes the
result once. This module measures that, with the evidence next to the number:

* :class:`PointwiseChain`: an elementwise-heavy block (no matmul), the workload where fusion shows.
* :func:`eager_ops`: the ATen operations eager runs for one call (each one a kernel and a pass over memory),
  counted with a :class:`~torch.utils._python_dispatch.TorchDispatchMode`.
* :func:`compile_and_capture`: compiles and makes the first call, returning the cold-start time and the code
  Inductor generated (what ``TORCH_LOGS="output_code"`` prints); :func:`kernel_names` lists its kernels.
* :func:`graph_report`: ``torch._dynamo.explain`` in short -- how many graphs Dynamo captured and why it broke
  between them. Each *graph break* splits the work into separately compiled pieces with Python in between, so
  nothing fuses across it. :func:`clipped_gelu_residual` has one (a ``.item()`` feeding a Python ``if``);
  :func:`clipped_gelu_residual_fixed` computes the same values as one graph.
* :func:`break_even_calls`: after how many calls the cold compile has paid for itself.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from course_lib import clock

__all__ = [
    "PointwiseChain", "eager_ops", "kernel_names", "kernel_sources", "CompiledCapture", "compile_and_capture",
    "GraphReport", "graph_report", "clipped_gelu_residual", "clipped_gelu_residual_fixed", "break_even_calls",
]


class PointwiseChain(torch.nn.Module):
    """``x -> tanh(rmsnorm(x + 0.5 * swish(gelu(x + bias))) * gain)`` on ``(N, C)``: many pointwise ops, no matmul.

    Each step is cheap arithmetic; in eager each one still reads and writes a whole ``(N, C)`` tensor. Thirteen
    ATen operations per call (see :func:`eager_ops`); Inductor turns them into one or two loops.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        if channels < 1:
            raise ValueError(f"channels={channels} must be >= 1.")
        generator = torch.Generator().manual_seed(0)
        self.bias = torch.nn.Parameter(0.1 * torch.randn(channels, generator=generator))
        self.gain = torch.nn.Parameter(torch.ones(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(x + self.bias, approximate="tanh")  # bias + activation
        h = h * torch.sigmoid(h)  # a gate (swish)
        h = x + 0.5 * h  # residual
        rms = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)  # RMSNorm
        return torch.tanh(h * rms * self.gain)


class _OpRecorder(TorchDispatchMode):
    """Records the name of every ATen operation that runs while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def eager_ops(fn: Callable[..., Any], *args: Any) -> list[str]:
    """The ATen operations (``"aten.add"``, ...) one eager call of ``fn(*args)`` runs, in order, without autograd.

    Each is a separate kernel on a CPU: one pass over its inputs, one freshly written output.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    recorder = _OpRecorder()
    with torch.no_grad(), recorder:
        fn(*args)
    return recorder.ops


# A generated CPU kernel is bound as ``cpp_fused_<ops>_<n> = async_compile.cpp_pybinding(...)``; a GPU one as
# ``triton_<kind>_fused_<ops>_<n> = async_compile.triton(...)``.
_KERNEL = re.compile(r"^(\w+) = async_compile\.(?:cpp_pybinding|cpp|triton)\(", re.MULTILINE)


def kernel_names(code: str) -> list[str]:
    """The kernels defined in Inductor's generated ``code`` (one module's source), in order of definition.

    A kernel's name lists the operations fused into it: ``cpp_fused_add_gelu_mean_mul_...``.
    """
    return _KERNEL.findall(code)


_KERNEL_SOURCE = re.compile(r"^(\w+) = async_compile\.\w+\(.*?r('''|\"\"\")(.*?)\2", re.MULTILINE | re.DOTALL)


def kernel_sources(code: str) -> dict[str, str]:
    """Kernel name -> its generated source (C++ on a CPU, Triton on a GPU), from one generated module."""
    return {m.group(1): m.group(3).strip("\n") for m in _KERNEL_SOURCE.finditer(code)}


@dataclass
class CompiledCapture:
    """What compiling one function produced: the compiled callable, the cold first call, the generated code."""

    compiled: Callable[..., Any]
    first_call_s: float
    code: list[str]
    backend: str

    @property
    def kernels(self) -> list[str]:
        """Kernel names across every generated module (empty for backends that generate no code)."""
        return [name for source in self.code for name in kernel_names(source)]

    def kernel_sources(self) -> dict[str, str]:
        """Kernel name -> generated source, across every generated module."""
        return {name: text for source in self.code for name, text in kernel_sources(source).items()}


def compile_and_capture(fn: Callable[..., Any], *args: Any, backend: str = "inductor") -> CompiledCapture:
    """``torch.compile(fn, backend=backend)``, called once on ``args`` under ``no_grad``, timed, code captured.

    The first call is where Dynamo traces and Inductor generates and compiles code, so its time is the cold start
    (much shorter on a second run: Inductor caches generated code on disk). Dynamo's graph-break warnings are
    silenced (:func:`graph_report` lists the breaks). With Inductor the generated Python
    modules are returned as text (``torch._inductor.utils.run_and_get_code``); other backends generate nothing.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    compiled = torch.compile(fn, backend=backend)
    start = clock.now()
    with torch.no_grad(), _quiet_dynamo():
        if backend == "inductor":
            from torch._inductor.utils import run_and_get_code

            _, code = run_and_get_code(compiled, *args)
        else:
            compiled(*args)
            code = []
    return CompiledCapture(compiled, clock.now() - start, list(code), backend)


@dataclass
class GraphReport:
    """How Dynamo split a function: ``graphs`` captured, ``breaks`` between them, and why (one line each)."""

    graphs: int
    breaks: int
    reasons: list[str]
    ops_per_graph: list[int]

    def summary(self) -> str:
        """One line: ``2 graphs, 1 break: Tensor.item() ...``."""
        why = "; ".join(self.reasons) if self.reasons else "no break"
        return f"{self.graphs} graph(s), {self.breaks} break(s): {why}"


def _first_line(reason: str) -> str:
    return " ".join(str(reason).strip().splitlines()[0].split())[:160] if str(reason).strip() else "(no reason given)"


@contextlib.contextmanager
def _quiet_dynamo() -> Iterator[None]:
    """Silence Dynamo's own graph-break warnings (``explain`` reports the same reasons, once, as data)."""
    loggers = [logging.getLogger(name) for name in ("torch._dynamo", "torch._dynamo.variables.tensor")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def graph_report(fn: Callable[..., Any], *args: Any) -> GraphReport:
    """``torch._dynamo.explain(fn)(*args)`` in short, starting from (and leaving) an empty Dynamo cache.

    ``explain`` traces with Dynamo only (nothing is code-generated), so it takes about a second even for a model.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    torch._dynamo.reset()
    try:
        with _quiet_dynamo():
            out = torch._dynamo.explain(fn)(*args)
    finally:
        torch._dynamo.reset()
    reasons = [_first_line(getattr(b, "reason", b)) for b in out.break_reasons]
    ops = [len(list(gm.graph.nodes)) for gm in out.graphs] if out.graphs else []
    return GraphReport(int(out.graph_count), int(out.graph_break_count), reasons, ops)


def clipped_gelu_residual(x: torch.Tensor, bias: torch.Tensor, limit: float = 4.0) -> torch.Tensor:
    """``x + h`` where ``h = gelu(x + bias)``, scaled down so its largest magnitude is at most ``limit``.

    Written the natural eager way, with a graph break: ``.item()`` turns a tensor into a Python float, which
    Dynamo cannot keep in a graph, and the ``if`` on it decides in Python which code runs next. Dynamo compiles
    the code before the break and the code after it as separate graphs, with Python in between.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    h = F.gelu(x + bias, approximate="tanh")
    peak = h.abs().max().item()
    if peak > limit:
        h = h * (limit / peak)
    return x + h


def clipped_gelu_residual_fixed(x: torch.Tensor, bias: torch.Tensor, limit: float = 4.0) -> torch.Tensor:
    """The same values as :func:`clipped_gelu_residual`, as one graph: the decision stays a tensor.

    ``clamp(limit / peak, max=1)`` is ``limit / peak`` when the peak is over the limit and 1 otherwise: the branch
    became arithmetic, so there is nothing for Python to decide and nothing to break on.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    h = F.gelu(x + bias, approximate="tanh")
    peak = h.abs().amax()
    return x + h * torch.clamp(limit / peak, max=1.0)


def break_even_calls(first_call_s: float, eager_s: float, compiled_s: float) -> int | None:
    """The fewest calls ``n`` after which compiling has paid off, or ``None`` if it never does.

    Compiled, ``n`` calls cost the cold first call plus ``n - 1`` steady calls; eager, ``n`` steady calls. The
    smallest whole ``n >= 1`` with ``first_call_s + (n - 1) * compiled_s <= n * eager_s`` is
    ``ceil((first_call_s - compiled_s) / (eager_s - compiled_s))``. When the compiled call is not faster
    (``compiled_s >= eager_s``) the cold start is never recovered: ``None``.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    for name, value in (("first_call_s", first_call_s), ("eager_s", eager_s), ("compiled_s", compiled_s)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name}={value!r} must be a positive, finite number of seconds.")
    if compiled_s >= eager_s:
        return None
    return max(1, math.ceil((first_call_s - compiled_s) / (eager_s - compiled_s)))
