"""A data-parallel training step you can watch: ``python -m course_lib.ddp_demo --strategy ddp|fsdp|none ...``.

Run it under torchrun (or the notebook's ``%%torchrun -n 2`` cell magic)::

    torchrun --standalone --nproc_per_node=2 -m course_lib.ddp_demo --strategy ddp fsdp none

and read what each rank prints:

1. **Sharded data.** ``DistributedSampler`` gives each rank a disjoint slice of the (shuffled) dataset;
   ``set_epoch(e)`` reshuffles differently each epoch, identically on every rank (forget it and every epoch
   repeats the same order).
2. **Effective batch and LR.** Each rank loads ``--batch`` samples per step, so one optimizer step sees
   ``batch x world_size`` samples; the learning rate is scaled from the one tuned at ``--base-batch``.
3. **Gradient all-reduce.** Each rank computes a *different* loss on its own samples, yet after
   ``backward()`` DDP has averaged the gradients, so every rank applies the same update and the parameters
   stay identical (checked with an ``all_gather``). With ``--strategy none`` nothing is averaged: the ranks
   drift apart after one step — which is the bug DDP exists to prevent.
4. **FSDP2 sharding.** With ``--strategy fsdp`` each rank *stores* only its shard of every parameter;
   it prints how many elements it holds against the full model.
5. **Rank-0 logging.** Summaries are printed by rank 0 only; per-rank lines say so explicitly.
6. **Results as files.** With ``--results DIR`` every rank also writes what it saw (its shards, local losses,
   stored elements, whether the ranks ended identical) to ``DIR/<strategy>.rank<R>.json``;
   :func:`read_results` and :func:`summary_table` turn those files into one compact table per run, so a
   notebook never parses the printed prose.

Everything the processes share (dataset, model) is defined at module scope, so it also works with the
``spawn`` start method.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from course_lib import atomic
from course_lib import distributed as dist
from course_lib.argparsing import CommandParser
from course_lib.train.loss import mean_cross_entropy

IN_FEATURES = 16
HIDDEN = 32
CLASSES = 4


class DemoMLP(nn.Module):
    """A small residual MLP without dropout or BatchNorm, so every rank computes exactly the same function.

    The hidden blocks sit in an ``nn.ModuleList``, which ``wrap_model(strategy="fsdp")`` shards block by block.
    """

    def __init__(self, n_blocks: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(IN_FEATURES, HIDDEN)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.GELU())
                                    for _ in range(n_blocks))
        self.out = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


def make_dataset(n: int = 256, seed: int = 0) -> TensorDataset:
    """A fixed synthetic classification set (same on every rank: built from a seed, not shared memory).

    Taught in lesson 09 (``notebooks/09_distributed.ipynb``).
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, IN_FEATURES, generator=g)
    y = (x[:, :CLASSES] * 2).argmax(dim=1)
    return TensorDataset(x, y)


def make_model(seed: int = 0, n_blocks: int = 1) -> DemoMLP:
    """A :class:`DemoMLP` whose initial weights depend on ``seed`` only (the same on every rank).

    Taught in lesson 09 (``notebooks/09_distributed.ipynb``).
    """
    torch.manual_seed(seed)
    return DemoMLP(n_blocks)


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """Every parameter of ``model`` (a DDP wrapper is looked through) as one detached CPU vector.

    Taught in lesson 09 (``notebooks/09_distributed.ipynb``).
    """
    return torch.cat([p.detach().reshape(-1).float().cpu() for p in dist.unwrap(model).parameters()])


class TwoHeads(nn.Module):
    """A :class:`DemoMLP` body with two output heads, of which each step uses one (``forward(x, head="a")``).

    The other head's parameters get no gradient that step: what DDP's ``find_unused_parameters`` is about.
    """

    def __init__(self) -> None:
        super().__init__()
        self.body = DemoMLP(n_blocks=1)
        self.heads = nn.ModuleDict({"a": nn.Linear(CLASSES, CLASSES), "b": nn.Linear(CLASSES, CLASSES)})

    def forward(self, x: torch.Tensor, head: str = "a") -> torch.Tensor:
        return self.heads[head](self.body(x))


def global_batches(reads: Sequence[Sequence[int]], group: int, per_epoch: int | None = None) -> list[list[int]]:
    """The global batch of every optimizer step, from the indices each rank read in order.

    ``group`` is the samples one rank contributes to a step (micro-batch size x accumulation steps); the global
    batch of step k is every rank's k-th group, together. With ``per_epoch`` (the samples one rank reads in an
    epoch) the reads are cut into epochs first and the last group of each epoch may be short (a step on what is
    left, as a loop that steps on the short last group does). Raises ``ValueError`` when the ranks read different
    numbers of samples, or not whole groups (whole epochs with ``per_epoch``): then no single-process run matches.

    Taught in lesson 09 (``notebooks/09_distributed.ipynb``).
    """
    lengths = {len(r) for r in reads}
    unit = per_epoch or group
    if len(lengths) != 1 or next(iter(lengths)) % unit:
        whole = f"epochs of {per_epoch}" if per_epoch else f"groups of {group}"
        raise ValueError(f"the ranks read {[len(r) for r in reads]} samples: not the same whole number of {whole}")
    batches = []
    for start in range(0, len(reads[0]), unit):
        end = start + unit
        batches += [[i for r in reads for i in r[k:min(k + group, end)]] for k in range(start, end, group)]
    return batches


