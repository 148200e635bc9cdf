"""Data parallelism written from collectives: three versions, each faster than the one before.

Every rank holds the whole model, runs forward and backward on its own slice of the global batch, and then the
ranks **average their gradients** (all-reduce SUM, divide by ``world``) so that every rank takes the identical
optimizer step. With equal slices and a mean loss, the average of the ranks' gradients *is* the gradient of the
whole batch: the replicas train exactly as one process would on the concatenated batch (up to float rounding).

1. :func:`allreduce_gradients` -- after ``backward()``, one all-reduce per parameter. Correct, and simple, but the
   network sits idle during backward and the ranks sit idle during communication.
2. :class:`OverlappedDP` -- backward produces gradients from the last layer to the first. A hook fires the moment a
   parameter's gradient is final (``register_post_accumulate_grad_hook``) and launches its all-reduce
   asynchronously, while backward goes on computing the earlier layers. Communication hides behind compute. But it
   sends one message per parameter, and each message pays the latency (``comm.py``): a GPT-2 small has 148
   parameter tensors, so 148 latencies per step.
3. :class:`BucketedDP` -- what ``DistributedDataParallel`` does: parameters grouped, in the order their gradients
   usually arrive (reverse registration order), into buckets of about ``bucket_cap_mb``; each bucket sends one flat
   message once its last gradient is ready *and* every bucket before it has been sent. Few messages (latency paid a
   few times) that still start early (overlap). DDP's default cap is 25 MiB.

**Every rank issues its collectives in the same order.** A collective has no name: the k-th call on one rank is
matched with the k-th call on every other rank. If rank 0 sends bucket 1 first and rank 1 bucket 0 first (their
gradients became ready in different orders: a model whose layers run in another order than they were registered,
a branch taken on one rank only), the ranks sum pieces of different buckets, or wait for each other forever. So
the buckets leave in a fixed order, the same on every rank: bucket k only after buckets 0 .. k-1, as DDP does
("Buckets are reduced in sequence"). A bucket that fills early waits for the ones before it.

Gradient accumulation: the micro-batches before the last one only accumulate into ``.grad``; inside
``no_sync()`` nothing is launched, and the last backward all-reduces the accumulated sum once.

Start every version from identical weights (:func:`broadcast_parameters`), and call ``finish()`` before
``optimizer.step()``: it waits for the messages still in flight and divides by the world size.

Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

MIB = 2**20  # DDP's bucket_cap_mb counts MiB


def broadcast_parameters(model: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank, so that the replicas start identical.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor, src=src)


def allreduce_gradients(model: nn.Module) -> None:
    """Average every gradient over the ranks, after ``backward()``: one blocking all-reduce per parameter.

    Gloo has no AVG reduction, so: SUM, then divide by the world size.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    world = dist.get_world_size()
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad.div_(world)


@contextlib.contextmanager
def _no_sync(hooks: Any) -> Iterator[None]:
    """While active, the gradient hooks of ``hooks`` (an OverlappedDP or BucketedDP) launch nothing."""
    hooks._sync = False
    try:
        yield
    finally:
        hooks._sync = True


class OverlappedDP:
    """One async all-reduce per parameter, launched from backward the moment that parameter's gradient is ready.

    Usage, per step::

        dp = OverlappedDP(model)                 # once; wraps nothing, only registers hooks
        with dp.no_sync():                       # micro-batches before the last: accumulate only
            loss_fn(model(x0), y0).backward()
        loss_fn(model(x1), y1).backward()        # all-reduces start during this backward
        dp.finish()                              # wait for them, average
        optimizer.step()

    ``launched`` counts the all-reduces of the current step (one per parameter with a gradient).

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.world = dist.get_world_size()
        self._sync = True
        self._pending: list[tuple[nn.Parameter, Any]] = []
        self._hooks = [p.register_post_accumulate_grad_hook(self._launch)
                       for p in model.parameters() if p.requires_grad]

    def _launch(self, param: nn.Parameter) -> None:
        # Called by autograd once param.grad holds this backward's full contribution (accumulated onto the
        # micro-batches before it): from here on nothing writes to it until the optimizer steps.
        if self._sync:
            self._pending.append((param, dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, async_op=True)))

    @property
    def launched(self) -> int:
        return len(self._pending)

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """Backward passes inside only accumulate gradients locally; the next one outside all-reduces the sum."""
        return _no_sync(self)

    def finish(self) -> None:
        """Wait for every all-reduce of this step and divide by the world size. Call before ``optimizer.step()``."""
        for param, work in self._pending:
            work.wait()
            param.grad.div_(self.world)  # type: ignore[union-attr]  # it had a gradient: that is why it launched
        self._pending.clear()

    def remove(self) -> None:
        """Take the hooks off the model (it trains alone again)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()


