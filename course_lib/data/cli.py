"""``python -m course_lib data prepare|info``: generate the offline data once, or show where it lives.

``prepare`` is what ``make lab`` and ``make test`` run first: it generates what is missing, then verifies the
shapes against their manifest (class folders, file sizes and CRC-32s: well under a second) and repairs whatever is
damaged, saying what it repaired. ``info`` reports what is on disk, damage included, never just what
``meta.json`` claims.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from course_lib import mode
from course_lib.argparsing import CommandParser

WHICH = ("shapes", "text", "cifar10")


def _parse_which(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in WHICH]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--which {value!r}: choose a comma-separated subset of {','.join(WHICH)}")
    return names


def _folder_size(path: Path) -> tuple[int, int]:
    files = [p for p in path.rglob("*") if p.is_file()] if path.exists() else []
    return len(files), sum(p.stat().st_size for p in files)


def prepare(which: list[str], quiet: bool) -> int:
    # shapes and corpus import neither torch nor torchvision: a no-op prepare stays fast.
    from course_lib.data.corpus import prepare_text
    from course_lib.data.shapes import prepare_shapes

    for name in which:
        if name == "shapes":
            from course_lib.data.errors import DataError
            from course_lib.data.verify import repair_shapes, verify_shapes

            path = prepare_shapes(progress=not quiet)
            try:
                damage = repair_shapes(path)
                after = verify_shapes(path)
            except DataError as error:
                print(f"error: {error}", file=sys.stderr)
                return 1
            if not damage.ok:
                print(f"shapes: repaired {path} ({damage.summary()})", file=sys.stderr)
            if not after.ok:
                print(f"error: shapes in {path} are still damaged after the repair ({after.summary()}); delete "
                      f"{path} and run this command again.", file=sys.stderr)
                return 1
        elif name == "text":
            path = prepare_text()
        else:
            from course_lib.data.cifar import ensure_cifar10
            from course_lib.data.errors import DatasetUnavailable

            try:
                path = ensure_cifar10()
            except DatasetUnavailable as error:
                print(error, file=sys.stderr)
                return 1
        if not quiet:
            print(f"{name}: ready in {path}")
    return 0


def info() -> int:
    from course_lib.data.cifar import cifar_present, cifar_root
    from course_lib.data.corpus import text_root
    from course_lib.data.shapes import META_FILE, read_meta, shapes_root

    print(f"mode: {mode.mode()}    data dir: {mode.data_dir()}  (COURSE_DATA_DIR)")
    from course_lib.data.errors import DataError
    from course_lib.data.verify import is_junk, verify_shapes

    shapes = shapes_root()
    try:
        meta = read_meta(shapes) if (shapes / META_FILE).is_file() else None
    except DataError as error:  # info tells what is on disk, a damaged manifest included
        print(f"shapes:  {shapes}\n  DAMAGED: {error}")
        meta = {}
    if meta:
        files, size = _folder_size(shapes)
        on_disk = {split: sum(1 for p in (shapes / split).rglob("*.jpg") if not is_junk(p.name))
                   if (shapes / split).is_dir() else 0 for split in ("train", "val")}
        print(f"shapes:  {shapes}\n  {on_disk['train']} train / {on_disk['val']} val JPEGs on disk "
              f"(generated: {meta['counts']['train']} / {meta['counts']['val']}), "
              f"{meta['image_size']}x{meta['image_size']} px stored, {files} files, {size / 1e6:.1f} MB")
        print(f"  classes ({len(meta['class_names'])}): {', '.join(sorted(meta['class_names']))}")
        try:
            report = verify_shapes(shapes)
            state = "verified: every file matches the manifest" if report.ok else (
                f"DAMAGED: {report.summary()}; repair with `python -m course_lib data prepare`")
        except DataError as error:
            state = f"cannot verify: {error}"
        print(f"  {state}")
    elif meta is None:
        print(f"shapes:  {shapes}  (not generated yet: python -m course_lib data prepare)")
    text = text_root()
    if (text / "meta.json").is_file():
        lines = {s: (text / f"{s}.txt").read_text().splitlines() for s in ("train", "val")}
        lengths = [len(line) for line in lines["train"]]
        print(f"text:    {text}\n  {len(lines['train'])} train / {len(lines['val'])} val lines, "
              f"{min(lengths)}..{max(lengths)} characters per line, "
              f"{len(set(''.join(lines['train'])))} distinct characters")
    else:
        print(f"text:    {text}  (not generated yet: python -m course_lib data prepare)")
    cifar = cifar_root()
    state = ("present" if cifar_present(cifar)
             else "absent (optional; load_image_datasets('cifar10') explains how to add it)")
    allow = os.environ.get("COURSE_ALLOW_DOWNLOAD", "1")
    print(f"cifar10: {cifar}  {state}; COURSE_ALLOW_DOWNLOAD={allow}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser(prog="python -m course_lib data", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    p_prepare = sub.add_parser("prepare", help="generate what the current mode needs (idempotent, fast when done)")
    p_prepare.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    p_prepare.add_argument("--which", type=_parse_which, default=["shapes", "text"],
                           help="comma-separated subset of shapes,text,cifar10 (default: shapes,text)")
    p_prepare.add_argument("--mode", choices=mode.MODES, help="override COURSE_MODE for this command")
    p_info = sub.add_parser("info", help="print where the data lives, sizes and class names")
    p_info.add_argument("--mode", choices=mode.MODES, help="override COURSE_MODE for this command")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.mode:
        os.environ["COURSE_MODE"] = args.mode
    if args.action == "prepare":
        return prepare(args.which, args.quiet)
    return info()


if __name__ == "__main__":
    raise SystemExit(main())
