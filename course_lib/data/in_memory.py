"""The whole dataset as one tensor on the device: batching and augmentation without a DataLoader.

When a dataset is small enough to fit in device memory (CIFAR-10 is 150 MB as uint8), the fastest input
pipeline has no host-side work at all: keep every image as ``uint8`` on the device, draw the order with
``torch.randperm``, and do the random crop, flip and normalisation on whole batches there. No decode, no
workers, no host-to-device copy per step. The catch: augmentation is limited to what can be written as tensor
operations, and it only works while the data fits. (This is different from a DataLoader with pinned memory,
which still prepares every batch on the host.)

:func:`load_image_tensors` provides the uint8 tensors (decoded once and cached as a ``.pt`` next to the data).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from course_lib import atomic
from course_lib.data.sampler import aug_seed_for
from course_lib.progress import tqdm


def to_uint8_tensors(dataset, *, size: int, progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode every image of ``dataset`` (no augmentation), resized to ``size``: ``(uint8[N,C,H,W], int64[N])``.

    ``dataset`` must offer ``load_image(index) -> (PIL image, label)``, as the course's image datasets do.
    """
    if not hasattr(dataset, "load_image"):
        raise TypeError(f"to_uint8_tensors: {type(dataset).__name__} has no load_image(index); use a dataset from "
                        "load_image_datasets().")
    n = len(dataset)
    images = torch.empty(n, 3, size, size, dtype=torch.uint8)
    labels = torch.empty(n, dtype=torch.long)
    for i in tqdm(range(n), desc="decoding to tensors", unit="img", disable=not progress, mininterval=0.5):
        image, label = dataset.load_image(i)
        if image.size != (size, size):
            image = image.resize((size, size), Image.Resampling.BILINEAR)
        images[i] = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)
        labels[i] = label
    return images, labels


@dataclass
class ImageTensors:
    """A whole image dataset as uint8 tensors (on the CPU), with what is needed to normalise it."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    val_images: torch.Tensor
    val_labels: torch.Tensor
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: list[str]
    image_size: int

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def load_image_tensors(name: str = "shapes", *, root: str | Path | None = None, size: int | None = None,
                       progress: bool = True) -> ImageTensors:
    """``name``'s train and val splits as uint8 tensors, cached as ``tensors-<size>px.pt`` next to the data.

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    from course_lib.data.images import load_image_datasets  # local: images imports nothing from here

    data = load_image_datasets(name, root=root, augment=False, size=size)
    cache = Path(data.root) / f"tensors-{data.image_size}px.pt"
    if cache.is_file():
        try:
            saved = torch.load(cache, weights_only=True)
            return ImageTensors(**{**saved, "mean": tuple(saved["mean"]), "std": tuple(saved["std"])})
        except Exception:  # a truncated or stale cache is simply rebuilt
            cache.unlink(missing_ok=True)
    train_images, train_labels = to_uint8_tensors(data.train, size=data.image_size, progress=progress)
    val_images, val_labels = to_uint8_tensors(data.val, size=data.image_size, progress=progress)
    result = ImageTensors(train_images, train_labels, val_images, val_labels, tuple(data.mean), tuple(data.std),
                          list(data.class_names), data.image_size)
    # Atomic: a reader never sees half a file, and parallel test workers may build it at once.
    atomic.torch_save({**result.__dict__, "mean": list(result.mean), "std": list(result.std)}, cache)
    return result


