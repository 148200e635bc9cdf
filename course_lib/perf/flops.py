"""FLOPs counted the same on every device: ``FlopCounterMode`` with attention counted as model FLOPs everywhere.

``torch.utils.flop_counter.FlopCounterMode`` counts an operation only when a formula is registered for it, and
attention reaches it through a different kernel on each device:

* on a CPU, ``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward, which have no formula
  (torch 2.14): a CPU count of a transformer step silently leaves attention out (lesson 14's small GPT: 2,555,904
  FLOPs per token on a CPU against 2,949,120 on ``meta``);
* on ``meta``, the math path: two batched matmuls forward (the scores ``q @ k^T``, the weighted sum ``p @ v``) and
  four backward, twice the forward's FLOPs;
* on a CUDA GPU, flash / memory-efficient / cuDNN kernels, whose registered backward also counts the scores
  recomputed inside the kernel: 2.5 times the forward.

MFU counts the FLOPs the *model* needs, not what a kernel chose to recompute (PaLM, appendix B), so
:func:`counted_flops` counts every attention kernel as the math path does: the forward by torch's own formula (the
causal mask not subtracted, as torch does), the backward as twice the forward. A CPU, a GPU and ``meta`` then agree.

Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

_FORWARD = ("_scaled_dot_product_flash_attention_for_cpu",)
_BACKWARD = ("_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_flash_attention_backward",
             "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward")


def attention_backward_flops(grad_out_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any, *args: Any,
                             **kwargs: Any) -> int:
    """The model FLOPs of attention's backward: the gradients of the scores, of ``v``, of ``q`` and of ``k``, four
    matmuls with the forward's shapes, twice the forward's FLOPs (no recomputed scores)."""
    return 2 * flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def attention_forward_flops(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
    """The FLOPs of attention's forward: the scores ``q @ k^T`` and the weighted sum ``p @ v`` (torch's formula)."""
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def _attention_mapping() -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    for names, formula in ((_FORWARD, attention_forward_flops), (_BACKWARD, attention_backward_flops)):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is not None:  # an older or newer torch may lack a kernel
                mapping[packet] = formula
    return mapping


def flop_counter_mode() -> FlopCounterMode:
    """A ``FlopCounterMode`` (no printed table) that counts attention as model FLOPs on every device (see the
    module docstring)."""
    return FlopCounterMode(display=False, custom_mapping=_attention_mapping())


def counted_flops(run: Callable[[], object]) -> int:
    """The FLOPs counted while ``run()`` runs (forward and, when ``run`` calls it, backward), the same on a CPU, a
    GPU and ``meta``.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    with flop_counter_mode() as counter:
        run()
    return int(counter.get_total_flops())


__all__ = ["attention_forward_flops", "attention_backward_flops", "flop_counter_mode", "counted_flops"]
