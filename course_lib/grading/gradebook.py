"""The grade book's chores: which grader graded, what a regrade changed, and exports a learning platform imports.

* :func:`grader_version` -- the course's version and a hash of every file that can change a verdict (the grading
  package, the checks, the instructor's extra checks). ``grades.csv`` and each ``results.json`` record it.
* :func:`regrade_report` -- after ``grade --regrade OLD.csv``: per student and exercise, the points before and now
  and the checks whose outcome changed (read from the old run's ``results.json`` files).
* :func:`read_roster`, :func:`build_export`, :func:`write_canvas_csv`, :func:`write_moodle_csv` -- the same points
  in the CSV layouts Canvas's and Moodle's grade imports read, joined with a roster (login, name, email, SIS id,
  section per student folder; without one the folder name is the login). Missing or not attempted work is blank,
  never 0 (both read a blank as "no change"); a student the platform could not match is written aside.
* :func:`read_overrides` -- the instructor's points adjustments (``grade --overrides FILE``): per student and
  exercise, ``+2``/``-1`` or ``set 7``, with a reason the student's feedback shows.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from course_lib import __version__, atomic

GRADING_DIR = Path(__file__).resolve().parent
CANVAS_IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_IDENTITY = ["Full name", "Username", "Email address", "ID number"]


def grader_version(extra_dirs: Iterable[Path] = ()) -> str:
    """``"0.1.0+grader.1a2b3c4d5e6f"``: the course version and a hash of the grader's and the checks' sources."""
    digest = hashlib.sha256()
    files = sorted(GRADING_DIR.rglob("*.py")) + sorted(p for d in extra_dirs for p in Path(d).glob("*.py"))
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{__version__}+grader.{digest.hexdigest()[:12]}"


def exercise_column(number: str) -> str:
    return f"Exercise {number}"


# --- the roster and the platforms' imports ------------------------------------------------------------------------
ROSTER_FIELDS = ("folder", "login", "name", "email", "sis_id", "section", "canvas_id")
# --id-column: the roster field a platform matches students by, and the column it is in in each export.
ID_COLUMNS = {"login": ("SIS Login ID", "Username"), "email": (None, "Email address"),
              "sis_id": ("SIS User ID", "ID number"), "canvas_id": ("ID", None)}


@dataclass(frozen=True)
class Person:
    """One roster row: ``folder`` is the class folder's sub-folder of this student (their login when not given)."""

    folder: str
    login: str = ""
    name: str = ""
    email: str = ""
    sis_id: str = ""
    section: str = ""
    canvas_id: str = ""


def read_roster(path: Path) -> dict[str, Person]:
    """``{folder: Person}`` from a CSV with a header naming some of :data:`ROSTER_FIELDS` (``folder`` or ``login``
    required); a clear ``ValueError`` naming the row at fault otherwise."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:  # -sig: a spreadsheet's UTF-8 mark
            rows = list(csv.DictReader(handle))
            header = [h.strip().lower() for h in (rows[0].keys() if rows else [])]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"--roster {path}: cannot be read ({exc}); give a UTF-8 CSV") from exc
    if "folder" not in header and "login" not in header:
        raise ValueError(f"--roster {path}: the header needs a 'folder' or 'login' column (it has "
                         f"{', '.join(header) or 'none'}); columns read: {', '.join(ROSTER_FIELDS)}")
    roster: dict[str, Person] = {}
    for line, row in enumerate(rows, start=2):
        fields = {k.strip().lower(): from_csv_cell((v or "").strip()) for k, v in row.items() if k}
        known = {k: v for k, v in fields.items() if k in ROSTER_FIELDS}
        known["folder"] = known.get("folder") or known.get("login", "")
        if not known["folder"]:
            raise ValueError(f"--roster {path}, line {line}: no folder and no login; fill one in or delete the row")
        if known["folder"] in roster:
            raise ValueError(f"--roster {path}, line {line}: {known['folder']!r} is on the roster twice")
        roster[known["folder"]] = Person(**known)
    return roster


@dataclass
class Export:
    """The rows both exports hold: who (a roster row) and their points per exercise (None: missing or not attempted,
    written blank, which both platforms read as "no change"; 0 is a grade)."""

    possible: dict[str, int]
    rows: list[tuple[Person, dict[str, int | None]]]
    unmapped: list[tuple[str, str, dict[str, int | None]]] = field(default_factory=list)  # folder, why, points


def build_export(points: Mapping[str, Mapping[str, int | None]], possible: Mapping[str, int],
                 roster: Mapping[str, Person] | None = None, id_column: str = "login") -> Export:
    """Join the points with the roster: a graded folder the roster does not name, or whose roster row lacks
    ``id_column``, is set aside (``unmapped``: an unknown user makes Moodle refuse the whole file); a roster student
    with no folder gets a row of blanks."""
    export = Export(dict(possible), [])
    if roster is None:  # the folder name is the login
        export.rows = [(Person(folder, login=folder, name=folder), dict(per_ex)) for folder, per_ex in points.items()]
    else:
        for folder, per_ex in points.items():
            person = roster.get(folder)
            if person is None:
                export.unmapped.append((folder, "not on the roster", dict(per_ex)))
            elif not getattr(person, id_column):
                export.unmapped.append((folder, f"the roster gives no {id_column}", dict(per_ex)))
            else:
                export.rows.append((person, dict(per_ex)))
        blanks: dict[str, int | None] = dict.fromkeys(possible)
        export.rows += [(p, dict(blanks)) for folder, p in roster.items() if folder not in points and
                        getattr(p, id_column)]
    return export


def _write_table(out: Path, header: list[str], rows: Iterable[list[Any]]) -> None:
    def write_rows(handle: IO[str]) -> None:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows([csv_cell("" if c is None else c) for c in row] for row in rows)

    atomic.write_with(out, write_rows, encoding="utf-8", newline="")


def write_canvas_csv(export: Export, out: Path) -> None:
    """Canvas's gradebook import: ``Student, ID, SIS User ID, SIS Login ID, Section``, one column per exercise, a
    ``Points Possible`` row. Canvas matches a row by ``ID``, else ``SIS User ID``, else ``SIS Login ID``."""
    exercises = list(export.possible)
    header = CANVAS_IDENTITY + [exercise_column(n) for n in exercises]
    rows: list[list[Any]] = [["    Points Possible", "", "", "", "", *(export.possible[n] for n in exercises)]]
    rows += [[p.name or p.folder, p.canvas_id, p.sis_id, p.login, p.section, *(per_ex[n] for n in exercises)]
             for p, per_ex in export.rows]
    _write_table(out, header, rows)


def moodle_column(number: str, possible: int) -> str:
    """``Exercise 05 (max 5)``: Moodle's CSV import reads no maximum, so the header says what to create."""
    return f"{exercise_column(number)} (max {possible})"


