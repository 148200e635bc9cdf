"""Check a generated dataset against its manifest, and repair it: the data is what ``meta.json`` says, or an error.

A generated dataset is a folder of files plus ``meta.json``, which records the class list and every file's size
and CRC-32 (see :mod:`course_lib.data.shapes`). Damage is easy to cause and silent without a check: a deleted
*validation* class folder shifts every validation label after it; an extra class folder makes an 11-class model;
a truncated JPEG fails deep inside a DataLoader worker. So:

* :func:`check_shapes` (each time the data is loaded): the class folders of ``train/`` and ``val/`` are exactly the
  stored class list, and every file is there with its recorded size. Sizes come from ``stat``: cheap.
* :func:`verify_shapes` (``data prepare`` and ``data info``): the same, plus each file's CRC-32 (reads every byte;
  a fraction of a second for the full dataset).
* :func:`content_damage` (each time an image is read, by ``KeyedImageFolder``): the bytes just read against their
  manifest entry. A CRC-32 of a few KB costs far less than decoding the JPEG, and bytes that rot after the load-time
  check (same size, still decodable) would otherwise train silently on wrong pixels.
* :func:`is_junk`: what every listing of class folders skips (``.DS_Store``, macOS ``._*`` twins, any hidden name).
* :func:`repair_shapes`: every image is a pure function of the generation parameters and its position, so a missing
  or damaged file is drawn again, byte for byte; files and folders the manifest does not list are removed.
"""

from __future__ import annotations

import os
import shutil
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from course_lib import atomic
from course_lib.data.errors import DataError
from course_lib.data.shapes import SPLITS, encode_image, read_meta

REPAIR_HINT = "repair it with `python -m course_lib data prepare`"


def is_junk(name: str) -> bool:
    """A hidden name (``.DS_Store``, macOS's ``._0.jpg`` twins, ``.ipynb_checkpoints``): never a class or a sample."""
    return name.startswith(".")


def content_damage(data: bytes, entry: Sequence[int]) -> str | None:
    """Why ``data`` is not the file its manifest entry ``[size, crc32]`` describes; None when it is."""
    size, crc = entry
    if len(data) != size:
        return f"{len(data)} bytes, expected {size}"
    if zlib.crc32(data) != crc:
        return "contents changed"
    return None


@dataclass
class DataReport:
    """What differs between a dataset folder and its manifest (relative paths)."""

    root: Path
    missing: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    files: int = 0

    @property
    def ok(self) -> bool:
        return not (self.missing or self.damaged or self.extra)

    def summary(self, limit: int = 4) -> str:
        """``"missing val/star/ (8 files), damaged train/circle/3.jpg (size 0, expected 2911)..."``, or ``"intact"``."""
        if self.ok:
            return "intact"
        parts = []
        for label, items in (("missing", self.missing), ("damaged", self.damaged), ("unexpected", self.extra)):
            if items:
                shown = ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")
                parts.append(f"{label}: {shown}")
        return "; ".join(parts)


def _group_missing(root: Path, missing: list[str]) -> list[str]:
    """A whole missing class folder reads better than its every file: ``val/star/ (the whole folder, 8 files)``."""
    by_folder: dict[str, list[str]] = {}
    for path in missing:
        by_folder.setdefault(path.rsplit("/", 1)[0], []).append(path)
    grouped: list[str] = []
    for folder, files in by_folder.items():
        if (root / folder).is_dir():
            grouped.extend(files)
        else:
            grouped.append(f"{folder}/ (the whole class folder, {len(files)} files)")
    return grouped


def _scan(root: Path, meta: dict, *, checksums: bool) -> DataReport:
    report = DataReport(root=root)
    manifest: dict[str, list[int]] = meta.get("files") or {}
    classes = list(meta["class_names"])
    for split in SPLITS:
        split_dir = root / split
        present = sorted(p.name for p in split_dir.iterdir()) if split_dir.is_dir() else []
        for name in present:  # every folder here becomes a class (hidden ones are skipped): only the listed may exist
            if name not in classes and not is_junk(name) and (split_dir / name).is_dir():
                report.extra.append(f"{split}/{name}/")
        for name in classes:
            folder = split_dir / name
            if not folder.is_dir():
                continue
            listed = {k.rsplit("/", 1)[1] for k in manifest if k.startswith(f"{split}/{name}/")}
            for entry in sorted(os.listdir(folder)):
                if entry not in listed and not is_junk(entry):  # .DS_Store and the like are no samples
                    report.extra.append(f"{split}/{name}/{entry}")
    for relative, (size, crc) in manifest.items():
        path = root / relative
        try:
            actual = path.stat().st_size
        except FileNotFoundError:
            report.missing.append(relative)
            continue
        report.files += 1
        if actual != size:
            report.damaged.append(f"{relative} ({actual} bytes, expected {size})")
        elif checksums and (why := content_damage(path.read_bytes(), (size, crc))):
            report.damaged.append(f"{relative} ({why})")
    report.missing = _group_missing(root, report.missing)
    return report


def verify_shapes(root: str | Path, *, checksums: bool = True) -> DataReport:
    """Compare the dataset in ``root`` with its manifest (``checksums=False``: sizes only)."""
    root = Path(root)
    meta = read_meta(root)
    if not meta.get("files"):
        raise DataError(f"{root / 'meta.json'} has no file manifest (an older format); {REPAIR_HINT}.")
    return _scan(root, meta, checksums=checksums)


def check_shapes(root: str | Path) -> None:
    """Raise :class:`DataError` naming what is wrong when ``root`` does not match its manifest (sizes only)."""
    report = verify_shapes(root, checksums=False)
    if not report.ok:
        raise DataError(f"the shapes dataset in {report.root} is damaged ({report.summary()}); training on it would "
                        f"give wrong labels or fail mid-run. {REPAIR_HINT[0].upper() + REPAIR_HINT[1:]}.")


def repair_shapes(root: str | Path) -> DataReport:
    """Restore ``root`` to its manifest: redraw missing or damaged images, delete what is not listed.

    Returns the report of what was wrong before the repair.
    """
    root = Path(root)
    meta = read_meta(root)
    before = _scan(root, meta, checksums=True)
    if before.ok:
        return before
    params, manifest = meta["params"], meta["files"]
    classes = list(meta["class_names"])
    for extra in before.extra:
        path = root / extra.rstrip("/")
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    for relative, (size, crc) in manifest.items():
        path = root / relative
        if path.is_file() and path.stat().st_size == size and content_damage(path.read_bytes(), (size, crc)) is None:
            continue
        split, class_name, file_name = relative.split("/")
        data, _ = encode_image(params, split, classes.index(class_name), int(file_name.split(".")[0]))
        if zlib.crc32(data) != crc:
            raise DataError(f"{path} cannot be redrawn identically (this version of the drawing code or of Pillow "
                            f"differs from the one that generated it); delete {root} and run `python -m course_lib "
                            f"data prepare` to generate it afresh.")
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_bytes(path, data)
    return before
