"""ZeRO-1 by hand: every rank keeps the optimizer state of 1/world of the parameters, not all of them.

Under plain data parallelism each rank holds, per parameter, 4 bytes of fp32 weight, 4 of gradient and 8 of AdamW
state (the moments ``m`` and ``v``): the state is half of the 16 bytes, and identical on every rank. ZeRO stage 1
stops the duplication. Flatten the parameters, in order, into one long vector and cut it into ``world`` contiguous
shards (the last one shorter when ``world`` does not divide the count). Rank ``r`` builds a real optimizer over
shard ``r`` only, so after the gradients are averaged (by data parallelism, as before)::

    each rank steps its own shard     -> AdamW state: 8 / world bytes per parameter on each rank
    all-gather the updated shards     -> every rank has every parameter again (one message of numel / world each)

AdamW works element by element, so stepping the shards separately gives exactly the numbers one AdamW over all
parameters gives. On 2 ranks this saves 4 of 16 bytes per parameter, on 8 ranks 7: the state is the largest part.

Stage 2 also shards the gradients (a reduce-scatter instead of the all-reduce: each rank only needs the averaged
gradient of its shard), stage 3 the parameters (gathered layer by layer just before use). Stage 3 is what FSDP
does; :func:`fsdp_memory_per_rank` measures what FSDP2 (``fully_shard``) leaves on each rank, for comparison.

Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course_lib import distributed


def shard_bounds(numel: int, world: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each rank's shard of ``numel`` elements: ``ceil(numel / world)`` each, the last ones
    shorter (possibly empty) when ``world`` does not divide ``numel``.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    if world < 1 or numel < 0:
        raise ValueError(f"need world >= 1 and numel >= 0, got world={world!r}, numel={numel!r}.")
    size = math.ceil(numel / world)
    return [(min(r * size, numel), min((r + 1) * size, numel)) for r in range(world)]


# Bytes per parameter of AdamW training (weights, gradients, optimizer state), as the ZeRO paper (Rajbhandari et al.,
# 2020) counts them. fp32: 4 + 4 + 8 (the two moments). Mixed precision: bf16/fp16 weights and gradients, 2 + 2, and
# K = 12 bytes of fp32 state (a master copy of the weights and the two moments).
ZERO_BYTES_PER_PARAM = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}


def zero_bytes_per_rank(numel: int, world: int, stage: int, precision: str = "mixed") -> int:
    """Bytes one rank keeps for ``numel`` parameters under ZeRO ``stage`` (0: plain data parallelism; 1: optimizer
    state sharded; 2: and gradients; 3: and parameters), activations aside. A sharded category keeps the largest
    shard, ``ceil(numel / world)`` elements (:func:`shard_bounds`).

    Stage 1 divides only the state: at most 16 / 8 = 2x less with the fp32 accounting, 16 / 4 = 4x with the
    mixed-precision one (the state is 12 of its 16 bytes): the saving the paper quotes is the mixed-precision one.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    if precision not in ZERO_BYTES_PER_PARAM or stage not in (0, 1, 2, 3) or world < 1 or numel < 0:
        raise ValueError(f"need precision in {sorted(ZERO_BYTES_PER_PARAM)}, stage 0-3, world >= 1 and numel >= 0; "
                         f"got precision={precision!r}, stage={stage!r}, world={world!r}, numel={numel!r}.")
    weights, grads, state = ZERO_BYTES_PER_PARAM[precision]
    shard = -(-numel // world)  # ceil in integers: exact for any numel
    return (weights * (shard if stage >= 3 else numel) + grads * (shard if stage >= 2 else numel)
            + state * (shard if stage >= 1 else numel))


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _tensor_bytes(t: Any) -> int:
    if not isinstance(t, torch.Tensor):
        return 0
    if hasattr(t, "to_local"):  # a DTensor (FSDP2): count the shard this rank stores
        t = t.to_local()
    return t.numel() * t.element_size()


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: this rank's optimizer (AdamW by default) owns one contiguous shard of the flattened parameters.

    ``ShardedOptimizer(model.parameters(), lr=1e-3, weight_decay=0.1)`` replaces ``AdamW(model.parameters(), ...)``
    once the gradients are averaged over the ranks (e.g. by :class:`~course_lib.parallel.data_parallel.BucketedDP`).
    It is a ``torch.optim.Optimizer``: parameter groups (``[{"params": decay, "weight_decay": 0.1}, {"params":
    no_decay, "weight_decay": 0.0}]``), LR schedulers, ``zero_grad()`` and ``state_dict()`` work as on any
    optimizer. The groups are flattened one after the other and the whole is cut into ``world`` shards; where this
    rank's shard crosses a group, each piece joins the inner optimizer with its group's settings (a shard may cut
    through a tensor: the settings belong to the group, not the tensor). ``step()`` updates this rank's shard and
    all-gathers every shard back into the parameters; ``state_bytes()`` is the size of this rank's optimizer state.
    A collective: call ``step()`` on every rank.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """

    def __init__(self, params: Iterable[Any], optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
                 **defaults: Any) -> None:
        super().__init__(params, defaults)  # self.param_groups: every parameter, with its group's settings
        self.params = [p for group in self.param_groups for p in group["params"]]
        if not self.params or len({(p.dtype, p.device) for p in self.params}) != 1:
            raise ValueError("ShardedOptimizer needs parameters that all share one dtype and one device.")
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.bounds = shard_bounds(self.numel, self.world)
        self.shard_size = self.bounds[0][1] - self.bounds[0][0]  # every shard padded to this for the all-gather
        start, end = self.bounds[self.rank]
        flat = _flat(self.params).detach()
        # This rank's part of each group's stretch of the flat vector, as its own leaf tensor: (group, piece).
        self.pieces: list[tuple[int, nn.Parameter]] = []
        group_start = 0
        for index, group in enumerate(self.param_groups):
            group_end = group_start + sum(p.numel() for p in group["params"])
            lo, hi = max(start, group_start), min(end, group_end)
            if lo < hi:
                self.pieces.append((index, nn.Parameter(flat[lo:hi].clone())))
            group_start = group_end
        inner = [{**self._settings(index), "params": [piece]} for index, piece in self.pieces]
        self.optimizer = optimizer_class(inner) if inner else None  # None: an empty shard (more ranks than elements)

    def _settings(self, index: int) -> dict[str, Any]:
        return {k: v for k, v in self.param_groups[index].items() if k != "params"}

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Step this rank's shard with its (already averaged) gradient, then share the updated shards."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        start, end = self.bounds[self.rank]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        shard_grad = _flat(grads)[start:end]
        offset = 0
        for (index, piece), inner in zip(self.pieces, self.optimizer.param_groups if self.optimizer else []):
            inner.update(self._settings(index))  # what a scheduler or the learner set on the group since
            piece.grad = shard_grad[offset:offset + piece.numel()]
            offset += piece.numel()
        if self.optimizer is not None:
            self.optimizer.step()
        # all_gather_into_tensor needs equal pieces: pad the (possibly shorter) last shard with zeros.
        send = torch.zeros(self.shard_size, dtype=self.params[0].dtype, device=self.params[0].device)
        if self.pieces:
            send[: end - start] = torch.cat([piece for _, piece in self.pieces])
        gathered = torch.empty(self.shard_size * self.world, dtype=send.dtype, device=send.device)
        with warnings.catch_warnings():  # newer torch renames it all_gather_single; older torch lacks that name
            warnings.simplefilter("ignore", FutureWarning)
            dist.all_gather_into_tensor(gathered, send)
        offset = 0
        for p in self.params:
            p.copy_(gathered[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        return loss

    def state_dict(self) -> dict[str, Any]:
        """The groups' settings (as any optimizer's) and this rank's shard state under ``"shard"``: each rank saves
        its own file, and loads it back on the same rank of the same world size."""
        out = super().state_dict()
        out["shard"] = {"rank": self.rank, "world": self.world,
                        "optimizer": None if self.optimizer is None else self.optimizer.state_dict()}
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        shard = state_dict.pop("shard")
        if (shard["rank"], shard["world"]) != (self.rank, self.world):
            raise ValueError(f"this state is rank {shard['rank']} of {shard['world']}'s shard; this optimizer is rank "
                             f"{self.rank} of {self.world}: load each rank's own file, with the same world size.")
        super().load_state_dict(state_dict)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(shard["optimizer"])

    def state_bytes(self) -> int:
        """Bytes of this rank's optimizer state (AdamW: ``m`` and ``v`` of its shard, and a step counter)."""
        return 0 if self.optimizer is None else optimizer_state_bytes(self.optimizer)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of an optimizer's state on this rank (for a DTensor, the local shard).

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    return sum(_tensor_bytes(t) for state in optimizer.state.values() for t in state.values())


