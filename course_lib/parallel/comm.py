"""Communication, counted and priced: which collectives a step issues, how many bytes, and what they should cost.

Every kind of parallelism is a trade: less compute or memory per rank, paid for in messages. This file makes the
messages visible.

**Counting.** ``with count_collectives() as log:`` replaces ``torch.distributed.all_reduce``, ``broadcast``,
``all_gather_into_tensor``, ``all_gather``, ``reduce_scatter_tensor`` and ``reduce_scatter`` with wrappers that
record one :class:`CommRecord` per call -- the op, the bytes of the tensor this rank passes in, whether it was
async, when it was issued and when it finished (for ``async_op=True``: when ``.wait()`` returned) -- then call the
real function. The originals are put back on exit, also when an exception escapes. Only calls that go through the
``torch.distributed`` module are seen: DDP's reducer issues its all-reduces from C++; :func:`record_ddp_allreduces`
sees those through a DDP communication hook. On GPUs the times are the host's: a NCCL call returns once queued.

**Pricing: the alpha-beta model of a ring all-reduce.** ``world`` ranks in a ring each send ``world - 1`` chunks of
``nbytes / world`` to reduce (reduce-scatter) and ``world - 1`` more to share the result (all-gather)::

    bytes each rank sends = 2 (world - 1) / world * nbytes        # -> 2 * nbytes for a large world
    time                  = 2 (world - 1) * latency + that / bandwidth

So the bytes per rank grow with the number of ranks but approach a limit: 1x nbytes at 2 ranks, 1.75x at 8, 1.97x
at 64, never 2x; the latency term grows with every rank: small messages are latency-bound, large ones
bandwidth-bound. That is why DDP packs gradients into 25 MiB buckets instead of sending one message per parameter.
The two numbers belong to the link: NVLink is specified at hundreds of GB/s; gloo between CPU processes goes through
the operating system's TCP stack (the loopback interface when the ranks share a machine) and is far slower.
:func:`measure_allreduce` times all-reduces on this machine and :func:`fit_bandwidth_latency` reads the two numbers
off the measurements.

**Notation.** The literature (Thakur, Rabenseifner and Gropp, "Optimization of collective communication operations
in MPICH", 2005) writes ``alpha`` for the latency per message, ``beta`` for the transfer time *per byte* and ``gamma``
for the reduction's compute time per byte: a ring all-reduce costs ``2 (n - 1) alpha + 2 (n - 1)/n N beta +
(n - 1)/n N gamma``. The code here keeps ``latency = alpha`` and ``bandwidth`` in bytes per second; a fit of measured
times cannot tell sending from adding, so ``1 / bandwidth = beta + gamma / 2`` (the per-byte cost of the ring bytes).

Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from course_lib import clock
from course_lib.device import synchronize

# op name -> the argument that holds what this rank sends (a tensor, or a list of tensors).
PAYLOAD_ARGUMENT: dict[str, str] = {
    "all_reduce": "tensor",
    "broadcast": "tensor",
    "all_gather_into_tensor": "input_tensor",
    "all_gather": "tensor",
    "reduce_scatter_tensor": "input",
    "reduce_scatter": "input_list",
}


@dataclass
class CommRecord:
    """One collective call: ``op``, ``nbytes`` this rank passed in, ``async_op``, and host times ``issued`` and
    ``finished`` on the course clock (``finished`` is ``None`` for an async op nobody waited for).

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """

    op: str
    nbytes: int
    async_op: bool
    issued: float
    finished: float | None = None


@dataclass
class CommLog:
    """The records of a :func:`count_collectives` block, in the order the calls were issued.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """

    records: list[CommRecord] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Number of calls per op."""
        out: dict[str, int] = {}
        for r in self.records:
            out[r.op] = out.get(r.op, 0) + 1
        return out

    def bytes_by_op(self) -> dict[str, int]:
        """Bytes passed in per op (what this rank contributed, before the ring's 2 (world - 1) / world)."""
        out: dict[str, int] = {}
        for r in self.records:
            out[r.op] = out.get(r.op, 0) + r.nbytes
        return out

    @property
    def total_bytes(self) -> int:
        return sum(r.nbytes for r in self.records)

    def __len__(self) -> int:
        return len(self.records)

    def summary(self) -> str:
        """One line per op: calls and MiB."""
        counts, nbytes = self.counts(), self.bytes_by_op()
        return "\n".join(f"{op:<24} {counts[op]:>5} calls {nbytes[op] / 2**20:>10.3f} MiB" for op in counts) or "none"


