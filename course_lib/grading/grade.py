"""Instructor: grade a class. ``python -m course_lib grade SUBMISSIONS --out grades.csv``.

``SUBMISSIONS`` holds one folder per student, each with that student's ``NN_topic.ipynb``
notebooks. Every notebook is graded in its own isolated process (see
:mod:`course_lib.grading.runner`), so a broken, missing, endless or hostile notebook costs its
author the points of that exercise and nothing else. The CSV has one row per student, one
column per exercise (points earned), the total, the maximum, a grading status (``graded``, or per
exercise ``timed out`` / ``ended early`` / ``invalid notebook`` / ``missing``) and flags (an exercise
that uses the reference implementation). Per student, ``<feedback>/<student>/results.json`` (the
Gradescope format) and ``feedback.txt`` (what failed, why, the hint); a summary table is printed. Beside the CSV,
the same points in Canvas's and Moodle's import layouts; every output records the grader's version, and
``--regrade OLD.csv`` reports what changed since that run (see :mod:`course_lib.grading.gradebook`). All these files are
written as one set and swapped in whole (:mod:`course_lib.grading.outputs`): Ctrl-C keeps the previous complete set.
``--extra-tests DIR`` adds checks kept by the instructor (``*.py`` files using ``@check_for``). ``--overrides FILE``
adjusts points per student and exercise with a reason (:func:`gradebook.read_overrides`); the file is kept with the
feedback, so later runs, incremental or not, apply it again until another ``--overrides`` replaces it.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from textwrap import indent
from typing import IO, Any

from course_lib import atomic
from course_lib.argparsing import CommandParser
from course_lib.grading import gradebook, runner, sandbox
from course_lib.grading.api import (
    CheckResult,
    checks_for,
    known_exercises,
    load_extra_checks,
    normalise_exercise,
    printable,
)
from course_lib.grading.collect import collected_note
from course_lib.grading.outputs import OutputSet, Staging
from course_lib.grading.report import format_results, shorten
from course_lib.grading.reuse import Reuse
from course_lib.grading.runner import (
    DEFAULT_TIMEOUT_S,
    GRADED,
    INTERRUPTED,
    MISSING,
    REFUSED,
    NotebookGrade,
    failed_result,
    find_notebooks,
    grade_notebook,
    renamed_note,
)

Table = dict[str, dict[str, NotebookGrade]]
OVERRIDES_NAME = "overrides.csv"  # the overrides a run applied, kept in its feedback folder for the next run


@dataclass
class OverriddenGrade(NotebookGrade):
    """A notebook's grade with the instructor's override applied: ``earned`` is the override's points; the checks'
    results stay as they were (the regrade compares them, and reuse records the grade before the override)."""

    override: gradebook.Override | None = None

    @property
    def earned(self) -> int:
        checks = super().earned
        return self.override.apply(checks, self.points) if self.override is not None else checks


def apply_overrides(table: Table, overrides: dict[tuple[str, str], gradebook.Override]) -> Table:
    """A new table with each override applied and said beside the score ("instructor override: +2 points (was
    3): reason"); the graded ``NotebookGrade`` objects are not changed."""
    result: Table = {}
    for student, per_ex in table.items():
        result[student] = dict(per_ex)
        for number, grade in per_ex.items():
            override = overrides.get((student, number))
            if override is None:
                continue
            said = f"instructor override: {override.describe()} (the checks gave {grade.earned}): {override.reason}"
            copied = {f.name: getattr(grade, f.name) for f in fields(NotebookGrade)}
            copied["note"] = "; ".join(filter(None, (grade.note, said)))
            result[student][number] = OverriddenGrade(**copied, override=override)
    return result


def student_folders(submissions: Path, outputs: Sequence[Path] = ()) -> list[Path]:
    """The student folders of ``submissions``: hidden folders and folders holding this grader's ``outputs`` (the
    CSV, the feedback folder: graded as a student on the next run otherwise) are left out, each with one line."""
    students = []
    for folder in sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith(".")):
        here = folder.resolve()
        holds_output = [o for o in outputs if o.resolve() == here or here in o.resolve().parents]
        if holds_output and not folder.is_symlink():
            print(f"skipped {printable(folder.name)}/: it holds this grader's output ({holds_output[0].name})",
                  file=sys.stderr)
            continue
        students.append(folder)
    return students


