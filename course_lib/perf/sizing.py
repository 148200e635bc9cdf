"""A size for the device: how much work each timed call of a lesson does, chosen from what the device measured.

Full mode is sized for a few minutes on a 2-core laptop CPU (:mod:`course_lib.mode`). Run unchanged on a
data-centre GPU, those sizes time the cost of *launching* kernels, not the effect the lesson is about: lesson 05's
batch-64, width-32 CNN step is 3.9 GFLOP, which an H200's bf16 tensor cores finish in about 5 µs, less than the
launch of one of the step's ~100 kernels. The lesson then concluded "keep fp32" on the GPU with the fastest bf16
units there are.

**The rule.** On a GPU every timed call does enough work that launching it is a small part of its time::

    device time of one call  >=  max(1 ms, 50 x the measured cost of one tiny operation)

where a call's *device time* is the roofline's estimate at the device's measured roofs:
``max(FLOPs / fastest measured matmul roof, bytes / measured bandwidth)`` (FLOPs counted with
``torch.utils.flop_counter.FlopCounterMode``, bytes as every operation reading its inputs and writing its outputs
once, both on the ``meta`` device: no memory, no time). The fastest roof (bf16 on a tensor-core GPU) is used for
every contender, fp32 included, because an fp32 convolution may run on TF32 tensor cores: the FLOP term is a true
lower bound, and the estimate errs towards too little time, which makes the rule stricter. Launch cost is then a
small part of the call (one launch of a few µs against 1 ms; a step's ~100 launches are issued while earlier
kernels run, and the GPU keeps up only when kernels are longer than launches, which the profiler checks).
And a full-mode lesson still takes minutes: :func:`estimated_seconds` bounds the part of the lesson whose length
the sizes decide (each precision's quality run), at a pessimistic fifth of the fp32 roof.

**The classes.** ``"cpu"``: the sizes the lessons have always used, full and smoke alike (on a CPU a call's fixed
cost is microseconds against milliseconds of work). ``"small-gpu"`` (T4/L4-like: under 32 GiB or under 100 TFLOP/s
at its fastest measured roof) and ``"large-gpu"`` (A100/H100/H200-like): the class sets where the search starts
(the CNN's width) and the memory it may use; the search takes the smallest batch, then width, that meets the rule
on *this* device's measured figures. No size is looked up from a device's name.

**Two GPU-only comparisons** take their sizes from here too. Lesson 02's host-to-GPU copy (:func:`copy_batch`):
the bytes of one copy meet the rule at the *measured bandwidth* of the device's memory; a copy over PCIe or NVLink
is slower than that memory, so the estimate errs towards too little time again. Lesson 07's CUDA graph step
(:func:`graph_step_size`) is the opposite case, on purpose: a step of many small kernels, **launch-bound**, where a
graph wins. Its rule counts launches, not work: ``launches x launch cost >= max(1 ms, 50 x launch cost)`` (the
eager call lasts long enough to time) while its work at the roofs takes under :data:`LAUNCH_BOUND_SHARE` of that
launch time (so launches, not kernels, set the eager step's time).

Taught in lesson 05 (``notebooks/05_mixed_precision.ipynb``); later lessons take their sizes from here too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from course_lib import mode
from course_lib.perf.device_facts import DeviceFacts

CLASSES = ("cpu", "small-gpu", "large-gpu")
MIN_CALL_S = 1e-3  # the rule's floor: at least 1 ms of device time per timed call
LAUNCHES_PER_CALL = 50  # ... and at least 50 times the cost of one tiny operation
LARGE_GPU_MEMORY = 32 * 2**30
LARGE_GPU_FLOPS = 100e12
PESSIMISTIC_EFFICIENCY = 0.2  # share of the fp32 roof assumed when bounding how long a lesson takes
BATCHES = (64, 128, 256, 512, 1024)  # at most 1024: four distinct batches still fit in the shapes' training split
WIDTHS = (32, 64, 128, 256)
START_WIDTH = {"small-gpu": 64, "large-gpu": 128}
MEMORY_SHARE = 0.25  # a step's activations may use at most this share of the device's memory
NUM_CLASSES = 10  # the classifier head is a rounding error in the work; the shapes dataset has fewer classes
COPY_IMAGE_SIZE = 32  # lesson 02 copies batches of float32 3 x 32 x 32 images, the size its JPEGs decode to
COPY_BATCH_STEP = 64  # a copy's batch is a whole number of 64-image batches
LAUNCH_BOUND_SHARE = 0.1  # a launch-bound step's work, at the roofs, takes under a tenth of its launches' time
GRAPH_WIDTH, GRAPH_BATCH = 128, 64  # lesson 07's small-kernel step: narrow layers, a small batch
GRAPH_LAYERS = (16, 32, 64, 128, 256, 512)


@dataclass(frozen=True)
class Sizes:
    """The workload sizes a lesson uses on this device (see the module docstring).

    Lesson 05: ``precision_width`` and ``precision_batch`` (the :class:`~course_lib.models.SmallCNN` training step
    timed in fp32 and in low precision), ``precision_batches`` (distinct batches cycled), ``precision_steps`` (steps
    each precision trains for the quality comparison), ``tf32_size`` (the square matmul timed with and without TF32).
    ``device_class`` names the class; ``why`` says in one sentence how the sizes were chosen.
    """

    device_class: str
    precision_width: int
    precision_batch: int
    precision_batches: int
    precision_steps: int
    tf32_size: int
    why: str = ""


@dataclass(frozen=True)
class Work:
    """What one call does, counted on the ``meta`` device: ``flops`` (FlopCounterMode), ``bytes`` (each
    operation's inputs read and outputs written), ``held`` (an upper estimate of the memory it holds at once:
    for a training step, every forward output kept for backward plus weights, gradients and AdamW's two moments)
    and ``launches`` (operations that are not views: at least one kernel launch each on a GPU).
    """

    flops: float
    bytes: float
    held: float = 0.0
    launches: int = 0


class _ByteCounter(TorchDispatchMode):
    """Bytes each operation reads and writes, from its tensors' shapes and dtypes (views move nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.written = 0
        self.operations = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if not getattr(func, "is_view", False):
            self.operations += 1
            seen: set[int] = set()  # an in-place result is its input: counted once
            for t in tree_flatten((args, kwargs))[0]:
                if isinstance(t, torch.Tensor) and id(t) not in seen:
                    seen.add(id(t))
                    self.bytes += t.numel() * t.element_size()
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and id(t) not in seen:
                    seen.add(id(t))
                    self.bytes += t.numel() * t.element_size()
                    self.written += t.numel() * t.element_size()
        return out


def count_work(run: Callable[[], object], *, held: float = 0.0) -> Work:
    """FLOPs and bytes of ``run()``, which builds its tensors on the ``meta`` device (``with torch.device("meta")``)
    so that nothing is allocated or computed; ``held`` is passed through."""
    with FlopCounterMode(display=False) as flops, _ByteCounter() as moved:
        run()
    return Work(flops=float(flops.get_total_flops()), bytes=float(moved.bytes), held=held,
                launches=moved.operations)


def precision_step_work(width: int, batch: int, *, dtype: str = "fp32", image_size: int = 32) -> Work:
    """One training step of lesson 05's timed comparison, counted: SmallCNN forward, cross-entropy, backward and an
    AdamW step on ``batch`` images. ``dtype="bf16"``/``"fp16"`` counts the model in that dtype (autocast on
    ``meta`` would not cast): a lower bound on the autocast step's bytes, which keeps fp32 weights."""
    from course_lib.models import SmallCNN

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]

    with torch.device("meta"):
        model = SmallCNN(num_classes=NUM_CLASSES, width=width)
        x = torch.randn(batch, 3, image_size, image_size)
        y = torch.randint(0, NUM_CLASSES, (batch,))
    model, x = model.to(torch_dtype), x.to(torch_dtype)
    state = 4 * sum(p.numel() * 4 for p in model.parameters())  # fp32 weights, gradients, two AdamW moments
    with _ByteCounter() as forward:
        model(x)

    def step() -> None:
        opt = torch.optim.AdamW(model.parameters(), foreach=False)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return count_work(step, held=forward.written + state)