def _payload_bytes(payload: Any) -> int:
    if isinstance(payload, torch.Tensor):
        return payload.numel() * payload.element_size()
    return sum(t.numel() * t.element_size() for t in payload)


class _TimedWork:
    """The ``Work`` an async collective returns, with ``wait()`` stamping the record's finish time."""

    def __init__(self, work: Any, record: CommRecord) -> None:
        self._work, self._record = work, record

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        if self._record.finished is None:
            self._record.finished = clock.now()
        return result

    def __getattr__(self, name: str) -> Any:  # is_completed(), get_future(), ...: the real Work's
        return getattr(self._work, name)


def _counting(op: str, original: Callable[..., Any], log: CommLog) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        async_op = bool(bound.arguments.get("async_op", False))
        record = CommRecord(op, _payload_bytes(bound.arguments[PAYLOAD_ARGUMENT[op]]), async_op, clock.now())
        log.records.append(record)  # list.append is atomic: hooks on autograd's threads may call this too
        work = original(*args, **kwargs)
        if not async_op:
            record.finished = clock.now()
            return work
        return _TimedWork(work, record)

    return wrapper


@contextlib.contextmanager
def count_collectives() -> Iterator[CommLog]:
    """Record every collective issued through ``torch.distributed`` inside the block::

        with count_collectives() as log:
            loss.backward()
            dp.finish()
        print(log.counts(), log.bytes_by_op())

    The wrapped functions are module attributes, so code that calls ``torch.distributed.all_reduce(...)`` (or
    ``dist.all_reduce`` after ``import torch.distributed as dist``) is counted; the originals return on exit,
    whatever happens inside.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    log = CommLog()
    originals = {op: getattr(dist, op) for op in PAYLOAD_ARGUMENT}
    try:
        for op, original in originals.items():
            setattr(dist, op, _counting(op, original, log))
        yield log
    finally:
        for op, original in originals.items():
            setattr(dist, op, original)


def record_ddp_allreduces(model: torch.nn.parallel.DistributedDataParallel) -> CommLog:
    """Record each all-reduce a ``DistributedDataParallel`` model's reducer issues, one :class:`CommRecord` per
    bucket, in a :class:`CommLog` this returns (it keeps growing: ``log.records.clear()`` between steps).

    DDP's reducer calls its communication hook from C++ the moment a bucket is ready, during backward: this hook
    stamps the time, then does what DDP's default does (divide by the world size, all-reduce the bucket's flat
    buffer asynchronously). Register it before the first step; a model takes one hook.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    log = CommLog()
    model.register_comm_hook(log, _recording_allreduce_hook)
    return log


