"""The machine's ceiling: the matmul FLOP/s and memory bandwidth it really reaches, and the roofline built on them.

A speed-up says how much faster a step got; it does not say how far the step still is from what the hardware can
do. Two measured figures answer that:

* **compute**: the best FLOP/s of a matrix multiply over a sweep of shapes, per dtype the device runs fast (fp32;
  bf16 where supported). Measured, not read from a datasheet: a datasheet's peak assumes every unit busy at the top
  clock, and a laptop reaches a fraction of it (thermals, the thread count, the BLAS library). A matmul of size
  ``m x k`` by ``k x n`` does ``2 m n k`` FLOPs (one multiply and one add per term).
* **bandwidth**: bytes per second between memory and the cores, from two streaming kernels on arrays far larger
  than the caches: *copy* (``b = a``: one read and one write per element) and *triad* (``a = b + s * c``: two reads
  and one write).

**The roofline.** An operation that does ``F`` FLOPs while moving ``B`` bytes has *arithmetic intensity*
``I = F / B``. The fastest it can run is ``min(peak_flops, I * bandwidth)``: below the *ridge* intensity
``peak_flops / bandwidth`` memory is the limit (memory-bound: fewer bytes help, more FLOP/s do not), above it
compute is (compute-bound: only fewer FLOPs or faster arithmetic help). An operation far *below* its roof is bound
by neither: overhead (Python, kernel launches, small shapes) is eating the time.

**Bounded time.** The sweep runs from the smallest shape up, per dtype, fp32 first. A shape whose one call would
take longer than ``max_call_s`` (predicted from the dtype's best rate so far) is not measured, and a dtype that runs
slower than fp32 on two shapes in a row is not swept further: that device has no fast path for it (a CPU without
bf16 matrix instructions took 59 s for one 2048-wide bf16 multiply), and its roof is the best of the shapes measured.
:attr:`Ceiling.stopped` says which sweeps stopped early and why.

The measurement is cached per machine (:func:`cached_ceiling`) and reused, however busy the machine was, until the
learner asks for a new one (``refresh=True``); :meth:`Ceiling.provenance` says how old the cached one is and how
busy the machine was then.

Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from course_lib import atomic, clock, mode
from course_lib.device import course_threads, supports_bf16, synchronize
from course_lib.perf.compare import Comparison, OtherPrograms
from course_lib.perf.mfu import peak_flops
from course_lib.progress import tqdm

BOUNDS = ("compute", "memory")
SLOWER, CALL_TOO_LONG = "slower than fp32", "call too long"
BUSY_CORES = 0.5  # other programs' cores from which a measured ceiling may be low


@dataclass(frozen=True)
class RooflinePoint:
    """Where one operation sits under the roofline.

    ``intensity``: FLOPs per byte moved. ``attainable``: the roof above it, ``min(peak_flops, intensity *
    bandwidth)`` in FLOP/s. ``bound``: ``"compute"`` at or above the ridge intensity, ``"memory"`` below it.
    """

    intensity: float
    attainable: float
    bound: str


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}={value!r} must be a positive number.")
    return float(value)


def ridge_intensity(peak_flops: float, bandwidth: float) -> float:
    """FLOPs per byte where the roofline's slope meets its flat roof: ``peak_flops / bandwidth``."""
    return _positive("peak_flops", peak_flops) / _positive("bandwidth", bandwidth)


