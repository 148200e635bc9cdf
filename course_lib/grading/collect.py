"""Instructor: hand-ins as the platform gives them, into the class layout ``grade`` reads.

``python -m course_lib collect --canvas submissions.zip --into class/`` or ``--moodle download.zip|FOLDER``:

* Canvas's "Download Submissions" zip names each file ``login_userid_submissionid_name.ipynb`` (a late one
  ``login_late_userid_submissionid_name.ipynb``): saved as ``class/<login>/<name>``.
* Moodle's "Download all submissions" holds one folder per student, ``Full Name_userid_assignsubmission_file_/``,
  with the files as uploaded: saved as ``class/<Full Name>/<name>`` (give ``grade --roster`` a ``folder`` column with
  the full names to map them to logins).

A name ``grade`` finds (``05_lr_schedule.ipynb``, or a renamed copy such as ``Copy of 05_lr_schedule-1.ipynb``, which
``grade`` flags) is kept. Any other name that carries an exercise's number and every word of its title (``Zoe - 05 LR
schedule final.ipynb``) is saved under the exercise's own name, and the renaming is recorded: in
``class/collected.csv`` (one row per file: folder, handed in as, saved as, late, note), in one line on the terminal,
and in ``<student>/.collected.json``, from which ``grade`` adds it to the student's feedback. A name with no
exercise's number and title is saved as it is and named in a warning: it would be graded as missing otherwise, silently.
Only the files' base names are used: a member path such as ``../../x`` cannot write outside ``--into``.
"""

from __future__ import annotations

import csv
import json
import re
import sys
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from course_lib import atomic
from course_lib.argparsing import CommandParser
from course_lib.grading.api import printable
from course_lib.grading.gradebook import csv_cell
from course_lib.grading.notebook import NOTEBOOK_NAME
from course_lib.grading.runner import RENAMED_COPY

CHECKS_DIR = Path(__file__).resolve().parent / "checks"
CANVAS_NAME = re.compile(r"^(?P<login>.+?)(?P<late>_late)?_(?P<userid>\d+)_(?P<submission>\d+)_(?P<name>.+)$")
MOODLE_FOLDER = re.compile(r"^(?P<name>.+?)_(?P<userid>\d+)_assignsubmission_[a-z]+_?$")
RECORD = ".collected.json"  # in a student folder: {saved name: what was handed in}, read by grade


@dataclass
class HandIn:
    folder: str  # the student's folder in the class layout
    name: str  # the file's name as handed in
    data: bytes
    late: bool = False


@dataclass
class Collected:
    folder: str
    handed_in: str
    saved_as: str
    late: bool
    note: str


def exercise_titles(folders: Iterable[Path] = ()) -> dict[str, str]:
    """``{"05": "lr_schedule"}``: from the course's checks (``exNN_topic.py``) and any ``NN_topic.ipynb`` in
    ``folders`` (an ``exercises/`` folder, or the instructor's own)."""
    titles = {m[1]: m[2] for p in CHECKS_DIR.glob("ex*.py") if (m := re.match(r"ex(\d\d)_(\w+)\.py$", p.name))}
    for folder in folders:
        titles.update({m["number"]: m["topic"] for p in Path(folder).glob("*.ipynb")
                       if (m := NOTEBOOK_NAME.match(p.name))})
    return titles


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+|\d+", text.lower())


def exercise_name(name: str, titles: dict[str, str]) -> tuple[str, str]:
    """``(name to save as, note)``: a name grade finds is kept; one with an exercise's number and title's words is
    renamed to ``NN_topic.ipynb``; any other is kept with a note saying it will not be graded."""
    if NOTEBOOK_NAME.match(name) or RENAMED_COPY.match(name):
        return name, ""
    words = set(_words(Path(name).stem))
    matches = [n for n, topic in titles.items() if n in words and set(_words(topic)) <= words]
    if len(matches) == 1 and name.endswith(".ipynb"):
        wanted = f"{matches[0]}_{titles[matches[0]]}.ipynb"
        return wanted, f"handed in as {name!r}, saved as {wanted}: hand it in under that name"
    why = f"it names exercises {' and '.join(matches)}" if matches else "no exercise's number and title in its name"
    return name, f"{name!r} is not graded: {why}; rename it to NN_topic.ipynb if it is an exercise"


def _zip_members(path: Path) -> Iterator[tuple[str, bytes]]:
    """(member path, bytes) of every file in a zip; a clear ValueError when it is not one."""
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.is_dir():
                    yield info.filename, archive.read(info)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ValueError(f"{path}: not a zip file that can be read ({exc}); give the platform's download") from exc


def canvas_hand_ins(path: Path) -> Iterator[HandIn]:
    for member, data in _zip_members(path):
        base = member.replace("\\", "/").rsplit("/", 1)[-1]
        match = CANVAS_NAME.match(base)
        if not match:
            raise ValueError(f"{path}: {member!r} is not named login_userid_submissionid_name as Canvas names the "
                             f"files of 'Download Submissions'; give that zip as it was downloaded")
        yield HandIn(match["login"], match["name"], data, late=bool(match["late"]))