def matmul_work(n: int, *, element_bytes: int = 4) -> Work:
    """One ``n x n`` matmul: ``2 n^3`` FLOPs, two operands read and the result written."""
    return Work(flops=2.0 * n**3, bytes=3.0 * n * n * element_bytes, held=3.0 * n * n * element_bytes)


def inference_work(width: int, batch: int, *, image_size: int = 32, num_classes: int = NUM_CLASSES) -> Work:
    """One inference forward of a :class:`~course_lib.models.SmallCNN` of ``width`` on ``batch`` images, without
    gradients, counted on ``meta`` (lesson 08's batched forward)."""
    from course_lib.models import SmallCNN

    with torch.device("meta"):
        model = SmallCNN(num_classes=num_classes, width=width)
        x = torch.randn(batch, 3, image_size, image_size)

    def forward() -> None:
        with torch.no_grad():
            model(x)

    params = sum(p.numel() * p.element_size() for p in model.parameters())
    first_map = batch * width * image_size * image_size * 4  # the largest activation, fp32
    return count_work(forward, held=params + 4 * first_map)  # inference frees each map: at most a few alive at once


def copy_work(batch: int, *, image_size: int = COPY_IMAGE_SIZE) -> Work:
    """One host-to-device copy of lesson 02: ``batch`` float32 images of 3 x ``image_size`` x ``image_size``,
    its bytes from the shape (written once on the device; read on the host, which the device's memory does not
    see)."""
    with torch.device("meta"):
        images = torch.empty(batch, 3, image_size, image_size)
    n = images.numel() * images.element_size()
    return Work(flops=0.0, bytes=float(n), held=float(n))


