"""Device and precision choices that every lesson shares.

The course runs unchanged on CUDA, Apple's MPS and the CPU. ``pick_device`` picks
in that order; ``resolve_amp_dtype`` turns a precision name into the dtype that
``torch.autocast`` should use on that device (or ``None`` for plain fp32).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from course_lib import device_audit

PRECISIONS = ("auto", "bf16", "fp16", "fp32")


def pick_device(preference: str = "auto") -> torch.device:
    """Return ``cuda`` if present, then ``mps``, then ``cpu`` (or the one asked for).

    ``preference`` may be ``"auto"`` or any string ``torch.device`` accepts
    (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``). Asking for an accelerator that
    is not there is an error, not a silent fallback: a learner must know where the
    numbers came from.

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    if preference == "auto":
        if device_audit.requested():  # the test suite's stand-in for a separate device (course_lib/device_audit.py)
            return device_audit.enable()
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(preference)
    except RuntimeError as exc:  # e.g. "gpu"
        raise ValueError(
            f"device={preference!r} is not a device; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'."
        ) from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but no CUDA GPU is visible; use device='auto' or 'cpu'.")
    if device.type == "mps" and not (
        getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    ):
        raise ValueError("device='mps' was asked for but MPS is not available; use device='auto' or 'cpu'.")
    return device


def supports_bf16(device: torch.device | str) -> bool:
    """Whether autocast to bfloat16 is supported (and sensible) on ``device``.

    Taught in lesson 05 (``notebooks/05_mixed_precision.ipynb``).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    # CPU autocast supports bf16 everywhere; it is fast only with AVX512-BF16/AMX,
    # which is why the precision lesson measures instead of assuming.
    return device.type in ("cpu", "mps")


def resolve_amp_dtype(name: str | torch.dtype | None, device: torch.device | str) -> torch.dtype | None:
    """Map a precision name to the autocast dtype for ``device``; ``None`` means fp32.

    * ``"auto"``: on CUDA, bf16 where the GPU supports it, else fp16 (with a GradScaler);
      fp32 on the CPU and MPS, where low-precision speed depends on the chip (the
      precision lesson measures it instead of assuming).
    * ``"bf16"`` / ``"fp16"`` / ``"fp32"``: exactly that. fp16 works on every device type, the CPU included
      (autocast and an enabled ``GradScaler("cpu")`` support it), though only GPUs make it fast.
    Torch dtypes are accepted too (``torch.bfloat16``), as older configs often store them.
    """
    device = torch.device(device)
    if isinstance(name, torch.dtype):
        name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(name, str(name))
    if name is None:
        return None
    if name not in PRECISIONS:
        raise ValueError(f"precision {name!r} is not one of {PRECISIONS}.")
    if name == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if supports_bf16(device) else torch.float16
    if name == "fp32":
        return None
    if name == "bf16":
        if not supports_bf16(device):
            raise ValueError(f"bf16 autocast is not supported on {device}; use 'fp16' or 'fp32'.")
        return torch.bfloat16
    return torch.float16


def autocast(device: torch.device | str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for ``device`` with ``dtype``; a no-op context for fp32 (``None``)."""
    device = torch.device(device)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def synchronize(device: torch.device | str) -> None:
    """Wait for queued device work to finish (timings are wrong without it on GPUs).

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@contextlib.contextmanager
def matmul_precision(level: str) -> Iterator[None]:
    """Temporarily set ``torch.set_float32_matmul_precision`` (``"highest"``/``"high"``/``"medium"``)."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(level)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def course_threads() -> int:
    """The intra-op thread count every lesson measures with: ``COURSE_THREADS``, else half the cores (>= 1).

    Half the cores because a learner's laptop is never idle: a thread per core competes with the browser and
    the video call for every core, and one preempted thread stalls the whole parallel region (lesson 01 measures
    this). Raise it with ``COURSE_THREADS=<n>`` on a machine you keep quiet.
    """
    raw = os.environ.get("COURSE_THREADS", "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"COURSE_THREADS={raw!r} must be a whole number >= 1 (the intra-op thread count).")
        return value
    cores = os.cpu_count() or 1
    return max(1, cores // 2)


def apply_course_threads() -> int:
    """Set ``torch``'s intra-op thread count to :func:`course_threads` and return it."""
    n = course_threads()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
