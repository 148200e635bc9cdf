"""Profiling a short, representative run with ``torch.profiler``.

How to read a profile (the things that trip everyone up):

* **Self vs total time.** An operator's *total* time includes every operator it called (``aten::linear`` calls
  ``aten::addmm``); its *self* time is the part spent in its own code. Sort by self time to find where the time is
  really spent; use total time to see which high-level call is expensive.
* **Never sum nested totals.** ``linear``'s total already contains ``addmm``'s; adding the two counts ``addmm``
  twice. Only self times add up (to the profiled time).
* **CPU dispatch time vs device execution time.** On a GPU, the CPU columns are the time to *launch* kernels
  (Python, dispatcher, launch overhead); the device columns are the time the kernels ran. A table sorted by CPU
  time shows launch overhead; sort by device time (``by="self_device_time_total"``) to see what the GPU did. If CPU
  time per step exceeds device time, the GPU is starved by the host: fewer, bigger kernels (``torch.compile``,
  bigger batches, CUDA graphs) help.
* **Profiler overhead.** Recording every operator, its shapes, memory and stacks costs time, sometimes a lot for
  small ops. Diagnose *with* the profiler; time *without* it (:mod:`course_lib.perf.timing`).
* **Schedule.** ``wait`` steps are skipped (start-up), ``warmup`` steps are profiled but thrown away (the profiler
  itself warms up), ``active`` steps are recorded; the loop must call ``prof.step()`` once per step.

Traces open in https://ui.perfetto.dev or ``chrome://tracing`` (:func:`export_chrome_trace`), or in TensorBoard
when ``trace_dir`` is given (``tensorboard_trace_handler``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

SORT_KEYS = ("self_cpu_time_total", "cpu_time_total", "self_device_time_total", "device_time_total")
_ALIASES = {"self_cuda_time_total": "self_device_time_total", "cuda_time_total": "device_time_total",
            "device": "self_device_time_total", "cpu": "self_cpu_time_total"}


@dataclass
class ProfileResult:
    """The finished profiler plus what the run wrote. ``table()`` prints torch's own summary table.

    ``trace_files``: the JSON traces that ``tensorboard_trace_handler`` wrote during *this* run (empty without
    ``trace_dir``).
    """

    prof: Any
    steps: int
    activities: list[str]
    trace_files: list[Path] = field(default_factory=list)

    def key_averages(self, group_by_input_shape: bool = False) -> Any:
        return self.prof.key_averages(group_by_input_shape=group_by_input_shape)

    def table(self, by: str = "self_cpu_time_total", k: int = 10, group_by_input_shape: bool = False) -> str:
        """torch's formatted table of the top ``k`` operators sorted by ``by``."""
        return self.key_averages(group_by_input_shape).table(sort_by=_sort_key(by), row_limit=k)

    def export_chrome_trace(self, path: str | Path) -> Path:
        """Write this window's Chrome/Perfetto trace (see the module-level :func:`export_chrome_trace`)."""
        return export_chrome_trace(self, path)


def _sort_key(by: str) -> str:
    by = _ALIASES.get(by, by)
    if by not in SORT_KEYS:
        raise ValueError(f"by={by!r} is not one of {SORT_KEYS}.")
    return by


def profile_steps(
    step_fn: Callable[[], Any],
    *,
    steps: int | None = None,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    record_shapes: bool = True,
    profile_memory: bool = True,
    with_stack: bool = False,
    trace_dir: str | Path | None = None,
) -> ProfileResult:
    """Call ``step_fn()`` ``steps`` times (default ``wait + warmup + active``) under a scheduled profiler.

    CUDA activity is recorded too when a GPU is present. With ``trace_dir``, each active window is written there by
    ``tensorboard_trace_handler`` (``tensorboard --logdir trace_dir``, or open the ``.pt.trace.json`` in Perfetto).

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    for name, value, low in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r} must be an int >= {low}.")
    cycle = wait + warmup + active
    steps = cycle if steps is None else steps
    if not isinstance(steps, int) or steps < cycle:
        raise ValueError(f"steps={steps!r} must be >= wait + warmup + active = {cycle}, or nothing is recorded.")
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    handler = None
    before: set[Path] = set()
    if trace_dir is not None:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
        before = set(Path(trace_dir).glob("*.json"))  # a reused folder may hold older traces: not this run's
        handler = tensorboard_trace_handler(str(trace_dir))
    with profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=handler,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
    ) as prof:
        for _ in range(steps):
            step_fn()
            prof.step()  # tells the schedule that one step ended
    files = sorted(set(Path(trace_dir).glob("*.json")) - before) if trace_dir is not None else []
    return ProfileResult(prof=prof, steps=steps, activities=[a.name for a in activities], trace_files=files)


def top_ops(result: ProfileResult, k: int = 5, by: str = "self_cpu_time_total") -> list[dict[str, Any]]:
    """The ``k`` operators with the largest ``by`` (microsecond totals turned into milliseconds), largest first.

    ``by`` is one of ``self_cpu_time_total``, ``cpu_time_total``, ``self_device_time_total``,
    ``device_time_total``. Rows: name, calls, self_cpu_ms, cpu_total_ms, self_device_ms, device_total_ms,
    self_cpu_memory_mb, and ``value_ms`` (the sort column). Remember: totals of nested operators overlap.

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} must be an int >= 1.")
    key = _sort_key(by)
    events = sorted(result.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:k]
    return [
        {
            "name": e.key, "calls": e.count, "value_ms": getattr(e, key) / 1000.0,
            "self_cpu_ms": e.self_cpu_time_total / 1000.0, "cpu_total_ms": e.cpu_time_total / 1000.0,
            "self_device_ms": e.self_device_time_total / 1000.0, "device_total_ms": e.device_time_total / 1000.0,
            "self_cpu_memory_mb": e.self_cpu_memory_usage / 2**20,
        }
        for e in events
    ]


def format_rows(rows: list[dict[str, Any]], by: str = "value_ms") -> str:
    """A plain-text table of :func:`top_ops` rows.

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    lines = [f"{'operator':<40} {'calls':>6} {'self CPU ms':>12} {'CPU total ms':>13} {'self dev ms':>12}"]
    for r in rows:
        lines.append(f"{r['name'][:40]:<40} {r['calls']:>6} {r['self_cpu_ms']:>12.3f} {r['cpu_total_ms']:>13.3f} "
                     f"{r['self_device_ms']:>12.3f}")
    return "\n".join(lines)


def export_chrome_trace(result: ProfileResult, path: str | Path) -> Path:
    """Write the recorded window as a Chrome/Perfetto JSON trace and return its path.

    torch's profiler can save a window's trace only once. When ``profile_steps`` ran with ``trace_dir``, the
    handler has already saved it (``result.trace_files``), and asking the profiler again fails with "Trace is
    already saved"; so the handler's file is copied instead. Either way the file at ``path`` holds the same trace.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if result.trace_files:
        if result.trace_files[-1].resolve() != path.resolve():
            shutil.copyfile(result.trace_files[-1], path)
    else:
        result.prof.export_chrome_trace(str(path))
    return path


__all__ = ["ProfileResult", "profile_steps", "top_ops", "format_rows", "export_chrome_trace", "SORT_KEYS"]
