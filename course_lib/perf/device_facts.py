"""What this device is and what it measured: the facts a lesson sizes its work from and explains its numbers with.

A lesson that times something on a GPU needs to know more than "cuda": how fast its matrix units really are, how
long one tiny operation takes from Python to a launched kernel, how much memory it has, and which low-precision
formats it runs on tensor cores. :class:`DeviceFacts` holds those facts, each either *reported* by the device
(name, memory, CUDA compute capability, the CPU's feature flags) or *measured* on it (the matmul roofs and memory
bandwidth of lesson 14's sweep, :mod:`course_lib.perf.ceiling`, and the cost of one tiny call,
:func:`launch_seconds`). Nothing is looked up from a device's name.

Two users:

* :mod:`course_lib.perf.sizing` picks each lesson's workload from these facts, so a timed call on a GPU does enough
  work that launching it is a small part of its time;
* the explanation functions (:mod:`course_lib.perf.precision`) say what the hardware has in the words that fit it
  (tensor cores on a GPU, AVX512-BF16/AMX on a CPU) and cite the measured roofs.

Facts are plain data: a test builds them for a device it does not have (the H200 of the GPU evidence, a T4, an
A100) and replays the lessons' explanations and sizes on them.

Taught in lesson 05 (``notebooks/05_mixed_precision.ipynb``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from course_lib import clock
from course_lib.device import synchronize

KINDS = ("cpu", "cuda", "mps")
# CPU flags (as /proc/cpuinfo spells them) of the matrix units that make bf16 fast on a CPU.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class DeviceFacts:
    """Reported and measured facts of one device (see the module docstring).

    ``kind``: ``"cpu"``, ``"cuda"`` or ``"mps"``; ``name``: the GPU's name or the CPU's model; ``memory_bytes``: the
    GPU's memory (the host's RAM for a CPU), ``None`` when unknown; ``capability``: CUDA compute capability
    ``(major, minor)``, ``None`` elsewhere; ``matmul``: measured matmul roof in FLOP/s per dtype name
    (``"float32"``, ``"bfloat16"``, ``"float16"``), empty when not measured; ``bandwidth``: measured bytes/s,
    ``None`` when not measured; ``launch_s``: measured seconds of one tiny operation issued from Python
    (:func:`launch_seconds`), ``None`` when not measured; ``cpu_flags``: the CPU's feature flags (``None`` when
    not a CPU, or when the operating system does not list them).
    """

    kind: str
    name: str
    memory_bytes: int | None = None
    capability: tuple[int, int] | None = None
    matmul: Mapping[str, float] = field(default_factory=dict)
    bandwidth: float | None = None
    launch_s: float | None = None
    cpu_flags: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"DeviceFacts: kind={self.kind!r} must be one of {KINDS}.")
        if self.capability is not None and self.kind != "cuda":
            raise ValueError(f"DeviceFacts: capability={self.capability} is a CUDA fact; kind is {self.kind!r}.")
        for dtype, flops in self.matmul.items():
            if dtype not in DTYPE_SHORT or not flops > 0:
                raise ValueError(f"DeviceFacts: matmul[{dtype!r}]={flops!r}: dtypes are {list(DTYPE_SHORT)}, "
                                 "roofs positive FLOP/s.")
        for name in ("bandwidth", "launch_s", "memory_bytes"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"DeviceFacts: {name}={value!r} must be positive (or None when unknown).")

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("cuda", "mps")

    @property
    def has_tf32(self) -> bool:
        """TF32 tensor cores: NVIDIA from Ampere (compute capability 8.0) on."""
        return self.kind == "cuda" and self.capability is not None and self.capability >= (8, 0)

    @property
    def fast_low_precision(self) -> str:
        """The autocast dtype worth timing against fp32 here: ``"fp16"`` on a CUDA GPU whose tensor cores have no
        bf16 (compute capability below 8.0: V100, T4), ``"bf16"`` everywhere else."""
        if self.kind == "cuda" and self.capability is not None and self.capability < (8, 0):
            return "fp16"
        return "bf16"

    @property
    def low_precision_units(self) -> str:
        """What this device has for low-precision matrix math, in words that fit it (``"bf16 and fp16 tensor cores
        (compute capability 9.0)"``, ``"no bf16 matrix units (it reports neither avx512_bf16 nor amx_bf16)"``)."""
        if self.kind == "cuda":
            if self.capability is None:
                return "tensor cores of an unknown compute capability"
            cc = f"compute capability {self._capability_text()}"
            if self.capability >= (8, 0):
                return f"bf16 and fp16 tensor cores ({cc})"
            if self.capability >= (7, 0):
                return f"fp16 tensor cores but no bf16 ones ({cc})"
            return f"no tensor cores ({cc})"
        if self.kind == "mps":
            return "Apple GPU cores, whose bf16 speed depends on the chip"
        if self.cpu_flags is None:
            return "bf16 support this machine does not report (the operating system lists no CPU flags)"
        found = sorted(self.cpu_flags & set(CPU_BF16_FLAGS))
        if found:
            return f"bf16 matrix instructions (it reports {' and '.join(found)})"
        return f"no bf16 matrix units (it reports neither {' nor '.join(CPU_BF16_FLAGS)})"

    @property
    def cpu_bf16_units(self) -> bool:
        """A CPU that reports bf16 matrix instructions (AVX512-BF16 or AMX)."""
        return self.kind == "cpu" and bool(self.cpu_flags and self.cpu_flags & set(CPU_BF16_FLAGS))

    @property
    def fastest_roof(self) -> float | None:
        """The highest measured matmul roof over the dtypes, FLOP/s (``None`` when nothing was measured)."""
        return max(self.matmul.values()) if self.matmul else None

    def roof_ratio(self, low: str = "bf16") -> float | None:
        """Measured matmul roof of ``low`` (``"bf16"``/``"fp16"``) over fp32's, or ``None`` when not both measured."""
        names = {v: k for k, v in DTYPE_SHORT.items()}
        if names.get(low) not in self.matmul or "float32" not in self.matmul:
            return None
        return self.matmul[names[low]] / self.matmul["float32"]

    def roofs_text(self) -> str:
        """``"measured matmul roofs: bf16 758 TFLOP/s, fp32 50.7 TFLOP/s"`` (empty when nothing was measured)."""
        if not self.matmul:
            return ""
        parts = [f"{DTYPE_SHORT[d]} {_flops_text(f)}" for d, f in sorted(self.matmul.items(), key=lambda i: -i[1])]
        return "measured matmul roofs: " + ", ".join(parts)

    def _capability_text(self) -> str:
        return "" if self.capability is None else f"{self.capability[0]}.{self.capability[1]}"

    def summary(self) -> str:
        """One line a lesson prints: what the device is and what was measured."""
        parts = [f"{self.name} ({self.kind}"
                 + (f", compute capability {self._capability_text()}" if self.capability else "") + ")"]
        if self.memory_bytes:
            parts.append(f"{self.memory_bytes / 2**30:,.0f} GiB {'host ' if self.kind == 'cpu' else ''}memory")
        if self.matmul:
            parts.append(self.roofs_text())
        if self.bandwidth:
            parts.append(f"bandwidth {self.bandwidth / 1e9:,.0f} GB/s")
        if self.launch_s:
            parts.append(f"one tiny operation {self.launch_s * 1e6:.1f} µs")
        return "; ".join(parts)


def _flops_text(flops: float) -> str:
    return f"{flops / 1e12:,.3g} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:,.3g} GFLOP/s"


def launch_seconds(device: torch.device | str, *, calls: int = 200, rounds: int = 5) -> float:
    """Seconds one tiny operation costs from Python to a launched kernel: the median over ``rounds`` of ``calls``
    in-place additions to a 16-element tensor, the device synchronised at the end of each round.

    The additions themselves take nanoseconds, so what is measured is the fixed cost of a call: Python, PyTorch's
    dispatcher and, on a GPU, the kernel launch. Lesson 14 measures the same cost against one large call.
    """
    device = torch.device(device)
    x = torch.zeros(16, device=device)
    for _ in range(10):
        x.add_(1.0)
    synchronize(device)
    per_call = []
    for _ in range(rounds):
        t0 = clock.now()
        for _ in range(calls):
            x.add_(1.0)
        synchronize(device)
        per_call.append((clock.now() - t0) / calls)
    return statistics.median(per_call)


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The CPU's feature flags (``/proc/cpuinfo``), ``None`` where the operating system does not list them."""
    try:
        for line in cpuinfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def _cached_cpu_ceiling(device: torch.device) -> Any:
    """The CPU ceiling lesson 14 cached, or ``None``: a lesson on a CPU does not pay for the sweep."""
    import json

    from course_lib.perf.ceiling import Ceiling, cache_path

    path = cache_path(device)
    try:
        return Ceiling.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def device_facts(device: torch.device | str, *, progress: bool = True) -> DeviceFacts:
    """This device's facts: reported ones read, the launch cost measured (a fraction of a second), and the matmul
    roofs and bandwidth from lesson 14's cached ceiling.

    On a GPU the ceiling is measured when no cache holds it (:func:`~course_lib.perf.ceiling.cached_ceiling`,
    seconds on a data-centre GPU): sizing needs it. On a CPU only an existing cache is read: the CPU's sizes do not
    depend on it, and its sweep would add seconds to every lesson.

    Taught in lesson 05 (``notebooks/05_mixed_precision.ipynb``); lesson 01 reads it first, to size its timed
    step on a GPU (and lessons 02, 07, 08 and 11 theirs).
    """
    import psutil

    from course_lib.perf.ceiling import cached_ceiling, device_name

    device = torch.device(device)
    if device.type not in KINDS:
        raise ValueError(f"device_facts: {device} is not a device the course runs on ({', '.join(KINDS)}).")
    memory: int | None = None
    capability = None
    flags = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        memory, capability = int(props.total_memory), (props.major, props.minor)
        ceiling = cached_ceiling(device, progress=progress)
    elif device.type == "mps":
        memory = int(psutil.virtual_memory().total)  # unified memory: the GPU shares the host's
        ceiling = cached_ceiling(device, progress=progress)
    else:
        memory = int(psutil.virtual_memory().total)
        flags = read_cpu_flags()
        ceiling = _cached_cpu_ceiling(device)
    return DeviceFacts(
        kind=device.type, name=device_name(device), memory_bytes=memory, capability=capability,
        matmul=dict(ceiling.matmul) if ceiling else {}, bandwidth=ceiling.bandwidth if ceiling else None,
        launch_s=launch_seconds(device), cpu_flags=flags,
    )


__all__ = ["KINDS", "CPU_BF16_FLAGS", "DeviceFacts", "launch_seconds", "read_cpu_flags", "device_facts"]