def assign_buckets(named_params: list[tuple[str, nn.Parameter]], cap_bytes: int) -> list[list[str]]:
    """Group parameters, in the order given, into buckets of at most ``cap_bytes`` (names per bucket).

    A parameter larger than the cap gets a bucket of its own; a change of dtype or device starts a new bucket
    (one bucket is one flat tensor).

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    if cap_bytes <= 0:
        raise ValueError(f"cap_bytes={cap_bytes!r} must be positive.")
    buckets: list[list[str]] = []
    current: list[str] = []
    current_bytes, kind = 0, None
    for name, param in named_params:
        size = param.numel() * param.element_size()
        if current and (current_bytes + size > cap_bytes or (param.dtype, param.device) != kind):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(name)
        current_bytes += size
        kind = (param.dtype, param.device)
    if current:
        buckets.append(current)
    return buckets


class _Bucket:
    """Parameters that travel together as one flat tensor, and how many of their gradients are ready."""

    def __init__(self, names: list[str], params: list[nn.Parameter]) -> None:
        self.names, self.params = names, params
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        self.ready = 0
        self.work: Any = None

    @property
    def full(self) -> bool:
        return self.ready == len(self.params)

    def launch(self) -> None:
        offset = 0
        for p in self.params:  # a parameter without a gradient this step contributes zeros
            n = p.numel()
            if p.grad is None:
                self.flat[offset:offset + n].zero_()
            else:
                self.flat[offset:offset + n].copy_(p.grad.reshape(-1))
            offset += n
        self.work = dist.all_reduce(self.flat, op=dist.ReduceOp.SUM, async_op=True)

    def finish(self, world: int) -> None:
        self.work.wait()
        self.flat.div_(world)
        offset = 0
        for p in self.params:
            n = p.numel()
            averaged = self.flat[offset:offset + n].view_as(p)
            if p.grad is None:
                p.grad = averaged.clone()
            else:
                p.grad.copy_(averaged)
            offset += n
        self.ready, self.work = 0, None


class BucketedDP:
    """Gradients all-reduced in buckets of about ``bucket_cap_mb`` MiB, launched in bucket order during backward.

    Buckets follow the *reverse* registration order (the order backward usually produces gradients), so the first
    bucket fills, and leaves, while backward is still busy with the earlier layers. Bucket k leaves once its last
    gradient is ready and buckets 0 .. k-1 have left: every rank issues the same all-reduces in the same order,
    whatever order its gradients became ready in (a bucket with a parameter that gets no gradient holds back the
    ones after it until ``finish()``). ``buckets`` lists the parameter names
    of each bucket; ``collectives_per_step`` is its length (one all-reduce per bucket); ``bytes_per_step`` what
    each rank passes in. Usage as :class:`OverlappedDP` (``no_sync()``, ``finish()`` before the optimizer step).

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """

    def __init__(self, model: nn.Module, bucket_cap_mb: float = 25.0) -> None:
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r} must be positive (DDP's default is 25).")
        self.model = model
        self.world = dist.get_world_size()
        self._sync = True
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad][::-1]
        by_name = dict(named)
        self.buckets = assign_buckets(named, int(bucket_cap_mb * MIB))
        self._buckets = [_Bucket(names, [by_name[n] for n in names]) for names in self.buckets]
        self._bucket_of = {id(p): b for b in self._buckets for p in b.params}
        self._next = 0  # the first bucket not launched yet this step
        self._hooks = [p.register_post_accumulate_grad_hook(self._ready) for _, p in named]

    @property
    def collectives_per_step(self) -> int:
        return len(self._buckets)

    @property
    def bytes_per_step(self) -> int:
        return sum(b.flat.numel() * b.flat.element_size() for b in self._buckets)

    def _ready(self, param: nn.Parameter) -> None:
        if not self._sync:
            return
        self._bucket_of[id(param)].ready += 1
        self._launch_in_order()

    def _launch_in_order(self, everything: bool = False) -> None:
        # Send every full bucket whose predecessors have left (all of them when ``everything``), in bucket order:
        # the same on every rank. Backward goes on while they travel.
        while self._next < len(self._buckets) and (everything or self._buckets[self._next].full):
            self._buckets[self._next].launch()
            self._next += 1

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """Backward passes inside only accumulate gradients locally; the next one outside all-reduces the sum."""
        return _no_sync(self)

    def finish(self) -> None:
        """Send the buckets still waiting (a parameter that got no gradient), in order; wait for all, copy averages
        back."""
        self._launch_in_order(everything=True)
        for bucket in self._buckets:
            bucket.finish(self.world)
        self._next = 0

    def remove(self) -> None:
        """Take the hooks off the model."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
