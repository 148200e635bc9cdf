"""A small convolutional classifier for the generated shapes (and CIFAR-10).

Three stages of ``conv -> BatchNorm -> ReLU``, halving the resolution between stages, then global average
pooling and one linear layer. Global pooling makes the network independent of the image size, so the same class
serves 32x32 CIFAR images and any size the shapes generator produces.

BatchNorm is the usual choice for CNNs and it is kept on purpose: it normalises with the statistics of the
*micro*-batch, so gradient accumulation with BatchNorm is close to, but not exactly, one big batch (a point the
accumulation lesson measures). In ``eval()`` mode it uses running statistics, so predictions do not depend on the
batch they are in.
"""

from __future__ import annotations

import torch
from torch import nn


def _conv_bn_relu(c_in: int, c_out: int) -> nn.Sequential:
    # bias=False: the BatchNorm right after has its own shift, a conv bias would be redundant.
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Module):
    """``[B, in_channels, H, W]`` images -> ``[B, num_classes]`` logits.

    Args:
        num_classes: number of output classes.
        in_channels: 3 for RGB.
        width: channels of the first stage; the later stages use ``2*width`` and ``4*width``.

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3, width: int = 32) -> None:
        super().__init__()
        for name, value in (("num_classes", num_classes), ("in_channels", in_channels), ("width", width)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"SmallCNN: {name}={value!r} must be a positive integer.")
        self.features = nn.Sequential(
            _conv_bn_relu(in_channels, width),
            nn.MaxPool2d(2),
            _conv_bn_relu(width, 2 * width),
            nn.MaxPool2d(2),
            _conv_bn_relu(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"SmallCNN expects images [B, C, H, W]; got a tensor of shape {tuple(x.shape)}.")
        return self.head(self.features(x).flatten(1))
