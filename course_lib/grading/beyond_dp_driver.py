"""Exercise 22's trusted driver: what runs inside each rank around the learner's reduce-scatter ZeRO-1 and
two-stage pipeline.

:func:`course_lib.grading.ddp_ranks.run_ranks` starts two gloo processes; in each, :func:`rank_driver` (named in the
job, from the runner's allow-list) records every collective *before* the learner's cell runs (so ``from
torch.distributed import reduce_scatter_tensor`` is recorded too), executes the cell, joins the process group, builds
everything from ``cfg`` (drawn from the grading run's seed) and runs two sections, each on its own so that one
unfinished part does not hide the other:

* ``zero``: the parameters and this rank's own gradients, stepped a few times by the learner's ``ReduceScatterAdamW``;
  it returns the final parameters, the optimizer's moment bytes and, per step, every collective issued with the
  bytes this rank passed in (what :func:`course_lib.parallel.comm.count_collectives` records, so
  :func:`course_lib.parallel.comm.ring_bytes_sent` prices it);
* ``pp``: rank ``r`` holds stage ``r`` of a two-stage model and calls the learner's ``pipeline_step`` once on the
  whole batch; it returns the loss (the last stage's), the stage's gradients and every point-to-point message;
* ``tp``: the learner's ``tp_attention`` runs this rank's heads of one causal self-attention layer (the course's
  :class:`~course_lib.models.gpt.CausalSelfAttention`, whole and the same on every rank); it returns the output, the
  input's and the layer's gradients, and the collectives of forward and of backward;
* ``sp``: the learner's ``sp_mlp`` runs an MLP block with sequence parallelism: each rank holds its slice of the
  tokens; it returns this rank's output slice, the gradients and the collectives of forward and of backward.

The grader's own process rebuilds the same tensors (:func:`zero_params`, :func:`local_grads`, :func:`pp_model`,
:func:`pp_batch`) and recomputes the references: one AdamW stepped with the gradients averaged over the ranks, and
the unsplit model's loss and gradients on the whole batch, and the unsplit attention layer's output and gradients.
"""

from __future__ import annotations

import datetime
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from course_lib.grading import ddp_ranks
from course_lib.grading.parallel_driver import RECORDED, cell_sources, flat, moment_bytes
from course_lib.parallel.comm import PAYLOAD_ARGUMENT

DRIVER = "course_lib.grading.beyond_dp_driver:rank_driver"
WORLD = 2
GLOO_TIMEOUT_S = 45  # a collective the other rank never joins fails after this, instead of hanging
NAMES = ("ReduceScatterAdamW", "pipeline_step", "tp_attention", "sp_mlp")


def exercise_config(seed: int = 0) -> dict[str, Any]:
    """Exercise 22's job for a grading run's seed: an odd number of parameters (the last shard is padded), never
    the same for two consecutive seeds, and settings that vary with it."""
    s = int(seed)
    rows, cols, vec = 2 + s % 3, 3 + s % 2, 1 + s % 2
    numel = 21 + 2 * (s % 23)
    micro_batches = 2 + s % 3
    return {"seed": 4000 + s % 9000, "shapes": [[rows, cols], [vec], [numel - rows * cols - vec]], "steps": 3,
            "lr": round(0.01 * (1 + s % 3), 4), "weight_decay": round(0.05 * (1 + s % 4), 4),
            "pp": {"seed": 6000 + s % 9000, "d_in": 3 + s % 5, "hidden": 4 + s % 7, "classes": 2 + s % 4,
                   "micro_batches": micro_batches, "batch": micro_batches * (2 + s % 2)},
            # Two or three heads per rank: with one, moving the heads' axis (transpose(1, 2)) changes nothing.
            "tp": {"seed": 8000 + s % 9000, "n_head": WORLD * (2 + s % 2), "head_dim": 2 + s % 3, "batch": 2 + s % 2,
                   "tokens": 3 + s % 4},
            # d / world never equals tokens / world, so a shape read from the wrong axis cannot pass.
            "sp": {"seed": 9000 + s % 9000, "d": WORLD * (2 + s % 3) + 3 + s % 5, "batch": 1 + s % 3,
                   "tokens": WORLD * (2 + s % 3)}}


def zero_params(cfg: dict[str, Any]) -> list[torch.Tensor]:
    """The parameters, the same on every rank."""
    g = torch.Generator().manual_seed(cfg["seed"])
    return [torch.randn(*shape, generator=g).requires_grad_() for shape in cfg["shapes"]]


