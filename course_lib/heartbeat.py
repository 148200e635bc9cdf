"""A cell that runs long says so: what the library is doing, how far it got, and about how long is left.

A lesson cell that measures for a minute used to show an empty output the whole time (lesson 05's precision cell:
about 114 s on a busy laptop), and a learner cannot tell a slow measurement from a hung kernel. Two parts:

* **What is being done.** The library's long loops say what they do with :func:`working_on` (``compare``'s
  rounds, a ceiling sweep) and :meth:`Activity.advance` after each unit. Nothing is printed by this: it only
  records ``what``, ``done`` of ``total`` and when it started.
* **A watch on the cell.** :func:`watch_cells` (installed by every lesson's set-up cell) starts a watcher thread
  with each cell. When the cell has printed nothing for ``SILENT_S`` seconds (no text, no display, no progress bar
  moving), the watcher shows one line and keeps it current in place::

      Still running, 24 s so far: timing fp32 vs bf16, 3 of 7 rounds done, about 12 s left.

  When the cell ends the line says how long it ran ("This cell ran for 26 s."). A cell that reports its own
  progress (``%%torchrun``, a ``tqdm`` bar) is left alone.

The estimate of the time left is the elapsed time per unit done, times the units left: rough, and said as "about".
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

SILENT_S = 10.0  # a cell silent this long gets a status line
REFRESH_S = 2.0  # how often the line is brought up to date


@dataclass
class Activity:
    """One long piece of work the library is doing: ``done`` of ``total`` ``unit``s (``total`` None: unknown)."""

    what: str
    total: int | None = None
    unit: str = "step"
    reports_itself: bool = False  # it prints its own progress (a launcher's lines, a bar): no status line
    done: int = 0
    started: float = field(default_factory=time.monotonic)

    def advance(self, n: int = 1) -> None:
        self.done += n

    def describe(self, now: float | None = None) -> str:
        """``what``, and ``done of total units done, about N s left`` once one unit is done."""
        now = time.monotonic() if now is None else now
        if self.total is None:
            return f"{self.what} ({self.done} {self.unit}s done)" if self.done else self.what
        units = f"{self.unit}s" if self.total != 1 else self.unit
        if not self.done:
            return f"{self.what}, {self.unit} 1 of {self.total} under way"
        left = (now - self.started) / self.done * max(self.total - self.done, 0)
        return f"{self.what}, {self.done} of {self.total} {units} done, about {format_duration(left)} left"


_stack: list[Activity] = []  # what the library is doing now, outermost first (main thread's work)


@contextlib.contextmanager
def working_on(what: str, *, total: int | None = None, unit: str = "step",
               reports_itself: bool = False) -> Iterator[Activity]:
    """Record, for the duration of the block, that the library is doing ``what`` (see the module docstring)."""
    activity = Activity(what, total, unit, reports_itself)
    _stack.append(activity)
    try:
        yield activity
    finally:
        _stack.remove(activity)


def current() -> list[Activity]:
    """What the library is doing now, outermost first."""
    return list(_stack)


def format_duration(seconds: float) -> str:
    """``8 s``, ``2 min 05 s``."""
    seconds = max(0, round(seconds))
    return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min {seconds % 60:02d} s"


def status_line(elapsed: float, activities: list[Activity], now: float | None = None) -> str:
    """The watcher's line: the cell's time so far and what the innermost described activity is doing."""
    doing = next((a for a in reversed(activities) if a.total is not None), activities[-1] if activities else None)
    said = f": {doing.describe(now)}" if doing is not None else " (this cell prints when it finishes)"
    return f"Still running, {format_duration(elapsed)} so far{said}."


def _bars_moving(now_wall: float) -> bool:
    """Whether an open tqdm bar was drawn in the last ``SILENT_S`` seconds (a bar's updates are not text)."""
    from tqdm import std

    bars = list(getattr(std.tqdm, "_instances", ()))
    return any(not getattr(b, "disable", True) and now_wall - getattr(b, "last_print_t", 0) < SILENT_S for b in bars)


class _Watch:
    """The watcher of one cell: a thread that shows and refreshes the status line while the cell is silent."""

    def __init__(self, last_output: list[float]) -> None:
        self.last_output = last_output
        self.started = time.monotonic()
        self.stop = threading.Event()
        self.handle: Any = None
        self.thread = threading.Thread(target=self.run, name="course-heartbeat", daemon=True)

    def silent_for(self, now: float) -> float:
        return now - max(self.started, self.last_output[0])

    def run(self) -> None:
        while not self.stop.wait(REFRESH_S if self.handle is not None else 1.0):
            now = time.monotonic()
            activities = current()
            if any(a.reports_itself for a in activities):
                continue
            if self.handle is None and (self.silent_for(now) < SILENT_S or _bars_moving(time.time())):
                continue
            self.show(status_line(now - self.started, activities, now))

    def show(self, text: str) -> None:
        from IPython.display import display

        line = _Plain(text)
        if self.handle is None:
            self.handle = display(line, display_id=True)
        else:
            self.handle.update(line)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        if self.handle is not None:
            self.handle.update(_Plain(f"This cell ran for {format_duration(time.monotonic() - self.started)}."))


class _Plain:
    """Plain text for a display (no quotes around it, as a ``str`` would get)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text)


def watch_cells(shell: Any) -> bool:
    """Install the watcher on an IPython kernel (once; returns whether it is installed)."""
    if shell is None or not hasattr(shell, "events") or getattr(shell, "_course_heartbeat", False):
        return bool(getattr(shell, "_course_heartbeat", False))
    last_output = [0.0]
    _note_output(sys.stdout, last_output)
    _note_output(sys.stderr, last_output)
    publisher = getattr(shell, "display_pub", None)
    if publisher is not None and hasattr(publisher, "publish"):
        publish = publisher.publish

        def publish_noted(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread().name != "course-heartbeat":  # the status line itself is not output
                last_output[0] = time.monotonic()
            return publish(*args, **kwargs)

        publisher.publish = publish_noted
    watches: list[_Watch] = []

    def pre_run_cell(info: Any = None) -> None:
        while watches:
            watches.pop().finish()
        watch = _Watch(last_output)
        watches.append(watch)
        watch.thread.start()

    def post_run_cell(result: Any = None) -> None:
        while watches:
            watches.pop().finish()

    shell.events.register("pre_run_cell", pre_run_cell)
    shell.events.register("post_run_cell", post_run_cell)
    shell._course_heartbeat = True
    shell._course_watches = watches  # the running cell's watch (read by the tests)
    return True


def _note_output(stream: Any, last_output: list[float]) -> None:
    """Wrap ``stream.write`` so each write records when the cell last printed."""
    write = getattr(stream, "write", None)
    if write is None or getattr(write, "_course_noted", False):
        return

    def write_noted(text: str) -> int:
        if text:
            last_output[0] = time.monotonic()
        return write(text)

    write_noted._course_noted = True  # type: ignore[attr-defined]
    try:
        stream.write = write_noted
    except (AttributeError, TypeError):  # a stream whose methods cannot be replaced: no silence is noticed on it
        pass
