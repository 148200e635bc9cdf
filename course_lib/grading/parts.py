"""Which parts of an exercise each check checks, found by blanking one part at a time (an author's tool).

The feedback table names, for each check, the parts of the exercise it checks (``14.1+2``), declared with
``check_for(..., parts=...)``. This module proves those declarations: for each solution region ``k`` it judges the
solution with only that region put back to its blank stub, in this process (trusted code: the course's own
solutions), and a check depends on part ``k`` when it fails then.

``python -m course_lib.grading.parts [NN ...]`` prints any check whose declared parts differ from the derived ones
and exits 1 if there is one.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from course_lib.argparsing import CommandParser
from course_lib.grading import notebook
from course_lib.grading.api import checks_for
from course_lib.grading.build import make_exercise
from course_lib.grading.inprocess import observe_and_judge
from course_lib.grading.worker import load_namespace

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


def _exercise_cells(nb: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in nb["cells"] if c.get("cell_type") == "code" and "exercise" in notebook.tags(c)]


def count_parts(nb: dict[str, Any]) -> int:
    """How many solution regions (parts) the solution notebook ``nb`` has."""
    return sum(notebook.source(c).count("### BEGIN SOLUTION") for c in _exercise_cells(nb))


def blank_only(nb: dict[str, Any], number: str, part: int) -> dict[str, Any]:
    """The solution ``nb`` with only its ``part``-th region replaced by the blank stub."""
    nb = copy.deepcopy(nb)
    k = 0
    for cell in _exercise_cells(nb):
        lines, keeps_region, mine = [], False, False
        for line in notebook.source(cell).split("\n"):
            if notebook.BEGIN.match(line):
                k += 1
                mine = k == part
            is_marker = bool(notebook.BEGIN.match(line) or notebook.END.match(line))
            if not is_marker or mine:
                lines.append(line)
            keeps_region |= mine
            if notebook.END.match(line):
                mine = False
        cell["source"] = "\n".join(lines)
        if not keeps_region:  # no region left: an ordinary cell
            cell["metadata"]["tags"] = [t for t in notebook.tags(cell) if t != "exercise"]
    return make_exercise(nb, number)


def derive(number: str, solution: Path | None = None) -> dict[str, tuple[str, ...]]:
    """``{check name: the parts whose blank stub makes it fail}`` for exercise ``number``."""
    path = solution or next(SOLUTIONS.glob(f"{number}_*.ipynb"))
    nb = notebook.read(path)
    failing: dict[str, list[str]] = {check.name: [] for check in checks_for(number)}
    for part in range(1, count_parts(nb) + 1):
        for result in observe_and_judge(number, load_namespace(blank_only(nb, number, part))):
            if not result.passed:
                failing[result.name].append(f"{number}.{part}")
    return {name: tuple(parts) for name, parts in failing.items()}


def differences(number: str) -> list[str]:
    """One line per check whose declared parts differ from the derived ones."""
    declared = {check.name: check.parts for check in checks_for(number)}
    return [f"{number} {name!r}: declared {declared[name]}, derived {parts}"
            for name, parts in derive(number).items() if declared.get(name) != parts]


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser(prog="python -m course_lib.grading.parts", description=__doc__.splitlines()[0])
    parser.add_argument("exercises", nargs="*", help="exercise numbers (default: every exercise)")
    args = parser.parse_args(argv)
    numbers = args.exercises or sorted(p.name[:2] for p in SOLUTIONS.glob("[0-9][0-9]_*.ipynb"))
    problems = [line for number in numbers for line in differences(number)]
    print("\n".join(problems) or f"declared parts match for {', '.join(numbers)}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
