"""The rank side of tests/test_parallel.py: run under ``torchrun --nproc_per_node=2`` (gloo, CPU).

``python -m torch.distributed.run --standalone --nproc_per_node=2 tests/parallel_ranks.py OUT_DIR`` runs every
check of course_lib.parallel that needs real ranks and writes what it measured to ``OUT_DIR/rank<R>.json``; the
test file asserts on those numbers (one launch, many checks). Differences are max-abs over all parameters.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course_lib import clock, distributed
from course_lib.models import Net
from course_lib.parallel.comm import (
    PAYLOAD_ARGUMENT,
    count_collectives,
    fit_bandwidth_latency,
    measure_allreduce,
    record_ddp_allreduces,
)
from course_lib.parallel.data_parallel import BucketedDP, OverlappedDP, allreduce_gradients, broadcast_parameters
from course_lib.parallel.tensor_parallel import TPMLP
from course_lib.parallel.zero import ShardedOptimizer, fsdp_memory_per_rank, optimizer_state_bytes, rank_memory

STEPS = 5
GLOBAL_BATCH = 8


def max_diff(a: nn.Module | list[torch.Tensor], b: nn.Module | list[torch.Tensor]) -> float:
    pa = list(a.parameters()) if isinstance(a, nn.Module) else a
    pb = list(b.parameters()) if isinstance(b, nn.Module) else b
    return max(float((x.detach() - y.detach()).abs().max()) for x, y in zip(pa, pb))


def small_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(GLOBAL_BATCH, 8, generator=g), torch.randn(GLOBAL_BATCH, 4, generator=g)


def make_optimizer(kind: str, params: Any) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def reference(kind: str) -> nn.Module:
    """One process, the whole global batch, plain optimizer."""
    model = small_model(0)
    opt = make_optimizer(kind, model.parameters())
    for step in range(STEPS):
        x, y = global_batch(step)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model


def hand_dp(version: str, model: nn.Module, cap_mb: float) -> Any:
    """The hooks of ``version`` on ``model`` (None for the all-reduce after backward, and for DDP)."""
    if version == "overlapped":
        return OverlappedDP(model)
    if version == "bucketed":
        return BucketedDP(model, cap_mb)
    return None


def train_dp(kind: str, version: str, rank: int, world: int, accumulate: bool = False) -> tuple[nn.Module, list]:
    """This rank's half of each global batch; returns the model and the all-reduces counted per step."""
    local = GLOBAL_BATCH // world
    if version == "ddp":
        model: nn.Module = DistributedDataParallel(small_model(0))  # DDP broadcasts rank 0's weights itself
    else:
        model = small_model(rank)  # different on each rank on purpose: broadcast_parameters must fix it
        broadcast_parameters(model)
    dp = hand_dp(version, model, cap_mb=0.001)
    opt = make_optimizer(kind, model.parameters())
    counts = []
    for step in range(STEPS):
        x, y = global_batch(step)
        x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
        with count_collectives() as log:
            if accumulate:  # two micro-batches; each loss halved so that the sum is the mean over the local batch
                half = local // 2
                with (model.no_sync() if version == "ddp" else dp.no_sync()):
                    (nn.functional.mse_loss(model(x[:half]), y[:half]) / 2).backward()
                (nn.functional.mse_loss(model(x[half:]), y[half:]) / 2).backward()
            else:
                nn.functional.mse_loss(model(x), y).backward()
            if version == "naive":
                allreduce_gradients(model)
            elif dp is not None:
                dp.finish()
        counts.append(log.counts().get("all_reduce", 0))
        opt.step()
        opt.zero_grad()
    return (model.module if version == "ddp" else model), counts