def roofline_point(flops: float, bytes_moved: float, peak_flops: float, bandwidth: float) -> RooflinePoint:
    """Place an operation doing ``flops`` FLOPs while moving ``bytes_moved`` bytes under the roofline of a machine
    with ``peak_flops`` FLOP/s and ``bandwidth`` bytes/s (see the module's docstring).

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    intensity = _positive("flops", flops) / _positive("bytes_moved", bytes_moved)
    ridge = ridge_intensity(peak_flops, bandwidth)
    attainable = min(float(peak_flops), intensity * float(bandwidth))
    return RooflinePoint(intensity=intensity, attainable=attainable,
                         bound="compute" if intensity >= ridge else "memory")


# ---------------------------------------------------------------- measuring the ceiling
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CACHE_VERSION = 1


@dataclass(frozen=True)
class CeilingConfig:
    """What :func:`measure_ceiling` sweeps. ``sizes``: square matmul sizes; ``shapes``: extra ``(m, n, k)``
    shapes (tall-skinny, sizes that are not multiples of 8); ``stream_mib``: the size of each streaming array (far
    larger than the caches); ``seconds_per_shape``: how long each shape is repeated (the best call counts);
    ``max_call_s``: a shape whose one call is predicted to take longer is not measured (see the module docstring)."""

    sizes: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048)
    shapes: tuple[tuple[int, int, int], ...] = ((4096, 256, 256), (1000, 1000, 1000), (256, 4096, 1024))
    stream_mib: int = 128
    seconds_per_shape: float = 0.25
    max_call_s: float = 0.5

    @classmethod
    def for_mode(cls, device: torch.device | str = "cpu") -> CeilingConfig:
        """The full sweep, or a short one in smoke mode (``COURSE_MODE=smoke``); on a CUDA GPU, shapes large enough
        to fill it (a 2048-wide multiply leaves most of a data-centre GPU idle) and arrays larger than its L2 cache."""
        if torch.device(device).type == "cuda":
            return cls(sizes=(1024, 2048, 4096, 8192), shapes=((16384, 4096, 4096), (8192, 8192, 1024)),
                       stream_mib=1024, seconds_per_shape=0.2 if mode.is_smoke() else 0.4)
        if mode.is_smoke():
            return cls(sizes=(64, 256, 512), shapes=((1000, 1000, 1000),), stream_mib=32, seconds_per_shape=0.05,
                       max_call_s=0.1)
        return cls()


@dataclass
class Ceiling:
    """This machine's measured ceiling (see the module docstring).

    ``matmul``: dtype name -> best FLOP/s over the sweep; ``best_shape``: the ``(m, n, k)`` that reached it;
    ``sweep``: one row per ``(dtype, m, n, k)`` with its best FLOP/s; ``copy_bandwidth``/``triad_bandwidth``:
    bytes/s; ``threads``: intra-op threads during the measurement; ``others_cores``: cores other programs used
    meanwhile (a busy machine measures a lower ceiling); ``datasheet``: on a known GPU, the vendor's dense peak
    FLOP/s per dtype name (``None`` on a CPU: no datasheet figure applies to a laptop's cores); ``stopped``: dtype
    name -> why its sweep stopped before the largest shape (``{"reason": "slower than fp32" | "call too long",
    "shape": [m, n, k], "ratio": its rate over fp32's there}``); ``seconds``: how long the measurement took;
    ``measured_epoch``: when (seconds since the epoch); ``from_cache``: read back from the cache, not measured now.
    """

    device: str
    name: str
    threads: int
    torch_version: str
    matmul: dict[str, float]
    best_shape: dict[str, tuple[int, int, int]]
    sweep: list[dict[str, Any]]
    copy_bandwidth: float
    triad_bandwidth: float
    others_cores: float | None = None
    datasheet: dict[str, float] | None = None
    measured_at: str = ""
    mode: str = "full"
    stopped: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0
    measured_epoch: float = 0.0
    from_cache: bool = field(default=False, compare=False)

    @property
    def bandwidth(self) -> float:
        """The better of the two streaming figures, bytes/s: the slope of the roofline."""
        return max(self.copy_bandwidth, self.triad_bandwidth)

    def peak(self, dtype: str = "float32") -> float:
        """The measured matmul ceiling of ``dtype`` in FLOP/s (fp32's when ``dtype`` was not measured)."""
        return self.matmul.get(dtype, self.matmul["float32"])

    def slow_path(self, dtype: str) -> bool:
        """Whether ``dtype``'s sweep stopped because it ran slower than fp32: this device has no fast path for it."""
        return self.stopped.get(dtype, {}).get("reason") == SLOWER

    def largest_swept(self, dtype: str) -> int:
        """FLOPs of the largest matmul measured in ``dtype``'s sweep (0 when none was)."""
        return max((matmul_flops(r["m"], r["n"], r["k"]) for r in self.sweep if r["dtype"] == dtype), default=0)

    def provenance(self, now: float | None = None) -> str:
        """One sentence: measured now (how long it took) or read from the cache (how old, how busy the machine was
        then, and how to measure again)."""
        took = f" in {self.seconds:.1f} s" if self.seconds else ""
        busy = ("" if self.others_cores is None else
                f"; other programs used {self.others_cores:.1f} core(s) meanwhile"
                + (", so it may be low" if self.others_cores >= BUSY_CORES else ""))
        if not self.from_cache:
            return f"Measured now{took}{busy}."
        age = _age_text((now if now is not None else time.time()) - self.measured_epoch) if self.measured_epoch \
            else f"on {self.measured_at}"
        return (f"Read from this machine's cache: measured {age}{took}{busy}. "
                "`cached_ceiling(device, refresh=True)` measures it again.")

    def summary(self) -> str:
        lines = [f"{self.name} ({self.device}), {self.threads} intra-op thread(s), torch {self.torch_version}"]
        for dtype, flops in self.matmul.items():
            m, n, k = self.best_shape[dtype]
            sheet = self.datasheet.get(dtype) if self.datasheet else None
            extra = f"; datasheet {sheet / 1e12:,.1f} TFLOP/s, {flops / sheet:.0%} of it" if sheet else ""
            lines.append(f"  matmul {dtype:<9} best {flops / 1e9:9,.1f} GFLOP/s  at {m}x{k} @ {k}x{n}{extra}")
            stop = self.stopped.get(dtype)
            if stop:
                sm, sn, sk = stop["shape"]
                why = (f"{stop['ratio']:.2g}x fp32's rate at {sm}x{sk} @ {sk}x{sn}: no fast {dtype} path here"
                       if stop["reason"] == SLOWER else f"one call at {sm}x{sk} @ {sk}x{sn} would take too long")
                lines.append(f"    (sweep stopped early: {why})")
        lines.append(f"  memory bandwidth  copy {self.copy_bandwidth / 1e9:6.1f} GB/s, "
                     f"triad {self.triad_bandwidth / 1e9:6.1f} GB/s")
        lines.append(f"  ridge (fp32)      {ridge_intensity(self.peak(), self.bandwidth):6.1f} FLOP/byte")
        if self.others_cores is not None:
            lines.append(f"  other programs used {self.others_cores:.1f} core(s) while this was measured"
                         + (": a busy machine measures a lower ceiling" if self.others_cores >= BUSY_CORES else ""))
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("from_cache")
        out["best_shape"] = {k: list(v) for k, v in self.best_shape.items()}
        return {"version": CACHE_VERSION, **out}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ceiling:
        if data.get("version") != CACHE_VERSION:
            raise ValueError("an older cache format")
        fields = {k: v for k, v in data.items() if k != "version"}
        fields["best_shape"] = {k: tuple(v) for k, v in fields["best_shape"].items()}
        return cls(**fields)


def _age_text(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count > 1 else ''} ago"
    return f"{seconds:.0f} s ago"


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of ``(m x k) @ (k x n)``: ``m n k`` multiply-adds, two FLOPs each.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    return 2 * m * n * k


def best_call_seconds(fn: Callable[[], Any], device: torch.device, seconds: float, min_calls: int = 3) -> float:
    """The fastest of repeated timed calls of ``fn`` (after one untimed warm-up call), repeating for about
    ``seconds``. The *best* call, not the median: a ceiling is what the machine can do when nothing interrupts it.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    fn()
    synchronize(device)
    best, started, calls = math.inf, clock.now(), 0
    while calls < min_calls or clock.now() - started < seconds:
        t0 = clock.now()
        fn()
        synchronize(device)
        best = min(best, clock.now() - t0)
        calls += 1
    return best


def _matmul_row(dtype: str, m: int, n: int, k: int, device: torch.device, seconds: float) -> dict[str, Any]:
    a = torch.randn(m, k, device=device).to(DTYPES[dtype])
    b = torch.randn(k, n, device=device).to(DTYPES[dtype])
    best = best_call_seconds(lambda: torch.mm(a, b), device, seconds)
    return {"dtype": dtype, "m": m, "n": n, "k": k, "flops_per_s": matmul_flops(m, n, k) / best}


def stream_bandwidth(device: torch.device, mib: int, seconds: float) -> tuple[float, float]:
    """(copy, triad) bytes/s on arrays of ``mib`` MiB each: ``b.copy_(a)`` moves 2 bytes per byte of array (read
    ``a``, write ``b``), ``torch.add(b, c, alpha=s, out=a)`` moves 3 (read ``b`` and ``c``, write ``a``)."""
    n = mib * 2**20 // 4
    a, b, c = (torch.rand(n, device=device) for _ in range(3))
    nbytes = n * 4
    copy_s = best_call_seconds(lambda: b.copy_(a), device, seconds)
    triad_s = best_call_seconds(lambda: torch.add(b, c, alpha=3.0, out=a), device, seconds)
    return 2 * nbytes / copy_s, 3 * nbytes / triad_s


PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def fast_dtypes(device: torch.device) -> list[str]:
    """The dtypes worth sweeping: fp32 always; bf16 where the device supports it; fp16 on a CUDA GPU."""
    out = ["float32"]
    if supports_bf16(device):
        out.append("bfloat16")
    if device.type == "cuda":
        out.append("float16")
    return out


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name where the operating system tells it."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple GPU (mps)"
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _datasheet(device: torch.device) -> dict[str, float] | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    low = peak_flops(name, precision="bf16")
    fp32 = peak_flops(name, precision="fp32")
    if low is None or fp32 is None:
        return None
    return {"float32": fp32, "bfloat16": low, "float16": low}


def measure_ceiling(device: torch.device | str = "cpu", config: CeilingConfig | None = None, *,
                    progress: bool = True) -> Ceiling:
    """Sweep matmul shapes for each fast dtype and measure copy and triad bandwidth, with a progress bar.

    Runs at the course's thread count (:func:`~course_lib.device.course_threads`), the one every lesson measures
    with, so the ceiling is the one the lessons' steps are held to.
    """
    device = torch.device(device)
    config = config or CeilingConfig.for_mode(device)
    dtypes = fast_dtypes(device)
    shapes = sorted([(s, s, s) for s in config.sizes] + list(config.shapes), key=lambda s: matmul_flops(*s))
    threads = course_threads()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    started = clock.now()
    sweep: list[dict[str, Any]] = []
    stopped: dict[str, dict[str, Any]] = {}
    try:
        with OtherPrograms() as load, tqdm(total=len(dtypes) * len(shapes), desc="matmul sweep",
                                           disable=not progress, leave=False) as bar:
            for dtype in dtypes:
                stopped_here = _sweep_dtype(dtype, shapes, device, config, sweep, bar)
                if stopped_here:
                    stopped[dtype] = stopped_here
            copy_bw, triad_bw = stream_bandwidth(device, config.stream_mib, 2 * config.seconds_per_shape)
    finally:
        torch.set_num_threads(previous)
    matmul, best_shape = {}, {}
    for dtype in dtypes:
        best = max((row for row in sweep if row["dtype"] == dtype), key=lambda row: row["flops_per_s"])
        matmul[dtype], best_shape[dtype] = best["flops_per_s"], (best["m"], best["n"], best["k"])
    return Ceiling(device=device.type, name=device_name(device), threads=threads, torch_version=torch.__version__,
                   matmul=matmul, best_shape=best_shape, sweep=sweep, copy_bandwidth=copy_bw,
                   triad_bandwidth=triad_bw, others_cores=load.cores, datasheet=_datasheet(device),
                   measured_at=time.strftime("%Y-%m-%d %H:%M"), mode=mode.mode(), stopped=stopped,
                   seconds=clock.now() - started, measured_epoch=time.time())


def _sweep_dtype(dtype: str, shapes: list[tuple[int, int, int]], device: torch.device, config: CeilingConfig,
                 sweep: list[dict[str, Any]], bar: Any) -> dict[str, Any] | None:
    """Measure ``dtype`` on ``shapes`` (smallest first), appending rows to ``sweep``; stop at a shape whose call
    would take longer than ``config.max_call_s``, or after two shapes in a row slower than fp32 (measured first).
    Returns why it stopped early, or ``None``."""
    fp32 = {(r["m"], r["n"], r["k"]): r["flops_per_s"] for r in sweep if r["dtype"] == "float32"}
    best_rate, behind = 0.0, 0
    for done, (m, n, k) in enumerate(shapes):
        if best_rate and matmul_flops(m, n, k) / best_rate > config.max_call_s:
            bar.update(len(shapes) - done)
            return {"reason": CALL_TOO_LONG, "shape": [m, n, k],
                    "ratio": best_rate / max(fp32.values()) if fp32 else 1.0}
        row = _matmul_row(dtype, m, n, k, device, config.seconds_per_shape)
        sweep.append(row)
        bar.update(1)
        best_rate = max(best_rate, row["flops_per_s"])
        if dtype != "float32" and (m, n, k) in fp32:
            behind = behind + 1 if row["flops_per_s"] < fp32[(m, n, k)] else 0
            if behind == 2:
                bar.update(len(shapes) - done - 1)
                return {"reason": SLOWER, "shape": [m, n, k], "ratio": row["flops_per_s"] / fp32[(m, n, k)]}
    return None


def cache_path(device: torch.device | str = "cpu") -> Path:
    """Where this machine's ceiling is kept: one file per machine, device, thread count, torch version and mode.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    device = torch.device(device)
    key = "|".join([platform.node(), device_name(device), device.type, str(course_threads()), torch.__version__,
                    mode.mode()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return mode.data_dir() / "ceiling" / f"{device.type}-{digest}.json"


def cached_ceiling(device: torch.device | str = "cpu", *, refresh: bool = False, progress: bool = True) -> Ceiling:
    """This machine's ceiling from its cache file (``from_cache`` set), measured (and cached) when there is none or
    when ``refresh``. A ceiling measured on a busy machine is reused too (measuring again costs the learner the sweep
    on every run); :meth:`Ceiling.provenance` says how busy the machine was, and ``refresh=True`` replaces it.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    path = cache_path(device)
    if not refresh and path.is_file():
        try:
            cached = Ceiling.from_json(json.loads(path.read_text(encoding="utf-8")))
            cached.from_cache = True
            return cached
        except (ValueError, TypeError, KeyError):
            pass  # unreadable or an older format: measured again below
    ceiling = measure_ceiling(device, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, json.dumps(ceiling.as_json(), indent=1))
    return ceiling


# ---------------------------------------------------------------- placing work under the roofline
def seconds_per_unit(comparison: Comparison, name: str) -> float:
    """Median seconds per unit of work of contender ``name``, on the quantity its comparison decides on (CPU time
    when other programs took the cores): the rate a roofline point or an MFU figure is computed from.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    quantity, _ = comparison.quantity()
    return statistics.median(comparison[name].per_unit(quantity))


def training_step_bytes(param_bytes: int, activation_bytes: int, optimizer: str = "adamw") -> int:
    """A lower bound on the bytes one training step moves to and from memory.

    Parameters are read in forward and again in backward, gradients written once, and the optimizer reads and
    writes its state (AdamW: reads the parameter, gradient and two moments, writes the parameter and two moments:
    7 passes; SGD: 3); saved activations are written in forward and read in backward. Temporaries and cache misses
    come on top, so a real step moves more, and its true intensity is lower than this estimate.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    passes = {"adamw": 7, "sgd": 3}
    if optimizer not in passes:
        raise ValueError(f"optimizer={optimizer!r} is not one of {sorted(passes)}.")
    return (3 + passes[optimizer]) * int(param_bytes) + 2 * int(activation_bytes)


def plot_roofline(ceiling: Ceiling, points: Sequence[dict[str, Any]], *, moves: Sequence[tuple[str, str]] = (),
                  ax: Any = None, title: str = "") -> Any:
    """Draw this machine's roofline (one flat roof per measured dtype, the bandwidth slope) with ``points`` on it.

    ``points``: dicts with ``name``, ``intensity`` (FLOP/byte) and ``achieved`` (FLOP/s); ``moves``: pairs of
    point names joined by an arrow (what a technique changed). Returns the axes.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8.5, 4.8))
    intensities = [p["intensity"] for p in points] or [1.0]
    lo = min(min(intensities) / 4, 0.01)
    hi = max(max(intensities) * 4, 4 * ridge_intensity(max(ceiling.matmul.values()), ceiling.bandwidth))
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for style, (dtype, peak) in zip(("-", "--", ":"), ceiling.matmul.items()):
        ax.plot(xs, [min(peak, x * ceiling.bandwidth) / 1e9 for x in xs], style, color="black", linewidth=1.2,
                label=f"roof: {dtype} matmul {peak / 1e9:,.0f} GFLOP/s, {ceiling.bandwidth / 1e9:.0f} GB/s")
    by_name = {p["name"]: p for p in points}
    for start, end in moves:
        a, b = by_name[start], by_name[end]
        ax.annotate("", xy=(b["intensity"], b["achieved"] / 1e9), xytext=(a["intensity"], a["achieved"] / 1e9),
                    arrowprops={"arrowstyle": "->", "color": "tab:gray", "linewidth": 1.0})
    for i, p in enumerate(points):  # colour and marker together: twenty points stay distinct
        ax.plot(p["intensity"], p["achieved"] / 1e9, "osD^v"[i // 10 % 5], color=f"C{i % 10}", label=p["name"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(title or f"Roofline of this {ceiling.device} ({ceiling.threads} thread(s)), measured", fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, which="major", alpha=0.3)
    return ax
