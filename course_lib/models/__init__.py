"""The course's models: small enough for a laptop CPU, real enough to show every training concern.

* :class:`Block`, :class:`Net` -- the pre-norm residual MLP (``blocks.py``).
* :class:`SmallCNN` -- the image classifier for the shapes and CIFAR-10 data (``cnn.py``).
* :class:`GPTConfig`, :class:`TinyGPT` -- the character-level language model (``gpt.py``).
* :func:`build_model` -- one factory the training template calls by name.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from course_lib.models.blocks import Block, Net
from course_lib.models.cnn import SmallCNN
from course_lib.models.gpt import GPTConfig, TinyGPT

MODEL_NAMES = ("cnn", "net", "gpt")

__all__ = ["Block", "Net", "SmallCNN", "GPTConfig", "TinyGPT", "build_model", "MODEL_NAMES"]


def _need(name: str, arg: str, value: Any) -> None:
    if value is None:
        raise ValueError(f"build_model({name!r}) needs {arg}=...; pass it from the dataset (e.g. data.{arg}).")


def build_model(
    name: str,
    *,
    num_classes: int | None = None,
    vocab_size: int | None = None,
    image_size: int | tuple[int, int] | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Build a model by name.

    * ``"cnn"``: ``SmallCNN(num_classes, in_channels=3, width=32)``; ``kwargs`` go to ``SmallCNN``.
    * ``"net"``: ``Net(d_in=in_channels*H*W, d=128, n_blocks=2, n_out=num_classes)`` on flattened images;
      needs ``image_size``; ``kwargs`` (``d``, ``n_blocks``, ``p``, ``in_channels``) override the sizes.
    * ``"gpt"``: ``TinyGPT(GPTConfig(vocab_size=vocab_size, **kwargs))``.

    Taught in lesson 08 (``notebooks/08_latency_memory.ipynb``).
    """
    if name == "cnn":
        _need(name, "num_classes", num_classes)
        return SmallCNN(num_classes=num_classes, **kwargs)  # type: ignore[arg-type]
    if name == "net":
        _need(name, "num_classes", num_classes)
        _need(name, "image_size", image_size)
        hw = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)  # type: ignore[arg-type]
        in_channels = kwargs.pop("in_channels", 3)
        d = kwargs.pop("d", 128)
        n_blocks = kwargs.pop("n_blocks", 2)
        return Net(d_in=in_channels * math.prod(hw), d=d, n_blocks=n_blocks, n_out=num_classes, **kwargs)  # type: ignore[arg-type]
    if name == "gpt":
        _need(name, "vocab_size", vocab_size)
        return TinyGPT(GPTConfig(vocab_size=vocab_size, **kwargs))  # type: ignore[arg-type]
    raise ValueError(f"model {name!r} is not one of {MODEL_NAMES}.")