def check_equivalence(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("sgd", "adamw"):
        ref = reference(kind)
        ddp, _ = train_dp(kind, "ddp", rank, world)
        ddp_accumulated, _ = train_dp(kind, "ddp", rank, world, accumulate=True)
        for version, accumulate in (("naive", False), ("overlapped", False), ("bucketed", False),
                                    ("overlapped", True), ("bucketed", True)):
            model, counts = train_dp(kind, version, rank, world, accumulate)
            same_ddp = ddp_accumulated if accumulate else ddp
            name = f"{kind}/{version}" + ("+accum" if accumulate else "")
            rank0 = [p.detach().clone() for p in model.parameters()]
            for p in rank0:
                dist.broadcast(p, src=0)
            out[name] = {"vs_reference": max_diff(model, ref), "vs_ddp": max_diff(model, same_ddp),
                         "vs_rank0": max_diff(list(model.parameters()), rank0), "allreduces_per_step": counts}
        out[f"{kind}/ddp"] = {"vs_reference": max_diff(ddp, ref)}
        out[f"{kind}/ddp+accum"] = {"vs_reference": max_diff(ddp_accumulated, ref)}
    out["n_params"] = len(list(small_model(0).parameters()))
    return out


def linear_stack(seed: int = 0, width: int = 256, layers: int = 4) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def one_step(model: nn.Module, dp: Any, x: torch.Tensor, hook_first: bool = False) -> tuple[Any, list[float]]:
    """Forward, backward and finish under the counter; the times the first layer's gradients were ready."""
    first_ready: list[float] = []
    handles = []
    if hook_first:  # registered after the DP hooks: fires after them, when the first layer's gradient is final
        handles = [p.register_post_accumulate_grad_hook(lambda _: first_ready.append(clock.now()))
                   for p in model[0].parameters()]
    with count_collectives() as log:
        model(x).square().mean().backward()
        if dp is None:
            allreduce_gradients(model)
        else:
            dp.finish()
    for h in handles:
        h.remove()
    model.zero_grad()
    return log, first_ready


class RunsInAnotherOrder(nn.Module):
    """``late`` is registered first but runs last: backward makes its gradients first, while the buckets (reverse
    registration order) put them last. Sizes in bytes, bucket order: early.bias 64, early.weight 512, late.bias 16,
    late.weight 256."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.late = nn.Linear(16, 4)
        self.early = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.late(torch.relu(self.early(x)))


def check_order(rank: int, world: int) -> dict[str, Any]:
    """Which order gradients became ready in, and which order BucketedDP issued its all-reduces in."""
    model = RunsInAnotherOrder()
    ready: list[int] = []  # bytes of each gradient, in the order autograd finished them
    handles = [p.register_post_accumulate_grad_hook(lambda p: ready.append(p.numel() * 4)) for p in model.parameters()]
    bucketed = BucketedDP(model, bucket_cap_mb=100 / 2**20)  # 100 bytes: every parameter in a bucket of its own
    with count_collectives() as log:
        model(torch.randn(4, 8)).sum().backward()
        bucketed.finish()
    for h in handles:
        h.remove()
    bucketed.remove()
    by_name = dict(model.named_parameters())
    bucket_bytes = [sum(by_name[n].numel() * 4 for n in names) for names in bucketed.buckets]
    # torch's DDP through the recording hook: one record per bucket, issued during backward.
    ddp = DistributedDataParallel(linear_stack(), bucket_cap_mb=0.25)
    ddp_log = record_ddp_allreduces(ddp)
    steps = []
    for _ in range(2):  # DDP rebuilds its buckets after the first step
        ddp_log.records.clear()
        ddp(torch.randn(16, 256)).square().mean().backward()
        backward_done = clock.now()
        steps.append({"count": len(ddp_log), "bytes": ddp_log.total_bytes,
                      "first_issued_before_backward_returned": min(r.issued for r in ddp_log.records) < backward_done,
                      "all_finished": all(r.finished is not None for r in ddp_log.records)})
    return {"ready_bytes": ready, "bucket_bytes": bucket_bytes, "issued_bytes": [r.nbytes for r in log.records],
            "ddp": steps, "ddp_param_bytes": sum(p.numel() * 4 for p in ddp.parameters())}


def check_zero_optimizer(rank: int, world: int) -> dict[str, Any]:
    """ShardedOptimizer as a torch optimizer: weight-decay groups, an LR schedule, zero_grad and a saved state.

    433 parameters: the weights (396) in a group with weight decay, the biases (37) in one without; rank 0's shard
    [0, 217) lies in the first group, rank 1's [217, 433) crosses into the second."""
    def model_433() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 33), nn.GELU(), nn.Linear(33, 4))

    def groups(model: nn.Module) -> list[dict[str, Any]]:
        named = list(model.named_parameters())
        return [{"params": [p for n, p in named if n.endswith("weight")], "weight_decay": 0.1},
                {"params": [p for n, p in named if not n.endswith("weight")], "weight_decay": 0.0}]

    def train(model: nn.Module, opt: Any, steps: range, schedule: Any = None) -> None:
        for step in steps:  # the same whole batch on every rank: the gradients are already "averaged"
            g = torch.Generator().manual_seed(3000 + step)
            x, y = torch.randn(GLOBAL_BATCH, 8, generator=g), torch.randn(GLOBAL_BATCH, 4, generator=g)
            F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            if schedule is not None:
                schedule.step()

    halving = lambda step: 0.5 ** step  # noqa: E731
    plain, sharded = model_433(), model_433()
    plain_opt = torch.optim.AdamW(groups(plain), lr=0.01)
    sharded_opt = ShardedOptimizer(groups(sharded), lr=0.01)
    train(plain, plain_opt, range(4), torch.optim.lr_scheduler.LambdaLR(plain_opt, halving))
    train(sharded, sharded_opt, range(4), torch.optim.lr_scheduler.LambdaLR(sharded_opt, halving))
    out: dict[str, Any] = {
        "is_optimizer": isinstance(sharded_opt, torch.optim.Optimizer),
        "groups_and_schedule_vs_adamw": max_diff(plain, sharded),
        "lrs": [g["lr"] for g in sharded_opt.param_groups],
        "inner_lrs": [g["lr"] for g in sharded_opt.optimizer.param_groups],
        "inner_weight_decays": [g["weight_decay"] for g in sharded_opt.optimizer.param_groups],
        "grads_after_zero_grad": sum(p.grad is not None for p in sharded.parameters()),
        "state_bytes": sharded_opt.state_bytes(),
    }
    straight = model_433()
    straight_opt = ShardedOptimizer(groups(straight), lr=0.01)
    train(straight, straight_opt, range(4))
    resumed = model_433()
    first = ShardedOptimizer(groups(resumed), lr=0.01)
    train(resumed, first, range(2))
    saved = first.state_dict()
    second = ShardedOptimizer(groups(resumed), lr=0.01)
    second.load_state_dict(saved)
    train(resumed, second, range(2, 4))
    out["resumed_vs_straight"] = max_diff(straight, resumed)
    out["saved_keys"] = sorted(saved)
    other_rank = {**saved, "shard": {**saved["shard"], "rank": 1 - rank}}
    try:
        ShardedOptimizer(groups(model_433()), lr=0.01).load_state_dict(other_rank)
        out["other_rank_refused"] = ""
    except ValueError as exc:
        out["other_rank_refused"] = str(exc)
    return out


