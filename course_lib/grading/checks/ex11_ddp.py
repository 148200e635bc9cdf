"""Checks for exercise 11: the data-parallel bookkeeping, without launching any process.

The learner defines ``rank_indices(n, world_size, rank, epoch, seed=0)`` (with torch's ``DistributedSampler``,
passing ``num_replicas`` and ``rank`` explicitly), ``effective_batch(per_device_batch, world_size, accum=1)``,
``scaled_lr(base_lr, base_batch, per_device_batch, world_size, accum=1)`` (the linear rule) and
``save_on_main(state, path, rank)``. Expected values come from ``DistributedSampler`` itself and from
:func:`course_lib.distributed.scaled_lr`.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
from torch.utils.data.distributed import DistributedSampler

from course_lib.distributed import scaled_lr as reference_scaled_lr
from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line


def _sampler_indices(n: int, world: int, rank: int, epoch: int, seed: int = 0) -> list[int]:
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def _learner_indices(ns: dict[str, Any], n: int, world: int, rank: int, epoch: int) -> Any:
    fn = need(ns, "rank_indices", "define `rank_indices(n, world_size, rank, epoch, seed=0)` returning a list of ints")
    got = call(fn, n, world, rank, epoch)
    try:
        return [int(i) for i in got]
    except (TypeError, ValueError):
        return one_line(got)


def _indices(ns: dict[str, Any], n: int, world: int, rank: int, epoch: int) -> list[int]:
    got = observe(ns, _learner_indices, n, world, rank, epoch)
    if not isinstance(got, list):
        raise CheckFailed("rank_indices should return a list of ints", got=got)
    return got


@check_for("11", "ranks see disjoint shards covering the data", points=2)
def disjoint_cover(ns: dict[str, Any]) -> None:
    n, world = 36, 4
    shards = [_indices(ns, n, world, r, epoch=2) for r in range(world)]
    for rank, shard in enumerate(shards):
        expected = _sampler_indices(n, world, rank, 2)
        if shard != expected:
            raise CheckFailed(
                f"rank {rank} of {world} should see what DistributedSampler gives it (epoch 2)",
                hint="DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed), "
                "then sampler.set_epoch(epoch) before iterating",
                expected=expected,
                got=shard,
            )
    flat = [i for s in shards for i in s]
    if sorted(flat) != list(range(n)):
        raise CheckFailed("the ranks' shards should be disjoint and cover every index once", got=sorted(flat))
    uneven = [len(_indices(ns, 10, 4, r, 0)) for r in range(4)]
    if uneven != [3, 3, 3, 3]:
        raise CheckFailed(
            "with 10 samples on 4 ranks every rank still gets the same number (3): the sampler pads by repeating a "
            "few indices, so all ranks run the same number of steps (or collectives would hang)",
            expected=[3, 3, 3, 3],
            got=uneven,
        )


@check_for("11", "set_epoch reshuffles", points=1)
def epochs_differ(ns: dict[str, Any]) -> None:
    a, b = _indices(ns, 40, 2, 1, epoch=0), _indices(ns, 40, 2, 1, epoch=1)
    if a == b:
        raise CheckFailed(
            "epoch 0 and epoch 1 gave rank 1 the same order: every epoch would repeat the same batches",
            hint="call sampler.set_epoch(epoch): the shuffle is seeded with seed + epoch",
            got=a,
        )
    if b != _sampler_indices(40, 2, 1, 1):
        raise CheckFailed("epoch 1 does not match DistributedSampler after set_epoch(1)", expected=_sampler_indices(40, 2, 1, 1), got=b)


_SETUPS = ((24, 3, 1), (16, 8, 2), (5, 1, 7))


def _batches_and_lrs(ns: dict[str, Any]) -> list[list[Any]]:
    eff = need(ns, "effective_batch", "define `effective_batch(per_device_batch, world_size, accum=1)`")
    lr = need(ns, "scaled_lr", "define `scaled_lr(base_lr, base_batch, per_device_batch, world_size, accum=1)`")
    plain = lambda v: v if isinstance(v, (int, float)) and not isinstance(v, bool) else one_line(v)  # noqa: E731
    return [[plain(call(eff, per_device, world, accum)), plain(call(lr, 2e-3, 32, per_device, world, accum))]
            for per_device, world, accum in _SETUPS]


@check_for("11", "effective batch and linear LR scaling", points=1)
def batch_and_lr(ns: dict[str, Any]) -> None:
    for (per_device, world, accum), (got, got_lr) in zip(_SETUPS, observe(ns, _batches_and_lrs)):
        want = per_device * world * accum
        if got != want:
            raise CheckFailed(
                f"effective batch for {per_device} per device, {world} processes, {accum} accumulation steps",
                hint="every process sees its own per-device batch, and each step accumulates `accum` of them",
                expected=want,
                got=got,
            )
        expected_lr = reference_scaled_lr(2e-3, 32, want, "linear")
        if not isinstance(got_lr, (int, float)) or abs(got_lr - expected_lr) > 1e-12:
            raise CheckFailed(
                f"linear rule: an LR tuned at batch 32 scaled to an effective batch of {want}",
                hint="base_lr * effective_batch / base_batch",
                expected=expected_lr,
                got=got_lr,
            )


def _saves(ns: dict[str, Any]) -> dict[str, Any]:
    save = need(ns, "save_on_main", "define `save_on_main(state, path, rank)` returning True when it wrote the file")
    state = {"step": 17, "w": torch.arange(4.0)}
    with tempfile.TemporaryDirectory() as tmp:
        others = [os.path.join(tmp, f"rank{r}.pt") for r in (1, 3)]
        results = [one_line(call(save, state, p, r)) for p, r in zip(others, (1, 3))]
        written = [p for p in others if os.path.exists(p)]
        path = os.path.join(tmp, "ckpt.pt")
        main = one_line(call(save, state, path, 0))
        try:
            loaded = torch.load(path, weights_only=True) if os.path.exists(path) else None
        except Exception as exc:
            loaded = f"unreadable: {type(exc).__name__}"
        return {"others": results, "written": len(written), "main": main, "files": sorted(os.listdir(tmp)),
                "loaded": loaded if isinstance(loaded, (dict, str)) or loaded is None else one_line(loaded)}


@check_for("11", "only rank 0 saves", points=1)
def rank0_saves(ns: dict[str, Any]) -> None:
    seen = observe(ns, _saves)
    if seen["written"] or any(r != repr(False) and r != repr(None) for r in seen["others"]):
        raise CheckFailed(
            "ranks other than 0 wrote a checkpoint: N processes writing one file corrupt it, and the copies "
            "are identical anyway",
            hint="if rank != 0: return False",
            got={"returned": seen["others"], "files written": seen["written"]},
        )
    if seen["main"] != repr(True) or seen["loaded"] is None:
        raise CheckFailed("rank 0 should write the file and return True", got={"returned": seen["main"],
                                                                                "files": seen["files"]})
    loaded = seen["loaded"]
    if not isinstance(loaded, dict) or loaded.get("step") != 17 or not (
            isinstance(loaded.get("w"), torch.Tensor) and torch.equal(loaded["w"], torch.arange(4.0))):
        raise CheckFailed("the file rank 0 wrote does not hold the state it was given",
                          expected={"step": 17, "w": torch.arange(4.0)}, got=loaded)