def small_kernel_model(layers: int, width: int) -> torch.nn.Sequential:
    """``layers`` x (Linear(width, width) + GELU): two small kernels per layer, nothing for a library to fuse.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    if not isinstance(layers, int) or layers < 1 or not isinstance(width, int) or width < 1:
        raise ValueError(f"small_kernel_model: layers={layers!r} and width={width!r} must be whole numbers >= 1.")
    nn = torch.nn
    return nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(layers)))


def graph_step_work(layers: int, *, width: int = GRAPH_WIDTH, batch: int = GRAPH_BATCH) -> Work:
    """One forward step of lesson 07's small-kernel model (:func:`small_kernel_model`),
    counted on ``meta``: ``layers`` Linear + GELU layers of ``width`` on ``batch`` rows, without gradients.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    with torch.device("meta"):
        model = small_kernel_model(layers, width)
        x = torch.randn(batch, width)

    def forward() -> None:
        with torch.no_grad():
            model(x)

    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return count_work(forward, held=params + 2 * x.numel() * x.element_size())


# ------------------------------------------------------------------------------------------------ the rule
def min_call_seconds(facts: DeviceFacts) -> float:
    """The rule's floor for one timed call on this device: ``max(1 ms, 50 x launch cost)``."""
    return max(MIN_CALL_S, LAUNCHES_PER_CALL * (facts.launch_s or 0.0))


