"""Checks for exercise 21: bucketed data parallelism, ZeRO-1 and a tensor-parallel MLP, run on two real processes.

The learner's exercise cell defines ``broadcast_parameters``, ``BucketedAllReduce``, ``ShardedAdamW``,
``SumInForward``, ``SumInBackward`` and ``tp_mlp``. One two-process run per grading run
(:func:`course_lib.grading.parallel_driver.run_exercise`, reused by every check) executes the cell in each rank
under the course's trusted driver, which builds the models and data from the run's seed, calls the learner's code
and records what every rank ended with and which collectives it issued. The judges recompute every reference in the
grader's own process: rank 0's initial weights, one process trained on the whole batch, unsharded AdamW, the unsplit
MLP block, and the buckets :func:`course_lib.parallel.data_parallel.assign_buckets` makes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from course_lib.grading import parallel_driver as driver
from course_lib.grading.api import CheckFailed, check_for, need, observe, run_seed
from course_lib.grading.checks.common import gap, hidden_share, rank_records, split_layer_matches
from course_lib.parallel.data_parallel import assign_buckets
from course_lib.parallel.zero import shard_bounds

DP_TOLERANCE = 1e-5  # absolute, per weight: float rounding of a few SGD steps is ~1e-7
ZERO_TOLERANCE = 1e-6  # AdamW is element-wise: a shard steps exactly as the whole does, up to rounding
TP_TOLERANCE = 1e-5
HOW = {
    "broadcast_parameters": "define `broadcast_parameters(model)` in the exercise cell",
    "BucketedAllReduce": "define `class BucketedAllReduce` with `__init__(self, model, bucket_cap_bytes)` and "
                         "`finish(self)` in the exercise cell",
    "ShardedAdamW": "define `class ShardedAdamW` with `__init__(self, params, lr, weight_decay)` and `step(self)`",
    "SumInForward": "keep `class SumInForward(torch.autograd.Function)` in the exercise cell",
    "SumInBackward": "keep `class SumInBackward(torch.autograd.Function)` in the exercise cell",
    "tp_mlp": "define `tp_mlp(x, block, rank, world)` in the exercise cell",
}


def _section(ns: dict[str, Any], cfg: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Every rank's record of one section (the run itself is shared by all checks); raise what the ranks raised."""
    for wanted in driver.SECTIONS[name]:
        need(ns, wanted, HOW[wanted])
    return rank_records(driver.run_exercise, ns, cfg, name)


