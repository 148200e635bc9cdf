"""How much memory a model takes: counted, estimated, and measured.

Three different questions, three helpers:

* :func:`count_parameters` / :func:`stored_bytes` -- what the model *is*: exact numbers read off its tensors.
* :func:`training_memory_estimate` -- what training it *will need* for weights, gradients and optimizer state:
  the "about 16 bytes per parameter" arithmetic for AdamW.
* :class:`PeakMemory` / :func:`peak_memory` -- what running something *actually took* at its peak. On CUDA this is
  the caching allocator's own counter of bytes handed to tensors; on the CPU there is no such counter, so we
  report the growth of the process's resident memory, which measures something else (see the class docstring).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch

MB = 2**20


def count_parameters(model: torch.nn.Module, trainable_only: bool = True) -> int:
    """Number of parameter elements; frozen ones (``requires_grad=False``) too when ``trainable_only=False``.

    Parameters shared between modules (tied embeddings) are counted once: ``model.parameters()`` de-duplicates.

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def stored_bytes(model: torch.nn.Module) -> int:
    """Bytes held by the model's parameters **and buffers**, frozen parameters included, each tensor once.

    This is the size of the model's state in memory, at each tensor's own dtype (a bf16 parameter counts 2 bytes).
    It does **not** include:

    * activations saved for the backward pass (often the largest term in training; they grow with batch size),
    * gradients (one per trainable parameter, once ``backward`` has run),
    * optimizer state (AdamW keeps two more fp32 tensors per parameter),
    * allocator overhead (the CUDA caching allocator rounds and keeps freed blocks; the CPU allocator fragments),
    * the size of a checkpoint file (which adds pickling metadata, may hold optimizer state, and may be compressed
      or stored at another dtype).

    Taught in lesson 03 (``notebooks/03_modules.ipynb``).
    """
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = t.data_ptr() if t.numel() else id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


_OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "sgd_momentum": 4, "sgd": 0}


def training_memory_estimate(
    n_params: int, optimizer: str = "adamw", mixed_precision: bool = True
) -> dict[str, Any]:
    """Bytes per parameter needed to *train*, before any activation is stored.

    With AdamW the classic answer is 16 bytes per parameter:

    * mixed precision (the accounting of large-model training): a 16-bit copy of the weights (2) and of the
      gradients (2), fp32 master weights (4), and Adam's two fp32 moments (4 + 4) -> 16.
      (PyTorch's ``autocast`` instead keeps fp32 weights (4) and fp32 gradients (4) plus the moments (8) and makes
      short-lived 16-bit copies during the forward -- also about 16.)
    * fp32: weights (4), gradients (4), moments (8) -> 16.

    The lesson: mixed precision does **not** shrink the per-parameter state; what it shrinks is activation memory
    and time. ``optimizer`` is ``"adamw"``/``"adam"`` (two moments), ``"sgd_momentum"`` (one) or ``"sgd"`` (none).
    Activations, the CUDA context (several hundred MB) and allocator fragmentation come on top.

    Taught in lesson 09 (``notebooks/09_distributed.ipynb``).
    """
    if optimizer not in _OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer={optimizer!r} is not one of {sorted(_OPTIMIZER_STATE_BYTES)}.")
    if not isinstance(n_params, int) or n_params < 0:
        raise ValueError(f"n_params={n_params!r} must be a non-negative int (use count_parameters(model)).")
    state = _OPTIMIZER_STATE_BYTES[optimizer]
    if mixed_precision:
        breakdown = {"weights_16bit": 2, "grads_16bit": 2, "master_weights_fp32": 4, "optimizer_state_fp32": state}
    else:
        breakdown = {"weights_fp32": 4, "grads_fp32": 4, "optimizer_state_fp32": state}
    per_param = sum(breakdown.values())
    total = per_param * n_params
    return {
        "n_params": n_params, "optimizer": optimizer, "mixed_precision": mixed_precision,
        "bytes_per_param": per_param, "breakdown_bytes_per_param": breakdown,
        "total_bytes": total, "total_gib": total / 2**30,
        "excludes": "activations, temporary buffers, CUDA context, allocator fragmentation",
    }