def _recording_allreduce_hook(log, bucket):  # type: ignore[no-untyped-def]
    # No annotations: DDP compares them with dist.GradBucket, and this file's are strings (__future__ annotations).
    buffer = bucket.buffer()
    record = CommRecord("all_reduce", buffer.numel() * buffer.element_size(), True, clock.now())
    log.records.append(record)
    buffer.div_(dist.get_world_size())
    # distributed_c10d's function, not torch.distributed's attribute: count_collectives must not count it twice.
    future = dist.distributed_c10d.all_reduce(buffer, async_op=True).get_future()

    def finished(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        record.finished = clock.now()
        return done.value()[0]

    return future.then(finished)


# --- the alpha-beta model -----------------------------------------------------------------------------------------


def ring_allreduce_bytes(nbytes: float, world: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``nbytes``: ``2 (world - 1) / world * nbytes``.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    if world < 1:
        raise ValueError(f"world={world!r} must be at least 1 (the number of ranks).")
    return 2 * (world - 1) / world * nbytes


# Bytes each rank sends in a ring, per byte it passed in (what count_collectives records as nbytes): a reduce-scatter
# passes in the whole vector and sends world - 1 of its world chunks; an all-gather passes in one chunk and sends it on
# world - 1 times; an all-reduce is the two one after the other.
RING_SENDS_PER_BYTE: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda world: 2 * (world - 1) / world,
    "reduce_scatter_tensor": lambda world: (world - 1) / world,
    "reduce_scatter": lambda world: (world - 1) / world,
    "all_gather_into_tensor": lambda world: world - 1,
    "all_gather": lambda world: world - 1,
}


def ring_bytes_sent(op: str, nbytes: float, world: int) -> float:
    """Bytes each rank sends in a ring for one collective ``op`` of which it passed in ``nbytes`` (a
    :class:`CommRecord`'s ``nbytes``): ``all_reduce`` ``2 (world - 1) / world * nbytes``, a reduce-scatter
    ``(world - 1) / world * nbytes``, an all-gather ``(world - 1) * nbytes``.

    So ZeRO-1 with a reduce-scatter of the gradients and an all-gather of the parameters sends what one all-reduce
    sends (data parallelism's bytes); an all-reduce followed by an all-gather sends 1.5x that (exercise 22).

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    if op not in RING_SENDS_PER_BYTE:
        raise ValueError(f"op={op!r} is not a ring collective this model prices; use one of "
                         f"{sorted(RING_SENDS_PER_BYTE)}.")
    if world < 1:
        raise ValueError(f"world={world!r} must be at least 1 (the number of ranks).")
    return RING_SENDS_PER_BYTE[op](world) * nbytes


def predicted_allreduce_seconds(nbytes: float, world: int, bandwidth: float, latency: float) -> float:
    """The alpha-beta model: ``2 (world - 1) * latency + ring_allreduce_bytes(nbytes, world) / bandwidth``.

    ``bandwidth`` in bytes per second each rank can send, ``latency`` in seconds per message (per ring step).

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    if not bandwidth > 0:
        raise ValueError(f"bandwidth={bandwidth!r} must be positive (bytes per second).")
    return 2 * (world - 1) * latency + ring_allreduce_bytes(nbytes, world) / bandwidth


def measure_allreduce(sizes_bytes: Sequence[int], reps: int = 10, *, device: torch.device | str | None = None,
                      warmup: int = 2) -> list[tuple[int, float]]:
    """Median seconds of one all-reduce per message size: rows ``(nbytes, seconds)``, the same on every rank.

    A barrier before each timed call starts every rank together (otherwise the first rank to arrive times its
    wait for the others); the device is synchronised before the clock is read (NCCL returns once queued). Every size
    is warmed up first, then the sizes are timed in interleaved rounds (one call of each per round). Each
    rank's median is then all-reduced with MAX: a collective is as slow as its slowest rank. A collective itself:
    call it on every rank. ``device``: where the float32 messages live (default: CUDA's current device under NCCL,
    else the CPU).

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    if reps < 1 or not sizes_bytes or any(s < 4 for s in sizes_bytes):
        raise ValueError(f"need reps >= 1 (got {reps}) and sizes of at least 4 bytes (got {list(sizes_bytes)}).")
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    device = torch.device(device)
    messages = [torch.ones(nbytes // 4, dtype=torch.float32, device=device) for nbytes in sizes_bytes]
    for message in messages:  # the first calls of each size set up connections and buffers: untimed
        for _ in range(warmup):
            dist.all_reduce(message)
    times: list[list[float]] = [[] for _ in messages]
    for _ in range(reps):  # interleaved: a slow moment of the machine hits every size alike
        for message, measured in zip(messages, times):
            dist.barrier()
            start = clock.now()
            dist.all_reduce(message)
            synchronize(device)
            measured.append(clock.now() - start)
    rows = []
    for message, measured in zip(messages, times):
        slowest = torch.tensor([statistics.median(measured)], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        rows.append((message.numel() * 4, float(slowest.item())))
    return rows


def fit_bandwidth_latency(rows: Sequence[tuple[float, float]], world: int) -> tuple[float, float]:
    """``(bandwidth bytes/s, latency s)`` of the alpha-beta model that best fits measured ``(nbytes, seconds)``.

    The model is a line in the ring bytes ``x = ring_allreduce_bytes(nbytes, world)``: ``t = a + x / bandwidth``
    with ``a = 2 (world - 1) * latency``. Least squares on the *relative* error (each residual divided by the
    measured time), so the microsecond messages count as much as the millisecond ones. A negative intercept (noise
    on a fast link) is refitted as a line through the origin: latency 0.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    if world < 2:
        raise ValueError(f"world={world!r}: a single rank sends nothing; fit measurements from 2 or more ranks.")
    points = [(ring_allreduce_bytes(n, world), t) for n, t in rows]
    if len({x for x, _ in points}) < 2 or any(t <= 0 for _, t in points):
        raise ValueError("need positive times for at least two different message sizes to fit a line.")
    # Weighted least squares, weight 1/t^2: minimise sum(((a + b x) - t) / t)^2 over a and b (b = 1 / bandwidth).
    w = [1 / t**2 for _, t in points]
    sw = sum(w)
    sx = sum(wi * x for wi, (x, _) in zip(w, points))
    st = sum(wi * t for wi, (_, t) in zip(w, points))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, points))
    sxt = sum(wi * x * t for wi, (x, t) in zip(w, points))
    slope = (sw * sxt - sx * st) / (sw * sxx - sx * sx)
    intercept = (st - slope * sx) / sw
    if intercept < 0:
        intercept, slope = 0.0, sxt / sxx
    if not slope > 0:
        raise ValueError("the times do not grow with the message size; measure larger messages (MiB, not bytes).")
    return 1 / slope, intercept / (2 * (world - 1))