def one_process_reference(model: nn.Module, dataset: Dataset, global_batches: Sequence[Sequence[int]],
                          lr: float) -> nn.Module:
    """Train ``model`` in one process with plain SGD, one step per global batch (a list of dataset indices).

    The loss of each step is the mean over the whole global batch: what N ranks of DDP compute together when each
    divides its micro-batches' summed losses by the samples it reads in the group (``loss / accum`` when every
    micro-batch is full) and DDP averages over the ranks, whose groups hold equally many samples (DistributedSampler
    pads the shards to one length). Returns ``model``, trained.

    Taught in lesson 09 (``notebooks/09_distributed.ipynb``).
    """
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for indices in global_batches:
        pairs = [dataset[i] for i in indices]
        x = torch.stack([p[0] for p in pairs])
        y = torch.stack([p[1] for p in pairs])
        optimizer.zero_grad(set_to_none=True)
        mean_cross_entropy(model(x), y).backward()
        optimizer.step()
    return model


def _flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters as one vector (full tensors: FSDP2 shards are gathered first, a collective)."""
    parts = []
    for p in model.parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p  # DTensor under FSDP2
        parts.append(full.detach().reshape(-1).float().cpu())
    return torch.cat(parts)


def _same_on_all_ranks(vector: torch.Tensor, world_size: int) -> bool:
    """Gather every rank's vector with ``all_gather`` and compare them exactly (bitwise)."""
    if world_size == 1:
        return True
    gathered = [torch.empty_like(vector) for _ in range(world_size)]
    torch.distributed.all_gather(gathered, vector)
    return all(torch.equal(gathered[0], other) for other in gathered[1:])


