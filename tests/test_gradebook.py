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
    gradebook.write_canvas_csv(gradebook.build_export(POINTS, POSSIBLE), out)
    rows = list(csv.reader(out.open(encoding="utf-8", newline="")))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Exercise 05", "Exercise 07"]
    assert rows[1] == ["    Points Possible", "", "", "", "", "5", "3"]
    assert rows[2:] == [["ada", "", "", "ada", "", "5", "3"], ["bob", "", "", "bob", "", "0", "1"]]


def test_moodle_export_has_identity_columns_and_the_maximum_in_each_exercise_header(tmp_path: Path) -> None:
    out = tmp_path / "moodle.csv"
    gradebook.write_moodle_csv(gradebook.build_export(POINTS, POSSIBLE), out)
    rows = list(csv.reader(out.open(encoding="utf-8", newline="")))
    assert rows == [["Full name", "Username", "Email address", "ID number", "Exercise 05 (max 5)",
                     "Exercise 07 (max 3)"], ["ada", "ada", "", "", "5", "3"], ["bob", "bob", "", "", "0", "1"]]


# --- faithful models of the two importers ------------------------------------------------------------------------
# Canvas (GradebookImporter): identity columns by name, a "Points Possible" row, a student matched by ID, else SIS
# User ID, else SIS Login ID; a row it cannot match is listed as an unknown student and imports nothing; a blank
# cell is "no change". Moodle (gradeimport_csv/load_data.php): the instructor maps one column to a user field
# (username, email, idnumber) and each other column to a grade item; one row whose user is not found aborts the
# whole import (usermappingerror); a blank cell is skipped; a new item gets a maximum of 100.


def canvas_import(path: Path, users: list[dict[str, str]]) -> tuple[dict, list, dict]:
    rows = list(csv.reader(path.open(encoding="utf-8", newline="")))
    header, body = rows[0], rows[1:]
    assert header[:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"], header
    items = header[5:]
    possible = {}
    if body and body[0][0].strip() == "Points Possible":
        possible = {item: float(v) for item, v in zip(items, body[0][5:])}
        body = body[1:]
    grades, unknown = {}, []
    for row in body:
        cells = dict(zip(header, row))
        user = next((u for key, column in (("id", "ID"), ("sis_user_id", "SIS User ID"), ("login", "SIS Login ID"))
                     for u in users if cells[column] and u.get(key) == cells[column]), None)
        if user is None:
            unknown.append(row)
            continue
        for item in items:
            if cells[item] != "":  # blank: no change
                grades[user["login"], item] = float(cells[item])
    return grades, unknown, possible


class MoodleImportError(Exception):
    pass


def moodle_import(path: Path, users: list[dict[str, str]], map_from: str, map_to: str,
                  maxima: dict[str, float]) -> dict:
    rows = list(csv.reader(path.open(encoding="utf-8", newline="")))
    header, body = rows[0], rows[1:]
    column = header.index(map_from)
    grades = {}
    for row in body:
        user = next((u for u in users if u.get(map_to) == row[column]), None)
        if user is None:
            raise MoodleImportError(f"usermappingerror: {map_to} = {row[column]!r}")  # the whole import stops
        for item, value in zip(header, row):
            if item in maxima and value != "":
                if float(value) > maxima[item]:
                    raise MoodleImportError(f"{value} is above the maximum of {item}")
                grades[user["username"], item] = float(value)
    return grades


ZOE = '=1+1 Zoë "Z" O\'Brien, Jr'


def _roster(tmp_path: Path) -> Path:
    path = tmp_path / "roster.csv"
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["Folder", "login", "name", "email", "sis_id", "section"])
        writer.writerow(["ada", "ada.l", "Ada Lovelace", "ada@example.edu", "S1", "A"])
        writer.writerow(["zoe", "zobrien", ZOE, "zoe@example.edu", "S2", "Sec, \"B\""])
        writer.writerow(["cy", "cy", "Cy Twombly", "cy@example.edu", "", "A"])  # handed in nothing, no SIS id
    return path


