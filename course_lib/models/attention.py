"""Attention written by hand, next to :func:`torch.nn.functional.scaled_dot_product_attention`.

``softmax(q @ k^T / sqrt(head_dim) + mask) @ v`` in four lines is how attention is usually first written. It
builds the whole ``[T, T]`` score matrix per head, keeps it for backward, and launches one kernel per line.
``F.scaled_dot_product_attention`` computes the same thing through a *backend*: ``math`` (the four lines, in
C++), ``flash`` (tiles that never build the full matrix; on CPU too in recent PyTorch) or ``efficient``
(memory-efficient attention, CUDA only). :class:`~course_lib.models.gpt.TinyGPT` uses the fused call.

Lesson 12 ("scaled_dot_product_attention and its backends") compares them.
"""

from __future__ import annotations

import math

import torch

__all__ = ["manual_attention"]


def manual_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """``softmax(q k^T * scale + causal mask) v`` for ``[..., T, head_dim]`` tensors, the way it is first written.

    ``scale`` defaults to ``1/sqrt(head_dim)`` like ``F.scaled_dot_product_attention``; ``is_causal`` lets
    position ``t`` attend to positions ``<= t`` only (the upper triangle is set to ``-inf`` before the softmax).

    Taught in lesson 12 (``notebooks/12_techniques.ipynb``).
    """
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"attention shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}.")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        t_q, t_k = q.shape[-2], k.shape[-2]
        future = torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(dim=-1) @ v