def _ranks(ns: dict[str, Any], name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    cfg = driver.exercise_config(run_seed(ns))
    return cfg, observe(ns, _section, cfg, name)


# ------------------------------------------------------------------------------ 21.1: data parallelism


@check_for("21", "broadcast_parameters: every rank holds rank 0's weights", points=1, parts=("21.1",))
def broadcast(ns: dict[str, Any]) -> None:
    cfg, ranks = _ranks(ns, "broadcast")
    want = driver.flat(driver.make_dp_model(cfg, 0).parameters())
    for rank, record in enumerate(ranks):
        got = record["params"]
        if got.shape != want.shape or not torch.equal(got, want):
            same = ranks[0]["params"].shape == ranks[1]["params"].shape and torch.equal(ranks[0]["params"],
                                                                                          ranks[1]["params"])
            raise CheckFailed(
                f"after broadcast_parameters rank {rank}'s weights are not rank 0's initial weights"
                + (" (the ranks agree, on other weights)" if same else ""),
                hint="dist.broadcast(param, src=0) for every parameter, in place, inside torch.no_grad(): each rank "
                     "built its model from its own seed",
                expected=f"{want.numel()} weights equal to rank 0's", got=gap(got, want))


def _one_process(cfg: dict[str, Any]) -> torch.Tensor:
    """The reference: rank 0's initial model trained by one process with SGD on every step's whole batch."""
    dp = cfg["dp"]
    model = driver.make_dp_model(cfg, 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=dp["lr"])
    for step in range(dp["steps"]):
        x, y = driver.dp_batch(cfg, step)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return driver.flat(model.parameters())


_NOT_RESET_HINT = ("finish() must leave every bucket as __init__ made it -- no gradient counted as ready, no flat "
                   "buffer, no handle -- so that the next backward fills and launches every bucket again: the first "
                   "step was right and a later one was not, which is what state kept from the step before does")


def _not_reset(record: dict[str, Any]) -> str:
    """Why a later step's messages differ from the first step's ('' when they do not): state not reset."""
    first = record["steps"][0]
    for k, step in enumerate(record["steps"][1:], 1):
        if (step["all_reduce_bytes"], sorted(step["before_marker"])) != (first["all_reduce_bytes"],
                                                                         sorted(first["before_marker"])):
            return (f"step {k} sent all-reduces of {step['all_reduce_bytes']} bytes ({len(step['before_marker'])} "
                    f"during backward) where step 0 sent {first['all_reduce_bytes']} ({len(first['before_marker'])} "
                    "during backward): the buckets' state was not reset after finish()")
    return ""


@check_for("21", "bucketed training matches one process on the whole batch", points=2, parts=("21.1", "21.2", "21.3"))
def matches_one_process(ns: dict[str, Any]) -> None:
    cfg, ranks = _ranks(ns, "dp")
    want = _one_process(cfg)
    for rank, record in enumerate(ranks):
        got = record["params"]
        if got.shape == want.shape and torch.allclose(got, want, rtol=0, atol=DP_TOLERANCE):
            continue
        unwaited = max(step["unwaited"] for step in record["steps"])
        stale = _not_reset(record)
        why = stale or (f"{unwaited} async all-reduce(s) had not been waited for when optimizer.step() ran, so the "
                        "step used gradients that were never averaged" if unwaited else
                        "its gradients were not the average over the ranks of every step's gradients")
        raise CheckFailed(
            f"rank {rank}'s weights after {cfg['dp']['steps']} SGD steps (lr {cfg['dp']['lr']:g}) differ from one "
            f"process trained on the {driver.WORLD * cfg['dp']['batch']}-sample global batches: {why}",
            hint=_NOT_RESET_HINT if stale else
            "all-reduce SUM then divide by the world size; launch a bucket from "
            "register_post_accumulate_grad_hook (register_hook runs before autograd writes .grad); finish() "
            "sends the buckets still waiting, waits on every handle, then copies the averages into .grad",
            expected=f"within {DP_TOLERANCE:g} of the one-process weights", got=gap(got, want))


def _buckets(cfg: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Bytes of each reference bucket, and of those complete before ``inp.weight``'s gradient (overlapped)."""
    model = driver.make_dp_model(cfg, 0)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad][::-1]
    sizes = dict((n, p.numel() * p.element_size()) for n, p in named)
    buckets = assign_buckets(named, cfg["dp"]["cap_bytes"])
    late = ("aux.", "inp.weight")  # aux gets no gradient: finish() sends its bucket; inp.weight's comes last
    early = [b for b in buckets if not any(n.startswith(late) for n in b)]
    return [sum(sizes[n] for n in b) for b in buckets], [sum(sizes[n] for n in b) for b in early]


@check_for("21", "one all-reduce per bucket, of the bucket's bytes, in bucket order", points=1,
           parts=("21.1", "21.2", "21.3"))
def bucket_messages(ns: dict[str, Any]) -> None:
    cfg, ranks = _ranks(ns, "dp")
    want, _ = _buckets(cfg)
    for rank, record in enumerate(ranks):
        for step, got in enumerate(record["steps"]):
            if sorted(got["all_reduce_bytes"]) == sorted(want) and got["all_reduce_bytes"] != want:
                raise CheckFailed(
                    f"rank {rank}, step {step}: one all-reduce per bucket, but not in bucket order: a bucket was "
                    "sent before one that comes earlier in the buckets",
                    hint="collectives are paired by position on every rank, so every rank must send the buckets in "
                         "the same, fixed order: launch bucket k only once it is full and buckets 0 .. k-1 have been "
                         "launched (a full bucket waits for the ones before it); finish() sends the rest in order",
                    expected=f"{want} bytes, in this order", got=f"{got['all_reduce_bytes']} bytes (sent order)")
            if sorted(got["all_reduce_bytes"]) != sorted(want):
                stale = _not_reset(record) if step else ""
                raise CheckFailed(
                    f"rank {rank}, step {step}: the all-reduces sent are not one per bucket of at most "
                    f"{cfg['dp']['cap_bytes']} bytes" + (f" ({stale})" if stale else ""),
                    hint=_NOT_RESET_HINT if stale else
                    "walk the parameters in reverse registration order; close the bucket before a parameter "
                    "that would take it past the cap (a parameter larger than the cap goes alone); one flat "
                    "message per bucket, float32 (4 bytes per element)",
                    expected=f"{len(want)} messages of {want} bytes (bucket order)",
                    got=f"{len(got['all_reduce_bytes'])} messages of {got['all_reduce_bytes']} bytes (sent order)")
    for k, (job, want_edge) in enumerate(zip(cfg["dp"]["edges"], _edge_buckets(cfg))):
        for rank, record in enumerate(ranks):
            got_edge = record["edges"][k]
            if got_edge != want_edge:
                raise CheckFailed(
                    f"rank {rank}: vectors of {_backward_bytes(job)} bytes (backward's order) with a cap of "
                    f"{job['cap_bytes']} bytes are not bucketed at the cap",
                    hint="a bucket holds at most the cap: a parameter that brings it exactly to the cap still goes "
                         "in (close it when the total would pass the cap: >, not >=), one that would pass it by a "
                         "single byte starts the next bucket; each bucket's total starts at 0",
                    expected=f"{want_edge} bytes (bucket order)", got=f"{got_edge} bytes (sent order)")


def _backward_bytes(job: dict[str, Any]) -> list[int]:
    return [4 * n for n in job["numels"][::-1]]


def _edge_buckets(cfg: dict[str, Any]) -> list[list[int]]:
    """Bytes of each reference bucket of the driver's edge jobs (buckets exactly full and one byte over)."""
    out = []
    for job in cfg["dp"]["edges"]:
        named = [(n, p) for n, p in driver.EdgeNet(job["numels"], seed=0).named_parameters()][::-1]
        sizes = {n: p.numel() * p.element_size() for n, p in named}
        out.append([sum(sizes[n] for n in b) for b in assign_buckets(named, job["cap_bytes"])])
    return out


@check_for("21", "overlap: buckets sent while backward still runs", points=1, parts=("21.1", "21.2", "21.3"))
def overlap(ns: dict[str, Any]) -> None:
    cfg, ranks = _ranks(ns, "dp")
    _, want = _buckets(cfg)
    for rank, record in enumerate(ranks):
        for step, got in enumerate(record["steps"]):
            if sorted(got["before_marker"]) != sorted(want):
                stale = _not_reset(record)
                raise CheckFailed(
                    f"rank {rank}, step {step}: the buckets whose gradients were all final before the first layer's "
                    "were not sent while backward was still running" + (f" ({stale})" if stale else ""),
                    hint=_NOT_RESET_HINT if stale else
                    "launch each bucket from register_post_accumulate_grad_hook, the moment its last gradient "
                    "is final, with async_op=True; finish() only sends what never filled",
                    expected=f"all-reduces of {sorted(want)} bytes before inp.weight's gradient was final",
                    got=f"{sorted(got['before_marker'])} bytes before it, {got['all_reduce_bytes']} in all")


# ------------------------------------------------------------------------------ 21.2: ZeRO-1


def _unsharded(cfg: dict[str, Any]) -> torch.Tensor:
    z = cfg["zero"]
    params = driver.zero_params(cfg)
    optimizer = torch.optim.AdamW(params, lr=z["lr"], weight_decay=z["weight_decay"])
    for step in range(z["steps"]):
        for p, g in zip(params, driver.zero_grads(cfg, step)):
            p.grad = g
        optimizer.step()
    return driver.flat(params)


@check_for("21", "ShardedAdamW matches unsharded AdamW (uneven last shard)", points=2, parts=("21.4", "21.5"))
def zero_matches_unsharded(ns: dict[str, Any]) -> None:
    cfg, ranks = _ranks(ns, "zero")
    want = _unsharded(cfg)
    bounds = shard_bounds(want.numel(), driver.WORLD)
    for rank, record in enumerate(ranks):
        got = record["params"]
        if got.shape == want.shape and torch.allclose(got, want, rtol=0, atol=ZERO_TOLERANCE):
            continue
        wrong = ((got - want).abs() > ZERO_TOLERANCE).nonzero().flatten().tolist() if got.shape == want.shape else []
        raise CheckFailed(
            f"rank {rank}'s parameters after {cfg['zero']['steps']} steps differ from one AdamW over all "
            f"{want.numel()} of them",
            hint=f"shards [start, end) of ceil(numel / world) elements each, the last shorter ({bounds} here); step "
                 "your shard, then every rank needs every updated shard (all-gather, padding the short one, or one "
                 "broadcast per shard)",
            expected=f"within {ZERO_TOLERANCE:g} of unsharded AdamW",
            got=f"{gap(got, want)}; wrong elements {wrong[:12]}" if wrong else gap(got, want))


@check_for("21", "optimizer state: each rank keeps its shard's moments only", points=1, parts=("21.4", "21.5"))
def zero_state(ns: dict[str, Any]) -> None:
    cfg, ranks = _ranks(ns, "zero")
    numel = driver.flat(driver.zero_params(cfg)).numel()
    for rank, ((start, end), record) in enumerate(zip(shard_bounds(numel, driver.WORLD), ranks)):
        want = 2 * 4 * (end - start)  # AdamW's exp_avg and exp_avg_sq, float32, per element of the shard
        if record["state_bytes"] != want:
            raise CheckFailed(
                f"rank {rank}'s `optimizer` keeps moments for {record['state_bytes'] // 8} elements; its shard "
                f"[{start}, {end}) of the {numel} has {end - start}",
                hint="self.optimizer = torch.optim.AdamW([shard], ...) over this rank's slice only: 2 moments x 4 "
                     "bytes per element of the shard (the step counter aside)",
                expected=f"{want} bytes", got=f"{record['state_bytes']} bytes ({record['optimizer']})")


# ------------------------------------------------------------------------------ 21.3: tensor parallelism


def _unsplit(cfg: dict[str, Any]) -> dict[str, Any]:
    block = driver.tp_block(cfg)
    x, weights = driver.tp_input(cfg)
    x.requires_grad_()
    out = block(x)
    (out * weights).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad, "grads": {n: p.grad for n, p in block.named_parameters()}}


