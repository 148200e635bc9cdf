"""AdamW with weight decay on matrices only.

Weight decay pulls weights towards zero. That is a useful prior for the *matrices* of linear, conv and embedding
layers, but harmful for 1-D parameters: biases and the scales/shifts of normalisation layers set offsets and
gains, and shrinking them towards zero just fights the normalisation. So parameters with ``dim() >= 2`` go in a
decayed group and the rest in a group with ``weight_decay=0``. Frozen parameters (``requires_grad=False``) are
left out entirely (the optimizer would only carry dead state for them).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

BETAS = (0.9, 0.95)  # beta2 = 0.95 (rather than 0.999) reacts faster to gradient-scale changes: the LLM default


def param_groups(model: nn.Module, wd: float) -> list[dict[str, Any]]:
    """Two AdamW parameter groups: ``[{"params": matrices, "weight_decay": wd}, {"params": others, 0.0}]``.

    Each group also carries ``"names"`` (the parameter names) so a lesson can print what went where.
    Tied parameters appear once (``named_parameters`` deduplicates them).

    Taught in lesson 04 (``notebooks/04_template.ipynb``).
    """
    decay, no_decay = [], []
    decay_names, no_decay_names = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.dim() >= 2:
            decay.append(p)
            decay_names.append(name)
        else:
            no_decay.append(p)
            no_decay_names.append(name)
    return [
        {"params": decay, "weight_decay": wd, "names": decay_names},
        {"params": no_decay, "weight_decay": 0.0, "names": no_decay_names},
    ]


def build_optimizer(model: nn.Module, cfg: Any) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` with ``lr=cfg.lr``, ``betas=(0.9, 0.95)``.

    On CUDA the fused implementation (one kernel for the whole update, deterministic) is used; elsewhere the
    default implementation, whose results do not depend on the thread count.
    """
    groups = param_groups(model, cfg.wd)
    if not any(g["params"] for g in groups):
        raise ValueError("the model has no trainable parameters (all have requires_grad=False).")
    params = [p for g in groups for p in g["params"]]
    fused = bool(params) and all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=BETAS, fused=fused or None)
