"""Every command ends a fixable failure in one line: bad environment values and file-system faults, drawn at random
(seeded, so every run draws the same cases) from a small table, each driven through ``python -m course_lib``'s
:func:`course_lib.cli.main`.

The property, for every case: exit code 2 (130 for Ctrl-C), exactly one ``error:`` line on stderr, no traceback,
and no file outside the run's own folder changed.
"""

from __future__ import annotations

import errno
import pathlib
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from course_lib import cli, mode

COMMANDS = {
    "train": lambda run: ["train", "--steps", "2", "--eval-every", "1", "--bs", "8", "--device", "cpu",
                          "--out", str(run)],
    "data prepare": lambda run: ["data", "prepare", "--quiet"],
    "data info": lambda run: ["data", "info"],
}


@dataclass(frozen=True)
class Fault:
    name: str
    commands: tuple[str, ...]  # where it must fail (``data info`` only reads: a folder it cannot create is no fault)
    apply: Callable[[pytest.MonkeyPatch, Path, random.Random], None]
    code: int = 2


def _garbage(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits + " -_.") for _ in range(rng.randint(1, 12)))


def _bad_mode(mp: pytest.MonkeyPatch, home: Path, rng: random.Random) -> None:
    value = _garbage(rng)
    while value.strip().lower() in mode.MODES + ("",):
        value = _garbage(rng)
    mp.setenv("COURSE_MODE", value)


def _data_dir_is_a_file(mp: pytest.MonkeyPatch, home: Path, rng: random.Random) -> None:
    mp.setenv("COURSE_DATA_DIR", str(home / "notes.txt"))


def _data_dir_under_a_file(mp: pytest.MonkeyPatch, home: Path, rng: random.Random) -> None:
    mp.setenv("COURSE_DATA_DIR", str(home / "notes.txt" / f"data-{rng.randrange(1000)}"))


def _data_dir_cannot_be_created(mp: pytest.MonkeyPatch, home: Path, rng: random.Random) -> None:
    mp.setenv("COURSE_DATA_DIR", f"/proc/course-data-{rng.randrange(10**6)}")


def _bad_threads(mp: pytest.MonkeyPatch, home: Path, rng: random.Random) -> None:
    mp.setenv("COURSE_THREADS", rng.choice(["0", "-3", "many", "1.5", _garbage(rng) + "x"]))


def _writes_fail(code: int) -> Callable[[pytest.MonkeyPatch, Path, random.Random], None]:
    """Every file the data generation writes fails with ``code`` (a full disk, a read-only file system...)."""
    def apply(mp: pytest.MonkeyPatch, home: Path, rng: random.Random) -> None:
        def fail(self: Path, data: bytes) -> int:
            raise OSError(code, __import__("os").strerror(code), str(self))

        mp.setattr(pathlib.Path, "write_bytes", fail)
    return apply


def _ctrl_c_at_start_up(mp: pytest.MonkeyPatch, home: Path, rng: random.Random) -> None:
    def interrupted() -> str:
        raise KeyboardInterrupt

    mp.setattr(mode, "mode", interrupted)


ALL = tuple(COMMANDS)
FAULTS = [
    Fault("bad COURSE_MODE", ALL, _bad_mode),
    Fault("data folder is a file", ALL, _data_dir_is_a_file),
    Fault("data folder under a file", ("train", "data prepare"), _data_dir_under_a_file),
    Fault("data folder cannot be created", ("train", "data prepare"), _data_dir_cannot_be_created),
    Fault("bad COURSE_THREADS", ("train",), _bad_threads),
    Fault("disk full", ("train", "data prepare"), _writes_fail(errno.ENOSPC)),
    Fault("read-only file system", ("train", "data prepare"), _writes_fail(errno.EROFS)),
    Fault("permission denied", ("train", "data prepare"), _writes_fail(errno.EACCES)),
    Fault("Ctrl-C during start-up", ALL, _ctrl_c_at_start_up, code=130),
]


def _cases(seed: int, count: int) -> list[tuple[str, Fault, int]]:
    """Every (command, fault) pair of the table once, then random ones up to ``count``; each with the seed of its
    random values."""
    rng = random.Random(seed)
    cases = [(command, fault, rng.randrange(2**31)) for fault in FAULTS for command in fault.commands]
    while len(cases) < count:
        fault = rng.choice(FAULTS)
        cases.append((rng.choice(fault.commands), fault, rng.randrange(2**31)))
    return cases


CASES = _cases(seed=20261203, count=24)


def _files(root: Path, skip: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and skip not in p.parents}


@pytest.mark.parametrize(("command", "fault", "seed"), CASES,
                         ids=[f"{i:02d}-{c}-{f.name}" for i, (c, f, _) in enumerate(CASES)])
def test_every_command_ends_a_fault_in_one_error_line(command: str, fault: Fault, seed: int, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("a learner's notes")
    (home / "lesson.ipynb").write_text('{"cells": []}')
    run = home / "run"
    monkeypatch.setenv("COURSE_MODE", "smoke")
    monkeypatch.setenv("COURSE_DATA_DIR", str(home / "data"))  # empty: the data would be generated here
    monkeypatch.delenv("COURSE_THREADS", raising=False)
    before = _files(home, run)
    fault.apply(monkeypatch, home, random.Random(seed))
    code = cli.main(COMMANDS[command](run))
    monkeypatch.undo()  # before reading files back: a fault may patch Path itself
    out, err = capsys.readouterr()
    assert code == fault.code, (code, out, err)
    assert "Traceback" not in err + out, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert _files(home, run) == before