def _share(name: str, grad: torch.Tensor, rank: int) -> torch.Tensor:
    """The part of the unsplit block's gradient that reaches rank ``rank``'s block (zeros elsewhere)."""
    return grad if name == "2.bias" else hidden_share(name, grad, rank, driver.WORLD)


@check_for("21", "tensor-parallel output and gradients match the unsplit block", points=2,
           parts=("21.6", "21.7", "21.8"))
def tp_matches_unsplit(ns: dict[str, Any]) -> None:
    cfg, ranks = _ranks(ns, "tp")
    want = _unsplit(cfg)
    hint = ("columns [r*h/world, (r+1)*h/world) of the first Linear (rows of its weight), GELU, the same rows of the "
            "second's input (columns of its weight), SumInForward over the partial outputs, then the bias once; "
            "SumInBackward on the input so its gradient is summed; slice block's weights (views), do not copy them")
    split_layer_matches(ranks, want, _share, layer="block", param=lambda name: f"block[{name.replace('.', '].')}",
                        hint=hint, tolerance=TP_TOLERANCE)


@check_for("21", "one activation-sized all-reduce in forward, one in backward", points=1,
           parts=("21.6", "21.7", "21.8"))
def tp_messages(ns: dict[str, Any]) -> None:
    cfg, ranks = _ranks(ns, "tp")
    shape = (cfg["tp"]["batch"], cfg["tp"]["tokens"], cfg["tp"]["d"])
    nbytes = 4 * shape[0] * shape[1] * shape[2]
    for rank, record in enumerate(ranks):
        if tuple(record["out"].shape) != shape:
            raise CheckFailed(f"rank {rank}: tp_mlp returned the wrong shape", expected=shape,
                              got=tuple(record["out"].shape))
        for direction in ("forward", "backward"):
            if record[direction] != [["all_reduce", nbytes]]:
                raise CheckFailed(
                    f"rank {rank}: the block's {direction} should send exactly one all-reduce of the activations",
                    hint="SumInForward all-reduces in forward only, SumInBackward in backward only; nothing else "
                         "communicates",
                    expected=f"[['all_reduce', {nbytes}]] ({shape} float32)", got=record[direction])
