"""Keep notebooks clean in git: no outputs, no execution counts, no volatile metadata.

``python -m course_lib.nbclean PATH...`` rewrites notebooks in place (folders are searched
for ``*.ipynb``); ``--check`` only reports, exiting 1 when a notebook is dirty. A test runs
the check over the whole repository, so a notebook saved with outputs cannot land.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# Cell metadata worth keeping: tags drive nbval, the exercise builder and the grader.
KEEP_CELL_METADATA = ("tags",)
KEEP_NOTEBOOK_METADATA = ("kernelspec", "language_info")


def clean(nb: dict[str, Any]) -> dict[str, Any]:
    """Return a cleaned copy of the notebook dict ``nb`` (nbformat 4 JSON)."""
    nb = json.loads(json.dumps(nb))
    meta = nb.get("metadata", {})
    nb["metadata"] = {k: meta[k] for k in KEEP_NOTEBOOK_METADATA if k in meta}
    if "language_info" in nb["metadata"]:
        nb["metadata"]["language_info"] = {"name": nb["metadata"]["language_info"].get("name", "python")}
    for cell in nb.get("cells", []):
        cell_meta = cell.get("metadata", {})
        cell["metadata"] = {k: cell_meta[k] for k in KEEP_CELL_METADATA if cell_meta.get(k)}
        cell.pop("id", None) if nb.get("nbformat_minor", 0) < 5 else None
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        else:
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
            if cell.get("cell_type") == "markdown":
                cell.pop("attachments", None) if not cell.get("attachments") else None
    return nb


def dumps(nb: dict[str, Any]) -> str:
    """Serialise the way Jupyter does (1-space indent, trailing newline), so diffs stay small."""
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def notebooks(paths: Iterable[str | Path]) -> list[Path]:
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        elif path.suffix == ".ipynb":
            found.append(path)
        else:
            raise FileNotFoundError(f"{path}: not a notebook or a folder")
    return found


def is_clean(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    return dumps(clean(json.loads(text))) == text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.nbclean", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="notebooks or folders")
    parser.add_argument("--check", action="store_true", help="report dirty notebooks, change nothing")
    args = parser.parse_args(argv)
    dirty = []
    for path in notebooks(args.paths):
        if is_clean(path):
            continue
        dirty.append(path)
        if not args.check:
            path.write_text(dumps(clean(json.loads(path.read_text(encoding="utf-8")))), encoding="utf-8")
    verb = "dirty" if args.check else "cleaned"
    for path in dirty:
        print(f"{verb}: {path}")
    return 1 if (args.check and dirty) else 0


if __name__ == "__main__":
    raise SystemExit(main())
