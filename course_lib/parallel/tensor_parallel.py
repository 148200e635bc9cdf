"""Tensor parallelism of one MLP block (Megatron-LM style): the weight matrices themselves split over the ranks.

The block is ``Linear(d, h) -> GELU -> Linear(h, d)`` with ``h = 4 d``. Split it so that the GELU needs nothing
from the other ranks:

* the first linear **by output features** (:class:`ColumnParallelLinear`): rank ``r`` holds ``h / world`` rows of
  its weight and computes ``h / world`` of the hidden units, from the whole input. GELU acts on each unit alone, so
  it runs on the slice as is.
* the second linear **by input features** (:class:`RowParallelLinear`): rank ``r`` holds the ``h / world`` columns
  that read its hidden units and produces a *partial* output; the full output is the **sum** over ranks.

So the block costs exactly two messages, each the size of the activations ``[batch, tokens, d]``:

    forward:  one all-reduce of the output partial sums        (_ReduceFromParallel: all-reduce fwd, identity bwd)
    backward: one all-reduce of the input gradient's partials   (_CopyToParallel: identity fwd, all-reduce bwd)

Each rank stores and computes ``1 / world`` of the block's weights and FLOPs. The price is that the messages grow
with the activations and sit on the critical path (nothing to overlap them with): two per MLP and two per attention
in every transformer layer, forward and backward. That is why tensor parallelism stays inside one node, over
NVLink (hundreds of GB/s), usually at most 8 ways, while data parallelism goes across nodes.

Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class _CopyToParallel(torch.autograd.Function):
    """Forward: the input as is (every rank needs all of it). Backward: all-reduce the input gradient, because
    each rank's gradient only covers the hidden units it holds."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()  # our own buffer to reduce into: autograd may still read the one it gave
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad


class _ReduceFromParallel(torch.autograd.Function):
    """Forward: all-reduce the partial outputs into the full output. Backward: the gradient as is (the output
    gradient is the same on every rank, and each partial contributes to the sum with weight 1)."""

    @staticmethod
    def forward(ctx: Any, partial: torch.Tensor) -> torch.Tensor:
        out = partial.contiguous().clone()  # a new tensor: autograd forbids changing an input in place unannounced
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _rank_world(rank: int | None, world: int | None) -> tuple[int, int]:
    rank = dist.get_rank() if rank is None else rank
    world = dist.get_world_size() if world is None else world
    if not 0 <= rank < world:
        raise ValueError(f"rank={rank} is outside 0..{world - 1}.")
    return rank, world


def _split(n: int, world: int, what: str) -> int:
    if n % world:
        raise ValueError(f"{what}={n} is not divisible by world={world}; tensor parallelism splits it evenly.")
    return n // world


class ColumnParallelLinear(nn.Module):
    """``nn.Linear`` split by output features: this rank holds rows ``[r * out/world, (r+1) * out/world)`` of the
    weight (and of the bias) and returns that slice of the output, computed from the whole input.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, rank: int | None = None,
                 world: int | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.rank, self.world = _rank_world(rank, world)
        local = _split(out_features, self.world, "out_features")
        full = nn.Linear(in_features, local, bias=bias, device=device, dtype=dtype)  # nn.Linear's initialisation
        self.weight = full.weight
        self.bias = full.bias

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, rank: int | None = None,
                    world: int | None = None) -> ColumnParallelLinear:
        """This rank's rows of a full ``linear`` (copied)."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, rank=rank, world=world,
                    device=linear.weight.device, dtype=linear.weight.dtype)
        rows = slice(layer.rank * layer.weight.shape[0], (layer.rank + 1) * layer.weight.shape[0])
        with torch.no_grad():
            layer.weight.copy_(linear.weight[rows])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias[rows])
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(_CopyToParallel.apply(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``nn.Linear`` split by input features: this rank holds columns ``[r * in/world, (r+1) * in/world)`` of the
    weight, reads the matching slice of the input and all-reduces the partial outputs. The bias is whole on every
    rank and added once, after the sum.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, rank: int | None = None,
                 world: int | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.rank, self.world = _rank_world(rank, world)
        local = _split(in_features, self.world, "in_features")
        full = nn.Linear(local, out_features, bias=bias, device=device, dtype=dtype)
        self.weight = full.weight
        self.bias = full.bias

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, rank: int | None = None,
                    world: int | None = None) -> RowParallelLinear:
        """This rank's columns of a full ``linear`` (copied); the bias whole."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, rank=rank, world=world,
                    device=linear.weight.device, dtype=linear.weight.dtype)
        cols = slice(layer.rank * layer.weight.shape[1], (layer.rank + 1) * layer.weight.shape[1])
        with torch.no_grad():
            layer.weight.copy_(linear.weight[:, cols])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _ReduceFromParallel.apply(F.linear(x, self.weight))
        return out if self.bias is None else out + self.bias


class TPMLP(nn.Module):
    """``ColumnParallelLinear -> GELU -> RowParallelLinear``: one MLP block split over the ranks.

    ``TPMLP.from_full(block)`` shards a full block whose two ``nn.Linear`` (in registration order) are the
    expansion and the projection, e.g. ``Block.mlp`` of ``course_lib.models`` or ``TinyGPT``'s ``MLP``; the GELU's
    ``approximate`` is taken from an ``nn.GELU`` in the block if there is one. Dropout is not carried over
    (tensor parallelism does not change it; evaluate the equality without it).

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
    """

    def __init__(self, fc: ColumnParallelLinear, proj: RowParallelLinear, approximate: str = "none") -> None:
        super().__init__()
        self.fc, self.proj = fc, proj
        self.act = nn.GELU(approximate=approximate)

    @classmethod
    def from_full(cls, block: nn.Module, *, rank: int | None = None, world: int | None = None) -> TPMLP:
        linears = [m for m in block.modules() if isinstance(m, nn.Linear)]
        if len(linears) != 2 or linears[0].out_features != linears[1].in_features:
            raise ValueError("from_full needs a block with exactly two nn.Linear, Linear(d, h) then Linear(h, d); "
                             f"found {[(m.in_features, m.out_features) for m in linears]}.")
        gelus = [m for m in block.modules() if isinstance(m, nn.GELU)]
        return cls(ColumnParallelLinear.from_linear(linears[0], rank=rank, world=world),
                   RowParallelLinear.from_linear(linears[1], rank=rank, world=world),
                   approximate=gelus[0].approximate if gelus else "none")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))
