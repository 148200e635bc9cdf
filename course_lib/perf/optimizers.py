"""The three implementations of one optimizer: a Python loop, ``foreach``, ``fused``.

``torch.optim.AdamW`` can update the parameters one tensor at a time (``foreach=False``: a handful of small
kernels *per parameter*), a list at a time (``foreach=True``: ``torch._foreach_*`` kernels over all parameters at
once, the default on CUDA) or in one kernel per group (``fused=True``: CUDA, and CPU in recent PyTorch). The maths
is the same; what changes is how many times the framework is entered. A model with many small tensors (biases,
norms) pays most for the loop.

Lesson 12 ("Fused and foreach optimizers") measures them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["ADAMW_IMPLEMENTATIONS", "many_small_params", "adamw_step"]

ADAMW_IMPLEMENTATIONS: dict[str, dict[str, Any]] = {
    "for-loop": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def many_small_params(n_layers: int = 48, width: int = 32, seed: int = 0) -> nn.Module:
    """A stack of ``n_layers`` small ``Linear + LayerNorm`` layers: four small tensors each, the optimizer's worst
    case (its per-tensor overhead dominates the arithmetic).

    Taught in lesson 12 (``notebooks/12_techniques.ipynb``).
    """
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width)) for _ in range(n_layers)])


def adamw_step(model: nn.Module, implementation: str, lr: float = 1e-3) -> Callable[[], None]:
    """A function doing one ``AdamW.step()`` with ``implementation`` (one of :data:`ADAMW_IMPLEMENTATIONS`) on
    gradients set once (so only the optimizer is timed); the model's own copy of the weights is updated.

    Taught in lesson 12 (``notebooks/12_techniques.ipynb``).
    """
    if implementation not in ADAMW_IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r} is not one of {list(ADAMW_IMPLEMENTATIONS)}.")
    params = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(1)
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator) * 1e-3
    optimizer = torch.optim.AdamW(params, lr=lr, **ADAMW_IMPLEMENTATIONS[implementation])
    return optimizer.step
