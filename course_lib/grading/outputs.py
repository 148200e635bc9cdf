"""One ``grade`` run, one consistent set of files: written to a staging place, then swapped in whole.

A run writes ``grades.csv``, the feedback folder, the Canvas and Moodle exports and (with ``--regrade``) the regrade
report. Written one after the other in place, a Ctrl-C half-way left files from two runs that disagree (a CSV of the
new, partial run beside exports of the previous one). So every file is first written into a hidden staging folder
beside the CSV (``.grades-staging-<random>/``; the feedback into ``.grades-feedback-staging-<random>/`` beside the
feedback folder, so each rename stays on its file system), and :meth:`Staging.publish` then moves them into place
with a Ctrl-C held back until the last rename is done: a stop at any moment leaves the previous complete set or the
new complete set. Files of the set the new run does not write (a regrade report when this run has no ``--regrade``)
are removed in the same swap, so no file of another run is left beside the new set.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from course_lib.interrupts import ctrl_c_deferred


@dataclass(frozen=True)
class OutputSet:
    """The files one ``grade`` run owns, named from ``--out`` and ``--feedback``."""

    csv: Path
    feedback: Path

    def beside(self, suffix: str) -> Path:
        """``grades-canvas.csv`` for ``"-canvas.csv"``: a file named after the CSV, in its folder."""
        return self.csv.with_name(self.csv.stem + suffix)

    @property
    def canvas(self) -> Path:
        return self.beside("-canvas.csv")

    @property
    def moodle(self) -> Path:
        return self.beside("-moodle.csv")

    @property
    def regrade(self) -> Path:
        return self.beside("-regrade.txt")

    @property
    def unmapped(self) -> Path:
        return self.beside("-unmapped.csv")

    def files(self) -> list[Path]:
        """Every file of the set (besides the feedback folder), whether or not this run writes it."""
        return [self.csv, self.canvas, self.moodle, self.regrade, self.unmapped]


# Called with the name of each step of publish() before it runs: a test's way to stop a run at that very moment.
before_step: Callable[[str], None] = lambda step: None  # noqa: E731


class Staging:
    """Where a run writes its set before :meth:`publish` swaps it in; :meth:`discard` when the run does not finish."""

    def __init__(self, outputs: OutputSet) -> None:
        token = secrets.token_hex(4)
        self.outputs = outputs
        self.folder = outputs.csv.parent / f".{outputs.csv.stem}-staging-{token}"
        self.feedback = outputs.feedback.parent / f".{outputs.feedback.name}-staging-{token}"
        self._previous_feedback = outputs.feedback.parent / f".{outputs.feedback.name}-previous-{token}"
        self.published = False  # True once every file is in place (a Ctrl-C held back may still be raised)
        self.folder.mkdir(parents=True)
        self.feedback.mkdir(parents=True)

    def path(self, final: Path) -> Path:
        """Where the file that ends up at ``final`` is written during the run."""
        return self.folder / final.name

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        shutil.rmtree(self.feedback, ignore_errors=True)

    def publish(self) -> None:
        """Move the staged set into place; a Ctrl-C meanwhile is raised once every file is in place."""
        feedback = self.outputs.feedback
        with ctrl_c_deferred():
            before_step("feedback")
            if feedback.exists():
                feedback.rename(self._previous_feedback)
            self.feedback.rename(feedback)
            for final in self.outputs.files():
                before_step(final.name)
                staged = self.path(final)
                if staged.exists():
                    os.replace(staged, final)
                elif final.is_file():
                    final.unlink()  # another run's file: it would sit beside this set as if it belonged to it
            before_step("clean up")
            shutil.rmtree(self._previous_feedback, ignore_errors=True)
            shutil.rmtree(self.folder, ignore_errors=True)
            self.published = True
