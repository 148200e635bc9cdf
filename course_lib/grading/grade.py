"""Instructor: grade a class. ``python -m course_lib grade SUBMISSIONS --out grades.csv``.

``SUBMISSIONS`` holds one folder per student, each with that student's ``NN_topic.ipynb``
notebooks. Every notebook is graded in its own isolated process (see
:mod:`course_lib.grading.runner`), so a broken, missing, endless or hostile notebook costs its
author the points of that exercise and nothing else. The CSV has one row per student, one
column per exercise (points earned) and a total; a summary table is printed.
``--extra-tests DIR`` adds checks kept by the instructor (``*.py`` files using ``@check_for``).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from course_lib.grading.api import CheckResult, checks_for, known_exercises, load_extra_checks, normalise_exercise
from course_lib.grading.runner import DEFAULT_TIMEOUT_S, find_notebooks, grade_notebook


def grade_class(submissions: Path, exercises: list[str], *, timeout_s: float, extra_dirs: list[Path],
                jobs: int) -> dict[str, dict[str, list[CheckResult]]]:
    """``{student: {exercise: [results]}}`` for every student folder in ``submissions``."""
    students = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    for number in exercises:
        checks_for(number, extra_dirs)  # import once, before the threads start
    threads = max(1, (os.cpu_count() or 1) // jobs)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {}
        for student in students:
            found = find_notebooks(student)
            for number in exercises:
                futures[student.name, number] = pool.submit(
                    grade_notebook, found.get(number), number, timeout_s=timeout_s, extra_dirs=extra_dirs,
                    threads=threads)
        table: dict[str, dict[str, list[CheckResult]]] = {s.name: {} for s in students}
        for (student, number), future in futures.items():
            table[student][number] = future.result()
    return table


def write_csv(table: dict[str, dict[str, list[CheckResult]]], exercises: list[str], out: Path) -> None:
    """One row per student: points per exercise, total and the maximum possible."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", *[f"ex{n}" for n in exercises], "total", "max"])
        for student, per_ex in table.items():
            earned = [sum(r.earned for r in per_ex[n]) for n in exercises]
            possible = sum(r.points for n in exercises for r in per_ex[n])
            writer.writerow([student, *earned, sum(earned), possible])


def summary(table: dict[str, dict[str, list[CheckResult]]], exercises: list[str]) -> str:
    """A table for the terminal: points per exercise per student, and the first failure of each."""
    name_w = max([7, *map(len, table)])
    header = f"{'student':<{name_w}} " + " ".join(f"{'ex' + n:>6}" for n in exercises) + f" {'total':>7}"
    lines = [header, "-" * len(header)]
    notes = []
    for student, per_ex in table.items():
        cells, total, possible = [], 0, 0
        for n in exercises:
            earned, points = sum(r.earned for r in per_ex[n]), sum(r.points for r in per_ex[n])
            total, possible = total + earned, possible + points
            cells.append(f"{earned}/{points}".rjust(6))
            first = next((r for r in per_ex[n] if not r.passed), None)
            if first:
                notes.append(f"  {student} ex{n} {first.name}: {first.message}"[:160])
        lines.append(f"{student:<{name_w}} " + " ".join(cells) + f" {f'{total}/{possible}':>7}")
    if notes:
        lines += ["", "first failure per exercise:", *notes]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib grade", description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=Path, help="folder with one sub-folder per student")
    parser.add_argument("--out", type=Path, required=True, help="CSV to write")
    parser.add_argument("--exercises", nargs="*", help="exercise numbers (default: every exercise with checks)")
    parser.add_argument("--extra-tests", type=Path, action="append", default=[], help="folder of instructor checks")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per notebook")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="notebooks graded at once")
    args = parser.parse_args(argv)
    if not args.submissions.is_dir():
        parser.error(f"{args.submissions}: not a folder (expected one sub-folder per student)")
    if args.timeout <= 0 or args.jobs < 1:
        parser.error("--timeout must be > 0 and --jobs >= 1")
    try:
        exercises = sorted({normalise_exercise(n) for n in args.exercises}) if args.exercises else known_exercises()
        extra_dirs = [d.resolve() for d in args.extra_tests]
        for directory in extra_dirs:
            load_extra_checks(directory)  # fail now, with the file at fault, not inside every worker
    except (ValueError, FileNotFoundError, SyntaxError, ImportError) as exc:
        parser.error(str(exc))
    table = grade_class(args.submissions, exercises, timeout_s=args.timeout, extra_dirs=extra_dirs, jobs=args.jobs)
    if not table:
        print(f"{args.submissions}: no student folders", file=sys.stderr)
        return 1
    write_csv(table, exercises, args.out)
    print(summary(table, exercises))
    print(f"\nwrote {args.out}")
    return 0