def device_seconds(work: Work, facts: DeviceFacts) -> float:
    """A lower bound on the device time of ``work``: at the fastest measured matmul roof and the measured bandwidth.

    Needs the measured figures: without them (a CPU whose ceiling lesson 14 has not cached) a :class:`ValueError`
    says so.
    """
    roof, bandwidth = facts.fastest_roof, facts.bandwidth
    if roof is None or bandwidth is None:
        raise ValueError(f"device_seconds: {facts.name} has no measured matmul roof or bandwidth; measure them with "
                         "course_lib.perf.ceiling.cached_ceiling (lesson 14) first.")
    return max(work.flops / roof, work.bytes / bandwidth)


def meets_rule(work: Work, facts: DeviceFacts) -> bool:
    """Whether one call of ``work`` takes at least :func:`min_call_seconds` on this device, estimated from below."""
    return device_seconds(work, facts) >= min_call_seconds(facts)


def launch_seconds_of(work: Work, facts: DeviceFacts) -> float:
    """The host's time to launch ``work``'s operations one by one: ``launches x`` the measured cost of one tiny
    operation (a :class:`ValueError` when that cost was not measured)."""
    if facts.launch_s is None:
        raise ValueError(f"launch_seconds_of: {facts.name} has no measured launch cost; measure it with "
                         "course_lib.perf.device_facts.launch_seconds first.")
    return work.launches * facts.launch_s


def meets_launch_rule(work: Work, facts: DeviceFacts) -> bool:
    """Whether a step is long *and* launch-bound on this device (see the module docstring): its launches take at
    least :func:`min_call_seconds`, and its work at the roofs under :data:`LAUNCH_BOUND_SHARE` of that."""
    launching = launch_seconds_of(work, facts)
    return launching >= min_call_seconds(facts) and device_seconds(work, facts) < LAUNCH_BOUND_SHARE * launching


def device_class(facts: DeviceFacts) -> str:
    """``"cpu"``, ``"small-gpu"`` or ``"large-gpu"`` from the device's kind, memory and fastest measured roof."""
    if facts.kind == "cpu":
        return "cpu"
    roof = facts.fastest_roof or 0.0
    memory = facts.memory_bytes or 0
    return "large-gpu" if memory >= LARGE_GPU_MEMORY and roof >= LARGE_GPU_FLOPS else "small-gpu"


def cpu_sizes() -> Sizes:
    """What the lessons have always used on a CPU, by mode (smoke: seconds; full: minutes)."""
    return Sizes(device_class="cpu", precision_width=32, precision_batch=mode.by_mode(smoke=16, full=64),
                 precision_batches=mode.by_mode(smoke=2, full=8), precision_steps=mode.by_mode(smoke=3, full=40),
                 tf32_size=256, why="the course's CPU sizes: on a CPU a call's fixed cost is microseconds against "
                                    "milliseconds of work")


def _first_meeting_rule(candidates: list[tuple[int, ...]], work_of: Callable[..., Work], facts: DeviceFacts,
                        fits: Callable[[Work], bool]) -> tuple[tuple[int, ...], bool]:
    """The first candidate whose work meets the rule and fits; the largest that fits when none meets it."""
    fitting = None
    for candidate in candidates:
        work = work_of(*candidate)
        if not fits(work):
            break
        fitting = candidate
        if meets_rule(work, facts):
            return candidate, True
    return (fitting or candidates[0]), False