def write_moodle_csv(export: Export, out: Path) -> None:
    """Moodle's "Import grades: CSV file": ``Full name, Username, Email address, ID number`` (map users from the
    column of ``--id-column``), one column per exercise, to map to a grade item whose maximum the header gives."""
    exercises = list(export.possible)
    header = MOODLE_IDENTITY + [moodle_column(n, export.possible[n]) for n in exercises]
    _write_table(out, header, [[p.name or p.folder, p.login, p.email, p.sis_id, *(per_ex[n] for n in exercises)]
                               for p, per_ex in export.rows])


def write_unmapped_csv(export: Export, out: Path) -> None:
    """The graded students no export holds (``grades-unmapped.csv``): folder, why, points; to enter by hand."""
    exercises = list(export.possible)
    _write_table(out, ["folder", "why", *(exercise_column(n) for n in exercises)],
                 [[folder, why, *(per_ex[n] for n in exercises)] for folder, why, per_ex in export.unmapped])


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


OVERRIDE_FIELDS = ("student", "exercise", "points", "reason")
_OVERRIDE_POINTS = re.compile(r"(?P<sign>[+-])\s*(?P<delta>\d+)|set\s+(?P<value>\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Override:
    """The instructor's word on one student's exercise: add ``delta`` points, or ``set`` them, for ``reason``."""

    student: str
    exercise: str
    reason: str
    delta: int = 0
    set: int | None = None

    def apply(self, earned: int, possible: int) -> int:
        """The points after the override, never below 0 nor above the exercise's ``possible`` points."""
        return min(possible, max(0, self.set if self.set is not None else earned + self.delta))

    def describe(self) -> str:
        """``"+2 points"``, ``"-1 point"`` or ``"set to 7 points"``, as the feedback says it."""
        if self.set is not None:
            return f"set to {self.set} point{'s' * (self.set != 1)}"
        return f"{self.delta:+d} point{'s' * (abs(self.delta) != 1)}"


def read_overrides(path: Path, students: Iterable[str], exercises: Iterable[str]) -> dict[tuple[str, str], Override]:
    """``{(student, exercise): Override}`` from a CSV with the header ``student,exercise,points,reason``.

    ``points`` is ``+2`` or ``-1`` (added to what the checks gave) or ``set 7``, the result kept between 0 and the
    exercise's maximum; the reason is required, as the student reads it. A ``ValueError`` naming the line at fault
    for a student folder or an exercise that this run does not grade, malformed points, an empty reason or a second
    row for the same student and exercise.
    """
    students, exercises = set(students), set(exercises)
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle)
            header = [(h or "").strip().lower() for h in (reader.fieldnames or [])]
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"--overrides {path}: cannot be read ({exc}); give a UTF-8 CSV") from exc
    missing = [f for f in OVERRIDE_FIELDS if f not in header]
    if missing:
        raise ValueError(f"--overrides {path}: the header lacks {', '.join(missing)} (it has "
                         f"{', '.join(h for h in header if h) or 'none'}); write {','.join(OVERRIDE_FIELDS)}")
    overrides: dict[tuple[str, str], Override] = {}
    for line, row in enumerate(rows, start=2):
        cells = {(k or "").strip().lower(): from_csv_cell((v or "").strip()) for k, v in row.items() if k}
        if not any(cells.values()):
            continue  # a blank line a spreadsheet left
        where = f"--overrides {path}, line {line}"
        student, exercise = cells["student"], cells["exercise"].removeprefix("ex")
        exercise = exercise.zfill(2) if exercise.isdigit() else exercise
        if student not in students:
            raise ValueError(f"{where}: no student folder {student!r} in the submissions; use the folder's name")
        if exercise not in exercises:
            raise ValueError(f"{where}: exercise {cells['exercise']!r} is not graded in this run (graded: "
                             f"{', '.join(sorted(exercises))})")
        points = _OVERRIDE_POINTS.fullmatch(cells["points"])
        if points is None:
            raise ValueError(f"{where}: points {cells['points']!r} is not '+N', '-N' or 'set N' "
                             "(write +2 to add two points, set 7 to give 7)")
        if not cells["reason"]:
            raise ValueError(f"{where}: no reason; the student's feedback shows it, so write one")
        if (student, exercise) in overrides:
            raise ValueError(f"{where}: a second override of {student!r}'s exercise {exercise}; keep one row")
        delta = int(points["delta"]) * (-1 if points["sign"] == "-" else 1) if points["sign"] else 0
        value = int(points["value"]) if points["value"] is not None else None
        overrides[student, exercise] = Override(student, exercise, cells["reason"], delta, value)
    return overrides
