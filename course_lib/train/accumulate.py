"""Gradient accumulation that gives exactly the gradient of one big batch.

Gradients *add up* across ``backward()`` calls until ``zero_grad``. To train with an effective batch of
``accum`` micro-batches, run forward/backward on each and step once. The only subtle part is the scaling:

* The big-batch loss is ``sum of per-target losses / number of targets``.
* So each micro-batch must contribute ``its loss SUM / the group's TOTAL count``, not its own mean divided by
  ``accum``. The popular ``loss / accumulation_steps`` is wrong whenever micro-batches hold different numbers of
  targets: the incomplete last group of an epoch (133 samples in micro-batches of 12 with 4 per group: groups of
  48, 48 and 37 samples) or text batches with different numbers of real (non-padding) tokens.

That is why a group's micro-batches are fetched *first*, their targets counted, and only then run.
Targets equal to ``IGNORE_INDEX`` (``-100``, padding) are ignored in the loss and in every count
(:mod:`course_lib.train.loss`).

Two more rules: ``zero_grad(set_to_none=True)`` only at group boundaries (never between micro-batches), and with
fp16 one GradScaler scale for the whole group: ``scale(loss).backward()`` per micro-batch, then a single
``unscale_ -> clip -> step -> update`` at the boundary. BatchNorm still normalises each micro-batch on its own,
so with BatchNorm accumulation is close to, not identical to, one big batch.

Under DDP (``world_size > 1``) each rank holds different micro-batches: the group count is summed over ranks
(so every rank divides by the global count), and the loss is multiplied by ``world_size`` because DDP *averages*
the gradients across ranks. Only the group's last backward needs the all-reduce (``no_sync_if``).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from course_lib.device import autocast
from course_lib.distributed import all_reduce_sum, no_sync_if
from course_lib.train.loss import (
    IGNORE_INDEX,
    cross_entropy_sum,
    mean_cross_entropy,
    real_targets,
    summed_cross_entropy,
)

Batch = Sequence[torch.Tensor]
T = TypeVar("T")


def move_batch(batch: Batch, device: torch.device | str) -> tuple[torch.Tensor, ...]:
    """Move every tensor of ``(x, y)`` / ``(x, y, lengths)`` to ``device`` (asynchronously from pinned memory)."""
    return tuple(t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) and t.device != device else t
                 for t in batch)


def count_targets(batch: Batch) -> torch.Tensor | int:
    """Number of real targets (not ``-100``) in ``batch``: a 0-d tensor on the targets' device (no sync), or a plain
    ``int`` for targets in CPU memory (counted by numpy: no tensor operations on the training loop's hot path)."""
    targets = batch[1]
    # Host memory is the plain "cpu" device (a device index means a separate device, as the device audit makes).
    if targets.device == torch.device("cpu") and not targets.requires_grad:
        return int((targets.numpy() != IGNORE_INDEX).sum())
    return real_targets(targets).sum()


def loss_and_count(model: nn.Module, batch: Batch, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of per-target cross-entropy, number of targets != -100)`` for one batch.

    Works for images (logits ``[B, K]``, targets ``[B]``) and text (logits ``[B, T, V]``, targets ``[B, T]``,
    flattened to ``[B*T, V]`` / ``[B*T]``). The sum is in fp32 even under autocast. Both values stay on the device,
    so nothing waits for the GPU here.
    """
    x, y = move_batch(batch[:2], device)
    return summed_cross_entropy(model(x), y)


def take_group(batches: Iterator[T], size: int) -> list[T]:
    """The next ``size`` items of ``batches``, or fewer when it runs out (an empty list: it had none left).

    The one way the course cuts a stream of micro-batches into accumulation groups: :func:`train_accumulated`
    and :class:`course_lib.train.stream.BatchStream` both call it.
    """
    return list(itertools.islice(batches, size))


def accumulation_groups(n_batches: int, accum: int) -> list[int]:
    """How ``n_batches`` micro-batches split into optimizer steps of ``accum``: ``(10, 4) -> [4, 4, 2]``.

    Taught in lesson 06 (``notebooks/06_accumulation.ipynb``).
    """
    if not isinstance(n_batches, int) or n_batches < 0:
        raise ValueError(f"n_batches={n_batches!r} must be an integer >= 0.")
    if not isinstance(accum, int) or accum < 1:
        raise ValueError(f"accum={accum!r} must be an integer >= 1.")
    full, rest = divmod(n_batches, accum)
    return [accum] * full + ([rest] if rest else [])


def backward_one(
    model: nn.Module,
    batch: Batch,
    device: torch.device,
    *,
    amp_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> torch.Tensor:
    """Forward + backward of one batch, no accumulation, one process: what a hand-written loop does, nothing more.

    The mean over the real targets is their sum divided by their count, computed by ``cross_entropy`` itself.
    Returns the mean loss (detached).
    """
    x, y = move_batch(batch[:2], device)
    with autocast(device, amp_dtype):
        loss = mean_cross_entropy(model(x), y)
    (scaler.scale(loss) if scaler is not None and scaler.is_enabled() else loss).backward()
    return loss.detach()


def backward_group(
    model: nn.Module,
    micro_batches: Sequence[Batch],
    device: torch.device | str,
    *,
    amp_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    world_size: int = 1,
) -> tuple[torch.Tensor, torch.Tensor | int]:
    """Forward + backward every micro-batch of one optimizer step; gradients end up as for one big batch.

    Does not step and does not zero the gradients (the caller does both at the group boundary).
    Returns ``(loss sum over this rank's micro-batches (detached tensor), group target count over all ranks)``;
    the count is an ``int`` when the targets were counted in host memory (one process), else a 0-d tensor on the
    device (no sync either way).

    Taught in lesson 04 (``notebooks/04_template.ipynb``).
    """
    device = torch.device(device)
    if len(micro_batches) == 1 and world_size == 1:
        # Counted in the batch as the loader gave it: targets in host memory are counted there, a plain int, so
        # no operation is launched on the device for it.
        count = count_targets(micro_batches[0])
        mean_loss = backward_one(model, micro_batches[0], device, amp_dtype=amp_dtype, scaler=scaler)
        return mean_loss * count, count
    # 1. Count first: every micro-batch is divided by the count of the WHOLE group. Targets still on the CPU are
    #    counted there (a plain int: no GPU round trip); targets already on the device stay a device tensor.
    counts = [count_targets(b) for b in micro_batches]
    if all(isinstance(c, int) for c in counts):
        total: torch.Tensor | int = sum(counts)
    else:
        total = torch.stack([torch.as_tensor(c, device=device) for c in counts]).sum()
    if world_size > 1:
        total = all_reduce_sum(torch.as_tensor(total, device=device))  # every rank divides by the global count
    # x world_size because DDP *averages* gradients over ranks; clamp: a group of pure padding adds nothing.
    denominator = (total.clamp_min(1).float() if isinstance(total, torch.Tensor) else float(max(total, 1))) / world_size
    # no_sync must reach the DDP wrapper even when torch.compile wrapped it.
    ddp_model = getattr(model, "_orig_mod", model)
    losses = []
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        # 2. Only the last backward of the group all-reduces gradients (no-op without DDP).
        sync = no_sync_if(ddp_model, not last) if world_size > 1 else contextlib.nullcontext()
        with sync:
            x, y = move_batch(batch[:2], device)
            with autocast(device, amp_dtype):
                batch_loss = cross_entropy_sum(model(x), y)  # the group's count is known: no second count
            loss = batch_loss / denominator
            (scaler.scale(loss) if scaler is not None and scaler.is_enabled() else loss).backward()
        losses.append(batch_loss.detach())
    return torch.stack(losses).sum(), total


def train_accumulated(
    model: nn.Module,
    loader: Iterable[Batch],
    optimizer: torch.optim.Optimizer,
    device: torch.device | str,
    microbatches: int = 4,
) -> dict[str, Any]:
    """One epoch over ``loader`` with ``microbatches`` micro-batches per optimizer step (single device, fp32).

    Every group, including an incomplete last one, is averaged by its actual number of samples, so each step
    uses the gradient of the mean loss over exactly the samples it saw.

    Returns ``{"loss": mean training loss over the epoch, "steps": optimizer steps, "group_sizes": samples per
    step}`` (133 samples in micro-batches of 12, ``microbatches=4`` -> ``group_sizes == [48, 48, 37]``).

    Taught in lesson 06 (``notebooks/06_accumulation.ipynb``).
    """
    if not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches={microbatches!r} must be an integer >= 1.")
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total_loss = torch.zeros((), device=device)
    total_count = torch.zeros((), device=device, dtype=torch.long)
    group_sizes: list[torch.Tensor | int] = []
    batches = iter(loader)
    while group := take_group(batches, microbatches):  # the epoch's last group may be shorter
        loss_sum, count = backward_group(model, group, device)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # clear only at the group boundary
        total_loss += loss_sum
        total_count += count
        group_sizes.append(count)
        if len(group) < microbatches:
            break
    n = int(total_count)
    return {
        "loss": float(total_loss) / max(n, 1),
        "steps": len(group_sizes),
        "group_sizes": [int(c) for c in group_sizes],
    }