def host_rss_mb() -> float:
    """Resident set size of this process in MiB (physical memory it holds right now, all allocators together)."""
    return psutil.Process().memory_info().rss / MB


def process_footprint_mb(proc: psutil.Process | None = None) -> tuple[float, str]:
    """The memory a process really costs, in MiB, and which measure that is: ``(value, "PSS" | "USS" | "RSS")``.

    RSS counts every page a process maps, including pages it *shares*: DataLoader workers are forked from the
    main process, so each worker's RSS repeats the main process's libraries and tensors, and summing RSS over
    workers counts those pages once per worker. **PSS** (proportional set size, Linux) divides each shared page
    among the processes sharing it, so PSS values add up to the real footprint of a group of processes. Where
    the OS has no PSS (macOS, Windows), **USS** (unique set size: pages no other process maps) is the next best:
    it never double-counts, but leaves shared pages out entirely. RSS is the last resort. A process that is gone
    or not ours counts 0.
    """
    proc = psutil.Process() if proc is None else proc
    try:
        info = proc.memory_full_info()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return 0.0, "PSS"
    except psutil.AccessDenied:
        try:
            return proc.memory_info().rss / MB, "RSS"
        except (psutil.Error, OSError):
            return 0.0, "RSS"
    for kind in ("pss", "uss"):
        value = getattr(info, kind, None)
        if value is not None:
            return value / MB, kind.upper()
    return info.rss / MB, "RSS"


@dataclass
class PeakMemory:
    """Context manager: the peak memory used while the block ran, and what that number means.

    * **CUDA**: ``torch.cuda.reset_peak_memory_stats`` at entry, ``torch.cuda.max_memory_allocated`` at exit.
      ``peak_mb`` is the highest total of bytes held by live tensors (cached-but-free blocks excluded);
      ``delta_mb`` is that peak minus what was allocated at entry, i.e. what the block added.
    * **CPU** (and MPS): there is no allocator counter, so a background thread samples the process's resident set
      size (RSS) every ``interval_s``; ``peak_mb`` is the highest RSS seen and ``delta_mb`` its growth over the RSS at
      entry. RSS counts *everything* the process holds -- Python objects, freed memory the allocator has not
      returned to the OS, shared libraries paged in -- and a spike shorter than the interval can be missed. Memory
      already held from an earlier run is reused without growing RSS, so a second identical run can show ~0.
      Use it to compare runs made the same way in a fresh process; it is **not comparable** with CUDA numbers.

    Taught in lesson 08 (``notebooks/08_latency_memory.ipynb``).
    """

    device: torch.device | str = "cpu"
    interval_s: float = 0.002
    start_mb: float = field(default=0.0, init=False)
    peak_mb: float = field(default=0.0, init=False)
    delta_mb: float = field(default=0.0, init=False)
    what: str = field(default="", init=False)
    result: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.device = torch.device(self.device)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        proc = psutil.Process()
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, proc.memory_info().rss / MB)
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_mb = torch.cuda.memory_allocated(self.device) / MB
            self.what = "CUDA bytes held by tensors (torch.cuda.max_memory_allocated)"
        else:
            self.start_mb = self.peak_mb = host_rss_mb()
            self.what = "process RSS high-water growth, sampled (not comparable with CUDA numbers)"
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / MB
        else:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            self.peak_mb = max(self.peak_mb, host_rss_mb())
        self.delta_mb = max(0.0, self.peak_mb - self.start_mb)

    def summary(self) -> str:
        return f"peak {self.peak_mb:.1f} MiB (+{self.delta_mb:.1f} MiB during the block) on {self.device}: {self.what}"


def peak_memory(fn: Callable[[], Any], *, device: torch.device | str = "cpu") -> PeakMemory:
    """Run ``fn()`` once inside :class:`PeakMemory`; the return value of ``fn`` is kept in ``.result``."""
    with PeakMemory(device) as pm:
        pm.result = fn()
    return pm


__all__ = [
    "count_parameters", "stored_bytes", "training_memory_estimate", "host_rss_mb", "process_footprint_mb", "PeakMemory",
    "peak_memory",
]
