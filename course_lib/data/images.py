"""The generated shapes as an image folder that decodes and augments in ``__getitem__``, and
:func:`load_image_datasets` (shapes or CIFAR-10).

Each sample is produced on demand: read the file, decode the JPEG, augment, convert to a normalised float tensor.
That per-sample CPU work is exactly what ``DataLoader(num_workers=...)`` parallelises; doing it in
``__getitem__`` (not once up front) is what lets workers overlap it with the model's compute.
Keys and augmentation: :mod:`course_lib.data.imagedata`.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

from course_lib.data.cifar import load_cifar10
from course_lib.data.errors import DataError
from course_lib.data.imagedata import ImageData, KeyedImages, image_transform
from course_lib.data.shapes import SHAPES_IMAGE_SIZE, prepare_shapes, read_meta
from course_lib.data.verify import check_shapes, content_damage, is_junk


def _is_sample(path: str) -> bool:
    """An image file that is not junk (macOS's ``._0.jpg`` has the right extension and no image in it)."""
    return not is_junk(os.path.basename(path)) and has_file_allowed_extension(path, IMG_EXTENSIONS)


class KeyedImageFolder(KeyedImages, ImageFolder):
    """``torchvision.datasets.ImageFolder`` whose ``__getitem__`` also accepts ``(index, aug_seed)``.

    The folder scan (classes = sorted sub-folders, ``self.samples`` = ``(path, label)`` pairs) is
    torchvision's, minus hidden names (``.DS_Store``, ``._*``, hidden folders); the keyed augmentation is added.
    ``manifest`` (path relative to ``root`` -> ``[size, crc32]``, from ``meta.json``) checks each file's bytes as
    they are read. Module scope, so it pickles under ``spawn``.
    """

    def __init__(self, root: str | Path, transform: Callable[[Image.Image], torch.Tensor],
                 manifest: Mapping[str, Sequence[int]] | None = None) -> None:
        self.manifest = manifest
        super().__init__(str(root), transform=transform, is_valid_file=_is_sample)

    def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
        classes, _ = super().find_classes(directory)
        classes = [c for c in classes if not is_junk(c)]
        return classes, {c: i for i, c in enumerate(classes)}

    def load_image(self, index: int) -> tuple[Image.Image, int]:
        """Read and decode one JPEG (no augmentation): the raw ``(PIL image, label)``.

        A file that cannot be decoded raises :class:`DataError` naming it (PIL's own message does not).
        """
        path, label = self.samples[index]
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise DataError(f"{path} cannot be read ({exc.strerror or exc}); repair the data with "
                            "`python -m course_lib data prepare`.") from None
        entry = None if self.manifest is None else self.manifest.get(
            os.path.relpath(path, self.root).replace(os.sep, "/"))
        why = None if entry is None else content_damage(data, entry)
        if why is not None:
            raise DataError(f"{path} is damaged ({why} since it was generated); training on it would use wrong "
                            "pixels. Repair the data with `python -m course_lib data prepare`.")
        try:
            with Image.open(io.BytesIO(data)) as image:
                return image.convert("RGB"), label
        except (OSError, SyntaxError, ValueError) as exc:  # PIL raises these for truncated or foreign files
            raise DataError(f"{path} cannot be decoded ({exc}); the file is damaged. Repair the data with "
                            "`python -m course_lib data prepare`, or replace that file.") from None


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

    Taught in lesson 00 (``notebooks/00_welcome.ipynb``).
    """
    if size is not None and (not isinstance(size, int) or size < 8):
        raise ValueError(f"load_image_datasets: size={size!r} must be an int >= 8 (side length in pixels).")
    if name == "cifar10":
        return load_cifar10(root=root, augment=augment, size=size, download=download)
    if name != "shapes":
        raise ValueError(f"load_image_datasets: name={name!r} is unknown; use 'shapes' (offline) or 'cifar10'.")
    folder = prepare_shapes(root)
    check_shapes(folder)  # class folders and file sizes as generated, or a DataError naming what is not
    meta = read_meta(folder)
    size = size or SHAPES_IMAGE_SIZE
    mean, std = tuple(meta["mean"]), tuple(meta["std"])
    files = meta.get("files") or {}

    def manifest(split: str) -> dict[str, list[int]]:
        return {k.split("/", 1)[1]: v for k, v in files.items() if k.startswith(split + "/")}

    train = KeyedImageFolder(folder / "train", image_transform(size, mean, std, augment=augment), manifest("train"))
    val = KeyedImageFolder(folder / "val", image_transform(size, mean, std, augment=False), manifest("val"))
    for split in (train, val):  # checked above; this states the invariant the labels rely on
        if split.classes != sorted(meta["class_names"]):
            raise DataError(f"{split.root}: class folders {split.classes} differ from the stored class list "
                            f"{sorted(meta['class_names'])}; repair it with `python -m course_lib data prepare`.")
    return ImageData(train=train, val=val, num_classes=len(train.classes), image_size=size,
                     class_names=list(train.classes), root=folder, mean=mean, std=std, name="shapes")