def local_grads(cfg: dict[str, Any], step: int, rank: int) -> list[torch.Tensor]:
    """Rank ``rank``'s own gradients at ``step`` (its share of the batch): different on every rank."""
    g = torch.Generator().manual_seed(cfg["seed"] + 100 + 17 * step + 5003 * rank)
    return [torch.randn(*shape, generator=g) for shape in cfg["shapes"]]


def pp_model(cfg: dict[str, Any]) -> nn.Sequential:
    """The whole model, ``Sequential(stage 0, stage 1)``: ``Linear(d_in, hidden) -> Tanh`` on rank 0, ``Linear(hidden,
    classes)`` (the loss's stage) on rank 1."""
    pp = cfg["pp"]
    with torch.random.fork_rng(devices=[]):  # nn.Linear draws from the global generator: leave it as it was
        torch.manual_seed(pp["seed"])
        return nn.Sequential(nn.Sequential(nn.Linear(pp["d_in"], pp["hidden"]), nn.Tanh()),
                             nn.Sequential(nn.Linear(pp["hidden"], pp["classes"])))


def pp_batch(cfg: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch: inputs ``(batch, d_in)`` and class targets ``(batch,)``, the same on both ranks."""
    pp = cfg["pp"]
    g = torch.Generator().manual_seed(pp["seed"] + 1)
    return torch.randn(pp["batch"], pp["d_in"], generator=g), torch.randint(0, pp["classes"], (pp["batch"],),
                                                                            generator=g)


def tp_attention_layer(cfg: dict[str, Any]) -> nn.Module:
    """The whole causal self-attention layer, the same on every rank (no dropout)."""
    from course_lib.models.gpt import CausalSelfAttention, GPTConfig

    tp = cfg["tp"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(tp["seed"])
        return CausalSelfAttention(GPTConfig(n_head=tp["n_head"], n_embd=tp["n_head"] * tp["head_dim"],
                                             block_size=tp["tokens"], dropout=0.0, bias=True))


def tp_input(cfg: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's input ``(batch, tokens, n_embd)`` and the weights of the loss ``(output * weights).sum()``."""
    tp = cfg["tp"]
    g = torch.Generator().manual_seed(tp["seed"] + 1)
    shape = (tp["batch"], tp["tokens"], tp["n_head"] * tp["head_dim"])
    return torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)


SP_DTYPE = torch.float64  # sequence parallelism's block and activations


def sp_block(cfg: dict[str, Any]) -> nn.Sequential:
    """The whole MLP block ``Linear(d, 4d) -> GELU -> Linear(4d, d)``, the same on every rank."""
    d = cfg["sp"]["d"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg["sp"]["seed"])
        # float64: buffers made in the default float32 instead of the activations' dtype fail
        return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)).to(SP_DTYPE)


