"""Exercise 22's trusted driver: what runs inside each rank around the learner's reduce-scatter ZeRO-1.

:func:`course_lib.grading.ddp_ranks.run_ranks` starts two gloo processes; in each, :func:`rank_driver` (named in the
job, from the runner's allow-list) records every collective *before* the learner's cell runs (so ``from
torch.distributed import reduce_scatter_tensor`` is recorded too), executes the cell, joins the process group, builds
the parameters and this rank's own gradients from ``cfg`` (drawn from the grading run's seed) and steps the learner's
``ReduceScatterAdamW`` a few times. It returns plain data: the final parameters, the optimizer's moment bytes and, per
step, every collective issued with the bytes this rank passed in (what
:func:`course_lib.parallel.comm.count_collectives` records, so :func:`course_lib.parallel.comm.ring_bytes_sent`
prices it).

The grader's own process rebuilds the same tensors (:func:`zero_params`, :func:`local_grads`) and recomputes the
reference: one AdamW stepped with the gradients averaged over the ranks.
"""

from __future__ import annotations

import datetime
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from course_lib.grading import ddp_ranks
from course_lib.grading.parallel_driver import RECORDED, cell_sources, flat, moment_bytes
from course_lib.parallel.comm import PAYLOAD_ARGUMENT

DRIVER = "course_lib.grading.beyond_dp_driver:rank_driver"
WORLD = 2
GLOO_TIMEOUT_S = 45  # a collective the other rank never joins fails after this, instead of hanging
NAMES = ("ReduceScatterAdamW",)


def exercise_config(seed: int = 0) -> dict[str, Any]:
    """Exercise 22's job for a grading run's seed: an odd number of parameters (the last shard is padded), never
    the same for two consecutive seeds, and settings that vary with it."""
    s = int(seed)
    rows, cols, vec = 2 + s % 3, 3 + s % 2, 1 + s % 2
    numel = 21 + 2 * (s % 23)
    return {"seed": 4000 + s % 9000, "shapes": [[rows, cols], [vec], [numel - rows * cols - vec]], "steps": 3,
            "lr": round(0.01 * (1 + s % 3), 4), "weight_decay": round(0.05 * (1 + s % 4), 4)}


def zero_params(cfg: dict[str, Any]) -> list[torch.Tensor]:
    """The parameters, the same on every rank."""
    g = torch.Generator().manual_seed(cfg["seed"])
    return [torch.randn(*shape, generator=g).requires_grad_() for shape in cfg["shapes"]]


def local_grads(cfg: dict[str, Any], step: int, rank: int) -> list[torch.Tensor]:
    """Rank ``rank``'s own gradients at ``step`` (its share of the batch): different on every rank."""
    g = torch.Generator().manual_seed(cfg["seed"] + 100 + 17 * step + 5003 * rank)
    return [torch.randn(*shape, generator=g) for shape in cfg["shapes"]]


def _payload_bytes(op: str, bound: dict[str, Any]) -> int:
    """Bytes this rank passed in, as count_collectives counts them (other ops: their first argument)."""
    payload = bound.get(PAYLOAD_ARGUMENT.get(op, ""), next(iter(bound.values()), None))
    if isinstance(payload, torch.Tensor):
        return payload.numel() * payload.element_size()
    if isinstance(payload, (list, tuple)):
        return sum(t.numel() * t.element_size() for t in payload if isinstance(t, torch.Tensor))
    return 0


def _instrument(events: list[list[Any]]) -> None:
    """Replace the collectives in ``torch.distributed`` (and where they are defined) by recording wrappers."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    def recording(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            events.append([op, _payload_bytes(op, signature.bind(*args, **kwargs).arguments)])
            return original(*args, **kwargs)

        return wrapper

    for op in RECORDED:
        original = getattr(distributed_c10d, op, None)
        if original is None:
            continue
        wrapper = recording(op, original)
        for module in (dist, distributed_c10d):
            if getattr(module, op, None) is original:
                setattr(module, op, wrapper)


def _zero(ns: dict[str, Any], cfg: dict[str, Any], rank: int, events: list[list[Any]]) -> dict[str, Any]:
    params = zero_params(cfg)
    sharded = ns["ReduceScatterAdamW"](list(params), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    steps = []
    for step in range(cfg["steps"]):
        for p, g in zip(params, local_grads(cfg, step, rank)):
            p.grad = g.clone()
        first = len(events)
        sharded.step()
        steps.append([list(e) for e in events[first:]])
    optimizer = getattr(sharded, "optimizer", None)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise AttributeError("ReduceScatterAdamW needs an attribute `optimizer`: the torch.optim.AdamW over this "
                             f"rank's shard (found {type(optimizer).__name__})")
    return {"params": flat(params), "state_bytes": moment_bytes(optimizer), "steps": steps}


def rank_driver(load_cell: Callable[[], dict[str, Any]], rank: int, world_size: int,
                cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank of exercise 22: instrument, run the cell, join the group, step the learner's optimizer."""
    import torch.distributed as dist

    if world_size != WORLD:
        raise ValueError(f"exercise 22 runs on {WORLD} ranks, not {world_size}")
    events: list[list[Any]] = []
    _instrument(events)  # before the cell runs: names imported from torch.distributed are the wrappers too
    try:
        ns = load_cell()
    except BaseException as exc:
        return {"error": ddp_ranks.exception_record(exc)}
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    try:
        if "ReduceScatterAdamW" not in ns:
            raise NameError("the exercise cell does not define ReduceScatterAdamW")
        return {"zero": _zero(ns, cfg, rank, events)}
    except BaseException as exc:
        return {"zero": {"error": ddp_ranks.exception_record(exc)}}
    finally:
        dist.destroy_process_group()


def run_exercise(ns: dict[str, Any], cfg: dict[str, Any], *, timeout_s: float = 240.0) -> dict[str, Any]:
    """Run exercise 22's exercise cell on two processes under :func:`rank_driver`; the same job's result is reused.

    Returns ``{"ranks": [record of rank 0, record of rank 1]}``, each ``{"zero": {...}}`` or ``{"error": {...}}``.
    """
    source = cell_sources(ns, NAMES)
    result = ddp_ranks.run_ranks(run_exercise, cfg, world_size=WORLD, timeout_s=timeout_s, reuse=True,
                                 driver=DRIVER, source=source)
    return {"ranks": result["ranks"]}


def describe(run: dict[str, Any]) -> str:
    """What each rank did (for the notebook's demo)."""
    lines = []
    for record in run["ranks"]:
        got = record.get("zero", record)
        if "error" in got:
            lines.append(f"rank {record.get('rank')}: raised {got['error']['type']}: {got['error']['message']}")
            continue
        lines.append(f"rank {record['rank']}: {got['params'].numel()} parameters, AdamW moments {got['state_bytes']} "
                     f"bytes; step 0 sent {got['steps'][0]} ([op, bytes passed in])")
    return "\n".join(lines)