def _refused(number: str, extra_dirs: list[Path], why: str) -> NotebookGrade:
    hint = "hand in the notebook file itself, in your own folder"
    return NotebookGrade(number, [failed_result(c, why, hint) for c in checks_for(number, extra_dirs)], REFUSED)


def _link_problem(path: Path, submissions: Path) -> str | None:
    """Why ``path`` (a student folder or notebook) is not graded as that student's own work, or None."""
    if path.is_symlink():
        return f"{path.name} is a link (to {printable(os.readlink(path))}), not a file handed in: it is not graded"
    if submissions.resolve() not in path.resolve().parents:
        return f"{path.name} resolves outside the class folder: it is not graded"
    return None


def grade_class(submissions: Path, exercises: list[str], *, timeout_s: float, extra_dirs: list[Path],
                jobs: int, outputs: Sequence[Path] = (), reuse: Reuse | None = None) -> Table:
    """``{student: {exercise: NotebookGrade}}`` for every student folder in ``submissions``.

    A student folder or notebook that is a link (to a classmate's work, to ``solutions/``) is refused: its
    exercises score nothing and the report says why. A renamed copy (``05_topic (1).ipynb``) is graded, with a note.
    With ``reuse``, a notebook graded before and unchanged is not run again (:mod:`course_lib.grading.reuse`).
    """
    students = student_folders(submissions, outputs)
    runner.allow_starts()
    for number in exercises:
        checks_for(number, extra_dirs)  # import once, before the threads start
    threads = max(1, (os.cpu_count() or 1) // jobs)
    table: Table = {s.name: {} for s in students}
    notes: dict[tuple[str, str], str] = {}
    paths: dict[tuple[str, str], Path | None] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {}
        for student in students:
            folder_problem = _link_problem(student, submissions)
            found = {} if folder_problem else find_notebooks(student)
            for number in exercises:
                path = found.get(number)
                problem = folder_problem or (path and _link_problem(path, submissions))
                if problem:
                    table[student.name][number] = _refused(number, extra_dirs, problem)
                    continue
                notes[student.name, number] = "; ".join(filter(None, (renamed_note(path), collected_note(path)))) \
                    if path is not None else ""
                paths[student.name, number] = path
                previous, why = reuse.lookup(student.name, number, path) if reuse else (None, "")
                if previous is not None:
                    previous.note = "; ".join(filter(None, (notes[student.name, number], why)))
                    table[student.name][number] = previous
                    continue
                futures[student.name, number] = pool.submit(
                    grade_notebook, path, number, timeout_s=timeout_s, extra_dirs=extra_dirs, threads=threads)
        try:
            for (student, number), future in futures.items():
                table[student][number] = future.result()
                table[student][number].note = notes[student, number]
                if reuse:
                    reuse.keep(student, number, paths[student, number], table[student][number])
        except KeyboardInterrupt:  # keep what is graded; the rest says so, and nothing runs on
            finished = {key for key, future in futures.items() if future.done()}  # before any child is ended
            pool.shutdown(wait=False, cancel_futures=True)
            runner.stop_all()
            for (student, number), future in futures.items():
                if (student, number) in finished and not future.cancelled() and future.exception() is None:
                    table[student][number] = future.result()
                    table[student][number].note = notes[student, number]
                elif number not in table[student]:
                    table[student][number] = _interrupted(number, extra_dirs)
            raise GradingInterrupted({s: dict(sorted(per_ex.items())) for s, per_ex in table.items()}) from None
    return {s: dict(sorted(per_ex.items())) for s, per_ex in table.items()}


class GradingInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`grade_class`; ``table`` holds every notebook graded before it (the rest: interrupted)."""

    def __init__(self, table: Table) -> None:
        super().__init__("grading interrupted")
        self.table = table


def _interrupted(number: str, extra_dirs: list[Path]) -> NotebookGrade:
    why = "grading was interrupted (Ctrl-C) before this notebook was graded"
    return NotebookGrade(number, [failed_result(c, why, "grade again") for c in checks_for(number, extra_dirs)],
                         INTERRUPTED)


def write_csv(table: Table, exercises: list[str], out: Path, grader: str = "") -> None:
    """One row per student: points per exercise, total, maximum, grading status, reference-use flags and the
    grader's version (:func:`gradebook.grader_version`)."""
    def write_rows(handle: IO[str]) -> None:
        writer = csv.writer(handle)
        writer.writerow(["student", *[f"ex{n}" for n in exercises], "total", "max", "status", "flags", "grader"])
        for student, per_ex in table.items():
            earned = [per_ex[n].earned for n in exercises]
            possible = sum(per_ex[n].points for n in exercises)
            status = "; ".join(f"ex{n} {per_ex[n].status}" for n in exercises if per_ex[n].status != GRADED)
            flags = "; ".join([f"ex{n} uses the reference implementation ({', '.join(per_ex[n].uses_reference)})"
                               for n in exercises if per_ex[n].uses_reference]
                              + [f"ex{n} {per_ex[n].note}" for n in exercises if per_ex[n].note])
            cells = (student, *earned, sum(earned), possible, status or GRADED, flags, grader)
            writer.writerow([gradebook.csv_cell(c) for c in cells])

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_with(out, write_rows, encoding="utf-8", newline="")


def check_label(exercise: str, result: CheckResult) -> str:
    """``"ex05 last group averaged"``: a check's name in ``results.json``, which a regrade compares by."""
    return f"ex{exercise} {result.name}"


def results_json(per_ex: dict[str, NotebookGrade], exercises: list[str], grader: str = "") -> dict[str, Any]:
    """Gradescope's ``results.json`` for one student: score, max_score and one entry per check (plus the grader's
    version and the status per exercise)."""
    tests = []
    for n in exercises:
        grade = per_ex[n]
        for r in grade.results:
            output = "" if r.passed else "\n".join(
                line for line in (r.message, f"hint: {r.hint}" if r.hint else "",
                                  f"expected: {r.expected}" if r.expected is not None else "",
                                  f"got: {r.got}" if r.got is not None else "") if line)
            tests.append({"name": check_label(n, r), "number": n, "score": r.earned, "max_score": r.points,
                          "status": "passed" if r.passed else "failed", "output": output})
    notes = [f"ex{n}: {per_ex[n].status}" for n in exercises if per_ex[n].status != GRADED]
    notes += [f"ex{n}: uses the reference implementation ({', '.join(per_ex[n].uses_reference)})"
              for n in exercises if per_ex[n].uses_reference]
    notes += [f"ex{n}: {per_ex[n].note}" for n in exercises if per_ex[n].note]
    return {"score": sum(per_ex[n].earned for n in exercises), "max_score": sum(per_ex[n].points for n in exercises),
            "output": "\n".join(notes), "tests": tests,
            "status": {f"ex{n}": per_ex[n].status for n in exercises}, "grader": grader}


def feedback_text(student: str, per_ex: dict[str, NotebookGrade], exercises: list[str]) -> str:
    """A readable report for one student: score per exercise, then each failed check with why and the hint."""
    lines = [f"Feedback for {printable(student)}", ""]
    for n in exercises:
        grade = per_ex[n]
        status = "" if grade.status == GRADED else f" ({grade.status})"
        lines.append(f"exercise {n}: {grade.earned}/{grade.points} points{status}")
        if grade.uses_reference:
            lines.append(f"  uses the reference implementation ({', '.join(grade.uses_reference)}): "
                         "this does not count as a solution")
        if grade.note:
            lines.append(f"  {grade.note}")
        if any(not r.passed for r in grade.results):
            lines.append(indent(format_results(grade.results), "  "))
        lines.append("")
    total = sum(per_ex[n].earned for n in exercises)
    possible = sum(per_ex[n].points for n in exercises)
    lines.append(f"total: {total}/{possible} points")
    return "\n".join(lines) + "\n"


def write_feedback(table: Table, exercises: list[str], folder: Path, grader: str = "") -> None:
    """``folder/<student>/results.json`` and ``folder/<student>/feedback.txt`` for every student."""
    for student, per_ex in table.items():
        target = folder / student
        target.mkdir(parents=True, exist_ok=True)
        (target / "results.json").write_text(json.dumps(results_json(per_ex, exercises, grader), indent=2) + "\n",
                                             encoding="utf-8")
        (target / "feedback.txt").write_text(feedback_text(student, per_ex, exercises), encoding="utf-8")


def not_handed_in(grade: NotebookGrade) -> bool:
    """Missing, or handed in with every check 'not attempted yet': blank in the exports, not 0 (a grade). An
    instructor's override is a grade."""
    if isinstance(grade, OverriddenGrade):
        return False
    return grade.status == MISSING or (grade.status == GRADED and bool(grade.results) and all(
        not r.passed and r.message.startswith("not attempted yet") for r in grade.results))


def write_gradebooks(table: Table, exercises: list[str], out: Path, roster: dict[str, gradebook.Person] | None = None,
                     id_column: str = "login") -> gradebook.Export:
    """``<out>-canvas.csv`` and ``<out>-moodle.csv`` beside the CSV (the points in the platforms' import layouts,
    joined with ``roster``), and ``<out>-unmapped.csv`` when a graded student cannot be matched."""
    points = {student: {n: None if not_handed_in(per_ex[n]) else per_ex[n].earned for n in exercises}
              for student, per_ex in table.items()}
    possible = {n: max(per_ex[n].points for per_ex in table.values()) for n in exercises}
    export = gradebook.build_export(points, possible, roster, id_column)
    gradebook.write_canvas_csv(export, out.with_name(f"{out.stem}-canvas.csv"))
    gradebook.write_moodle_csv(export, out.with_name(f"{out.stem}-moodle.csv"))
    if export.unmapped:
        gradebook.write_unmapped_csv(export, out.with_name(f"{out.stem}-unmapped.csv"))
    return export


def regrade_lines(previous: gradebook.PreviousRun, table: Table, exercises: list[str], grader: str) -> str:
    """What changed since the previous run (see :func:`gradebook.regrade_report`)."""
    points = {student: {f"ex{n}": str(per_ex[n].earned) for n in exercises} for student, per_ex in table.items()}
    checks = {student: {check_label(n, r): "passed" if r.passed else "failed"
                        for n in exercises for r in per_ex[n].results} for student, per_ex in table.items()}
    return gradebook.regrade_report(previous, grader, points, checks)


def summary(table: Table, exercises: list[str]) -> str:
    """A table for the terminal: points per exercise per student, and the first failure of each."""
    name_w = max([7, *(len(printable(s)) for s in table)])
    header = f"{'student':<{name_w}} " + " ".join(f"{'ex' + n:>6}" for n in exercises) + f" {'total':>7}"
    lines = [header, "-" * len(header)]
    notes = []
    for student, per_ex in table.items():
        cells, total, possible = [], 0, 0
        shown = printable(student)
        for n in exercises:
            grade = per_ex[n]
            total, possible = total + grade.earned, possible + grade.points
            cells.append(f"{grade.earned}/{grade.points}".rjust(6))
            first = next((r for r in grade.results if not r.passed), None)
            if grade.uses_reference:
                notes.append(f"  {shown} ex{n}: uses the reference implementation")
            if first:
                notes.append(shorten(f"  {shown} ex{n} {first.name}: {first.message}", 160))
        lines.append(f"{shown:<{name_w}} " + " ".join(cells) + f" {f'{total}/{possible}':>7}")
    if notes:
        lines += ["", "first failure per exercise:", *notes]
    return "\n".join(lines)


def _output_problem(out: Path, feedback: Path) -> str | None:
    """Why the CSV or the feedback folder could not be written (checked before grading), or None."""
    if out.is_dir():
        return f"--out {out}: is a folder; give the CSV's file name (e.g. {out / 'grades.csv'})"
    if feedback.exists() and not feedback.is_dir():
        return f"--feedback {feedback}: is a file; give a folder for the students' feedback"
    for target, flag in ((out.parent, "--out"), (feedback, "--feedback")):
        existing = next((p for p in (target, *target.parents) if p.exists()), None)
        if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            return f"{flag}: {existing or target} cannot be written here; choose a folder you can write to"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser(prog="python -m course_lib grade", description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=Path, help="folder with one sub-folder per student")
    parser.add_argument("--out", type=Path, required=True, help="CSV to write")
    parser.add_argument("--feedback", type=Path, help="folder for each student's results.json and feedback.txt "
                        "(default: next to the CSV, <name>-feedback/)")
    parser.add_argument("--exercises", nargs="*", help="exercise numbers (default: every exercise with checks)")
    parser.add_argument("--extra-tests", type=Path, action="append", default=[], help="folder of instructor checks")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per notebook")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="notebooks graded at once")
    parser.add_argument("--roster", type=Path, metavar="CSV", help="students' login, name, email, sis_id, section "
                        "per folder, joined into the Canvas and Moodle exports (header: folder or login, ...)")
    parser.add_argument("--id-column", choices=sorted(gradebook.ID_COLUMNS), default="login",
                        help="the roster field the platform matches students by (default: login)")
    parser.add_argument("--students", nargs="+", metavar="FOLDER", help="run only these students' notebooks; "
                        "every other student keeps the previous run's grades")
    parser.add_argument("--no-reuse", action="store_true",
                        help="run every notebook, even one graded before and unchanged under the same grader")
    parser.add_argument("--overrides", type=Path, metavar="CSV",
                        help="points adjustments with a reason (header: student,exercise,points,reason; points +2, "
                        "-1 or 'set 7'); kept with the feedback and applied again by later runs")
    parser.add_argument("--regrade", type=Path, metavar="OLD_CSV",
                        help="a previous run's grades.csv: report what changed, per student, exercise and check")
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
    unreadable = sandbox.unreadable_for_worker(extra_dirs)
    if unreadable:
        parser.error(unreadable)
    feedback = args.feedback or args.out.with_name(args.out.stem + "-feedback")
    problem = _output_problem(args.out, feedback)
    if problem:  # before any grading: a class's worth of work is not lost to a CSV that cannot be written
        parser.error(problem)
    roster = None
    if args.roster is not None:
        try:
            roster = gradebook.read_roster(args.roster)
        except ValueError as exc:
            parser.error(str(exc))
    previous = None
    if args.regrade is not None:  # read now: the new run may overwrite those very files
        try:
            previous = gradebook.read_previous(args.regrade, args.regrade.with_name(args.regrade.stem + "-feedback"))
        except ValueError as exc:
            parser.error(str(exc))
    grader = gradebook.grader_version(extra_dirs)
    sandbox.limit_own_memory()  # judging runs in this process: a bounded backstop beside the decoding cap
    print(sandbox.describe())
    outputs = OutputSet(args.out, feedback)
    earlier = [feedback] + ([args.regrade.with_name(args.regrade.stem + "-feedback")] if args.regrade else [])
    reuse = Reuse.read(grader, [] if args.no_reuse else earlier, args.students)
    if args.students:
        unknown = sorted(set(args.students) - {p.name for p in args.submissions.iterdir() if p.is_dir()})
        if unknown:
            parser.error(f"--students: no folder {', '.join(map(repr, unknown))} in {args.submissions}")
        if not reuse.previous:
            parser.error(f"--students: no previous run's grades in {feedback}/ to keep for the other students; "
                         "grade the whole class once first")
    overrides_file = args.overrides or next((folder / OVERRIDES_NAME for folder in earlier
                                             if (folder / OVERRIDES_NAME).is_file()), None)
    overrides: dict[tuple[str, str], gradebook.Override] = {}
    if overrides_file is not None:
        try:
            overrides = gradebook.read_overrides(
                overrides_file, [p.name for p in args.submissions.iterdir() if p.is_dir()], exercises)
        except ValueError as exc:
            parser.error(str(exc) if args.overrides else f"{exc} (kept from the previous run; pass --overrides "
                         "with a corrected file)")
        if not args.overrides:
            print(f"applying the previous run's {len(overrides)} override(s) kept in {overrides_file}")
    try:
        table = grade_class(args.submissions, exercises, timeout_s=args.timeout, extra_dirs=extra_dirs,
                            jobs=args.jobs, outputs=[args.out, feedback], reuse=reuse)
    except KeyboardInterrupt as stop:
        table = stop.table if isinstance(stop, GradingInterrupted) else {}
        done = sum(g.status != INTERRUPTED for per_ex in table.values() for g in per_ex.values())
        total = sum(len(per_ex) for per_ex in table.values())
        graded = f"{done} of {total} notebook(s) were graded, " if total else ""
        print(f"error: interrupted: {graded}{_kept(outputs)}. Run the same command again to grade everything.",
              file=sys.stderr)
        return 130
    if not table:
        print(f"{args.submissions}: no student folders", file=sys.stderr)
        return 1
    table = apply_overrides(table, overrides)
    report = regrade_lines(previous, table, exercises, grader) if previous is not None else None
    staging = None
    try:
        staging = Staging(outputs)
        export = write_set(staging, table, exercises, grader, report, roster, args.id_column)
        reuse.write(staging.feedback)
        if overrides_file is not None:
            shutil.copyfile(overrides_file, staging.feedback / OVERRIDES_NAME)
        staging.publish()
    except KeyboardInterrupt:
        if staging is not None and staging.published:
            print(f"error: interrupted once the new results were in place: {args.out}, its exports and {feedback}/ "
                  "are this run's, complete.", file=sys.stderr)
        else:
            print(f"error: interrupted while writing the results: {_kept(outputs)}. Run the same command again.",
                  file=sys.stderr)
        return 130
    finally:
        if staging is not None and not staging.published:
            staging.discard()
    print(summary(table, exercises))
    if reuse.reused:
        print(f"{reuse.reused} notebook(s) unchanged since they were graded: not run again (--no-reuse runs them)")
    print(f"\nwrote {args.out}, {outputs.canvas} and {outputs.moodle} (grade-book imports), and "
          f"{feedback}/<student>/results.json, feedback.txt; grader {grader}")
    if report is not None:
        print(f"\n{report}\n(also in {outputs.regrade})")
    if export.unmapped:
        names = ", ".join(printable(folder) for folder, _, _ in export.unmapped)
        print(f"warning: {len(export.unmapped)} graded student(s) are in no export, as the platform could not match "
              f"them by {args.id_column} ({names}): their points are in {outputs.unmapped}; add them to the roster "
              "or enter them by hand", file=sys.stderr)
    return 0


def write_set(staging: Staging, table: Table, exercises: list[str], grader: str, report: str | None,
              roster: dict[str, gradebook.Person] | None = None, id_column: str = "login") -> gradebook.Export:
    """Every file of one run, into ``staging`` (:meth:`Staging.publish` then swaps them in whole)."""
    csv_path = staging.path(staging.outputs.csv)
    write_csv(table, exercises, csv_path, grader)
    write_feedback(table, exercises, staging.feedback, grader)
    export = write_gradebooks(table, exercises, csv_path, roster, id_column)
    if report is not None:
        atomic.write_text(staging.path(staging.outputs.regrade), report + "\n")
    return export


def _kept(outputs: OutputSet) -> str:
    """What an interrupted run leaves: the previous run's complete set, named, or nothing."""
    kept = [str(p) for p in outputs.files() if p.is_file()] + [f"{outputs.feedback}/"] * outputs.feedback.is_dir()
    if not kept:
        return "nothing was written (there were no previous results)"
    return f"nothing of this run was written; the previous run's results are kept whole ({', '.join(kept)})"
