"""The grade book's chores: which grader graded, what a regrade changed, and exports a learning platform imports.

* :func:`grader_version` -- the course's version and a hash of every file that can change a verdict (the grading
  package, the checks, the instructor's extra checks). ``grades.csv`` and each ``results.json`` record it.
* :func:`regrade_report` -- after ``grade --regrade OLD.csv``: per student and exercise, the points before and now
  and the checks whose outcome changed (read from the old run's ``results.json`` files).
* :func:`write_canvas_csv`, :func:`write_moodle_csv` -- the same points in the CSV layouts Canvas's and Moodle's
  grade import read. Students are matched by login: name each student's folder with their platform login.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from course_lib import __version__, atomic

GRADING_DIR = Path(__file__).resolve().parent
CANVAS_IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_IDENTITY = ["Username"]


def grader_version(extra_dirs: Iterable[Path] = ()) -> str:
    """``"0.1.0+grader.1a2b3c4d5e6f"``: the course version and a hash of the grader's and the checks' sources."""
    digest = hashlib.sha256()
    files = sorted(GRADING_DIR.rglob("*.py")) + sorted(p for d in extra_dirs for p in Path(d).glob("*.py"))
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{__version__}+grader.{digest.hexdigest()[:12]}"


def exercise_column(number: str) -> str:
    return f"Exercise {number}"


def _write_table(out: Path, header: list[str], rows: Iterable[list[Any]]) -> None:
    def write_rows(handle: IO[str]) -> None:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)

    atomic.write_with(out, write_rows, encoding="utf-8", newline="")


def write_canvas_csv(points: Mapping[str, Mapping[str, int]], possible: Mapping[str, int], out: Path) -> None:
    """Canvas's gradebook import: ``Student, ID, SIS User ID, SIS Login ID, Section``, one column per exercise, a
    ``Points Possible`` row. The student's folder name goes to *SIS Login ID* (what Canvas matches on when the
    Canvas ``ID`` is empty) and *Student*."""
    exercises = list(possible)
    header = CANVAS_IDENTITY + [exercise_column(n) for n in exercises]
    rows = [["    Points Possible", "", "", "", "", *(possible[n] for n in exercises)]]
    rows += [[student, "", "", student, "", *(per_ex[n] for n in exercises)] for student, per_ex in points.items()]
    _write_table(out, header, rows)


def write_moodle_csv(points: Mapping[str, Mapping[str, int]], possible: Mapping[str, int], out: Path) -> None:
    """Moodle's "Import grades: CSV file": a ``Username`` column to map users by, one column per exercise (each
    mapped to a grade item when importing)."""
    exercises = list(possible)
    header = MOODLE_IDENTITY + [exercise_column(n) for n in exercises]
    _write_table(out, header, [[student, *(per_ex[n] for n in exercises)] for student, per_ex in points.items()])


# --- regrades -----------------------------------------------------------------------------------------------------
@dataclass
class PreviousRun:
    """What an earlier ``grade`` run wrote: points per student and exercise, and each check's outcome."""

    csv_path: Path
    grader: str
    points: dict[str, dict[str, str]] = field(default_factory=dict)  # student -> exNN -> points (as written)
    checks: dict[str, dict[str, str]] = field(default_factory=dict)  # student -> "exNN name" -> passed/failed
    missing_feedback: list[str] = field(default_factory=list)


# A cell that a spreadsheet would read as a formula (a student named "=HYPERLINK(...)").
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """Text that cannot run as a spreadsheet formula: a leading ``'`` where it would (numbers stay numbers)."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def from_csv_cell(text: str) -> str:
    """The value :func:`csv_cell` escaped, as it was: ``'=x`` reads back as ``=x`` (other text unchanged)."""
    return text[1:] if text.startswith("'") and text[1:].startswith(_FORMULA_START) else text


def read_previous(csv_path: Path, feedback: Path) -> PreviousRun:
    """Read an earlier run's CSV and its students' ``results.json``; a clear ``ValueError`` when it is not one."""
    try:
        with csv_path.open(encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"--regrade {csv_path}: cannot be read ({exc})") from exc
    if not rows or "student" not in rows[0]:
        raise ValueError(f"--regrade {csv_path}: not a grades.csv written by `grade` (no 'student' column)")
    previous = PreviousRun(csv_path, grader=rows[0].get("grader") or "unknown (written before graders were recorded)")
    for row in rows:
        student = from_csv_cell(row["student"])  # written escaped: "=1+1 Zoë" is stored as "'=1+1 Zoë"
        previous.points[student] = {k: v for k, v in row.items() if k.startswith("ex") and k[2:].isdigit()}
        try:
            results = json.loads((feedback / student / "results.json").read_text(encoding="utf-8"))
            previous.checks[student] = {t["name"]: t["status"] for t in results.get("tests", [])}
        except (OSError, ValueError, KeyError, TypeError):
            previous.missing_feedback.append(student)
    return previous


def regrade_report(previous: PreviousRun, grader: str, points: Mapping[str, Mapping[str, str]],
                   checks: Mapping[str, Mapping[str, str]]) -> str:
    """What changed since ``previous``: one line per student and exercise whose points changed, naming the checks
    whose outcome changed; students only in one of the two runs; and a summary line."""
    lines = [f"regrade against {previous.csv_path} (grader {previous.grader} -> {grader})"]
    changed_students = 0
    for student in sorted(set(points) | set(previous.points)):
        if student not in previous.points or student not in points:
            changed_students += 1
            lines.append(f"  {student}: new (not in the previous grades)" if student not in previous.points
                         else f"  {student}: in the previous grades, not graded now")
            continue
        student_changed = False
        for column, now in points[student].items():
            before = previous.points[student].get(column, "-")
            flips = [f"'{name.split(' ', 1)[1]}' now {status}" for name, status in checks.get(student, {}).items()
                     if name.startswith(column + " ")
                     and previous.checks.get(student, {}).get(name, status) != status]
            if str(before) != str(now) or flips:
                student_changed = True
                why = "; ".join(flips) or ("which checks: previous results.json not found"
                                           if student in previous.missing_feedback else "")
                lines.append(f"  {student} {column}: {before} -> {now}" + (f"  ({why})" if why else ""))
        changed_students += student_changed
    lines.append(f"{changed_students} of {len(set(points) | set(previous.points))} student(s) changed")
    return "\n".join(lines)