def check_buckets(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    x = torch.randn(16, 256)
    for cap in (0.0001, 0.25, 1.0, 25.0):
        model = linear_stack()
        bucketed = BucketedDP(model, cap)
        log, _ = one_step(model, bucketed, x)
        out[f"cap={cap}"] = {"buckets": bucketed.buckets, "collectives_per_step": bucketed.collectives_per_step,
                             "bytes_per_step": bucketed.bytes_per_step, "counted": log.counts(),
                             "counted_bytes": log.bytes_by_op(), "param_bytes": sum(
                                 p.numel() * p.element_size() for p in model.parameters())}
        bucketed.remove()
    # Overlap: the first all-reduce is issued before the first layer's gradients exist (before backward ends).
    for version in ("overlapped", "bucketed", "naive"):
        model = linear_stack()
        log, first_ready = one_step(model, hand_dp(version, model, cap_mb=0.25), x, hook_first=True)
        out[f"overlap/{version}"] = {"first_issued": log.records[0].issued, "first_layer_ready": min(first_ready),
                                     "last_finished": max(r.finished for r in log.records),
                                     "all_async": all(r.async_op for r in log.records)}
    # A model of ~2 M parameters (the lesson's), at DDP-like caps: messages and bytes per step.
    torch.manual_seed(0)
    net = Net(256, 256, 4, 10, p=0.0)
    out["net_params"] = sum(p.numel() for p in net.parameters())
    for cap in (0.25, 1.0, 4.0, 25.0):
        bucketed = BucketedDP(net, cap)
        with count_collectives() as log:
            net(torch.randn(8, 256)).sum().backward()
            bucketed.finish()
        net.zero_grad()
        out[f"net/cap={cap}"] = {"collectives": log.counts()["all_reduce"], "bytes": log.total_bytes,
                                 "collectives_per_step": bucketed.collectives_per_step}
        bucketed.remove()
    return out


def check_zero(rank: int, world: int) -> dict[str, Any]:
    def model_433() -> nn.Module:  # 8*33+33 + 33*4+4 = 433 parameters: 217 + 216 on 2 ranks (uneven last shard)
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 33), nn.GELU(), nn.Linear(33, 4))

    def run(make_opt: Callable[[nn.Module], Any], sharded_batch: bool) -> tuple[nn.Module, Any, list]:
        model = model_433()
        opt = make_opt(model)
        logs = []
        for step in range(STEPS):
            g = torch.Generator().manual_seed(2000 + step)
            x, y = torch.randn(GLOBAL_BATCH, 8, generator=g), torch.randn(GLOBAL_BATCH, 4, generator=g)
            if sharded_batch:
                local = GLOBAL_BATCH // world
                x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
            nn.functional.mse_loss(model(x), y).backward()
            with count_collectives() as averaging:
                if sharded_batch:
                    allreduce_gradients(model)
            with count_collectives() as log:
                opt.step()
            logs.append((log.counts(), log.bytes_by_op()))
            # everything this rank passed in to exchange the gradients and the weights: (op, bytes) per call
            traffic = [(r.op, r.nbytes) for r in averaging.records + log.records]
            opt.zero_grad()
        return model, opt, logs, traffic

    kwargs = dict(lr=1e-2, weight_decay=0.1)
    ref, ref_opt, _, _ = run(lambda m: torch.optim.AdamW(m.parameters(), **kwargs), sharded_batch=False)
    dp_full, _, _, dp_traffic = run(lambda m: torch.optim.AdamW(m.parameters(), **kwargs), sharded_batch=True)
    zero, zero_opt, logs, zero_traffic = run(lambda m: ShardedOptimizer(m.parameters(), **kwargs), sharded_batch=True)
    return {"vs_reference": max_diff(zero, ref), "vs_dp_adamw": max_diff(zero, dp_full),
            "numel": zero_opt.numel, "bounds": zero_opt.bounds, "state_bytes": zero_opt.state_bytes(),
            "unsharded_state_bytes": optimizer_state_bytes(ref_opt), "n_tensors": len(list(ref.parameters())),
            "step_collectives": logs[-1][0], "step_bytes": logs[-1][1],
            "dp_traffic": dp_traffic, "zero_traffic": zero_traffic}


