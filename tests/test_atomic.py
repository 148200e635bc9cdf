"""course_lib.atomic: the one way the library replaces a file (temporary file beside it, then ``os.replace``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from course_lib import atomic


def _names(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def test_writes_bytes_text_and_tensors(tmp_path: Path) -> None:
    assert atomic.write_bytes(tmp_path / "a.bin", b"\x00\x01") == tmp_path / "a.bin"
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    atomic.write_text(tmp_path / "b.txt", "caf\u00e9\n")
    assert (tmp_path / "b.txt").read_bytes() == "caf\u00e9\n".encode()
    atomic.torch_save({"w": torch.arange(3)}, tmp_path / "c.pt", fsync=True)
    assert torch.equal(torch.load(tmp_path / "c.pt", weights_only=True)["w"], torch.arange(3))
    atomic.write_with(tmp_path / "d.csv", lambda f: f.write("x\r\n"), encoding="utf-8", newline="")
    assert (tmp_path / "d.csv").read_bytes() == b"x\r\n"
    assert _names(tmp_path) == ["a.bin", "b.txt", "c.pt", "d.csv"]  # no temporary file left


def test_a_crash_between_write_and_replace_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    written: list[Path] = []

    def crash(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        written.append(Path(src))
        assert Path(src).read_text() == "new" and Path(src).parent == tmp_path  # fully written, beside the target
        raise KeyboardInterrupt  # anything at all, even Ctrl-C

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        atomic.write_text(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert _names(tmp_path) == ["state.json"]  # the temporary file is gone
    assert written and written[0].name.startswith(".state.json.") and written[0].name.endswith(".tmp")


def test_a_failing_writer_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.pt"
    target.write_bytes(b"good")

    def half_then_fail(f) -> None:
        f.write(b"PK half a zip")
        raise OSError("disk full (simulated)")

    with pytest.raises(OSError, match="simulated"):
        atomic.write_with(target, half_then_fail)
    assert target.read_bytes() == b"good"
    assert _names(tmp_path) == ["ckpt.pt"]


def test_temporary_names_are_unique_and_match_the_run_folder_cleanup(tmp_path: Path) -> None:
    names = {atomic.temporary_path(tmp_path / "ckpt.pt") for _ in range(50)}
    assert len(names) == 50
    assert all(p.match(".*.tmp") and p.parent == tmp_path for p in names)  # what train.rundir removes


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
def test_permissions_follow_the_umask_unless_private(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        atomic.write_bytes(tmp_path / "shared", b"")
        atomic.write_bytes(tmp_path / "private", b"", permissions=0o600)
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o644  # as open(..., "w") makes it
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600  # as tempfile.mkstemp made it


# ------------------------------------------------------------------------------------------- planted links
def test_replacing_a_planted_link_replaces_the_link_never_the_file_it_points_to(tmp_path: Path) -> None:
    notebook = tmp_path / "lesson.ipynb"
    notebook.write_bytes(b'{"cells": []}')
    link = tmp_path / "report.json"
    link.symlink_to(notebook)
    atomic.write_text(link, "new")
    assert notebook.read_bytes() == b'{"cells": []}'
    assert not link.is_symlink() and link.read_text() == "new"


@pytest.mark.parametrize("dangling", [False, True])
def test_appending_through_a_planted_link_is_refused_in_one_line(tmp_path: Path, dangling: bool) -> None:
    notebook = tmp_path / "lesson.ipynb"
    if not dangling:
        notebook.write_bytes(b'{"cells": []}')
    link = tmp_path / "claims.jsonl"
    link.symlink_to(notebook)
    with pytest.raises(atomic.LinkRefused) as caught:
        atomic.open_append(link)
    message = str(caught.value)
    assert "\n" not in message and str(link) in message and "symbolic link" in message and "rm " in message
    if dangling:
        assert not notebook.exists(), "a dangling link must not create the file it points to"
    else:
        assert notebook.read_bytes() == b'{"cells": []}'


def test_the_claim_log_and_the_journal_lock_never_write_through_a_planted_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from course_lib import journal
    from course_lib.perf import claims
    from course_lib.perf.compare import Verdict

    notebook = tmp_path / "lesson.ipynb"
    notebook.write_bytes(b'{"cells": []}')
    (tmp_path / "claims.jsonl").symlink_to(notebook)
    monkeypatch.setenv(claims.ENV, str(tmp_path / "claims.jsonl"))
    verdict = Verdict(a="a", b="b", outcome="too_close", ratio=1.0, low=0.9, high=1.1, quantity="wall", a_times=(1.0,),
                      b_times=(1.0,), band=0.1)
    with pytest.raises(atomic.LinkRefused):
        claims.record(verdict, "a and b are too close to call")
    (tmp_path / "progress.json.lock").symlink_to(notebook)
    monkeypatch.setenv("COURSE_PROGRESS_FILE", str(tmp_path / "progress.json"))
    monkeypatch.delenv("COURSE_UNATTENDED", raising=False)
    journal.exercise_checked("07", 1, 3)  # the journal never stops anything: one line
    assert "symbolic link" in capsys.readouterr().err
    assert notebook.read_bytes() == b'{"cells": []}'


def test_a_folder_that_refuses_new_files_is_named_not_the_temporary_file(tmp_path, monkeypatch) -> None:
    """Seen: writing data into a read-only folder said `.../circle/.0.jpg.a9be4abf.tmp: permission denied`."""
    import errno

    folder = tmp_path / "circle"
    folder.mkdir()
    real_open = os.open

    def refuse(path, flags, mode=0o777, **kwargs):
        if os.path.dirname(os.fspath(path)) == str(folder):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_open(path, flags, mode, **kwargs)

    monkeypatch.setattr(atomic.os, "open", refuse)
    with pytest.raises(OSError) as raised:
        atomic.write_bytes(folder / "0.jpg", b"x")
    line = atomic.os_error_line(raised.value)
    assert line.startswith(f"{folder}: permission denied") and ".tmp" not in line, line
    assert list(folder.iterdir()) == []
