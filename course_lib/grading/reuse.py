"""Incremental grading: a notebook graded before, unchanged, under the same grader, is not run again.

Each run keeps, in its feedback folder, ``.graded.json``: per student and exercise, the SHA-256 of the notebook's
bytes, the grader's version (:func:`gradebook.grader_version`: the grading code and every check) and the grade. The
next run (``--regrade``, or any run writing the same feedback folder) reuses a grade whose notebook and grader are
both unchanged; only a grade that ran to its end (``graded``, ``invalid notebook``) is kept, never a timeout or an
interruption, which may not happen again. The file is part of the run's set (:mod:`course_lib.grading.outputs`),
so it always describes the grades beside it. ``--students NAME ...`` runs only those students' notebooks and keeps
every other student's previous grades as they were (said in their flags when the notebook changed since).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_lib.grading.api import CheckResult
from course_lib.grading.runner import GRADED, INVALID, NotebookGrade

RECORD_NAME = ".graded.json"
REUSABLE = (GRADED, INVALID)


def notebook_hash(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _to_dict(grade: NotebookGrade) -> dict[str, Any]:
    return {"exercise": grade.exercise, "results": [r.to_dict() for r in grade.results], "status": grade.status,
            "uses_reference": grade.uses_reference, "seed": grade.seed}


def _from_dict(data: dict[str, Any]) -> NotebookGrade:
    return NotebookGrade(data["exercise"], [CheckResult.from_dict(r) for r in data["results"]], data["status"],
                         list(data.get("uses_reference", [])), seed=int(data.get("seed", 0)))


@dataclass
class Reuse:
    """The previous grades a run may reuse, and the record this run writes."""

    grader: str
    previous: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # student -> exercise -> entry
    only: Collection[str] | None = None  # --students: run only these
    record: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    reused: int = 0

    @classmethod
    def read(cls, grader: str, feedback_folders: Iterable[Path], only: Collection[str] | None = None) -> Reuse:
        """From the first readable record among ``feedback_folders``; a damaged or missing one reuses nothing."""
        for folder in feedback_folders:
            try:
                previous = json.loads((folder / RECORD_NAME).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(previous, dict):
                return cls(grader, previous, only)
        return cls(grader, {}, only)

    def lookup(self, student: str, number: str, path: Path | None) -> tuple[NotebookGrade | None, str]:
        """``(grade, note)``: the previous grade when it may stand in for running ``path`` again, else None."""
        entry = self.previous.get(student, {}).get(number)
        if path is None or not isinstance(entry, dict):
            return None, ""
        unchanged = entry.get("sha256") == notebook_hash(path) and entry.get("grader") == self.grader
        keep_as_was = self.only is not None and student not in self.only
        if not (unchanged or keep_as_was) or (self.only is not None and student in self.only):
            return None, ""
        try:
            grade = _from_dict(entry["grade"])
        except (KeyError, TypeError, ValueError):
            return None, ""
        if grade.status not in REUSABLE:
            return None, ""
        self.reused += 1
        self.record.setdefault(student, {})[number] = entry  # as it was: a changed notebook stays marked changed
        return grade, "" if unchanged else "not graded again (--students): the previous run's grade, though the " \
                                           "notebook or the grader changed since"

    def keep(self, student: str, number: str, path: Path | None, grade: NotebookGrade) -> None:
        """Record ``grade`` of ``path`` for the next run."""
        digest = notebook_hash(path) if path is not None else None
        if digest is not None and grade.status in REUSABLE:
            self.record.setdefault(student, {})[number] = {"sha256": digest, "grader": self.grader,
                                                           "grade": _to_dict(grade)}

    def write(self, feedback: Path) -> None:
        (feedback / RECORD_NAME).write_text(json.dumps(self.record, ensure_ascii=False) + "\n", encoding="utf-8")