class DeviceBatcher:
    """Iterate ``(x float normalised [B,C,H,W], y [B])`` batches from uint8 images kept on ``device``.

    Each epoch's order is ``torch.randperm`` with a generator seeded from ``(seed, epoch)``; the augmentation
    (pad-and-crop by ``padding`` pixels, horizontal flip) is drawn from the same generator, so an epoch is
    reproducible. Call :meth:`set_epoch` before each epoch, as with a distributed sampler.
    ``mean``/``std`` default to the per-channel statistics of ``images_uint8`` itself. ``shuffle=False`` and
    ``augment=False`` give a stable validation pass.

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """

    def __init__(
        self,
        images_uint8: torch.Tensor,
        labels: torch.Tensor,
        *,
        batch_size: int,
        device: str | torch.device,
        augment: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        shuffle: bool = True,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        padding: int | None = None,
    ) -> None:
        if not isinstance(images_uint8, torch.Tensor) or images_uint8.dtype != torch.uint8 or images_uint8.dim() != 4:
            raise ValueError("DeviceBatcher: images_uint8 must be a uint8 tensor [N, C, H, W], got "
                             f"{getattr(images_uint8, 'dtype', type(images_uint8))} "
                             f"{tuple(getattr(images_uint8, 'shape', ()))}.")
        if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or len(labels) != len(images_uint8):
            raise ValueError(f"DeviceBatcher: labels must be a 1-D tensor with one label per image "
                             f"({len(images_uint8)}), got shape {tuple(getattr(labels, 'shape', ()))}.")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"DeviceBatcher: batch_size={batch_size!r} must be an int >= 1.")
        if drop_last and len(images_uint8) < batch_size:
            raise ValueError(f"DeviceBatcher: batch_size={batch_size} > {len(images_uint8)} images with "
                             "drop_last=True gives zero batches; lower batch_size or pass drop_last=False.")
        _, channels, height, width = images_uint8.shape
        if padding is None:
            padding = max(1, min(height, width) // 8)
        if not isinstance(padding, int) or padding < 0:
            raise ValueError(f"DeviceBatcher: padding={padding!r} must be an int >= 0 (pixels of random shift).")
        self.device = torch.device(device)
        self.images = images_uint8.to(self.device)
        self.labels = labels.to(self.device, dtype=torch.long)
        self.batch_size, self.augment, self.seed = batch_size, augment, int(seed)
        self.drop_last, self.shuffle, self.padding = drop_last, shuffle, padding
        self.epoch = 0
        if mean is None or std is None:
            mean_t, std_t = self._channel_stats()
        if mean is not None:
            mean_t = torch.tensor(mean, dtype=torch.float32)
        if std is not None:
            std_t = torch.tensor(std, dtype=torch.float32)
        if mean_t.numel() != channels or std_t.numel() != channels:
            raise ValueError(f"DeviceBatcher: mean/std need {channels} values (one per channel).")
        self.mean = mean_t.to(self.device).view(1, channels, 1, 1)
        self.std = std_t.to(self.device).view(1, channels, 1, 1)

    def _channel_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        # In chunks, so the statistics never need a float copy of the whole dataset.
        total = torch.zeros(self.images.shape[1], dtype=torch.float64, device=self.device)
        total_sq = torch.zeros_like(total)
        for chunk in self.images.split(4096):
            values = chunk.to(torch.float64) / 255.0
            total += values.mean(dim=(2, 3)).sum(0)
            total_sq += (values**2).mean(dim=(2, 3)).sum(0)
        mean = total / len(self.images)
        std = (total_sq / len(self.images) - mean**2).clamp_min(1e-12).sqrt()
        return mean.float().cpu(), std.float().cpu()

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order and augmentation the next iteration uses."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        n = len(self.images)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _generator(self) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(aug_seed_for(self.seed, self.epoch, 0))

    def _crop_flip(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Random shift (pad with zeros = the mean colour after normalisation, then crop) and horizontal flip,
        for the whole batch at once with one gather."""
        batch, channels, height, width = x.shape
        p = self.padding
        padded = F.pad(x, (p, p, p, p))
        dy = torch.randint(0, 2 * p + 1, (batch,), generator=generator, device=self.device)
        dx = torch.randint(0, 2 * p + 1, (batch,), generator=generator, device=self.device)
        flip = torch.rand(batch, generator=generator, device=self.device) < 0.5
        rows = dy[:, None] + torch.arange(height, device=self.device)  # [B, H]
        cols = dx[:, None] + torch.arange(width, device=self.device)  # [B, W]
        cols = torch.where(flip[:, None], cols.flip(1), cols)  # a flip is just reversed column indices
        b = torch.arange(batch, device=self.device)[:, None, None, None]
        c = torch.arange(channels, device=self.device)[None, :, None, None]
        return padded[b, c, rows[:, None, :, None], cols[:, None, None, :]]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = self._generator()
        n = len(self.images)
        if self.shuffle:
            order = torch.randperm(n, generator=generator, device=self.device)
        else:
            order = torch.arange(n, device=self.device)
        for b in range(len(self)):
            index = order[b * self.batch_size:(b + 1) * self.batch_size]
            x = (self.images[index].float() / 255.0 - self.mean) / self.std
            if self.augment:
                x = self._crop_flip(x, generator)
            yield x, self.labels[index]