def moodle_hand_ins(path: Path) -> Iterator[HandIn]:
    if path.is_dir():
        members: Iterable[tuple[str, bytes]] = ((str(p.relative_to(path)), p.read_bytes())
                                                for p in sorted(path.rglob("*")) if p.is_file())
    else:
        members = _zip_members(path)
    for member, data in members:
        parts = member.replace("\\", "/").split("/")
        student = next((m for part in parts[:-1] if (m := MOODLE_FOLDER.match(part))), None)
        if student is None:
            raise ValueError(f"{path}: {member!r} is in no folder named 'Full Name_userid_assignsubmission_file_' as "
                             f"Moodle's 'Download all submissions' makes; give that download as it is")
        yield HandIn(student["name"], parts[-1], data)


def _safe_folder(name: str) -> str:
    """A folder name from a platform's name: no path separators, not hidden, not empty."""
    cleaned = name.replace("/", "_").replace("\\", "_").strip().lstrip(".")
    return cleaned or "_"


def _free_name(folder: Path, name: str) -> str:
    """``name``, or ``stem (2).ipynb`` when taken (a second file for the same exercise): a copy grade recognises."""
    stem, suffix = Path(name).stem, Path(name).suffix
    candidate, k = name, 2
    while (folder / candidate).exists():
        candidate, k = f"{stem} ({k}){suffix}", k + 1
    return candidate


def collect(hand_ins: Iterable[HandIn], into: Path, titles: dict[str, str]) -> list[Collected]:
    """Write every hand-in into ``into/<folder>/``; the record of what was saved under which name."""
    record: list[Collected] = []
    for hand_in in hand_ins:
        folder = into / _safe_folder(hand_in.folder)
        folder.mkdir(parents=True, exist_ok=True)
        wanted, note = exercise_name(_safe_folder(hand_in.name), titles)
        saved = _free_name(folder, wanted)
        atomic.write_bytes(folder / saved, hand_in.data)
        record.append(Collected(folder.name, hand_in.name, saved, hand_in.late, note))
    for folder in {r.folder for r in record}:
        renamed = {r.saved_as: {"handed_in": r.handed_in, "late": r.late} for r in record
                   if r.folder == folder and (r.saved_as != r.handed_in or r.late)}
        if renamed:
            atomic.write_text(into / folder / RECORD, json.dumps(renamed, indent=1, ensure_ascii=False) + "\n")
    return record


def collected_note(path: Path) -> str:
    """What ``collect`` recorded about the notebook at ``path`` (its name as handed in, late), or ``""``."""
    try:
        entry = json.loads((path.parent / RECORD).read_text(encoding="utf-8")).get(path.name)
    except (OSError, ValueError, AttributeError):
        return ""
    if not isinstance(entry, dict):
        return ""
    said = [f"handed in as {str(entry.get('handed_in'))!r}"] if entry.get("handed_in") != path.name else []
    return ", ".join(said + ["late"] * bool(entry.get("late")))


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser(prog="python -m course_lib collect", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--canvas", type=Path, metavar="ZIP", help="Canvas's 'Download Submissions' zip")
    source.add_argument("--moodle", type=Path, metavar="ZIP_OR_FOLDER", help="Moodle's 'Download all submissions'")
    parser.add_argument("--into", type=Path, required=True, help="the class folder to create (new or empty)")
    parser.add_argument("--titles-from", type=Path, action="append", default=[], metavar="DIR",
                        help="a folder of NN_topic.ipynb whose titles are matched too (e.g. the instructor's own)")
    args = parser.parse_args(argv)
    given = args.canvas or args.moodle
    if not given.exists():
        parser.error(f"{given}: not found")
    if args.into.exists() and (not args.into.is_dir() or any(args.into.iterdir())):
        parser.error(f"--into {args.into}: exists and is not an empty folder; give a new folder, so hand-ins of two "
                     "downloads are never mixed")
    hand_ins = canvas_hand_ins(given) if args.canvas else moodle_hand_ins(given)
    try:
        record = collect(list(hand_ins), args.into, exercise_titles(args.titles_from))
    except ValueError as exc:
        parser.error(str(exc))
    def write_rows(handle: IO[str]) -> None:
        writer = csv.writer(handle)
        writer.writerow(["folder", "handed in as", "saved as", "late", "note"])
        writer.writerows([csv_cell(c) for c in (r.folder, r.handed_in, r.saved_as, "late" * r.late, r.note)]
                         for r in record)

    atomic.write_with(args.into / "collected.csv", write_rows, encoding="utf-8", newline="")
    for r in record:
        if r.note:
            print(f"{'warning: ' * ('not graded' in r.note)}{printable(r.folder)}: {printable(r.note)}",
                  file=sys.stderr)
    late = sum(r.late for r in record)
    print(f"collected {len(record)} file(s) of {len({r.folder for r in record})} student(s) into {args.into}/"
          f"{f' ({late} late)' if late else ''}; the list is in {args.into / 'collected.csv'}")
    return 0
