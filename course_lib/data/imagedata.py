"""What every image dataset of the course shares: keyed ``__getitem__``, the transform, the :class:`ImageData` record.

Keys are ``int`` or ``(index, aug_seed)`` (see :mod:`course_lib.data.keys`): with a seed, the random crop, flip
and colour jitter are a pure function of that seed, so a resumed run, or one with a different number of workers,
sees exactly the same pixels. A dataset only says how to read one raw image (``load_image``);
:class:`KeyedImages` does the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision.transforms import v2

from course_lib.data.keys import split_key, with_seed


def image_transform(
    size: int, mean: Sequence[float], std: Sequence[float], *, augment: bool, crop: str = "resized"
) -> Callable[[Image.Image], torch.Tensor]:
    """The PIL -> normalised tensor pipeline.

    Training (``augment=True``): a random crop (``"resized"``: RandomResizedCrop, which also resamples, the
    costly part; ``"pad"``: CIFAR's classic 4-pixel pad-and-crop), a horizontal flip and a colour jitter.
    Validation: a deterministic resize only, so every evaluation sees the same pixels.
    """
    steps: list[Any] = []
    if augment and crop == "resized":
        steps.append(v2.RandomResizedCrop(size, scale=(0.55, 1.0), ratio=(0.8, 1.25), antialias=True))
    elif augment and crop == "pad":
        steps += [v2.Resize(size, antialias=True), v2.RandomCrop(size, padding=size // 8, padding_mode="reflect")]
    else:
        steps.append(v2.Resize((size, size), antialias=True))
    if augment:
        steps += [v2.RandomHorizontalFlip(), v2.ColorJitter(brightness=0.3, contrast=0.3, saturation=0.3)]
    steps += [v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
    return v2.Compose(steps)


class KeyedImages:
    """Mixin for a torchvision image dataset: ``__getitem__`` accepts an ``int`` or an ``(index, aug_seed)`` key.

    The dataset provides ``load_image(index) -> (PIL image, label)``, ``__len__`` and ``self.transform``.
    """

    accepts_aug_seed = True
    transform: Callable[[Image.Image], torch.Tensor] | None

    def load_image(self, index: int) -> tuple[Image.Image, int]:
        """The raw ``(PIL image, label)`` at ``index``, before any augmentation (each dataset says how)."""
        raise NotImplementedError

    if TYPE_CHECKING:  # provided by the torchvision dataset class this is mixed into

        def __len__(self) -> int: ...

    def __getitem__(self, key: Any) -> tuple[torch.Tensor, int]:
        index, aug_seed = split_key(key, len(self))
        image, label = self.load_image(index)
        transform = self.transform
        assert transform is not None
        return with_seed(lambda: transform(image), aug_seed), label


@dataclass
class ImageData:
    """What :func:`load_image_datasets` returns.

    ``train``/``val`` yield ``(float tensor [C, H, W] normalised, int label)``; ``mean``/``std`` are the
    per-channel constants used by ``Normalize`` (also what :class:`DeviceBatcher` should use).
    """

    train: Dataset
    val: Dataset
    num_classes: int
    image_size: int
    class_names: list[str]
    root: Path
    mean: tuple[float, ...] = field(default=(0.5, 0.5, 0.5))
    std: tuple[float, ...] = field(default=(0.25, 0.25, 0.25))
    name: str = "shapes"
