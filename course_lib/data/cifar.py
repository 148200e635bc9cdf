"""CIFAR-10 through torchvision, with the same interface and keys as the generated shapes.

The course never *requires* the internet: CIFAR-10 is used when it is already on disk (``data_dir()/cifar10``),
downloaded only when ``COURSE_ALLOW_DOWNLOAD`` is not ``"0"``, and otherwise reported with a
:class:`DatasetUnavailable` error that says exactly how to provide it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from PIL import Image
from torchvision.datasets import CIFAR10
from torchvision.datasets.utils import extract_archive

from course_lib import mode
from course_lib.data.errors import DatasetUnavailable
from course_lib.data.imagedata import ImageData, KeyedImages, image_transform

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
ARCHIVE = "cifar-10-python.tar.gz"
# Per-channel statistics of the CIFAR-10 training set (the usual Normalize constants).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
DOWNLOAD_TIMEOUT_S = 20


class KeyedCIFAR10(KeyedImages, CIFAR10):
    """``torchvision.datasets.CIFAR10`` whose ``__getitem__`` also accepts ``(index, aug_seed)`` keys."""

    def load_image(self, index: int) -> tuple[Image.Image, int]:
        """The raw ``(PIL image, label)`` (CIFAR-10 is stored decoded, as one uint8 array)."""
        return Image.fromarray(self.data[index]), int(self.targets[index])


def cifar_root(root: str | Path | None = None) -> Path:
    """``data_dir()/cifar10`` unless ``root`` is given."""
    return Path(root) if root is not None else mode.data_dir() / "cifar10"


def downloads_allowed() -> bool:
    """False when ``COURSE_ALLOW_DOWNLOAD=0`` (offline classrooms, CI)."""
    return os.environ.get("COURSE_ALLOW_DOWNLOAD", "1").strip() != "0"


def _how_to_provide(root: Path, reason: str) -> str:
    return (
        f"CIFAR-10 is not available: {reason}\n"
        "Provide it in one of these ways:\n"
        f"  1. copy the archive {CIFAR10_URL}\n"
        f"     to {root / ARCHIVE} (it is extracted on first use), or extract it so that\n"
        f"     {root / CIFAR10.base_folder} exists;\n"
        "  2. allow a download on a machine with internet access: unset COURSE_ALLOW_DOWNLOAD (or set it to 1);\n"
        "  3. use the offline dataset instead: load_image_datasets(name=\"shapes\")."
    )


def cifar_present(root: Path) -> bool:
    """True when the extracted CIFAR-10 batches are all in ``root``."""
    folder = root / CIFAR10.base_folder
    return all((folder / name).is_file() for name, _ in CIFAR10.train_list + CIFAR10.test_list)


def ensure_cifar10(root: str | Path | None = None, *, download: bool | None = None) -> Path:
    """Make sure CIFAR-10 is extracted under ``root``; raise :class:`DatasetUnavailable` (quickly) if it cannot be.

    ``download``: ``None`` follows ``COURSE_ALLOW_DOWNLOAD``; ``False`` never downloads (the training command line,
    which points at ``python -m course_lib data prepare --which cifar10`` instead).
    """
    root = cifar_root(root)
    if cifar_present(root):
        return root
    if (root / ARCHIVE).is_file():
        extract_archive(str(root / ARCHIVE), str(root))
        if cifar_present(root):
            return root
        raise DatasetUnavailable(_how_to_provide(root, f"{root / ARCHIVE} did not contain the expected files."))
    if download is False:
        raise DatasetUnavailable(_how_to_provide(root, f"it is not in {root}, and this command does not download."))
    if not downloads_allowed():
        raise DatasetUnavailable(_how_to_provide(root, f"it is not in {root} and COURSE_ALLOW_DOWNLOAD=0."))
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)  # an unreachable network fails in seconds, not minutes
    try:
        root.mkdir(parents=True, exist_ok=True)
        CIFAR10(str(root), train=True, download=True)
    except Exception as error:  # any failure means "not available"; the cause is chained
        raise DatasetUnavailable(_how_to_provide(root, f"the download failed ({error!r}).")) from error
    finally:
        socket.setdefaulttimeout(previous)
    return root


def load_cifar10(*, root: str | Path | None = None, augment: bool = True, size: int | None = None,
                 download: bool | None = None) -> ImageData:
    """CIFAR-10 train/val (the official test split) as keyed datasets; see :func:`load_image_datasets`."""
    folder = ensure_cifar10(root, download=download)
    size = size or 32
    train = KeyedCIFAR10(str(folder), train=True, download=False,
                         transform=image_transform(size, CIFAR10_MEAN, CIFAR10_STD, augment=augment, crop="pad"))
    val = KeyedCIFAR10(str(folder), train=False, download=False,
                       transform=image_transform(size, CIFAR10_MEAN, CIFAR10_STD, augment=False))
    return ImageData(train=train, val=val, num_classes=len(train.classes), image_size=size,
                     class_names=list(train.classes), root=folder, mean=CIFAR10_MEAN, std=CIFAR10_STD,
                     name="cifar10")