def check_fsdp(rank: int, world: int) -> dict[str, Any]:
    def net() -> nn.Module:
        torch.manual_seed(0)
        return Net(16, 32, 2, 5, p=0.0)

    x = torch.randn(4, 16)
    plain = net()
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    plain(x).sum().backward()
    opt.step()
    replicated = rank_memory(plain, opt)
    sharded = fsdp_memory_per_rank(net(), x)
    return {"replicated": vars(replicated), "fsdp": vars(sharded), "n_tensors": len(list(plain.parameters()))}


def check_tensor_parallel(rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    g = torch.Generator().manual_seed(1)
    x_full = torch.randn(3, 5, 16, generator=g, requires_grad=True)
    grad_out = torch.randn(3, 5, 16, generator=g)
    out_full = block(x_full)
    out_full.backward(grad_out)

    tp = TPMLP.from_full(block)
    x = x_full.detach().clone().requires_grad_(True)
    with count_collectives() as forward_log:
        out = tp(x)
    out_diff = float((out.detach() - out_full.detach()).abs().max())
    with count_collectives() as backward_log:
        out.backward(grad_out)
    rows = slice(rank * 64 // world, (rank + 1) * 64 // world)
    fc, proj = block[0], block[2]
    return {
        "out": out_diff,
        "x_grad": float((x.grad - x_full.grad).abs().max()),
        "fc_weight_grad": float((tp.fc.weight.grad - fc.weight.grad[rows]).abs().max()),
        "fc_bias_grad": float((tp.fc.bias.grad - fc.bias.grad[rows]).abs().max()),
        "proj_weight_grad": float((tp.proj.weight.grad - proj.weight.grad[:, rows]).abs().max()),
        "proj_bias_grad": float((tp.proj.bias.grad - proj.bias.grad).abs().max()),
        "local_weights": [list(tp.fc.weight.shape), list(tp.proj.weight.shape)],
        "forward": [forward_log.counts(), forward_log.bytes_by_op()],
        "backward": [backward_log.counts(), backward_log.bytes_by_op()],
        "activation_bytes": out.numel() * out.element_size(),
    }


def check_comm(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with count_collectives() as log:
        dist.all_reduce(torch.ones(10))
        dist.broadcast(torch.ones(3, dtype=torch.float64), src=0)
        work = dist.all_reduce(torch.ones(5), async_op=True)
        work.wait()
        dist.all_gather_into_tensor(torch.empty(2 * world), torch.ones(2))
        dist.all_gather([torch.empty(4) for _ in range(world)], torch.ones(4))
        dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * world))
        dist.reduce_scatter(torch.empty(2), [torch.ones(2) for _ in range(world)])
    out["records"] = [vars(r) for r in log.records]
    out["counts"], out["bytes"] = log.counts(), log.bytes_by_op()
    originals = {op: getattr(dist, op) for op in PAYLOAD_ARGUMENT}
    try:
        with count_collectives():
            assert dist.all_reduce is not originals["all_reduce"]
            raise KeyError("escapes")
    except KeyError:
        pass
    out["restored_after_exception"] = all(getattr(dist, op) is fn for op, fn in originals.items())
    rows = measure_allreduce([2**10, 2**16, 2**20], reps=3)
    out["rows"] = rows
    try:  # measured on a machine that may be busy: a fit, or the model's own refusal, never a failed job
        out["fit"] = fit_bandwidth_latency(rows, world)
    except ValueError as exc:
        out["fit"] = str(exc)
    return out


def main() -> None:
    ctx = distributed.setup()
    torch.set_num_threads(1)
    result = {"world": ctx.world_size}
    for name, check in (("comm", check_comm), ("equivalence", check_equivalence), ("buckets", check_buckets),
                        ("order", check_order), ("zero_optimizer", check_zero_optimizer),
                        ("zero", check_zero), ("tensor_parallel", check_tensor_parallel), ("fsdp", check_fsdp)):
        start = clock.now()
        result[name] = check(ctx.rank, ctx.world_size)
        result[f"{name}_seconds"] = clock.now() - start
    out_dir = Path(sys.argv[1])
    (out_dir / f"rank{ctx.rank}.json").write_text(json.dumps(result, indent=1))
    dist.barrier()
    distributed.teardown()


if __name__ == "__main__":
    main()
