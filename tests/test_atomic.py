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
