"""The learner's progress journal: which lessons ran (mode, and when their set-up cell last ran), how many
predictions were answered and matched what was measured, and each exercise's last check score. One small JSON
file; nothing leaves the machine.

``python -m course_lib progress`` prints it (:mod:`course_lib.room`); lesson 00 shows it with :func:`show`.

The journal is never required. It is written atomically, under a lock where the platform has one (two kernels may
record at once), and only by runs a person is looking at: tests, the site build and other unattended runs
(``COURSE_UNATTENDED=1``) record nothing. A missing file is an empty journal; a damaged one is set aside
(``progress.json.damaged``) with one line on stderr and a new one begun: it never stops a lesson.

Where: ``$COURSE_PROGRESS_FILE`` if set, else ``progress/<user>.json`` in the course's data folder
(:func:`course_lib.mode.data_dir`, ``~/.cache/course_lib`` unless ``COURSE_DATA_DIR`` says otherwise): one file per
learner, also when a class shares one data folder, and never inside the clone, which every process using that
checkout would share. A journal an earlier version kept in the clone (``.cache/progress.json``) is carried over the
first time the new one is written.
"""

from __future__ import annotations

import getpass
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from course_lib import atomic, mode

VERSION = 1
COURSE_ROOT = Path(__file__).resolve().parents[1]  # the clone, when course_lib is used from one

__all__ = ["path", "load", "valid_entries", "lesson_run", "prediction_answered", "exercise_checked",
           "current_notebook", "summary_markdown", "show"]


LEGACY_PATH = COURSE_ROOT / ".cache" / "progress.json"  # where earlier versions kept it, in the clone


