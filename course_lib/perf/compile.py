"""``torch.compile`` measured honestly: when it works, what it costs, when it recompiles, and TF32.

What compile does: TorchDynamo captures the Python forward into a graph; the backend (Inductor by default) fuses
elementwise operations into fewer kernels and generates C++ (CPU) or Triton (GPU) code. Fewer kernels means less
Python and launch overhead and fewer trips through memory.

Things to know before relying on it:

* **It is lazy.** ``torch.compile(model)`` returns at once; compilation happens at the *first call*, and that is
  also where it fails (no C/C++ compiler, unsupported platform, an operation it cannot trace). Hence
  :func:`warm_compile`, which makes that first call inside a ``try`` and falls back to eager with the reason.
* **The first step is slow** (seconds to minutes); the steady state is what gets faster. :func:`measure_compile`
  reports both, separately, eager and compiled side by side.
* **Shapes are part of the graph.** A new input shape (the last, smaller batch of an epoch; a different sequence
  length) triggers a *recompilation*: a stall in the middle of training. Static shapes (``drop_last=True``,
  padding to a fixed length) avoid it; ``dynamic=True`` or ``torch._dynamo.mark_dynamic(x, 0)`` compile one graph
  for all sizes. :class:`RecompileCounter` counts compilations; :func:`demonstrate_recompile` shows the stall.
* **Pass mode by keyword.** Everything after the model is keyword-only: ``torch.compile(model, *, fullgraph=False,
  dynamic=None, backend="inductor", mode=None, ...)``, and has been since ``torch.compile`` appeared in 2.0, so
  ``torch.compile(model, "max-autotune")`` is a ``TypeError``. Write ``mode="max-autotune"``.
  ``"reduce-overhead"`` uses CUDA graphs (GPU only; elsewhere it behaves like the default). ``"max-autotune"``
  benchmarks kernel variants and keeps the fastest (long compile): Triton configurations on a GPU, and on a CPU
  Inductor's C++ GEMM templates against the library matmul (where the weight is constant, e.g. inference with
  ``torch._inductor.config.freezing``).
* **TF32** (:func:`enable_tf32`) is a separate switch: on NVIDIA Ampere and newer, fp32 matmuls may run on tensor
  cores with a 10-bit mantissa. ``torch.set_float32_matmul_precision("high")`` enables it for matmuls; it is
  independent of autocast (which changes the *dtype* of activations) and of compile.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from course_lib import clock
from course_lib.device import synchronize

# Defined one layer down, where the training template needs them; re-exported for the lessons.
from course_lib.train.compiling import MODES, compile_blocker, compile_or_eager
from course_lib.train.compiling import check_mode as _check_mode
from course_lib.train.loss import mean_cross_entropy


def _eager_of(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "_orig_mod", model)


def warm_compile(model: torch.nn.Module, example: Any) -> tuple[torch.nn.Module, str | None, float]:
    """Call ``model(example)`` once to trigger compilation; ``(model, None, seconds)`` or eager fallback.

    On failure the *original* eager module is returned with the error as the reason (printed), so a notebook keeps
    running on any machine.

    Taught in lesson 11 (``notebooks/11_capstone.ipynb``).
    """
    t0 = clock.now()
    try:
        with torch.no_grad():
            model(*example) if isinstance(example, tuple) else model(example)
    except Exception as exc:  # compile errors come in many types (BackendCompilerFailed, OSError...)
        reason = f"compilation failed at the first call: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        print(f"torch.compile fell back to eager: {reason}")
        return _eager_of(model), reason, clock.now() - t0
    return model, None, clock.now() - t0


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = batch
    mean_cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _first_steps(eager: torch.nn.Module, opt_e: torch.optim.Optimizer, compiled: Any, twin: torch.nn.Module,
                 opt_c: torch.optim.Optimizer, example_fn: Callable[[], tuple[torch.Tensor, torch.Tensor]],
                 device: torch.device, reason: str | None) -> tuple[float, float, Any, str | None]:
    """Each copy's first training step, timed alone: eager's, and the compiled one's (its cold compile). A compilation
    that fails there falls back to the eager ``twin`` and says why. Returns ``(eager s, cold s, model, reason)``."""
    def timed(m: Any, opt: torch.optim.Optimizer) -> float:
        batch = example_fn()
        synchronize(device)
        t0 = clock.now()
        _train_step(m, opt, batch)
        synchronize(device)
        return clock.now() - t0

    eager_first = timed(eager, opt_e)
    try:
        return eager_first, timed(compiled, opt_c), compiled, reason
    except Exception as exc:
        reason = f"compilation failed at the first step: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        print(f"torch.compile fell back to eager: {reason}")
        return eager_first, timed(twin, opt_c), twin, reason


def measure_compile(
    model: torch.nn.Module,
    example_fn: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    *,
    steps: int,
    mode: str | None = None,
    backend: str = "inductor",
    device: torch.device | str = "cpu",
    warmup: int = 2,
    min_round_s: float = 0.05,
    budget_s: float | None = None,
) -> dict[str, Any]:
    """Training-step time, eager vs compiled, same weights and batches, cold start and steady state separately.

    ``example_fn()`` returns an ``(x, y)`` batch on ``device``. The compiled copy's first step (the cold compile) is
    timed alone, next to the eager copy's first step. Then the steady state goes through the course's measurement
    protocol (:func:`course_lib.perf.compare.compare`): ``warmup`` steps each, then ``steps`` interleaved rounds
    (stopping early at ``budget_s``). The result holds the medians, ``comparison`` and ``verdict``
    (compiled vs eager: ``"faster"`` means compiled was faster).

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    from course_lib.perf.compare import compare

    _check_mode(mode)
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1.")
    device = torch.device(device)
    eager = model.to(device).train()
    twin = copy.deepcopy(eager)
    compiled, reason = compile_or_eager(twin, mode=mode, backend=backend, device=device)
    opt_e = torch.optim.SGD(eager.parameters(), lr=1e-3)
    opt_c = torch.optim.SGD(twin.parameters(), lr=1e-3)

    eager_first, cold, compiled, reason = _first_steps(eager, opt_e, compiled, twin, opt_c, example_fn, device,
                                                       reason)
    comparison = compare(
        {"compiled": lambda: _train_step(compiled, opt_c, example_fn()),
         "eager": lambda: _train_step(eager, opt_e, example_fn())},
        rounds=steps, warmup=max(1, warmup), min_round_s=min_round_s, budget_s=budget_s, device=device,
        min_rounds=min(3, steps),
    )
    verdict = comparison.verdict("compiled", "eager")
    e, c = comparison["eager"].median_s, comparison["compiled"].median_s
    return {
        "device": str(device), "mode": mode, "backend": backend, "fallback_reason": reason, "steps": steps,
        "eager_step_s": e, "compiled_step_s": c, "speedup": verdict.ratio,
        "eager_first_step_s": eager_first, "cold_first_step_s": cold,
        "compile_overhead_s": cold - e,
        "break_even_steps": (cold - e) / (e - c) if verdict.outcome == "faster" and e > c else None,
        "comparison": comparison, "verdict": verdict,
    }


