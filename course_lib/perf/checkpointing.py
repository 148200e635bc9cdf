"""Activation checkpointing: keep fewer activations for backward, recompute them when backward needs them.

A training forward saves, for every operation, the tensors its backward will read (inputs of matmuls, the
normalised values of a LayerNorm, the dropout mask ...). :func:`torch.utils.checkpoint.checkpoint` runs a block
*without* keeping them: only the block's input is saved, and backward runs the block's forward a second time to
get them back. Memory drops by what the checkpointed blocks would have saved; time grows by one forward of them.

* :func:`checkpointed_forward` -- run a stack of blocks, checkpointing the chosen ones (exercise 15 writes it).
* :func:`count_saved_bytes` -- the bytes autograd keeps for backward, counted with ``saved_tensors_hooks``.
* :func:`block_stack` -- the residual MLP blocks the lesson and the exercise checkpoint.

Lesson 12 ("Activation checkpointing: memory for compute") measures both sides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from course_lib.models.blocks import Block

__all__ = ["checkpointed_forward", "count_saved_bytes", "block_stack"]


def block_stack(n_blocks: int, d: int, p: float = 0.1, seed: int = 0) -> nn.ModuleList:
    """``n_blocks`` residual :class:`~course_lib.models.blocks.Block` modules of width ``d``, seeded.

    Taught in lesson 12 (``notebooks/12_techniques.ipynb``).
    """
    if n_blocks < 1 or d < 1:
        raise ValueError(f"block_stack: n_blocks={n_blocks!r} and d={d!r} must be >= 1.")
    torch.manual_seed(seed)
    return nn.ModuleList(Block(d, p) for _ in range(n_blocks))


def checkpointed_forward(blocks: Iterable[nn.Module], x: torch.Tensor, which: Iterable[int]) -> torch.Tensor:
    """Apply ``blocks`` in order; those whose index is in ``which`` run under activation checkpointing.

    ``use_reentrant=False`` is the variant PyTorch recommends: gradients reach the block's parameters even when
    its input does not require grad, and ``preserve_rng_state`` (the default) replays the same dropout masks in the
    recomputation, so outputs and gradients equal the plain model's exactly.

    Taught in lesson 12 (``notebooks/12_techniques.ipynb``).
    """
    chosen = set(which)
    for i, block in enumerate(blocks):
        x = checkpoint(block, x, use_reentrant=False) if i in chosen else block(x)
    return x


def count_saved_bytes(fn: Callable[[], object], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``fn()`` runs (``exclude``: parameters).

    Each saved tensor passes through the pack hook of :func:`torch.autograd.graph.saved_tensors_hooks`; a storage
    saved by several operations (a block's input, read by two of them) is counted once. Inside a checkpointed
    block the checkpoint installs its own hooks, so only what it keeps (the block's input) is seen here -- which is
    exactly the memory that stays alive until backward.

    Taught in lesson 12 (``notebooks/12_techniques.ipynb``).
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())