def sp_input(cfg: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole sequence ``(batch, tokens, d)`` and the loss's weights; rank ``r`` holds tokens
    ``[r * tokens / world, (r + 1) * tokens / world)`` of both."""
    sp = cfg["sp"]
    g = torch.Generator().manual_seed(sp["seed"] + 1)
    shape = (sp["batch"], sp["tokens"], sp["d"])
    return torch.randn(*shape, generator=g, dtype=SP_DTYPE), torch.randn(*shape, generator=g, dtype=SP_DTYPE)


def token_slice(cfg: dict[str, Any], rank: int) -> slice:
    width = cfg["sp"]["tokens"] // WORLD
    return slice(rank * width, (rank + 1) * width)


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

    inside: list[bool] = []  # a collective another one calls (send calls isend) is not a message of its own

    def recording(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if inside:
                return original(*args, **kwargs)
            events.append([op, _payload_bytes(op, signature.bind(*args, **kwargs).arguments)])
            inside.append(True)
            try:
                return original(*args, **kwargs)
            finally:
                inside.pop()

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
    return {"params": flat(params), "state_bytes": moment_bytes(optimizer), "exp_avg": first_moments(optimizer),
            "steps": steps}


def first_moments(optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """AdamW's first moments (exp_avg) over every parameter it steps, flattened in its groups' order: they scale with
    the gradients it was given, where AdamW's update hardly does (m / sqrt(v) cancels a gradient's scale)."""
    return torch.cat([optimizer.state[p]["exp_avg"].detach().flatten() for group in optimizer.param_groups
                      for p in group["params"] if "exp_avg" in optimizer.state.get(p, {})] or [torch.zeros(0)])


def _pp(ns: dict[str, Any], cfg: dict[str, Any], rank: int, events: list[list[Any]]) -> dict[str, Any]:
    stage = pp_model(cfg)[rank]
    x, y = pp_batch(cfg)
    first = len(events)
    loss = ns["pipeline_step"](stage, rank, x, y, cfg["pp"]["micro_batches"], cfg["pp"]["hidden"])
    if rank == 1 and not isinstance(loss, torch.Tensor):
        raise TypeError(f"pipeline_step returned {type(loss).__name__} on rank 1: return the loss, a tensor")
    return {"loss": loss.detach().reshape(-1) if rank == 1 else None, "messages": [list(e) for e in events[first:]],
            "grads": {name: p.grad for name, p in stage.named_parameters()}}


def _tp(ns: dict[str, Any], cfg: dict[str, Any], rank: int, events: list[list[Any]]) -> dict[str, Any]:
    layer = tp_attention_layer(cfg)
    x, weights = tp_input(cfg)
    x.requires_grad_()
    first = len(events)
    out = ns["tp_attention"](x, layer, rank, WORLD)
    middle = len(events)
    (out * weights).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad, "grads": {n: p.grad for n, p in layer.named_parameters()},
            "forward": [list(e) for e in events[first:middle]], "backward": [list(e) for e in events[middle:]]}


def _sp(ns: dict[str, Any], cfg: dict[str, Any], rank: int, events: list[list[Any]]) -> dict[str, Any]:
    block = sp_block(cfg)
    x, weights = sp_input(cfg)
    mine = token_slice(cfg, rank)
    x_shard = x[:, mine].clone().requires_grad_()
    first = len(events)
    out = ns["sp_mlp"](x_shard, block, rank, WORLD)
    middle = len(events)
    (out * weights[:, mine]).sum().backward()
    return {"out": out.detach(), "x_grad": x_shard.grad, "grads": {n: p.grad for n, p in block.named_parameters()},
            "forward": [list(e) for e in events[first:middle]], "backward": [list(e) for e in events[middle:]]}


SECTIONS = {"zero": ("ReduceScatterAdamW", _zero), "pp": ("pipeline_step", _pp), "tp": ("tp_attention", _tp),
            "sp": ("sp_mlp", _sp)}


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
    record: dict[str, Any] = {}
    try:
        for name, (needed, section) in SECTIONS.items():
            try:
                if needed not in ns:
                    raise NameError(f"the exercise cell does not define {needed}")
                record[name] = section(ns, cfg, rank, events)
            except BaseException as exc:  # this section's checks report it; the other still runs
                record[name] = {"error": ddp_ranks.exception_record(exc)}
    finally:
        dist.destroy_process_group()
    return record


def run_exercise(ns: dict[str, Any], cfg: dict[str, Any], *, timeout_s: float = 240.0) -> dict[str, Any]:
    """Run exercise 22's exercise cell on two processes under :func:`rank_driver`; the same job's result is reused.

    Returns ``{"ranks": [record of rank 0, record of rank 1]}``, each ``{"zero": {...}, "pp": {...}}`` (a section
    that raised: ``{"error": {...}}``) or ``{"error": {...}}``.
    """
    source = cell_sources(ns, NAMES)
    result = ddp_ranks.run_ranks(run_exercise, cfg, world_size=WORLD, timeout_s=timeout_s, reuse=True,
                                 driver=DRIVER, source=source)
    return {"ranks": result["ranks"]}


def describe(run: dict[str, Any]) -> str:
    """What each rank did (for the notebook's demo)."""
    lines = []
    for record in run["ranks"]:
        rank = record.get("rank")
        if "error" in record:
            lines.append(f"rank {rank}: raised {record['error']['type']}: {record['error']['message']}")
            continue
        for name in SECTIONS:
            got = record.get(name, {})
            if "error" in got:
                lines.append(f"rank {rank} {name:<4}: raised {got['error']['type']}: {got['error']['message']}")
            elif name == "zero":
                lines.append(f"rank {rank} zero: {got['params'].numel()} parameters, AdamW moments "
                             f"{got['state_bytes']} bytes; step 0 sent {got['steps'][0]} ([op, bytes passed in])")
            elif name in ("tp", "sp"):
                lines.append(f"rank {rank} {name}  : output {tuple(got['out'].shape)}, forward {got['forward']}, "
                             f"backward {got['backward']}")
            else:
                loss = "" if got["loss"] is None else f"loss {got['loss'].item():.6f}, "
                lines.append(f"rank {rank} pp  : {loss}messages {got['messages']} ([op, bytes])")
    return "\n".join(lines)
