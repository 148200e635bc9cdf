"""Latency and throughput, measured so that the numbers mean something.

A forward pass timed naively (``t0 = time.time(); model(x); print(time.time() - t0)``) is wrong in four ways:

1. **Asynchronous devices.** On a GPU ``model(x)`` only *queues* kernels and returns at once; the clock stops before
   the work is done. We synchronise the device before starting and before stopping the clock (on CUDA we time with
   CUDA events, which are recorded in the device's own stream and read after a synchronise).
2. **Warm-up.** The first calls pay for lazy initialisation: cuDNN/oneDNN algorithm choice, memory-allocator growth,
   ``torch.compile`` compilation, caches. Those calls are run but *not* timed (``warmup``).
3. **Noise.** One measurement is one sample of a noisy distribution (other processes, frequency scaling). We repeat
   (``reps``) and report the median (robust to outliers) and the 90th percentile (what a user sees on a bad call),
   plus mean and standard deviation.
4. **Mixing concerns.** Moving the input to the device, switching to ``eval()`` and disabling autograd
   (``torch.inference_mode``) all happen *before* timing, so the number is the model's forward pass alone.
   What a user experiences -- decode, resize, forward, post-processing -- is a different number:
   :func:`end_to_end_latency` measures that one, separately.

Batch-one **latency** (how long one request waits) and large-batch **throughput** (samples per second when the
device is kept busy) answer different questions: :func:`measure_latency` at batch one gives the first, at a large
batch its ``samples_per_s`` gives the second. A bigger batch usually raises throughput *and* latency at once.

A result is only meaningful with its context, so :class:`LatencyResult` carries the shape, batch size, device,
precision, warm-up and repetition counts, and ``summary()`` prints them with the numbers.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from course_lib import clock
from course_lib.device import autocast, resolve_amp_dtype, synchronize

# Host-side timing reads the course's one clock (course_lib/clock.py), which tests substitute.
now = clock.now


def to_device(obj: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    """Move a tensor, or tensors nested in tuples/lists/dicts, to ``device`` (other objects are returned as is)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, (list, tuple)):
        moved = [to_device(o, device, non_blocking) for o in obj]
        return type(obj)(moved) if isinstance(obj, list) else tuple(moved)
    if isinstance(obj, dict):
        return {k: to_device(v, device, non_blocking) for k, v in obj.items()}
    return obj


def first_tensor(obj: Any) -> torch.Tensor | None:
    """The first tensor in ``obj`` (a tensor, or tensors nested in tuples/lists/dicts), or ``None``."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (list, tuple)):
        for o in obj:
            t = first_tensor(o)
            if t is not None:
                return t
    if isinstance(obj, dict):
        for o in obj.values():
            t = first_tensor(o)
            if t is not None:
                return t
    return None


def _check_counts(warmup: int, reps: int) -> None:
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be an int >= 0 (the untimed calls before measuring).")
    if not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps={reps!r} must be an int >= 1 (the number of timed calls).")


class Timer:
    """Context manager that times a block, synchronising ``device`` at enter and at exit.

    >>> with Timer("cuda") as t:        # doctest: +SKIP
    ...     y = model(x)
    >>> t.elapsed                        # seconds, the queued GPU work included

    On the CPU the synchronisation is a no-op; on CUDA/MPS it waits for queued kernels, so work queued *before* the
    block is not charged to it and work queued *inside* it is.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.start: float = 0.0
        self.elapsed: float = float("nan")

    def __enter__(self) -> Timer:
        synchronize(self.device)
        self.start = now()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        self.elapsed = now() - self.start


