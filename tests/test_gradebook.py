"""The grade book's chores (course_lib.grading.gradebook): grader versions, regrade reports, platform exports."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from course_lib.grading import gradebook

POINTS = {"ada": {"05": 5, "07": 3}, "bob": {"05": 0, "07": 1}}
POSSIBLE = {"05": 5, "07": 3}


def test_canvas_export_has_canvas_header_points_possible_and_logins(tmp_path: Path) -> None:
    out = tmp_path / "canvas.csv"
    gradebook.write_canvas_csv(POINTS, POSSIBLE, out)
    rows = list(csv.reader(out.open(encoding="utf-8", newline="")))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Exercise 05", "Exercise 07"]
    assert rows[1] == ["    Points Possible", "", "", "", "", "5", "3"]
    assert rows[2:] == [["ada", "", "", "ada", "", "5", "3"], ["bob", "", "", "bob", "", "0", "1"]]


def test_moodle_export_has_a_username_column_and_one_column_per_exercise(tmp_path: Path) -> None:
    out = tmp_path / "moodle.csv"
    gradebook.write_moodle_csv(POINTS, POSSIBLE, out)
    rows = list(csv.reader(out.open(encoding="utf-8", newline="")))
    assert rows == [["Username", "Exercise 05", "Exercise 07"], ["ada", "5", "3"], ["bob", "0", "1"]]


def test_the_grader_version_changes_with_any_check_and_only_then(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text("# an instructor's check\n")
    first = gradebook.grader_version([tmp_path])
    assert first == gradebook.grader_version([tmp_path]) and first.startswith(gradebook.__version__ + "+grader.")
    (tmp_path / "mine.py").write_text("# an instructor's check, fixed\n")
    assert gradebook.grader_version([tmp_path]) != first
    assert gradebook.grader_version() != first


def _previous(tmp_path: Path, with_feedback: bool = True) -> gradebook.PreviousRun:
    grades = tmp_path / "grades.csv"
    grades.write_text("student,ex05,total,max,status,flags,grader\nada,5,5,5,graded,,old\nbob,2,2,5,graded,,old\n"
                      "cy,1,1,5,graded,,old\n")
    feedback = tmp_path / "grades-feedback"
    if with_feedback:
        for student, statuses in {"ada": ["passed", "passed"], "bob": ["failed", "passed"],
                                  "cy": ["failed", "passed"]}.items():
            tests = [{"name": f"ex05 {name}", "status": status} for name, status in zip(("warm-up", "decay"), statuses)]
            (feedback / student).mkdir(parents=True)
            (feedback / student / "results.json").write_text(json.dumps({"tests": tests}))
    return gradebook.read_previous(grades, feedback)


def test_a_regrade_names_the_checks_whose_outcome_changed(tmp_path: Path) -> None:
    previous = _previous(tmp_path)
    assert previous.grader == "old" and previous.points["bob"] == {"ex05": "2"}
    points = {"ada": {"ex05": "5"}, "bob": {"ex05": "5"}, "cy": {"ex05": "1"}, "dee": {"ex05": "0"}}
    checks = {"ada": {"ex05 warm-up": "passed", "ex05 decay": "passed"},
              "bob": {"ex05 warm-up": "passed", "ex05 decay": "passed"},
              "cy": {"ex05 warm-up": "passed", "ex05 decay": "failed"}}
    report = gradebook.regrade_report(previous, "new", points, checks)
    assert "grader old -> new" in report
    assert "bob ex05: 2 -> 5  ('warm-up' now passed)" in report
    assert "cy ex05: 1 -> 1  ('warm-up' now passed; 'decay' now failed)" in report  # same points, other checks
    assert "ada" not in report and "dee: new" in report
    assert report.endswith("3 of 4 student(s) changed")


def test_a_regrade_without_the_old_feedback_still_reports_points(tmp_path: Path) -> None:
    previous = _previous(tmp_path, with_feedback=False)
    report = gradebook.regrade_report(previous, "new", {"ada": {"ex05": "4"}, "bob": {"ex05": "2"}}, {})
    assert "ada ex05: 5 -> 4  (which checks: previous results.json not found)" in report
    assert "cy: in the previous grades, not graded now" in report


@pytest.mark.parametrize("content, why", [("name,score\nada,3\n", "no 'student' column"), ("", "no 'student'"),
                                          (b"\xff\xfe\x00bad", "cannot be read")])
def test_a_file_that_is_not_a_grade_table_is_refused(tmp_path: Path, content, why: str) -> None:
    path = tmp_path / "g.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=why):
        gradebook.read_previous(path, tmp_path / "g-feedback")


def test_a_regrade_reads_back_names_escaped_against_spreadsheet_formulas(tmp_path: Path) -> None:
    """Seen: every student whose folder starts with = + - @ was split in two ("3 of 4 student(s) changed" in a class
    of 3, with nothing changed): grades.csv stores them with a leading ', which the regrade kept."""
    import csv

    names = ['=1+1 Zoë "Z" O\'Brien, Jr', "-dash", "@at", "+plus", "'quoted", "ada"]
    grades = tmp_path / "grades.csv"
    with grades.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "ex05", "total", "max", "status", "flags", "grader"])
        for name in names:
            writer.writerow([gradebook.csv_cell(c) for c in (name, 3, 3, 5, "graded", "", "old")])  # as write_csv
    previous = gradebook.read_previous(grades, tmp_path / "grades-feedback")
    assert sorted(previous.points) == sorted(names)
    report = gradebook.regrade_report(previous, "old", {name: {"ex05": "3"} for name in names}, {})
    assert report.endswith(f"0 of {len(names)} student(s) changed"), report
