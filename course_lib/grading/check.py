"""Check your own work: in a notebook (``check("05", globals())``) or from a shell.

In a notebook the checks run against the notebook's live namespace, so you get feedback as
you go. From a shell, ``python -m course_lib check [NN ...] [--notebooks DIR]`` grades the
saved notebooks the way an instructor would: each notebook's set-up and exercise cells run
in a fresh, separate process (outputs and kernel state are ignored), then the checks run there.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from course_lib import journal
from course_lib.argparsing import CommandParser
from course_lib.grading.api import checks_for, normalise_exercise, run_check
from course_lib.grading.report import format_results


class ChecksFailed(AssertionError):
    """Some checks of an exercise fail. In Jupyter it reads as one line under the score table, not a traceback
    (IPython asks an exception for ``_render_traceback_``); nbval and scripts still see a failing cell."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[31m{self}\x1b[0m"]


def practice_note(number: str) -> str:
    """What the in-notebook check is for, and where the grade comes from (said under every notebook check)."""
    return (f"(This check ran in your kernel: seconds, for practice. The grade comes from the saved notebook, run "
            f"afresh in a sandbox: save it, then run `python -m course_lib check {number}` in a terminal.)")


def check(exercise: str | int, namespace: dict[str, Any]) -> None:
    """Run every check of ``exercise`` against ``namespace`` (pass ``globals()``), print a table.

    Raises :class:`ChecksFailed` (an ``AssertionError``) when a check fails, so running the notebook under nbval
    fails exactly while an exercise is not solved yet.
    """
    number = normalise_exercise(exercise)
    results = [run_check(c, namespace) for c in checks_for(number)]
    if not results:
        raise AssertionError(f"exercise {number} has no checks (is course_lib up to date?)")
    print(format_results(results))
    print(practice_note(number))
    journal.exercise_checked(number, sum(r.earned for r in results), sum(r.points for r in results))
    failed = [r.name for r in results if not r.passed]
    if failed:
        raise ChecksFailed(f"exercise {number}: {len(failed)} check(s) to fix (see the table above)")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``python -m course_lib check [NN ...] [--notebooks DIR] [--timeout S]``; exit 0 iff all pass."""
    from course_lib.grading.runner import DEFAULT_TIMEOUT_S, find_notebooks, grade_notebooks

    parser = CommandParser(prog="python -m course_lib check", description=__doc__.splitlines()[0])
    parser.add_argument("exercises", nargs="*", help="exercise numbers (default: every notebook found)")
    parser.add_argument("--notebooks", type=Path, default=Path("exercises"), help="folder of NN_topic.ipynb")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per exercise")
    args = parser.parse_args(argv)
    try:
        wanted = [normalise_exercise(n) for n in args.exercises]
    except ValueError as exc:
        parser.error(str(exc))
    if not args.notebooks.is_dir():
        parser.error(f"--notebooks {args.notebooks}: no such folder (run from the course root, or pass the folder)")
    found = find_notebooks(args.notebooks)
    numbers = wanted or sorted(found)
    missing = [n for n in numbers if n not in found]
    if not numbers:
        print(f"no NN_topic.ipynb notebooks in {args.notebooks}", file=sys.stderr)
        return 1
    from course_lib.grading import sandbox

    print(sandbox.describe())
    graded = grade_notebooks({n: found.get(n) for n in numbers}, timeout_s=args.timeout)
    results = [r for n in numbers for r in graded[n].results]
    print(format_results(results))
    for n in numbers:
        if n in found:
            journal.exercise_checked(n, graded[n].earned, graded[n].points)
    if missing:
        print(f"not found in {args.notebooks}: exercise(s) {', '.join(missing)}")
    copied = [n for n in numbers if graded[n].uses_reference]
    for n in copied:
        print(f"exercise {n} uses the reference implementation ({', '.join(graded[n].uses_reference)}): "
              "its checks pass, but this does not count as your solution; write the function yourself")
    return 0 if results and all(r.passed for r in results) and not copied else 1
