"""Exercise 21's trusted driver: what runs inside each rank around the learner's data-parallel, ZeRO and TP code.

:func:`course_lib.grading.ddp_ranks.run_ranks` starts two gloo processes; in each, :func:`rank_driver` (named in the
job, from the runner's allow-list) does everything the learner's code must not decide:

1. it replaces ``torch.distributed``'s collectives with recording wrappers *before* the cell runs, then executes the
   cell and joins the process group itself;
2. it builds every model and batch from ``cfg`` (drawn from the grading run's seed: shapes the learner cannot
   predict) and calls the learner's functions in four sections, each on its own so that one unfinished part does
   not hide the others: ``broadcast`` (replicas made equal), ``dp`` (a few SGD steps with ``BucketedAllReduce``),
   ``zero`` (``ShardedAdamW`` steps) and ``tp`` (``tp_mlp`` forward and backward);
3. it returns plain data: final weights, outputs, gradients, and every collective the learner issued (op, bytes,
   whether it was issued before the first-registered parameter's gradient was final, whether it was waited for).

**Deterministic communication.** An ``all_reduce(..., async_op=True)`` does nothing when it is called: the real
(blocking) all-reduce runs when the learner calls ``.wait()`` on the handle. Real gloo would usually finish the
message on its own before a late ``wait()``; here a submission that never waits, or reads the buffer before waiting,
always sees its own un-reduced gradients, so the mistake fails every run instead of some.

**Overlap.** Before the learner's ``BucketedAllReduce`` registers its hooks, the driver registers a post-accumulate
hook on the model's first-registered parameter (``inp.weight``, whose gradient backward produces last). Every
all-reduce issued before that hook fired was issued while backward still had work to do.

The models and data are built by the same functions in the grader's own process (``make_dp_model``, ``dp_batch``,
...), which recomputes every reference from ``cfg``.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import linecache
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.grading import ddp_ranks

DRIVER = "course_lib.grading.parallel_driver:rank_driver"
WORLD = 2
GLOO_TIMEOUT_S = 45  # a learner's collective the other rank never joins fails after this, instead of hanging
# The learner's names, in the order of the exercise; the cells that define them are what each rank executes.
NAMES = ("broadcast_parameters", "BucketedAllReduce", "ShardedAdamW", "SumInForward", "SumInBackward", "tp_mlp")
SECTIONS = {"broadcast": ("broadcast_parameters",), "dp": ("broadcast_parameters", "BucketedAllReduce"),
            "zero": ("ShardedAdamW",), "tp": ("SumInForward", "SumInBackward", "tp_mlp")}
# Collectives the driver records (every one a learner might use to move these tensors).
RECORDED = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
            "reduce_scatter_tensor", "scatter", "gather", "reduce", "send", "recv", "isend", "irecv")


# ------------------------------------------------------------------------------ the job, built from the run's seed


def exercise_config(seed: int = 0) -> dict[str, Any]:
    """Exercise 21's job for a grading run's seed: every size varies with it, small enough for two CPU ranks.

    ``dp.cap_bytes`` makes four buckets of :class:`TiedNet` (reverse registration order): ``out`` and
    ``shared.bias`` (exactly the cap when ``seed % 3 == 0``), ``shared.weight`` alone (larger than the cap), ``aux``
    with ``inp.bias`` (``aux`` gets no gradient: only ``finish()`` can send it), ``inp.weight``.
    """
    s = int(seed)
    d_in, hidden, classes = 5 + s % 7, 10 + s % 9, 3 + s % 4
    rows, cols, vec = 2 + s % 3, 3 + s % 2, 1 + s % 2
    # Odd (the last shard is shorter), never the same for two consecutive seeds, and above the first two tensors'
    # largest total (4 * 4 + 2), so the third tensor always has elements.
    numel = 19 + 2 * (s % 20)
    return {
        "seed": s,
        "dp": {"model_seed": 1000 + s % 9000, "data_seed": 5000 + s % 9000, "d_in": d_in, "hidden": hidden,
               "classes": classes, "batch": 3 + s % 3, "steps": 3, "lr": round(0.1 * (1 + s % 4), 3),
               "cap_bytes": 4 * (classes + hidden * classes + hidden + s % 3), "edges": bucket_edges(s)},
        "zero": {"seed": 2000 + s % 9000, "shapes": [[rows, cols], [vec], [numel - rows * cols - vec]], "steps": 3,
                 "lr": round(0.01 * (1 + s % 3), 4), "weight_decay": round(0.05 * (1 + s % 4), 4)},
        "tp": {"seed": 3000 + s % 9000, "d": 4 + s % 5, "batch": 2 + s % 2, "tokens": 3 + s % 4},
    }


class TiedNet(nn.Module):
    """The data-parallel section's model: ``inp``, ``aux``, ``shared``, ``out``, registered in that order.

    ``shared`` is applied twice (one weight, two uses: its gradient is final only after both uses' backward), and
    ``aux`` is a head this loss never uses (its parameters get no gradient).
    """

    def __init__(self, d_in: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, hidden)
        self.aux = nn.Linear(hidden, classes)
        self.shared = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        h = torch.tanh(self.shared(h))
        h = torch.tanh(self.shared(h))  # the same weight again
        return self.out(h)


def bucket_edges(seed: int) -> list[dict[str, Any]]:
    """Two small jobs that put a bucket's bytes exactly on the cap and one byte past it, where near-miss rules
    (``>=`` for ``>``, a running total that starts at 1 or -1) close a bucket one parameter early or late; the
    main model's cap meets its first bucket exactly only one run in three. ``numels``: float32 vectors in
    registration order (backward's order is the reverse); bytes in backward's order, with ``c`` elements' bytes
    the cap:

    - cap ``4c``: ``4a, 4(c-a), 4b, 4(c-b), 4``: two buckets exactly full, then one of 4 bytes;
    - cap ``4c - 1``: ``4a, 4(c-a), 4a, 4``: each neighbouring pair is one byte over the cap.
    """
    rng = random.Random(seed * 7717 + 211)
    c = rng.randint(4, 12)
    a, b = rng.randint(1, c - 1), rng.randint(1, c - 1)
    a2 = rng.randint(1, c - 2)  # 4 a2 + 4 stays under the cap
    exact = [a, c - a, b, c - b, 1]
    over = [a2, c - a2, a2, 1]
    return [{"numels": exact[::-1], "cap_bytes": 4 * c}, {"numels": over[::-1], "cap_bytes": 4 * c - 1}]


class EdgeNet(nn.Module):
    """Float32 vectors of the given sizes, registered in order; the loss reaches every one of them."""

    def __init__(self, numels: list[int], seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.vectors = nn.ParameterList(nn.Parameter(torch.randn(n, generator=g)) for n in numels)

    def forward(self) -> torch.Tensor:
        return sum(((k + 1) * v * v).sum() for k, v in enumerate(self.vectors))


def _seeded() -> Any:
    return torch.random.fork_rng(devices=[])  # nn.Linear draws from the global generator: leave it as it was


def make_dp_model(cfg: dict[str, Any], rank: int = 0) -> TiedNet:
    """Rank ``rank``'s initial model: each rank starts from different weights until they are broadcast."""
    dp = cfg["dp"]
    with _seeded():
        torch.manual_seed(dp["model_seed"] + 7919 * rank)
        return TiedNet(dp["d_in"], dp["hidden"], dp["classes"])


def dp_batch(cfg: dict[str, Any], step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch (``world * batch`` rows); rank ``r`` trains on rows ``r * batch`` on."""
    dp = cfg["dp"]
    g = torch.Generator().manual_seed(dp["data_seed"] + step)
    n = WORLD * dp["batch"]
    return torch.randn(n, dp["d_in"], generator=g), torch.randint(0, dp["classes"], (n,), generator=g)


def zero_params(cfg: dict[str, Any]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(cfg["zero"]["seed"])
    return [torch.randn(*shape, generator=g).requires_grad_() for shape in cfg["zero"]["shapes"]]


def zero_grads(cfg: dict[str, Any], step: int) -> list[torch.Tensor]:
    """Step ``step``'s (already averaged) gradients: the same on every rank."""
    g = torch.Generator().manual_seed(cfg["zero"]["seed"] + 100 + step)
    return [torch.randn(*shape, generator=g) for shape in cfg["zero"]["shapes"]]


def tp_block(cfg: dict[str, Any]) -> nn.Sequential:
    """The whole MLP block ``Linear(d, 4d) -> GELU -> Linear(4d, d)``, the same on every rank."""
    d = cfg["tp"]["d"]
    with _seeded():
        torch.manual_seed(cfg["tp"]["seed"])
        return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))


def tp_input(cfg: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's input ``(batch, tokens, d)`` and the weights of the loss ``(output * weights).sum()``."""
    tp = cfg["tp"]
    g = torch.Generator().manual_seed(tp["seed"] + 1)
    shape = (tp["batch"], tp["tokens"], tp["d"])
    return torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)


def flat(tensors: Any) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


# ------------------------------------------------------------------------------ recording the collectives


class _Tape:
    """Every collective of this rank, in the order issued, and where the driver is in its script."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.stage = "setup"
        self.marker_fired = False


def _nbytes(payload: Any) -> int:
    if isinstance(payload, torch.Tensor):
        return payload.numel() * payload.element_size()
    if isinstance(payload, (list, tuple)):
        return sum(_nbytes(t) for t in payload)
    return 0


class _DeferredWork:
    """An async all-reduce's handle: the reduction itself happens in ``wait()`` (or any other way of asking)."""

    def __init__(self, run: Callable[[], Any], event: dict[str, Any], tape: _Tape, tensor: torch.Tensor) -> None:
        self._run, self._event, self._tape, self._tensor = run, event, tape, tensor

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        if self._event["waited"] is None:
            self._event["waited"] = self._tape.stage
            self._run()
        return True

    def is_completed(self) -> bool:
        self.wait()
        return True

    def is_success(self) -> bool:
        return self.is_completed()

    def get_future(self) -> torch.futures.Future:
        self.wait()
        future: torch.futures.Future = torch.futures.Future()
        future.set_result([self._tensor])
        return future

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return [self._tensor]

    def synchronize(self) -> None:
        self.wait()


class _WaitedWork:
    """Any other async collective's real handle, noting when it is waited for."""

    def __init__(self, work: Any, event: dict[str, Any], tape: _Tape) -> None:
        self._work, self._event, self._tape = work, event, tape

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        if self._event["waited"] is None:
            self._event["waited"] = self._tape.stage
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _recording(op: str, original: Callable[..., Any], tape: _Tape) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        first = next(iter(bound.arguments.values()), None)
        async_op = bool(bound.arguments.get("async_op", False)) or op in ("isend", "irecv")
        event = {"op": op, "nbytes": _nbytes(first), "async": async_op, "stage": tape.stage,
                 "before_marker": not tape.marker_fired, "waited": None}
        tape.events.append(event)
        if op == "all_reduce" and async_op:
            blocking = dict(bound.arguments, async_op=False)
            return _DeferredWork(lambda: original(**blocking), event, tape, bound.arguments["tensor"])
        work = original(*args, **kwargs)
        if not async_op:
            event["waited"] = tape.stage
            return work
        return _WaitedWork(work, event, tape)

    return wrapper


def _instrument(tape: _Tape) -> None:
    """Replace the collectives in ``torch.distributed`` (and where they are defined) by recording wrappers."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    for op in RECORDED:
        original = getattr(distributed_c10d, op, None)
        if original is None:
            continue
        wrapper = _recording(op, original, tape)
        for module in (dist, distributed_c10d):
            if getattr(module, op, None) is original:
                setattr(module, op, wrapper)


@contextmanager
def _stage(tape: _Tape, name: str) -> Iterator[None]:
    before, tape.stage = tape.stage, name
    try:
        yield
    finally:
        tape.stage = before


# ------------------------------------------------------------------------------ the four sections, in each rank


def _broadcast(ns: dict[str, Any], cfg: dict[str, Any], rank: int, tape: _Tape) -> dict[str, Any]:
    model = make_dp_model(cfg, rank)
    with _stage(tape, "broadcast"):
        ns["broadcast_parameters"](model)
    return {"params": flat(model.parameters())}


def _dp(ns: dict[str, Any], cfg: dict[str, Any], rank: int, tape: _Tape) -> dict[str, Any]:
    dp = cfg["dp"]
    model = make_dp_model(cfg, rank)
    with _stage(tape, "broadcast"):
        ns["broadcast_parameters"](model)

    def marker(param: torch.Tensor) -> None:
        tape.marker_fired = True

    model.inp.weight.register_post_accumulate_grad_hook(marker)  # before the learner's hooks: it runs first
    with _stage(tape, "init"):
        buckets = ns["BucketedAllReduce"](model, dp["cap_bytes"])
    optimizer = torch.optim.SGD(model.parameters(), lr=dp["lr"])
    section_first, steps = len(tape.events), []
    for step in range(dp["steps"]):
        x, y = dp_batch(cfg, step)
        mine = slice(rank * dp["batch"], (rank + 1) * dp["batch"])
        first = len(tape.events)
        tape.marker_fired = False
        with _stage(tape, "backward"):
            F.cross_entropy(model(x[mine]), y[mine]).backward()
        with _stage(tape, "finish"):
            buckets.finish()
        events = tape.events[first:]
        steps.append({
            "all_reduce_bytes": [e["nbytes"] for e in events if e["op"] == "all_reduce"],
            "before_marker": [e["nbytes"] for e in events if e["op"] == "all_reduce" and e["before_marker"]],
            "other_ops": [e["op"] for e in events if e["op"] != "all_reduce"],
            # async messages of this step (or earlier ones) nobody had waited for when optimizer.step() came
            "unwaited": sum(1 for e in tape.events[section_first:] if e["async"] and e["waited"] is None),
            "async": sum(1 for e in events if e["async"]),
        })
        with _stage(tape, "optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    edges = []
    for k, job in enumerate(dp["edges"]):
        probe = EdgeNet(job["numels"], seed=dp["model_seed"] + k)  # the same on every rank
        with _stage(tape, "init"):
            probe_buckets = ns["BucketedAllReduce"](probe, job["cap_bytes"])
        first = len(tape.events)
        with _stage(tape, "backward"):
            probe().backward()
        with _stage(tape, "finish"):
            probe_buckets.finish()
        edges.append([e["nbytes"] for e in tape.events[first:] if e["op"] == "all_reduce"])
    return {"params": flat(model.parameters()), "steps": steps, "edges": edges}


def moment_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of an optimizer's per-element state (AdamW's two moments), the 0-d step counters aside."""
    return sum(t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values()
               if isinstance(t, torch.Tensor) and t.dim() >= 1)


def _zero(ns: dict[str, Any], cfg: dict[str, Any], rank: int, tape: _Tape) -> dict[str, Any]:
    z = cfg["zero"]
    params = zero_params(cfg)
    with _stage(tape, "init"):
        sharded = ns["ShardedAdamW"](list(params), lr=z["lr"], weight_decay=z["weight_decay"])
    first = len(tape.events)
    for step in range(z["steps"]):
        for p, g in zip(params, zero_grads(cfg, step)):
            p.grad = g.clone()
        with _stage(tape, "step"):
            sharded.step()
    optimizer = getattr(sharded, "optimizer", None)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise AttributeError("ShardedAdamW needs an attribute `optimizer`: the torch.optim.AdamW over this rank's "
                             f"shard (found {type(optimizer).__name__})")
    return {"params": flat(params), "state_bytes": moment_bytes(optimizer), "optimizer": type(optimizer).__name__,
            "ops": [e["op"] for e in tape.events[first:]]}


def _tp(ns: dict[str, Any], cfg: dict[str, Any], rank: int, tape: _Tape) -> dict[str, Any]:
    block = tp_block(cfg)
    x, weights = tp_input(cfg)
    x.requires_grad_()
    first = len(tape.events)
    with _stage(tape, "forward"):
        out = ns["tp_mlp"](x, block, rank, WORLD)
    middle = len(tape.events)
    with _stage(tape, "backward"):
        (out * weights).sum().backward()

    def messages(events: list[dict[str, Any]]) -> list[list[Any]]:
        return [[e["op"], e["nbytes"]] for e in events]

    grads = {name: p.grad for name, p in block.named_parameters()}
    return {"out": out.detach(), "x_grad": x.grad, "grads": grads,
            "forward": messages(tape.events[first:middle]), "backward": messages(tape.events[middle:])}


_SECTIONS = {"broadcast": _broadcast, "dp": _dp, "zero": _zero, "tp": _tp}


def rank_driver(load_cell: Callable[[], dict[str, Any]], rank: int, world_size: int,
                cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank of exercise 21: instrument, run the cell, join the group, run every section; one record each."""
    import torch.distributed as dist

    if world_size != WORLD:
        raise ValueError(f"exercise 21 runs on {WORLD} ranks, not {world_size}")
    tape = _Tape()
    _instrument(tape)  # before the cell runs: `from torch.distributed import all_reduce` gets the wrapper too
    record: dict[str, Any] = {}
    try:
        ns = load_cell()
    except BaseException as exc:
        return {"error": ddp_ranks.exception_record(exc)}
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    try:
        for name, section in _SECTIONS.items():
            missing = [n for n in SECTIONS[name] if n not in ns]
            try:
                if missing:
                    raise NameError(f"the exercise cell does not define {', '.join(missing)}")
                with _stage(tape, name):
                    record[name] = section(ns, cfg, rank, tape)
            except BaseException as exc:  # this section's check reports it; the others still run
                record[name] = {"error": ddp_ranks.exception_record(exc)}
    finally:
        dist.destroy_process_group()
    return record


# ------------------------------------------------------------------------------ in the notebook / the grading child


def cell_sources(ns: dict[str, Any], names: tuple[str, ...] = NAMES) -> str:
    """The source of every cell that defines one of ``names`` (each cell once, in the order of ``names``)."""
    files: list[str] = []
    for name in names:
        obj = ns.get(name)
        functions = [obj] if inspect.isfunction(obj) else [
            getattr(v, "__func__", v) for v in vars(obj).values()] if inspect.isclass(obj) else []
        # A class's first plain method says where it was defined (a decorated one may point into torch).
        codes = [fn.__code__ for fn in functions if inspect.isfunction(fn)]
        if codes and codes[0].co_filename not in files:
            files.append(codes[0].co_filename)
    sources = ["".join(linecache.getlines(f)) for f in files]
    if not any(sources):
        raise ddp_ranks.RanksFailed(f"none of {', '.join(names)} is defined in a notebook cell or a file")
    return "\n\n".join(s for s in sources if s)


def run_exercise(ns: dict[str, Any], cfg: dict[str, Any], *, timeout_s: float = 240.0) -> dict[str, Any]:
    """Run exercise 21's cells on two processes under :func:`rank_driver`; the result of the same job is reused.

    Returns ``{"ranks": [record of rank 0, record of rank 1]}``; each record holds one entry per section
    (``broadcast``, ``dp``, ``zero``, ``tp``), itself plain data or ``{"error": {...}}``.
    """
    source = cell_sources(ns)
    anchor = next(ns[n] for n in NAMES if n in ns)
    fn = anchor if inspect.isfunction(anchor) else run_exercise  # only its name keys the reuse
    result = ddp_ranks.run_ranks(fn, cfg, world_size=WORLD, timeout_s=timeout_s, reuse=True, driver=DRIVER,
                                 source=source)
    return {"ranks": result["ranks"]}


def describe(run: dict[str, Any]) -> str:
    """What each rank did, one line per section (for the notebook's demo)."""
    lines = []
    for record in run["ranks"]:
        rank = record.get("rank")
        if "error" in record:
            lines.append(f"rank {rank}: {record['error']['type']}: {record['error']['message']}")
            continue
        for name in _SECTIONS:
            got = record.get(name, {})
            if "error" in got:
                lines.append(f"rank {rank} {name:<9}: raised {got['error']['type']}: {got['error']['message']}")
            elif name == "broadcast":
                lines.append(f"rank {rank} broadcast: {got['params'].numel()} weights, sum {got['params'].sum():.6f}")
            elif name == "dp":
                for i, step in enumerate(got["steps"]):
                    lines.append(f"rank {rank} dp step {i}: all-reduces of {step['all_reduce_bytes']} bytes, "
                                 f"{len(step['before_marker'])} issued while backward still ran, "
                                 f"{step['unwaited']} not waited for before optimizer.step()")
            elif name == "zero":
                lines.append(f"rank {rank} zero     : {got['params'].numel()} parameters, this rank's AdamW "
                             f"moments {got['state_bytes']} bytes, collectives {sorted(set(got['ops']))}")
            else:
                lines.append(f"rank {rank} tp       : output {tuple(got['out'].shape)}, forward {got['forward']}, "
                             f"backward {got['backward']}")
    return "\n".join(lines)