POINTS_NOW = {"ada": {"05": 5, "07": None}, "zoe": {"05": 0, "07": 3}, "stranger": {"05": 4, "07": 1}}
USERS = [{"id": "101", "sis_user_id": "S1", "login": "ada.l", "username": "ada.l", "email": "ada@example.edu",
          "idnumber": "S1"},
         {"id": "102", "sis_user_id": "S2", "login": "zobrien", "username": "zobrien", "email": "zoe@example.edu",
          "idnumber": "S2"},
         {"id": "103", "sis_user_id": "", "login": "cy", "username": "cy", "email": "cy@example.edu", "idnumber": ""}]


def test_exports_import_through_the_platforms_rules_with_a_roster(tmp_path: Path) -> None:
    """Seen: missing work exported as 0 (a grade), Moodle refusing the whole file for one unknown user, no ids, no
    maximum, and a name starting with '=' escaped in grades.csv but not in the exports."""
    roster = gradebook.read_roster(_roster(tmp_path))
    assert roster["zoe"].name == ZOE and roster["zoe"].section == 'Sec, "B"'
    export = gradebook.build_export(POINTS_NOW, POSSIBLE, roster)
    gradebook.write_canvas_csv(export, tmp_path / "canvas.csv")
    gradebook.write_moodle_csv(export, tmp_path / "moodle.csv")
    gradebook.write_unmapped_csv(export, tmp_path / "unmapped.csv")

    grades, unknown, possible = canvas_import(tmp_path / "canvas.csv", USERS)
    assert unknown == [] and possible == {"Exercise 05": 5, "Exercise 07": 3}
    assert grades == {("ada.l", "Exercise 05"): 5, ("zobrien", "Exercise 05"): 0, ("zobrien", "Exercise 07"): 3}

    maxima = {gradebook.moodle_column(n, p): p for n, p in POSSIBLE.items()}  # the items made as the header says
    for map_from, map_to in (("Username", "username"), ("Email address", "email")):
        assert moodle_import(tmp_path / "moodle.csv", USERS, map_from, map_to, maxima) == {
            ("ada.l", "Exercise 05 (max 5)"): 5, ("zobrien", "Exercise 05 (max 5)"): 0,
            ("zobrien", "Exercise 07 (max 3)"): 3}

    rows = list(csv.reader((tmp_path / "moodle.csv").open(encoding="utf-8", newline="")))
    assert rows[2][0] == "'" + ZOE and gradebook.from_csv_cell(rows[2][0]) == ZOE  # escaped as in grades.csv
    assert [gradebook.from_csv_cell(c) for c in rows[2][:4]] == [ZOE, "zobrien", "zoe@example.edu", "S2"]
    assert rows[3] == ["Cy Twombly", "cy", "cy@example.edu", "", "", ""]  # on the roster, nothing handed in: blank
    assert list(csv.reader((tmp_path / "unmapped.csv").open(encoding="utf-8"))) == [
        ["folder", "why", "Exercise 05", "Exercise 07"], ["stranger", "not on the roster", "4", "1"]]

    # Matched by SIS id, cy (no SIS id on the roster) is left out of both files rather than break Moodle's import.
    by_sis = gradebook.build_export(POINTS_NOW, POSSIBLE, roster, id_column="sis_id")
    gradebook.write_moodle_csv(by_sis, tmp_path / "moodle.csv")
    assert moodle_import(tmp_path / "moodle.csv", USERS, "ID number", "idnumber", maxima)
    assert [p.folder for p, _ in by_sis.rows] == ["ada", "zoe"]


def test_a_roster_without_a_login_or_folder_column_is_refused(tmp_path: Path) -> None:
    (tmp_path / "r.csv").write_text("name,email\nAda,ada@example.edu\n")
    with pytest.raises(ValueError, match="needs a 'folder' or 'login' column"):
        gradebook.read_roster(tmp_path / "r.csv")
    (tmp_path / "r.csv").write_text("login,name\nada,Ada\nada,Ada again\n")
    with pytest.raises(ValueError, match="line 3: 'ada' is on the roster twice"):
        gradebook.read_roster(tmp_path / "r.csv")


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