def gpu_sizes(facts: DeviceFacts) -> Sizes:
    """Sizes for a GPU from its measured figures (see the module docstring): the smallest CNN step and matmul that
    meet the rule, starting from the class's width, within :data:`MEMORY_SHARE` of its memory."""
    klass = device_class(facts)
    memory = facts.memory_bytes or 16 * 2**30

    def fits(work: Work) -> bool:
        return work.held <= MEMORY_SHARE * memory

    widths = [w for w in WIDTHS if w >= START_WIDTH[klass]]
    step, step_ok = _first_meeting_rule([(w, b) for w in widths for b in BATCHES],
                                        lambda w, b: precision_step_work(w, b, dtype=facts.fast_low_precision),
                                        facts, fits)
    (n,), matmul_ok = _first_meeting_rule([(s,) for s in (1024, 2048, 4096, 8192, 16384)], matmul_work, facts, fits)
    n = max(n, 4096)  # TF32's expectation is stated at 4096 and above (course_lib/perf/expectations.py)
    width, batch = step
    floor = min_call_seconds(facts)
    met = "meet" if step_ok and matmul_ok else "come as close as memory allows to"
    klass_words = klass.replace("-", " ").replace("gpu", "GPU")
    roofs = facts.roofs_text() or "no roofs measured"
    why = (f"sized for a {klass_words} from its measured figures ({roofs}; one tiny operation "
           f"{1e6 * (facts.launch_s or 0):.1f} µs): the smallest CNN step and matmul that {met} "
           f"{floor * 1e3:.1f} ms of device time per call even at its fastest roof")
    return Sizes(device_class=klass, precision_width=width, precision_batch=batch,
                 precision_batches=mode.by_mode(smoke=2, full=4), precision_steps=mode.by_mode(smoke=3, full=40),
                 tf32_size=n, why=why)


def _gpu_only(facts: DeviceFacts, what: str) -> None:
    if facts.kind != "cuda":
        raise ValueError(f"{what}: {facts.name} is a {facts.kind}; this comparison runs only on a CUDA GPU (the "
                         "lesson says why it is not run elsewhere).")


def copy_batch(facts: DeviceFacts) -> int:
    """Images per host-to-device copy in lesson 02, on a GPU: the fewest (a multiple of 64) whose bytes take at
    least :func:`min_call_seconds` at the device's measured memory bandwidth (see the module docstring).

    Taught in lesson 02 (``notebooks/02_dataloader.ipynb``).
    """
    _gpu_only(facts, "copy_batch")
    if facts.bandwidth is None:
        raise ValueError(f"copy_batch: {facts.name} has no measured bandwidth; measure it with "
                         "course_lib.perf.ceiling.cached_ceiling (lesson 14) first.")
    per_batch = copy_work(COPY_BATCH_STEP).bytes
    batches = max(1, math.ceil(min_call_seconds(facts) * facts.bandwidth / per_batch))
    return batches * COPY_BATCH_STEP


def throughput_batch(facts: DeviceFacts, *, width: int = 32, image_size: int = 32, num_classes: int = NUM_CLASSES,
                     cpu_batch: int = 64) -> int:
    """The large batch of lesson 08's throughput comparison (batch one is its latency side, launch-bound on purpose):
    ``cpu_batch`` on a CPU; on a GPU the smallest power of two from ``cpu_batch`` whose inference forward meets the
    rule, within :data:`MEMORY_SHARE` of its memory.

    Taught in lesson 08 (``notebooks/08_latency_memory.ipynb``).
    """
    if facts.kind == "cpu":
        return cpu_batch
    memory = facts.memory_bytes or 16 * 2**30
    batch = cpu_batch
    while True:
        work = inference_work(width, batch, image_size=image_size, num_classes=num_classes)
        if meets_rule(work, facts) or work.held * 2 > MEMORY_SHARE * memory:
            return batch
        batch *= 2


def step_batch(facts: DeviceFacts, *, width: int, cpu_batch: int) -> int:
    """The batch of a lesson's timed :class:`~course_lib.models.SmallCNN` training step of ``width``: ``cpu_batch``
    on a CPU; on a GPU the smallest power of two from ``cpu_batch`` whose step meets the rule (in the dtype this GPU
    runs fastest, a lower bound), within :data:`MEMORY_SHARE` of its memory.

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    if facts.kind == "cpu":
        return cpu_batch
    memory = facts.memory_bytes or 16 * 2**30
    batch = cpu_batch
    while True:
        work = precision_step_work(width, batch)
        if meets_rule(work, facts) or work.held * 2 > MEMORY_SHARE * memory:
            return batch
        batch *= 2


def graph_step_size(facts: DeviceFacts) -> int:
    """Layers of lesson 07's small-kernel step on a GPU: the fewest of :data:`GRAPH_LAYERS` that meet
    :func:`meets_launch_rule` (the deepest when none does).

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    _gpu_only(facts, "graph_step_size")
    for layers in GRAPH_LAYERS:
        if meets_launch_rule(graph_step_work(layers), facts):
            return layers
    return GRAPH_LAYERS[-1]