@dataclass
class LatencyResult:
    """Repeated timings of one call and the context needed to read them (times in milliseconds)."""

    times_ms: list[float]
    shape: tuple[int, ...] | None
    batch: int | None
    device: str
    precision: str
    warmup: int
    reps: int
    what: str = "forward"
    median_ms: float = field(init=False)
    p90_ms: float = field(init=False)
    mean_ms: float = field(init=False)
    std_ms: float = field(init=False)

    def __post_init__(self) -> None:
        ordered = sorted(self.times_ms)
        self.median_ms = statistics.median(ordered)
        self.p90_ms = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
        self.mean_ms = statistics.fmean(ordered)
        self.std_ms = statistics.stdev(ordered) if len(ordered) > 1 else 0.0

    @property
    def samples_per_s(self) -> float:
        """Batch size divided by the median time (throughput implied by this measurement)."""
        return (self.batch or 1) / (self.median_ms / 1000.0) if self.median_ms > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        return {
            "what": self.what, "shape": list(self.shape) if self.shape else None, "batch": self.batch,
            "device": self.device, "precision": self.precision, "warmup": self.warmup, "reps": self.reps,
            "median_ms": self.median_ms, "p90_ms": self.p90_ms, "mean_ms": self.mean_ms, "std_ms": self.std_ms,
        }

    def summary(self) -> str:
        """One line with the numbers and every condition they were measured under."""
        return (
            f"{self.what} latency: median {self.median_ms:.3f} ms, p90 {self.p90_ms:.3f} ms, "
            f"mean {self.mean_ms:.3f} ± {self.std_ms:.3f} ms | input shape {self.shape}, batch {self.batch}, "
            f"device {self.device}, precision {self.precision}, warm-up {self.warmup}, repetitions {self.reps}"
        )

    def __str__(self) -> str:
        return self.summary()


def _precision_name(dtype: torch.dtype | None) -> str:
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def _time_calls(call: Callable[[], Any], device: torch.device, warmup: int, reps: int) -> list[float]:
    """Run ``call`` ``warmup`` times untimed, then ``reps`` times timed; return milliseconds per timed call.

    Taught in lesson 08 (``notebooks/08_latency_memory.ipynb``).
    """
    for _ in range(warmup):
        call()
    synchronize(device)
    times: list[float] = []
    if device.type == "cuda":
        # CUDA events are timestamps written by the GPU itself, in stream order; reading them after a synchronise
        # gives the device-side duration without host-side jitter.
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            synchronize(device)
            times.append(start.elapsed_time(end))
        return times
    for _ in range(reps):
        synchronize(device)
        t0 = now()
        call()
        synchronize(device)
        times.append((now() - t0) * 1000.0)
    return times


def measure_latency(
    model: torch.nn.Module,
    example_input: Any,
    *,
    device: torch.device | str,
    warmup: int = 10,
    reps: int = 50,
    dtype: str | torch.dtype | None = None,
) -> LatencyResult:
    """Time ``model(example_input)``: eval mode, ``inference_mode``, input already on ``device``, warm-up excluded.

    ``dtype`` is the autocast precision (``None``/``"fp32"``, ``"bf16"``, ``"fp16"`` on GPUs). The model is moved to
    ``device`` and put in eval mode (dropout off, BatchNorm running statistics) -- the state it is served in. Pass a
    batch of one to measure latency, a large batch and the result's ``samples_per_s`` for throughput.

    Taught in lesson 08 (``notebooks/08_latency_memory.ipynb``).
    """
    _check_counts(warmup, reps)
    device = torch.device(device)
    amp = resolve_amp_dtype(dtype, device)
    model = model.to(device).eval()
    x = to_device(example_input, device)  # moved once, before any timing
    first = first_tensor(x)

    def call() -> Any:
        with torch.inference_mode(), autocast(device, amp):
            return model(*x) if isinstance(x, tuple) else model(x)

    times = _time_calls(call, device, warmup, reps)
    return LatencyResult(
        times_ms=times,
        shape=tuple(first.shape) if first is not None else None,
        batch=int(first.shape[0]) if first is not None and first.dim() > 0 else None,
        device=str(device), precision=_precision_name(amp), warmup=warmup, reps=reps,
    )


def end_to_end_latency(
    fn: Callable[..., Any],
    *args: Any,
    device: torch.device | str = "cpu",
    warmup: int = 3,
    reps: int = 20,
    batch: int | None = 1,
    **kwargs: Any,
) -> LatencyResult:
    """Time ``fn(*args, **kwargs)`` as a whole: pre-processing, transfer, forward and post-processing included.

    This is the latency a user experiences. It is reported separately from :func:`measure_latency`, which times
    the forward pass alone; the difference tells you whether optimising the model can help at all.

    Taught in lesson 08 (``notebooks/08_latency_memory.ipynb``).
    """
    _check_counts(warmup, reps)
    device = torch.device(device)
    times = _time_calls(lambda: fn(*args, **kwargs), device, warmup, reps)
    first = first_tensor(args)
    return LatencyResult(
        times_ms=times, shape=tuple(first.shape) if first is not None else None, batch=batch,
        device=str(device), precision="as called", warmup=warmup, reps=reps, what="end-to-end",
    )


__all__: Sequence[str] = [
    "Timer", "LatencyResult", "measure_latency", "end_to_end_latency", "to_device",
    "now",
]