@dataclass
class RankMemory:
    """Bytes one rank stores for training, by category (activations not included).

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """

    params: int
    grads: int
    optimizer_state: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer_state


def rank_memory(model: nn.Module, optimizer: torch.optim.Optimizer) -> RankMemory:
    """What this rank holds of ``model``'s parameters and gradients and of ``optimizer``'s state, in bytes.

    Sharded parameters (FSDP2's DTensors) count only their local shard. Call it after a step: gradients and
    AdamW's moments exist only from the first ``backward()`` / ``step()`` on.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    params = list(model.parameters())
    return RankMemory(
        params=sum(_tensor_bytes(p) for p in params),
        grads=sum(_tensor_bytes(p.grad) for p in params),
        optimizer_state=optimizer_state_bytes(optimizer),
    )


def fsdp_memory_per_rank(model: nn.Module, example_input: torch.Tensor, lr: float = 1e-3) -> RankMemory:
    """Shard ``model`` with FSDP2 (``course_lib.distributed.wrap_model(..., "fsdp")``: each block of an
    ``nn.ModuleList``, then the root), take one AdamW step on ``example_input`` (loss: the sum of the outputs) and
    return what this rank stores. A collective: call it on every rank, with the model built from the same seed.

    Compare with :func:`rank_memory` of a plain replica (what DDP keeps): about ``1 / world`` of each category.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """
    ctx = distributed.setup()  # the process group exists already; this reads rank, world and device
    model = distributed.wrap_model(model, ctx, strategy="fsdp")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)  # after wrapping: over the sharded parameters
    model(example_input.to(ctx.device)).float().sum().backward()
    optimizer.step()
    return rank_memory(model, optimizer)
