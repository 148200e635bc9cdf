"""Keep notebooks clean in git: no outputs, no execution counts, no volatile metadata.

``python -m course_lib.nbclean PATH...`` rewrites notebooks in place (folders are searched
for ``*.ipynb``); ``--check`` only reports, exiting 1 when a notebook is dirty. A test runs
the check over the whole repository, so a notebook saved with outputs cannot land.

Opening a stored notebook in JupyterLab changes its metadata in memory (the kernel reports its full
``language_info``, Python's version included, and its kernelspec's display name; the widget manager adds an empty
widget state), so the learner's next save would rewrite an untouched lesson and ``git pull`` would refuse to
update it. :func:`keep_stored_metadata`, the course lab's save hook, keeps a stored notebook's own metadata when
it is saved: saving an untouched lesson writes the same bytes on any Python.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from course_lib.argparsing import CommandParser

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
        source = cell.get("source", "")
        cell["source"] = ("".join(source) if isinstance(source, list) else source).splitlines(True)  # as Jupyter
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


def keep_stored_metadata(model: dict[str, Any], path: str, contents_manager: Any, **_: Any) -> None:
    """Jupyter server pre-save hook: a notebook stored in the course's clean form keeps that form's notebook
    metadata (kernelspec, minimal language_info), and an empty widget state is not written.

    Only notebooks whose file on disk is in the clean form are touched (a learner's own notebooks keep what
    JupyterLab writes); cells, outputs and a non-empty widget state are saved as they come.
    """
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    os_path = Path(contents_manager._get_os_path(path)) if hasattr(contents_manager, "_get_os_path") else None
    try:
        stored = json.loads(os_path.read_text(encoding="utf-8"))["metadata"] if os_path else None
    except (OSError, ValueError, KeyError, TypeError):
        return
    language = stored.get("language_info", {}) if isinstance(stored, dict) else None
    if not isinstance(language, dict) or set(stored) - set(KEEP_NOTEBOOK_METADATA) or set(language) - {"name"}:
        return  # not in the clean form: a learner's own notebook
    meta = model["content"].setdefault("metadata", {})
    for key in KEEP_NOTEBOOK_METADATA:
        meta.pop(key, None)
        if key in stored:
            meta[key] = stored[key]
    state = meta.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    if isinstance(state, dict) and not state.get("state"):
        meta.pop("widgets", None)


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
    parser = CommandParser(prog="python -m course_lib.nbclean", description=__doc__.splitlines()[0])
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