def _local_numel(model: nn.Module) -> int:
    """Elements this rank actually stores: the local shard under FSDP2, the full tensor otherwise."""
    return sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = CommandParser(prog="python -m course_lib.ddp_demo", description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=dist.STRATEGIES, nargs="+", default=["ddp"],
                        help="one or more, run one after the other in the same process group (e.g. ddp fsdp none)")
    parser.add_argument("--batch", type=int, default=8, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--base-lr", type=float, default=0.05, help="LR tuned for --base-batch samples per step")
    parser.add_argument("--base-batch", type=int, default=8)
    parser.add_argument("--lr-rule", choices=dist.LR_RULES, default="linear")
    parser.add_argument("--results", default=None,
                        help="folder where every rank writes <strategy>.rank<R>.json with what it saw")
    args = parser.parse_args(argv)
    for name in ("batch", "steps", "epochs", "base_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be at least 1")
    return args


def _write_json_atomically(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` through a temporary file and a rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, json.dumps(record))


def _train(ctx: dist.DistContext, args: argparse.Namespace, model: nn.Module, optimizer: torch.optim.Optimizer,
           dataset: Dataset, record: dict[str, Any], log: Callable[[str], None], say: Callable[[str], None]) -> None:
    """The training loop of :func:`demo`: each rank reads its shard, and every step's losses go into ``record``."""
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same one on every rank
        indices = list(sampler)
        record["indices"].append(indices)
        say(f"epoch {epoch} first sample indices {indices[:4]}")
        for step, (x, y) in enumerate(loader):
            if step == args.steps:
                break
            x, y = x.to(ctx.device), y.to(ctx.device)
            loss = mean_cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP/FSDP average the gradients across ranks here
            optimizer.step()
            say(f"epoch {epoch} step {step} local loss {loss.item():.4f} (differs per rank: different samples)")
            mean_loss = dist.all_reduce_mean(loss.detach().clone())
            record["local_losses"].append(loss.item())
            record["mean_losses"].append(mean_loss.item())
            log(f"epoch {epoch} step {step} mean loss over ranks {mean_loss.item():.4f}")


def demo(ctx: dist.DistContext, args: argparse.Namespace, strategy: str) -> dict[str, Any]:
    """One small training run with ``strategy``, with the per-rank and rank-0 prints of the module docstring.

    Returns this rank's record (also written to ``--results`` when given; see :func:`read_results`).
    """

    def log(message: str) -> None:  # rank-0 logging: one copy of every summary, not world_size copies
        if ctx.is_main:
            print(message, flush=True)

    def say(message: str) -> None:  # deliberately per rank, tagged
        print(f"rank {ctx.rank}/{ctx.world_size}: {message}", flush=True)

    dataset = make_dataset()
    global_batch = args.batch * ctx.world_size
    lr = dist.scaled_lr(args.base_lr, args.base_batch, global_batch, rule=args.lr_rule)
    log(f"strategy={strategy} world_size={ctx.world_size} backend={ctx.backend} device={ctx.device}")
    log(f"effective batch = {args.batch} per rank x {ctx.world_size} ranks = {global_batch}; "
        f"lr = {args.base_lr} x ({global_batch}/{args.base_batch}, {args.lr_rule} rule) = {lr:.4g}")

    torch.manual_seed(0)  # same seed on every rank: identical initial weights (DDP also broadcasts rank 0's)
    model = DemoMLP()
    full_numel = sum(p.numel() for p in model.parameters())
    model = dist.wrap_model(model, ctx, strategy=strategy)
    local = _local_numel(model)
    record: dict[str, Any] = {
        "strategy": strategy, "rank": ctx.rank, "world_size": ctx.world_size, "backend": ctx.backend,
        "effective_batch": global_batch, "lr": lr, "stored_elements": local, "full_elements": full_numel,
        "indices": [], "local_losses": [], "mean_losses": [],
    }
    if strategy == "fsdp":
        say(f"stores {local} of {full_numel} parameter elements ({100 * local / full_numel:.1f}%) [fsdp shard]")
    _train(ctx, args, model, torch.optim.SGD(model.parameters(), lr=lr), dataset, record, log, say)
    equal = _same_on_all_ranks(_flat_params(model), ctx.world_size)
    log(f"parameters identical on all ranks after training: {'yes' if equal else 'NO'}")
    if strategy == "none" and ctx.world_size > 1:
        log("(strategy none: gradients were never averaged, so each rank trained its own model)")
    record["identical"] = equal
    if args.results:
        _write_json_atomically(Path(args.results) / f"{strategy}.rank{ctx.rank}.json", record)
    return record


def read_results(folder: str | os.PathLike[str]) -> dict[str, list[dict[str, Any]]]:
    """The records the ranks wrote with ``--results folder``: strategy -> records sorted by rank.

    Raises ``FileNotFoundError`` when the folder holds none (the run failed before writing, or wrote elsewhere).
    """
    files = sorted(Path(folder).glob("*.rank*.json"))
    if not files:
        raise FileNotFoundError(f"no <strategy>.rank<R>.json files in {str(folder)!r}: run the demo with --results.")
    results: dict[str, list[dict[str, Any]]] = {}
    for f in files:
        record = json.loads(f.read_text(encoding="utf-8"))
        results.setdefault(record["strategy"], []).append(record)
    for records in results.values():
        records.sort(key=lambda r: r["rank"])
    return results


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What one strategy's run showed, from its ranks' records (pure: no process group needed)."""
    first = records[0]
    epochs = len(first["indices"])
    disjoint = all(
        not set(a["indices"][e]) & set(b["indices"][e])
        for e in range(epochs) for i, a in enumerate(records) for b in records[i + 1:]
    )
    reshuffled = epochs < 2 or all(r["indices"][0] != r["indices"][1] for r in records)
    losses_differ = len(records) > 1 and any(r["local_losses"] != first["local_losses"] for r in records[1:])
    stored = [r["stored_elements"] for r in records]
    return {
        "strategy": first["strategy"], "ranks": len(records), "effective_batch": first["effective_batch"],
        "lr": first["lr"], "disjoint_shards": disjoint, "reshuffled_each_epoch": reshuffled,
        "local_losses_differ": losses_differ, "identical": all(r["identical"] for r in records),
        "stored_elements": stored, "full_elements": first["full_elements"],
        "final_mean_loss": first["mean_losses"][-1] if first["mean_losses"] else float("nan"),
    }


def summary_table(results: dict[str, list[dict[str, Any]]]) -> str:
    """A Markdown table, one row per strategy, of :func:`summarize` (what the lesson shows instead of raw logs)."""
    rows = [
        "| strategy | ranks | shards disjoint | reshuffled per epoch | local losses differ | last mean loss "
        "| weights identical after training | elements stored per rank |",
        "|---|---:|---|---|---|---:|---|---|",
    ]
    yes, same = {True: "yes", False: "no"}, {True: "yes", False: "NO"}
    for records in results.values():
        s = summarize(records)
        full = s["full_elements"]
        stored = ", ".join(f"{n:,} ({n / full:.0%})" for n in s["stored_elements"])
        rows.append(
            f"| {s['strategy']} | {s['ranks']} | {yes[s['disjoint_shards']]} | {yes[s['reshuffled_each_epoch']]} "
            f"| {yes[s['local_losses_differ']]} | {s['final_mean_loss']:.4f} | {same[s['identical']]} "
            f"| {stored} of {full:,} |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ctx = dist.setup()
    try:
        # Training lives in its own function so the model, optimizer and loader (and DDP's reducer, which holds
        # the process group) are freed *before* the process group is destroyed.
        for strategy in args.strategy:
            demo(ctx, args, strategy)
    finally:
        dist.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
