"""The offline default dataset: coloured geometric shapes, generated as JPEG files.

Why generate images instead of downloading a benchmark? The course must run offline on a laptop, and the lessons
about input pipelines need *real files* whose decoding and augmentation cost real CPU time (the classic
"the accelerator idles while a few workers decode JPEGs" bottleneck). So :func:`generate_shapes` draws each
image with PIL and stores it as an individual JPEG in the layout that ``torchvision.datasets.ImageFolder`` and
most tools expect::

    root/train/<class>/<i>.jpg
    root/val/<class>/<i>.jpg
    root/meta.json          # written last: class names, sizes, seed, per-channel mean/std, and the
                            # manifest: every file's size and CRC-32, so damage can be found and repaired

Every image is a pure function of ``(seed, split, class, i)``: same seed, same bytes. Train and validation
images come from different random streams, so the splits are disjoint. Colour, size, position, rotation,
background clutter and pixel noise are all random, so the task is learnable by a small CNN but not trivial.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import zlib
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from course_lib import mode
from course_lib.data.errors import DataError
from course_lib.progress import tqdm

CLASS_NAMES: tuple[str, ...] = (
    "circle", "square", "triangle", "star", "cross", "ring", "hexagon", "diamond", "arrow", "crescent",
)
SPLITS: tuple[str, ...] = ("train", "val")
# Stored resolution of the JPEGs, and the default side length the model sees after augmentation (the random
# resized crop downsamples, which is part of the per-sample CPU cost a DataLoader worker pays).
SHAPES_STORED_SIZE = 96
SHAPES_IMAGE_SIZE = 32
# Images per class (train, val) by mode: smoke checks the wiring in seconds, full is what a learner trains on.
SHAPES_SIZES = {"smoke": (24, 8), "full": (500, 100)}
META_FILE = "meta.json"
FORMAT_VERSION = 2  # bump when the drawing or meta.json changes, so old caches are regenerated (2: manifest)
SUPERSAMPLE = 2  # draw at 2x and downscale: smooth (anti-aliased) edges like a photographed object

Points = list[tuple[float, float]]

# --- shape outlines, in unit coordinates (radius 1 around the origin) ---------------------------------------
def _regular(n: int, phase: float = 0.0) -> Points:
    return [(math.cos(phase + 2 * math.pi * k / n), math.sin(phase + 2 * math.pi * k / n)) for k in range(n)]

def _star(points: int = 5, inner: float = 0.45) -> Points:
    out: Points = []
    for k in range(2 * points):
        radius = 1.0 if k % 2 == 0 else inner
        angle = -math.pi / 2 + math.pi * k / points
        out.append((radius * math.cos(angle), radius * math.sin(angle)))
    return out

def _cross(arm: float = 0.34) -> Points:
    a = arm
    return [(-a, -1), (a, -1), (a, -a), (1, -a), (1, a), (a, a), (a, 1), (-a, 1), (-a, a), (-1, a), (-1, -a), (-a, -a)]

def _arrow() -> Points:
    return [(-1, -0.17), (0.15, -0.17), (0.15, -0.62), (1, 0), (0.15, 0.62), (0.15, 0.17), (-1, 0.17)]

POLYGONS: dict[str, Points] = {
    "square": _regular(4, math.pi / 4),
    "triangle": _regular(3, -math.pi / 2),
    "star": _star(),
    "cross": _cross(),
    "hexagon": _regular(6),
    "diamond": [(0, -1), (0.55, 0), (0, 1), (-0.55, 0)],
    "arrow": _arrow(),
}

def _place(points: Points, cx: float, cy: float, r: float, theta: float) -> Points:
    """Rotate by ``theta``, scale by ``r`` and move to ``(cx, cy)``."""
    c, s = math.cos(theta), math.sin(theta)
    return [(cx + r * (x * c - y * s), cy + r * (x * s + y * c)) for x, y in points]

def _shape_mask(name: str, size: int, cx: float, cy: float, r: float, theta: float) -> Image.Image:
    """A greyscale mask (255 = shape) of one shape on a ``size`` x ``size`` canvas."""
    mask = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(mask)
    box = (cx - r, cy - r, cx + r, cy + r)
    if name == "circle":
        draw.ellipse(box, fill=255)
    elif name == "ring":
        draw.ellipse(box, fill=255)
        inner = 0.58 * r
        draw.ellipse((cx - inner, cy - inner, cx + inner, cy + inner), fill=0)
    elif name == "crescent":
        draw.ellipse(box, fill=255)
        dx, dy = 0.45 * r * math.cos(theta), 0.45 * r * math.sin(theta)
        cut = 0.85 * r
        draw.ellipse((cx + dx - cut, cy + dy - cut, cx + dx + cut, cy + dy + cut), fill=0)
    else:
        draw.polygon(_place(POLYGONS[name], cx, cy, r, theta), fill=255)
    return mask

def _colour(rng: np.random.Generator, lo: int, hi: int) -> tuple[int, int, int]:
    return tuple(int(v) for v in rng.integers(lo, hi, size=3))  # type: ignore[return-value]

def draw_shape(name: str, rng: np.random.Generator, image_size: int) -> Image.Image:
    """Draw one RGB image of the shape ``name`` using only ``rng`` for randomness."""
    size = image_size * SUPERSAMPLE
    # Background: a random colour, either dark or light, so the shape can take the opposite brightness.
    dark_background = rng.random() < 0.5
    bg = _colour(rng, 0, 110) if dark_background else _colour(rng, 145, 256)
    fg = _colour(rng, 140, 256) if dark_background else _colour(rng, 0, 115)
    image = Image.new("RGB", (size, size), bg)
    draw = ImageDraw.Draw(image)
    # Clutter behind the shape: thin lines and small blobs in colours close to the background.
    for _ in range(int(rng.integers(3, 9))):
        shade = tuple(int(np.clip(c + rng.integers(-60, 61), 0, 255)) for c in bg)
        x0, y0, x1, y1 = (float(v) for v in rng.uniform(0, size, size=4))
        draw.line((x0, y0, x1, y1), fill=shade, width=int(rng.integers(1, 3 * SUPERSAMPLE)))
    for _ in range(int(rng.integers(1, 5))):
        shade = tuple(int(np.clip(c + rng.integers(-70, 71), 0, 255)) for c in bg)
        bx, by = (float(v) for v in rng.uniform(0, size, size=2))
        br = float(rng.uniform(0.02, 0.07)) * size
        draw.ellipse((bx - br, by - br, bx + br, by + br), fill=shade)
    # The shape: random radius, position (kept mostly inside the frame), rotation.
    r = float(rng.uniform(0.24, 0.40)) * size
    cx, cy = (float(v) for v in rng.uniform(r * 0.9, size - r * 0.9, size=2))
    theta = float(rng.uniform(0, 2 * math.pi))
    mask = _shape_mask(name, size, cx, cy, r, theta)
    image.paste(Image.new("RGB", (size, size), fg), (0, 0), mask)
    image = image.resize((image_size, image_size), Image.Resampling.BILINEAR)
    if rng.random() < 0.3:
        image = image.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.3, 1.0))))
    # Sensor-like pixel noise.
    pixels = np.asarray(image, dtype=np.float32)
    pixels += rng.normal(0.0, float(rng.uniform(4, 16)), size=pixels.shape).astype(np.float32)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")

def _image_rng(seed: int, split: str, class_index: int, i: int) -> np.random.Generator:
    # A separate stream per (seed, split, class, i): images are independent of generation order, and the
    # train and val streams never coincide.
    return np.random.default_rng([seed, SPLITS.index(split), class_index, i])

def is_complete(root: Path, params: dict) -> bool:
    """True when ``root`` holds a finished generation made with exactly ``params``."""
    meta_path = Path(root) / META_FILE
    if not meta_path.is_file():
        return False
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(meta, dict) and meta.get("params") == params

META_KEYS = ("params", "class_names", "counts", "image_size", "mean", "std")


def read_meta(root: Path) -> dict:
    """The ``meta.json`` of a generated dataset (class names, sizes, mean/std); :class:`DataError` when it is
    missing, cut short or not what generation writes (a copy interrupted half-way, a full disk)."""
    path = Path(root) / META_FILE
    fix = "`python -m course_lib data prepare` generates the dataset again"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path} is missing, so {root} holds no complete dataset; {fix}.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        why = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
        raise DataError(f"{path} is damaged (cut short, or not JSON: {why}); {fix}.") from None
    missing = [k for k in META_KEYS if k not in meta] if isinstance(meta, dict) else list(META_KEYS)
    if missing:
        raise DataError(f"{path} is damaged (it lacks {', '.join(missing)}); {fix}.")
    return meta

def generate_shapes(
    root: str | Path,
    *,
    n_train: int,
    n_val: int,
    image_size: int,
    seed: int = 0,
    quality: int = 90,
    progress: bool = True,
) -> Path:
    """Generate the shapes dataset under ``root`` (idempotent) and return ``root``.

    ``n_train`` and ``n_val`` are images *per class*; ``image_size`` is the stored side length in pixels.
    If ``root/meta.json`` exists with the same parameters nothing is done. Otherwise the images are written to a
    private scratch folder beside ``root``, ``meta.json`` last, and the folder is renamed to ``root`` in one
    step: an interrupted generation leaves no half-filled ``root`` (it is redone on the next call), and two
    processes generating at once (say, parallel test workers) never see each other's partial files.
    """
    for name, value, low in (("n_train", n_train, 1), ("n_val", n_val, 1), ("image_size", image_size, 8)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"generate_shapes: {name}={value!r} must be an int >= {low}.")
    if not 1 <= quality <= 95:
        raise ValueError(f"generate_shapes: quality={quality!r} must be in 1..95 (JPEG quality).")
    root = Path(root)
    params = {
        "format": FORMAT_VERSION, "n_train": n_train, "n_val": n_val, "image_size": image_size,
        "seed": int(seed), "quality": quality, "classes": list(CLASS_NAMES),
    }
    if is_complete(root, params):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_scratch(root)
    scratch = root.parent / f".{root.name}.partial-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    if scratch.is_symlink():  # rmtree refuses a link; writing into it would fill the folder it points to
        scratch.unlink()
    try:
        scratch.mkdir()  # ours alone: fails rather than reuse whatever sits at that name
        _write_images(scratch, params, progress=progress, label=str(root))
        if is_complete(root, params):  # another process finished first: keep its copy
            return root
        shutil.rmtree(root, ignore_errors=True)  # an outdated or interrupted generation
        try:
            os.rename(scratch, root)  # atomic on one filesystem
        except OSError:
            if not is_complete(root, params):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return root


def _remove_abandoned_scratch(root: Path) -> None:
    """Delete scratch folders left by generations that were killed (their process no longer exists)."""
    for folder in root.parent.glob(f".{root.name}.partial-*"):
        pid = folder.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def encode_image(params: dict, split: str, class_index: int, i: int) -> tuple[bytes, Image.Image]:
    """The JPEG bytes (and the image) of one sample: a pure function of ``params`` and its position."""
    image = draw_shape(CLASS_NAMES[class_index], _image_rng(params["seed"], split, class_index, i),
                       params["image_size"])
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=params["quality"])
    return buffer.getvalue(), image


def image_path(split: str, class_name: str, i: int) -> str:
    """The ``/``-separated path of one sample relative to the dataset root (the manifest's key)."""
    return f"{split}/{class_name}/{i}.jpg"


def _write_images(folder: Path, params: dict, *, progress: bool, label: str) -> None:
    """Draw and save every image of ``params`` under ``folder``, then write ``meta.json``."""
    n_train, n_val = params["n_train"], params["n_val"]
    for split in SPLITS:
        for name in CLASS_NAMES:
            (folder / split / name).mkdir(parents=True, exist_ok=True)
    jobs = [(split, c, i) for split, n in (("train", n_train), ("val", n_val))
            for c in range(len(CLASS_NAMES)) for i in range(n)]
    channel_sum = np.zeros(3)
    channel_sq = np.zeros(3)
    files: dict[str, list[int]] = {}
    for split, c, i in tqdm(jobs, desc=f"generating shapes in {label}", unit="img", disable=not progress,
                            mininterval=0.5):
        data, image = encode_image(params, split, c, i)
        relative = image_path(split, CLASS_NAMES[c], i)
        (folder / relative).write_bytes(data)
        files[relative] = [len(data), zlib.crc32(data)]
        if split == "train":  # statistics for Normalize, from the training split only
            pixels = np.asarray(image, dtype=np.float64).reshape(-1, 3) / 255.0
            channel_sum += pixels.mean(0)
            channel_sq += (pixels**2).mean(0)
    count = n_train * len(CLASS_NAMES)
    mean = channel_sum / count
    std = np.sqrt(np.maximum(channel_sq / count - mean**2, 1e-12))
    meta = {
        "params": params,
        "class_names": list(CLASS_NAMES),
        "counts": {"train": count, "val": n_val * len(CLASS_NAMES)},
        "image_size": params["image_size"],
        "mean": [round(float(m), 4) for m in mean],
        "std": [round(float(s), 4) for s in std],
        "files": files,  # relative path -> [size in bytes, CRC-32]: what `data prepare` verifies and repairs
    }
    (folder / META_FILE).write_text(json.dumps(meta, indent=2))  # last: marks the folder complete


def shapes_root(root: str | Path | None = None) -> Path:
    """Where the shapes for the current mode live: ``data_dir()/shapes-<mode>`` unless ``root`` is given."""
    return Path(root) if root is not None else mode.data_dir() / f"shapes-{mode.mode()}"


def prepare_shapes(root: str | Path | None = None, *, progress: bool = True) -> Path:
    """Generate the mode-sized shapes dataset if it is not complete yet (reads one small file when it is)."""
    n_train, n_val = SHAPES_SIZES[mode.mode()]
    return generate_shapes(shapes_root(root), n_train=n_train, n_val=n_val, image_size=SHAPES_STORED_SIZE,
                           seed=0, progress=progress)