@dataclass
class RecompileCounter:
    """A ``torch.compile`` backend that counts compilations, wrapping a real backend (``"eager"``, ``"inductor"``...).

    Dynamo calls the backend once per graph it captures; a second call for the same code is a *recompilation*
    (a guard failed, typically a new input shape). ``shapes`` records the example input shapes of each compile.

    >>> counter = RecompileCounter("eager")              # doctest: +SKIP
    >>> fast = torch.compile(model, backend=counter)    # doctest: +SKIP
    """

    backend: str = "eager"
    compiles: int = 0
    shapes: list[list[tuple[int, ...]]] = field(default_factory=list)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        from torch._dynamo import lookup_backend

        self.compiles += 1
        self.shapes.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)])
        return lookup_backend(self.backend)(gm, example_inputs)

    @property
    def recompiles(self) -> int:
        """Compilations after the first."""
        return max(0, self.compiles - 1)


def _demo_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 10))


def demonstrate_recompile(
    model: torch.nn.Module | None = None,
    *,
    batch_sizes: Sequence[int] = (16, 16, 7, 16, 5),
    features: int = 32,
    backend: str = "eager",
    variants: Sequence[str] = ("static", "automatic", "dynamic", "padded"),
) -> list[dict[str, Any]]:
    """Feed batches of ``batch_sizes`` to a compiled model under several shape policies; one row per call.

    * ``static`` (``dynamic=False``): every new batch size recompiles -- the stall you see mid-epoch.
    * ``automatic`` (``dynamic=None``, the default): the first new size recompiles once with a dynamic batch
      dimension; later sizes reuse it.
    * ``dynamic`` (``dynamic=True``): one graph for all sizes from the start.
    * ``padded``: every batch padded to the largest size (what ``drop_last=True`` achieves by dropping the odd
      batch): a single compilation, at the cost of some wasted compute.

    Rows: variant, call, batch_size, seconds (the stall shows as a spike), compiles so far, recompiled (bool).
    ``backend="eager"`` isolates Dynamo's tracing and is fast; ``"inductor"`` shows the full, much longer stall.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    settings = {"static": False, "automatic": None, "dynamic": True, "padded": False}
    unknown = [v for v in variants if v not in settings]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; choose from {list(settings)}.")
    base = model if model is not None else _demo_model()
    top = max(batch_sizes)
    rows: list[dict[str, Any]] = []
    for variant in variants:
        torch._dynamo.reset()  # forget earlier compilations so each variant starts cold
        counter = RecompileCounter(backend)
        fn = torch.compile(copy.deepcopy(base), backend=counter, dynamic=settings[variant])
        for i, bs in enumerate(batch_sizes):
            x = torch.randn(bs, features)
            if variant == "padded" and bs < top:
                x = torch.cat([x, x.new_zeros(top - bs, features)])
            before = counter.compiles
            t0 = clock.now()
            with torch.no_grad():
                fn(x)
            rows.append({"variant": variant, "call": i, "batch_size": bs, "seconds": clock.now() - t0,
                         "compiles": counter.compiles, "recompiled": i > 0 and counter.compiles > before})
    torch._dynamo.reset()
    return rows


def tf32_status() -> dict[str, Any]:
    """Whether TF32 can be used here and whether it is on (matmul and cuDNN flags, float32 matmul precision).

    Taught in lesson 05 (``notebooks/05_mixed_precision.ipynb``).
    """
    available = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8
    return {
        "available": available,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "explanation": ("TF32 runs fp32 matmuls/convolutions on tensor cores with a 10-bit mantissa (NVIDIA Ampere "
                        "and newer)." if available else
                        "TF32 exists only on NVIDIA GPUs from Ampere (compute capability 8.0) on; here it does "
                        "nothing, so fp32 stays full fp32."),
    }


def enable_tf32() -> str:
    """Allow TF32 for fp32 matmuls and convolutions where the GPU has it; returns what was done, in words.

    Equivalent to ``torch.set_float32_matmul_precision("high")`` plus ``torch.backends.cudnn.allow_tf32 = True``.
    Separate from autocast: TF32 keeps tensors in fp32 and only changes how matmuls compute them. On a CPU (or a
    GPU older than Ampere) this is a no-op, and says so.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    status = tf32_status()
    if not status["available"]:
        return "TF32 not enabled: " + status["explanation"]
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    return f"TF32 enabled on {status['device']}: float32 matmul precision 'high', cuDNN TF32 on."


__all__ = [
    "compile_blocker", "compile_or_eager", "warm_compile", "measure_compile", "RecompileCounter",
    "demonstrate_recompile", "tf32_status", "enable_tf32", "MODES",
]