def sizes_for(facts: DeviceFacts) -> Sizes:
    """The sizes for this device: :func:`cpu_sizes` on a CPU, :func:`gpu_sizes` on a GPU.

    Taught in lesson 05 (``notebooks/05_mixed_precision.ipynb``).
    """
    return cpu_sizes() if facts.kind == "cpu" else gpu_sizes(facts)


def timed_calls(sizes: Sizes, facts: DeviceFacts) -> dict[str, Work]:
    """Every timed call the lessons size from ``sizes``, counted: what the rule applies to (a lesson that takes a
    size from here adds its calls here, so the sizing test covers them)."""
    low = facts.fast_low_precision
    return {
        "05 precision step, fp32": precision_step_work(sizes.precision_width, sizes.precision_batch),
        f"05 precision step, {low}": precision_step_work(sizes.precision_width, sizes.precision_batch, dtype=low),
        "05 TF32 matmul (fp32 operands)": matmul_work(sizes.tf32_size),
        "02 host-to-device copy": copy_work(copy_batch(facts)),
        "01 width-8 CNN step (the narrow side)": precision_step_work(8, step_batch(facts, width=8, cpu_batch=64)),
        "08 batched inference forward": inference_work(32, throughput_batch(facts)),
        "11 capstone training step (the same SmallCNN step, fp32)": precision_step_work(sizes.precision_width,
                                                                                         sizes.precision_batch),
        # Lesson 12's prefetcher cell (GPU only) has fixed sizes: a width-64 SmallCNN step on 64 images of 224x224.
        "12 prefetcher step (fixed sizes)": precision_step_work(64, 64, image_size=224),
    }


def launch_bound_calls(facts: DeviceFacts) -> dict[str, Work]:
    """Every timed call the lessons size to be launch-bound on this GPU (:func:`meets_launch_rule` applies)."""
    return {"07 small-kernel step (CUDA graph vs eager)": graph_step_work(graph_step_size(facts))}


def estimated_seconds(sizes: Sizes, facts: DeviceFacts) -> float:
    """An upper estimate of the seconds lesson 05's size-dependent runs take on this device: each precision's
    quality run (``precision_steps`` steps), at :data:`PESSIMISTIC_EFFICIENCY` of the fp32 roof (the timed
    comparisons stop at their own time budgets)."""
    fp32 = facts.matmul.get("float32") or facts.fastest_roof
    if fp32 is None:
        raise ValueError(f"estimated_seconds: {facts.name} has no measured matmul roof.")
    step = precision_step_work(sizes.precision_width, sizes.precision_batch)
    per_step = max(step.flops / (PESSIMISTIC_EFFICIENCY * fp32), step.bytes / (PESSIMISTIC_EFFICIENCY *
                                                                              (facts.bandwidth or 1e9)))
    return 2 * sizes.precision_steps * per_step


__all__ = [
    "CLASSES", "MIN_CALL_S", "LAUNCHES_PER_CALL", "Sizes", "Work", "count_work", "precision_step_work",
    "matmul_work", "timed_calls", "min_call_seconds", "device_seconds", "meets_rule", "device_class", "cpu_sizes",
    "gpu_sizes", "sizes_for", "estimated_seconds", "copy_work", "graph_step_work", "launch_seconds_of",
    "meets_launch_rule", "copy_batch", "graph_step_size", "launch_bound_calls", "small_kernel_model",
    "inference_work", "throughput_batch", "step_batch",
]
