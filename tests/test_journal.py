"""The learner's progress journal (course_lib.journal): recorded by lessons and checks, shown by lesson 00 and
`python -m course_lib progress`, never required."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO
from course_lib import cli, journal
from course_lib.grading.api import checks_for

LESSON = "notebooks/00_welcome.ipynb"


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A learner's journal that does not exist yet, in a run a person is looking at."""
    where = tmp_path / "home" / ".cache" / "progress.json"
    monkeypatch.setenv("COURSE_PROGRESS_FILE", str(where))
    monkeypatch.delenv("COURSE_UNATTENDED", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    return where


def test_an_empty_journal_lists_every_lesson_and_exercise(fresh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["progress"]) == 0
    out = capsys.readouterr().out
    lessons = sorted(p.stem for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert all(f"| {name} | not run yet |" in out for name in lessons)
    assert out.count("not checked yet") == len(list((REPO / "exercises").glob("[0-9][0-9]_*.ipynb")))
    assert not fresh.exists()  # reading never writes


def test_a_lesson_its_predictions_and_a_check_are_recorded(fresh: Path) -> None:
    journal.lesson_run(LESSON)
    journal.prediction_answered("Which is faster?", "A", True, notebook=LESSON)
    journal.prediction_answered("How many?", "B", False, notebook=LESSON)
    journal.prediction_answered("Skipped?", "skip: just show me", None, notebook=LESSON)
    journal.exercise_checked("05", 3, 5)
    text = journal.summary_markdown()
    row = next(line for line in text.splitlines() if line.startswith("| 00_welcome |"))
    assert "(smoke mode)" in row and "| 3 | 1 of 2 |" in row and "not run yet" not in row
    assert "3/5 points" in next(line for line in text.splitlines() if line.startswith("| 05_lr_schedule |"))
    data = json.loads(fresh.read_text())
    assert data["exercises"]["05"]["earned"] == 3 and len(data["lessons"]["00_welcome"]["predictions"]) == 3


def test_only_lessons_are_recorded_and_unattended_runs_record_nothing(fresh: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    journal.lesson_run("exercises/05_lr_schedule.ipynb")
    journal.lesson_run("my_notes.ipynb")
    journal.lesson_run()  # no notebook known (a script)
    assert not fresh.exists()
    monkeypatch.setenv("COURSE_UNATTENDED", "1")
    journal.lesson_run(LESSON)
    journal.exercise_checked("05", 5, 5)
    assert not fresh.exists()
    monkeypatch.setenv("COURSE_UNATTENDED", "0")
    monkeypatch.setenv("JPY_SESSION_NAME", "course/notebooks/03_modules.ipynb")  # as JupyterLab tells the kernel
    journal.lesson_run()
    assert "03_modules" in json.loads(fresh.read_text())["lessons"]


@pytest.mark.parametrize("damage", ["{ not json", '["a list"]', '{"lessons": 3, "exercises": {}}', "\udcff"])
def test_a_damaged_journal_costs_one_line_and_is_kept_aside(fresh: Path, damage: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    fresh.parent.mkdir(parents=True)
    fresh.write_text(damage, errors="surrogateescape")
    journal.exercise_checked("07", 1, 3)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "starting a new journal" in err and "progress.json.damaged" in err
    assert json.loads(fresh.read_text())["exercises"]["07"]["earned"] == 1
    assert fresh.with_name("progress.json.damaged").read_text(errors="surrogateescape") == damage


@pytest.mark.parametrize("damage", [
    {"lessons": {"03_modules": "yes"}},                                       # seen: stopped every set-up cell
    {"exercises": {"05": {"earned": 3, "at": "2026-12-01T10:00"}}},           # no `possible`: KeyError in `progress`
    {"lessons": {"05_mixed_precision": {"predictions": {"q": "faster"}}}},
    {"exercises": {"07": {"earned": "3", "possible": 5}}},
])
def test_a_malformed_entry_is_set_aside_and_the_good_ones_kept(fresh: Path, damage: dict, monkeypatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    good = {"lessons": {"01_bottleneck": {"run": "2026-12-01T09:00:00+00:00", "mode": "full"}},
            "exercises": {"02": {"earned": 2, "possible": 4, "at": "2026-12-01T09:30:00+00:00"}}}
    data = {"version": 1, "lessons": {**good["lessons"], **damage.get("lessons", {})},
            "exercises": {**good["exercises"], **damage.get("exercises", {})}}
    fresh.parent.mkdir(parents=True)
    fresh.write_text(json.dumps(data))
    summary = journal.summary_markdown()  # what `course progress` and lesson 00 show: no exception
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "malformed entries" in err and "progress.json.damaged" in err, err
    assert "| 01_bottleneck | 2026-12-01 09:00 (full mode)" in summary and "2/4 points" in summary
    assert journal.load() == {"version": 1, **good}  # the good entries carry on, on disk too
    assert json.loads(fresh.with_name("progress.json.damaged").read_text()) == data
    monkeypatch.setenv("COURSE_UNATTENDED", "0")
    monkeypatch.setenv("JPY_SESSION_NAME", "course/notebooks/03_modules.ipynb")
    journal.lesson_run()  # a set-up cell records as usual
    assert "03_modules" in journal.load()["lessons"]


def test_an_unwritable_journal_never_stops_anything(fresh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fresh.parent.parent.mkdir(parents=True)
    fresh.parent.write_text("a file where the folder should be")
    journal.exercise_checked("07", 1, 3)  # no exception
    assert "not recorded" in capsys.readouterr().err


@pytest.mark.slow
def test_running_a_lesson_and_an_exercise_in_a_kernel_shows_in_the_progress_view(
        fresh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """As a learner's JupyterLab runs them (the kernel told its notebook's path), with a fresh journal."""
    import nbformat

    from course_lib.nbrun import NotebookRunner

    before = journal.summary_markdown()
    assert "| 00_welcome | not run yet |" in before and "| 05_lr_schedule | not checked yet |" in before
    for notebook in ("notebooks/00_welcome.ipynb", "solutions/05_lr_schedule.ipynb"):
        monkeypatch.setenv("JPY_SESSION_NAME", notebook)
        nb = nbformat.read(REPO / notebook, as_version=4)
        # A cell here takes seconds: one still running after 150 s is a hang, reported with the cell's source
        # (nbclient's CellTimeoutError) before the test's own 300 s limit.
        NotebookRunner(nb, timeout=150, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    assert cli.main(["progress"]) == 0
    out = capsys.readouterr().out
    lesson = next(line for line in out.splitlines() if line.startswith("| 00_welcome |"))
    assert "(smoke mode)" in lesson and "not run yet" not in lesson
    exercise = next(line for line in out.splitlines() if line.startswith("| 05_lr_schedule |"))
    possible = sum(c.points for c in checks_for("05"))
    assert f"| {possible}/{possible} points," in exercise


def test_progress_piped_into_head_says_nothing_on_stderr(tmp_path: Path) -> None:
    """Seen: `course progress | head` printed "error: Broken pipe". Here the reader is gone before the first write
    (a closed pipe), which `head` only sometimes is: the same error, every time."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ, "COURSE_PROGRESS_FILE": str(tmp_path / "progress.json")}
    try:
        done = subprocess.run([sys.executable, "-m", "course_lib", "progress"], stdout=write_end,
                              stderr=subprocess.PIPE, env=env, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_progress_is_kept_per_learner_in_the_data_folder_not_in_the_clone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen: every process and kernel using a checkout shared its `.cache/progress.json`. Now each learner has a
    file under the course's data folder (a class may share one), and a journal left in the clone is carried over."""
    import getpass

    monkeypatch.delenv("COURSE_PROGRESS_FILE", raising=False)
    monkeypatch.delenv("COURSE_UNATTENDED", raising=False)
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path / "data"))
    legacy = tmp_path / "clone" / ".cache" / "progress.json"
    legacy.parent.mkdir(parents=True)
    legacy.write_text(json.dumps({"version": 1, "lessons": {}, "exercises": {"03": {"earned": 2, "possible": 4,
                                                                                     "at": "2026-01-01"}}}))
    monkeypatch.setattr(journal, "LEGACY_PATH", legacy)
    for learner in ("ada", "grace"):
        monkeypatch.setattr(getpass, "getuser", lambda learner=learner: learner)
        assert journal.path() == tmp_path / "data" / "progress" / f"{learner}.json"
        journal.exercise_checked(f"0{len(learner)}", 1, 2)
    ada = json.loads((tmp_path / "data" / "progress" / "ada.json").read_text())["exercises"]
    grace = json.loads((tmp_path / "data" / "progress" / "grace.json").read_text())["exercises"]
    assert set(ada) == {"03"} and set(grace) == {"03", "05"}  # each their own, the clone's carried over
    assert not journal.path().is_relative_to(journal.COURSE_ROOT)


def _record_many(where: str, writer: int) -> None:
    import os

    os.environ["COURSE_PROGRESS_FILE"] = where
    os.environ.pop("COURSE_UNATTENDED", None)
    for i in range(15):
        journal.exercise_checked(f"w{writer}-{i}", i, 15)


def test_several_writers_at_once_lose_nothing(tmp_path: Path) -> None:
    """Kernels of several lessons record at once: under the journal's lock no update is lost."""
    import multiprocessing

    where = str(tmp_path / "progress.json")
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_record_many, args=(where, n)) for n in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    assert all(writer.exitcode == 0 for writer in writers)
    assert len(json.loads(Path(where).read_text())["exercises"]) == 4 * 15
