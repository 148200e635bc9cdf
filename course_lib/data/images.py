"""Image datasets that decode and augment in ``__getitem__``, and :func:`load_image_datasets`.

Each sample is produced on demand: read the file, decode the JPEG, augment, convert to a normalised float tensor.
That per-sample CPU work is exactly what ``DataLoader(num_workers=...)`` parallelises; doing it in
``__getitem__`` (not once up front) is what lets workers overlap it with the model's compute.

Keys are ``int`` or ``(index, aug_seed)`` (see :mod:`course_lib.data.keys`): with a seed, the random crop, flip
and colour jitter are a pure function of that seed, so a resumed run, or one with a different number of workers,
sees exactly the same pixels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

from course_lib.data.errors import DataError
from course_lib.data.keys import split_key, with_seed
from course_lib.data.shapes import SHAPES_IMAGE_SIZE, prepare_shapes, read_meta
from course_lib.data.verify import check_shapes


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


class KeyedImageFolder(ImageFolder):
    """``torchvision.datasets.ImageFolder`` whose ``__getitem__`` also accepts ``(index, aug_seed)``.

    The folder scan (classes = sorted sub-folders, ``self.samples`` = ``(path, label)`` pairs) is
    torchvision's; only the keyed augmentation is added. Module scope, so it pickles under ``spawn``.
    """

    accepts_aug_seed = True

    def __init__(self, root: str | Path, transform: Callable[[Image.Image], torch.Tensor]) -> None:
        super().__init__(str(root), transform=transform)

    def load_image(self, index: int) -> tuple[Image.Image, int]:
        """Read and decode one JPEG (no augmentation): the raw ``(PIL image, label)``.

        A file that cannot be decoded raises :class:`DataError` naming it (PIL's own message does not).
        """
        path, label = self.samples[index]
        try:
            with Image.open(path) as image:
                return image.convert("RGB"), label
        except (OSError, SyntaxError, ValueError) as exc:  # PIL raises these for truncated or foreign files
            raise DataError(f"{path} cannot be decoded ({exc}); the file is damaged. Repair the data with "
                            "`python -m course_lib data prepare`, or replace that file.") from None

    def __getitem__(self, key: Any) -> tuple[torch.Tensor, int]:  # type: ignore[override]
        index, aug_seed = split_key(key, len(self.samples))
        image, label = self.load_image(index)
        assert self.transform is not None
        return with_seed(lambda: self.transform(image), aug_seed), label


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


def load_image_datasets(
    name: str = "shapes", *, root: str | Path | None = None, augment: bool = True, size: int | None = None,
    download: bool | None = None,
) -> ImageData:
    """Build the train/val datasets of ``name`` (``"shapes"`` or ``"cifar10"``).

    ``size`` is the side length in pixels the model sees (default 32 for both). ``augment=False`` turns off the
    training augmentation (useful to look at the data, or to measure what augmentation costs). ``root``
    overrides the data folder. ``"shapes"`` is generated on first use (tqdm bar); ``"cifar10"`` raises
    :class:`DatasetUnavailable` with instructions when it is not on disk and cannot be downloaded
    (``download=False``: never try; ``None``: as ``COURSE_ALLOW_DOWNLOAD`` says).
    """
    if size is not None and (not isinstance(size, int) or size < 8):
        raise ValueError(f"load_image_datasets: size={size!r} must be an int >= 8 (side length in pixels).")
    if name == "cifar10":
        from course_lib.data.cifar import load_cifar10

        return load_cifar10(root=root, augment=augment, size=size, download=download)
    if name != "shapes":
        raise ValueError(f"load_image_datasets: name={name!r} is unknown; use 'shapes' (offline) or 'cifar10'.")
    folder = prepare_shapes(root)
    check_shapes(folder)  # class folders and file sizes as generated, or a DataError naming what is not
    meta = read_meta(folder)
    size = size or SHAPES_IMAGE_SIZE
    mean, std = tuple(meta["mean"]), tuple(meta["std"])
    train = KeyedImageFolder(folder / "train", image_transform(size, mean, std, augment=augment))
    val = KeyedImageFolder(folder / "val", image_transform(size, mean, std, augment=False))
    for split in (train, val):  # checked above; this states the invariant the labels rely on
        if split.classes != sorted(meta["class_names"]):
            raise DataError(f"{split.root}: class folders {split.classes} differ from the stored class list "
                            f"{sorted(meta['class_names'])}; repair it with `python -m course_lib data prepare`.")
    return ImageData(train=train, val=val, num_classes=len(train.classes), image_size=size,
                     class_names=list(train.classes), root=folder, mean=mean, std=std, name="shapes")
