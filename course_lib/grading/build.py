"""Generate the learner's ``exercises/`` from ``solutions/`` (deterministic, clean notebooks).

``python -m course_lib build-exercises [--solutions DIR] [--exercises DIR] [--check]``

Every ``### BEGIN SOLUTION: <what to do>`` ... ``### END SOLUTION`` region in a cell tagged
``exercise`` becomes ``raise NotImplementedError("Exercise NN.k: <what to do>")``; untagged code cells after
the first exercise (demos that call the learner's functions) get the ``raises-exception`` tag, so "Run All"
on an unsolved notebook still reaches its check cell. With
``--check`` nothing is written and the exit code is 1 when ``exercises/`` is out of date.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from course_lib import nbclean
from course_lib.argparsing import CommandParser
from course_lib.grading import notebook

DEMO_TAG = "raises-exception"


def make_exercise(nb: dict[str, Any], number: str, where: str = "notebook") -> dict[str, Any]:
    """Return the exercise version of solution notebook ``nb`` (cleaned, stubs in place)."""
    out = nbclean.clean(nb)
    k = 1
    for index, cell in enumerate(out["cells"]):
        code = notebook.source(cell)
        has_region = "### BEGIN SOLUTION" in code or "### END SOLUTION" in code
        if cell.get("cell_type") == "code" and k > 1 and not notebook.tags(cell):
            # A demo cell after an exercise calls the stubs: until they are written it raises. Tagged so, "Run All"
            # in JupyterLab (and nbval) goes on to the check cell, which says what is left to do.
            cell.setdefault("metadata", {})["tags"] = [DEMO_TAG]
        if cell.get("cell_type") != "code" or "exercise" not in notebook.tags(cell):
            if has_region:
                raise notebook.NotebookError(f"{where}, cell {index}: solution region outside a cell tagged 'exercise'")
            continue
        new, count = notebook.replace_regions(code, number, k, where=f"{where}, cell {index}")
        if count == 0:
            raise notebook.NotebookError(
                f"{where}, cell {index}: tagged 'exercise' but has no ### BEGIN SOLUTION region"
            )
        k += count
        cell["source"] = new.splitlines(keepends=True)  # the way Jupyter stores it
    if k == 1:
        raise notebook.NotebookError(f"{where}: no cell tagged 'exercise'")
    return out


def render(solution: Path) -> str:
    """The exact text ``exercises/<name>`` should contain for ``solution``."""
    nb = notebook.read(solution)
    return nbclean.dumps(make_exercise(nb, notebook.exercise_number(solution), where=str(solution)))


def build(solutions: Path, exercises: Path, *, check_only: bool = False) -> list[Path]:
    """Write (or with ``check_only`` compare) every exercise; return the paths that differ(ed)."""
    sources = sorted(solutions.glob("[0-9][0-9]_*.ipynb"))
    if not sources:
        raise FileNotFoundError(f"{solutions}: no NN_topic.ipynb solution notebooks")
    changed = []
    expected_names = {p.name for p in sources}
    for solution in sources:
        target = exercises / solution.name
        text = render(solution)
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            changed.append(target)
            if not check_only:
                exercises.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
    # An exercise whose solution was removed or renamed is stale too.
    stale = [p for p in sorted(exercises.glob("[0-9][0-9]_*.ipynb")) if p.name not in expected_names]
    for path in stale:
        changed.append(path)
        if not check_only:
            path.unlink()
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser(prog="python -m course_lib build-exercises", description=__doc__.splitlines()[0])
    parser.add_argument("--solutions", type=Path, default=Path("solutions"))
    parser.add_argument("--exercises", type=Path, default=Path("exercises"))
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if exercises/ is stale")
    args = parser.parse_args(argv)
    try:
        changed = build(args.solutions, args.exercises, check_only=args.check)
    except (notebook.NotebookError, FileNotFoundError) as exc:
        print(f"build-exercises: {exc}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"{'stale' if args.check else 'wrote'}: {path}")
    if args.check and changed:
        print("exercises/ is out of date: run `python -m course_lib build-exercises`", file=sys.stderr)
        return 1
    return 0