# --- when data parallelism becomes communication-bound ------------------------------------------------------------


def comm_bound_world(compute_s: float, grad_bytes: float, latency: float, bandwidth: float,
                     max_world: int = 4096) -> int | None:
    """The smallest number of ranks (2 .. ``max_world``) at which one all-reduce of ``grad_bytes`` takes at least
    ``compute_s``, the step's compute per rank (fixed batch per rank: the compute stays, the message grows with the
    ranks); ``None`` when no such world exists. Past it, a step that cannot hide its all-reduce is
    communication-bound.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    if not compute_s > 0:
        raise ValueError(f"compute_s={compute_s!r} must be positive (seconds of compute per step).")
    for world in range(2, max_world + 1):
        if predicted_allreduce_seconds(grad_bytes, world, bandwidth, latency) >= compute_s:
            return world
    return None


def bandwidth_for_compute(compute_s: float, grad_bytes: float, world: int, latency: float) -> float:
    """The link bandwidth (bytes per second) at which one all-reduce of ``grad_bytes`` over ``world`` ranks takes
    exactly ``compute_s``: a slower link makes the step communication-bound. ``math.inf`` when the latency term
    alone, ``2 (world - 1) * latency``, already takes ``compute_s``.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    if not compute_s > 0 or world < 2:
        raise ValueError(f"need compute_s > 0 and world >= 2, got compute_s={compute_s!r}, world={world!r}.")
    left = compute_s - 2 * (world - 1) * latency
    return math.inf if left <= 0 else ring_allreduce_bytes(grad_bytes, world) / left
