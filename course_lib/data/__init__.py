"""Datasets and input pipelines of the course.

Files, one idea each:

* ``shapes.py``    generate the offline JPEG dataset (coloured shapes, deterministic from a seed)
* ``verify.py``    check a generated dataset against its manifest (classes, sizes, CRC-32) and repair it
* ``imagedata.py`` what image datasets share: keyed ``__getitem__``, the transform, :class:`ImageData`
* ``images.py``    the shapes image folder (decode + augment in ``__getitem__``); :func:`load_image_datasets`
* ``cifar.py``     CIFAR-10 through torchvision (offline-first, clear error when absent)
* ``corpus.py``    a generated text corpus (template grammar, one story per line)
* ``text.py``      character-level datasets with variable-length samples and :func:`pad_collate`
* ``keys.py``      ``(index, aug_seed)`` keys: augmentation as a pure function of a seed
* ``sampler.py``   :class:`ResumableSampler`: order from (seed, epoch), sharding, resume position
* ``loaders.py``   :func:`make_loader` (every argument validated) and :func:`seed_worker`
* ``in_memory.py`` :class:`DeviceBatcher`: the whole dataset on the device, augmented there
* ``counting.py``  :class:`CountingDataset`: shows that each worker process has its own copy of the dataset
* ``cli.py``       ``python -m course_lib data prepare|info``

The names below are imported on first use (``course_lib.data.make_loader`` works as usual), so that
``python -m course_lib data prepare`` can check its marker files without paying for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "DatasetUnavailable": "errors", "LoaderConfigError": "errors", "DataError": "errors",
    "DataReport": "verify", "check_shapes": "verify", "repair_shapes": "verify", "verify_shapes": "verify",
    "CLASS_NAMES": "shapes", "generate_shapes": "shapes", "prepare_shapes": "shapes", "shapes_root": "shapes",
    "ImageData": "imagedata", "KeyedImages": "imagedata", "image_transform": "imagedata",
    "KeyedImageFolder": "images", "load_image_datasets": "images",
    "KeyedCIFAR10": "cifar", "ensure_cifar10": "cifar",
    "generate_text": "corpus", "prepare_text": "corpus",
    "IGNORE_INDEX": "text", "CharLinesDataset": "text", "TextData": "text", "load_text_datasets": "text",
    "pad_collate": "text",
    "split_key": "keys", "with_seed": "keys",
    "ResumableSampler": "sampler", "aug_seed_for": "sampler",
    "make_loader": "loaders", "seed_worker": "loaders",
    "CountingDataset": "counting",
    "DeviceBatcher": "in_memory", "ImageTensors": "in_memory", "load_image_tensors": "in_memory",
    "to_uint8_tensors": "in_memory",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'course_lib.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"course_lib.data.{_EXPORTS[name]}"), name)
    globals()[name] = value  # cache: the next access is a plain attribute lookup
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)