def _learner() -> str:
    """The learner's account name (the uid where the system has no name for it)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid{os.getuid()}" if hasattr(os, "getuid") else "learner"


def path() -> Path:
    """Where the journal lives (see the module's docstring)."""
    if os.environ.get("COURSE_PROGRESS_FILE"):
        return Path(os.environ["COURSE_PROGRESS_FILE"]).expanduser()
    try:
        folder = mode.data_dir()
    except mode.SettingError:  # a data folder that is a file: the lessons say so; the journal never stops one
        folder = Path.home() / ".cache" / "course_lib"
    return folder / "progress" / f"{_learner()}.json"


def _empty() -> dict[str, Any]:
    return {"version": VERSION, "lessons": {}, "exercises": {}}


def load(where: Path | None = None) -> dict[str, Any]:
    """The journal (an empty one when there is none; a damaged one is set aside with one line on stderr)."""
    where = where or path()
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if where != LEGACY_PATH and LEGACY_PATH.is_file() and not os.environ.get("COURSE_PROGRESS_FILE"):
            return load(LEGACY_PATH)  # kept in the clone by an earlier version: carried over on the next write
        return _empty()
    except (OSError, ValueError) as exc:
        _set_aside(where, exc)
        return _empty()
    if not isinstance(data, dict) or not isinstance(data.get("lessons"), dict) or \
            not isinstance(data.get("exercises"), dict):
        _set_aside(where, ValueError("not a progress journal"))
        return _empty()
    clean, dropped = valid_entries(data)
    if dropped:
        _set_aside(where, ValueError(f"malformed entries: {', '.join(dropped)}"), kept_entries=clean)
        try:  # the good entries carry on in a new journal
            atomic.write_text(where, json.dumps(clean, indent=1, sort_keys=True) + "\n")
        except OSError:
            pass
    return clean


def _valid_lesson(entry: Any) -> bool:
    if not isinstance(entry, dict) or not all(isinstance(entry.get(k, ""), str) for k in ("run", "mode")):
        return False
    predictions = entry.get("predictions", {})
    return isinstance(predictions, dict) and all(
        isinstance(answer, dict) and isinstance(answer.get("answer", ""), str)
        and answer.get("matched") in (True, False, None) for answer in predictions.values())


def _valid_exercise(entry: Any) -> bool:
    return (isinstance(entry, dict) and all(type(entry.get(k)) is int for k in ("earned", "possible"))
            and isinstance(entry.get("at", ""), str))


def valid_entries(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The journal with only the entries every reader can use, and the names of those left out."""
    lessons = {k: v for k, v in data["lessons"].items() if _valid_lesson(v)}
    exercises = {k: v for k, v in data["exercises"].items() if _valid_exercise(v)}
    dropped = [f"lesson {k}" for k in data["lessons"] if k not in lessons]
    dropped += [f"exercise {k}" for k in data["exercises"] if k not in exercises]
    return {**data, "lessons": lessons, "exercises": exercises}, dropped


def _set_aside(where: Path, why: Exception, kept_entries: dict[str, Any] | None = None) -> None:
    """Move the file to ``<name>.damaged`` and say so in one line: what was wrong and what the learner loses."""
    try:
        os.replace(where, where.with_name(where.name + ".damaged"))
        kept = f"the file is kept as {where.name}.damaged"
    except OSError:
        kept = "the file is left as it is"
    if kept_entries is None:
        lost = "starting a new journal: the lessons and scores it recorded are no longer shown"
    else:
        lost = (f"a new journal keeps its {len(kept_entries['lessons'])} good lesson(s) and "
                f"{len(kept_entries['exercises'])} good exercise(s); the malformed entries are no longer shown")
    print(f"course progress: {where} could not be read ({why}): {lost}; {kept}.", file=sys.stderr)


@contextmanager
def _locked(where: Path) -> Iterator[None]:
    """An exclusive lock on ``<journal>.lock`` where fcntl exists (released by the OS if the process dies)."""
    try:
        import fcntl
    except ImportError:  # Windows: atomic replacement only
        yield
        return
    with atomic.open_append(where.with_name(where.name + ".lock")) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _recording() -> bool:
    return not mode.is_unattended()


def _update(change: Callable[[dict[str, Any]], None]) -> None:
    """Read, change and write the journal back; any failure is one line on stderr, never an exception."""
    if not _recording():
        return
    where = path()
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        with _locked(where):
            data = load(where)
            change(data)
            atomic.write_text(where, json.dumps(data, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        print(f"course progress: not recorded ({exc})", file=sys.stderr)


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def current_notebook() -> str:
    """The notebook this kernel runs (``notebooks/00_welcome.ipynb``), as JupyterLab tells its kernels; ""."""
    return os.environ.get("JPY_SESSION_NAME", "")


def _lesson_key(notebook: str) -> str | None:
    """``"00_welcome"`` for a lesson's notebook path; None for anything else (exercises, a learner's notebook)."""
    where = Path(notebook)
    if where.suffix == ".ipynb" and where.parent.name == "notebooks" and where.stem[:2].isdigit():
        return where.stem
    return None


def lesson_run(notebook: str | None = None) -> None:
    """The lesson's set-up cell ran: the lesson is being run (in this mode, now)."""
    key = _lesson_key(current_notebook() if notebook is None else notebook)
    if key is None:
        return
    _update(lambda data: data["lessons"].setdefault(key, {}).update(run=_now(), mode=mode.mode()))


def prediction_answered(question: str, answer: str, matched: bool | None, notebook: str | None = None) -> None:
    """A question of the lesson was answered; ``matched`` is None when nothing could be compared (skipped, or the
    measurement could not decide)."""
    key = _lesson_key(current_notebook() if notebook is None else notebook)
    if key is None:
        return
    _update(lambda data: data["lessons"].setdefault(key, {}).setdefault("predictions", {}).update(
        {question: {"answer": answer, "matched": matched, "at": _now()}}))


def exercise_checked(exercise: str, earned: int, possible: int) -> None:
    """The exercise's checks ran: its score now."""
    _update(lambda data: data["exercises"].update({exercise: {"earned": earned, "possible": possible,
                                                             "at": _now()}}))


def _course_notebooks(folder: str) -> list[str]:
    return sorted(p.stem for p in (COURSE_ROOT / folder).glob("[0-9][0-9]_*.ipynb"))


def summary_markdown(data: dict[str, Any] | None = None) -> str:
    """The journal as two Markdown tables: lessons, then exercises (every one the course has, run or not)."""
    data = load() if data is None else data
    lessons = sorted(set(_course_notebooks("notebooks")) | set(data["lessons"]))
    lines = ["| lesson | run | predictions answered | matched the measurement |", "|---|---|---|---|"]
    for key in lessons:
        entry = data["lessons"].get(key, {})
        run = (f"{entry['run'][:16].replace('T', ' ')} ({entry.get('mode', '?')} mode)" if entry.get("run")
               else "not run yet")
        answers = list(entry.get("predictions", {}).values())
        compared = [a for a in answers if a.get("matched") is not None]
        matched = f"{sum(bool(a['matched']) for a in compared)} of {len(compared)}" if compared else "-"
        lines.append(f"| {key} | {run} | {len(answers) or '-'} | {matched} |")
    course_exercises = _course_notebooks("exercises")
    exercises = course_exercises + sorted(set(data["exercises"]) - {name[:2] for name in course_exercises})
    lines += ["", "| exercise | last check |", "|---|---|"]
    for name in exercises:
        entry = data["exercises"].get(name[:2]) or data["exercises"].get(name)
        score = (f"{entry['earned']}/{entry['possible']} points, {entry['at'][:16].replace('T', ' ')}"
                 if entry else "not checked yet")
        lines.append(f"| {name} | {score} |")
    return "\n".join(lines)


def show() -> None:
    """Display the journal in a notebook (Markdown tables).

    Taught in lesson 00 (``notebooks/00_welcome.ipynb``).
    """
    from IPython.display import Markdown, display

    if not _recording():  # a test run or the site build: nobody's journal to show
        display(Markdown("*Your progress table appears here when you run the lessons yourself.*"))
        return
    display(Markdown(f"Your progress (kept in `{path()}`, on this machine only):\n\n{summary_markdown()}"))
