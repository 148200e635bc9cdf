"""``channels_last``: the same 4-D tensor, stored pixel by pixel (NHWC) instead of plane by plane (NCHW).

A convolution reads all channels of a small window of pixels. In the default layout (``contiguous_format``,
NCHW) those channels are a whole plane apart in memory; in ``channels_last`` (NHWC) they sit side by side, the
layout that oneDNN on x86 CPUs and the tensor cores of NVIDIA GPUs want. The shape does not change (still
``[N, C, H, W]``), only the strides. Convert the model *and* the inputs; a mismatch makes PyTorch convert at every
layer.

* :func:`to_channels_last` -- convert a model and a batch (exercise 16 writes it).
* :func:`layout_of` -- ``"channels_last"`` / ``"contiguous"`` / ``"other"`` of a tensor.

Lesson 12 ("channels_last for convolutions") measures it.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["to_channels_last", "layout_of", "conv_weights_layouts"]


def to_channels_last(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor]:
    """``model`` with its 4-D parameters in ``channels_last`` (in place, as ``.to`` does) and ``x`` converted too.

    ``x`` must be a 4-D image batch ``[N, C, H, W]``; its shape stays, its strides change. Never ``permute`` to
    ``[N, H, W, C]``: that is another shape, which a convolution would read as ``H`` channels.

    Taught in lesson 12 (``notebooks/12_techniques.ipynb``).
    """
    if x.dim() != 4:
        raise ValueError(f"channels_last needs a 4-D batch [N, C, H, W]; got shape {tuple(x.shape)}.")
    return model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)


def layout_of(t: torch.Tensor) -> str:
    """How a tensor is laid out: ``"channels_last"`` (NHWC strides), ``"contiguous"`` (NCHW), ``"both"``, ``"other"``.

    ``"both"``: a tensor so small in one dimension (one channel, or 1x1 pixels) that both layouts are the same bytes.

    Taught in lesson 12 (``notebooks/12_techniques.ipynb``).
    """
    nchw = t.is_contiguous()
    nhwc = t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
    names = {(True, True): "both", (True, False): "contiguous", (False, True): "channels_last"}
    return names.get((nchw, nhwc), "other")


def conv_weights_layouts(model: nn.Module) -> dict[str, str]:
    """``{name: layout}`` of every 4-D parameter (the convolution weights) of ``model``.

    Taught in lesson 12 (``notebooks/12_techniques.ipynb``).
    """
    return {name: layout_of(p) for name, p in model.named_parameters() if p.dim() == 4}
