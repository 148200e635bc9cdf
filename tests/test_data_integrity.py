"""A damaged dataset never trains: every problem names its file or folder, `data prepare` repairs it, `data info`
tells the truth."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from course_lib.data import DataError, load_image_datasets, repair_shapes, verify_shapes
from course_lib.data.cli import main as data_cli
from course_lib.data.shapes import prepare_shapes
from course_lib.train import cli as train_cli


@pytest.fixture(scope="module")
def pristine() -> Path:
    return prepare_shapes(progress=False)


@pytest.fixture
def shapes(tmp_path: Path, pristine: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the smoke shapes, made the current data directory."""
    data_dir = tmp_path / "data"
    copy = data_dir / pristine.name
    shutil.copytree(pristine, copy)
    monkeypatch.setenv("COURSE_DATA_DIR", str(data_dir))
    return copy


def _bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _delete_val_class(root: Path) -> str:
    shutil.rmtree(root / "val" / "star")
    return "val/star/"


def _delete_train_class(root: Path) -> str:
    shutil.rmtree(root / "train" / "triangle")
    return "train/triangle/"


def _extra_class(root: Path) -> str:
    (root / "train" / "owl").mkdir()
    shutil.copy(root / "train" / "circle" / "0.jpg", root / "train" / "owl" / "0.jpg")
    return "train/owl"


def _truncate(root: Path) -> str:
    path = root / "train" / "ring" / "3.jpg"
    path.write_bytes(path.read_bytes()[:500])
    return "train/ring/3.jpg"


def _extra_file(root: Path) -> str:
    (root / "val" / "arrow" / "notes.txt").write_text("not an image")
    return "val/arrow/notes.txt"


DAMAGE = {"deleted-val-class": _delete_val_class, "deleted-train-class": _delete_train_class,
          "extra-class": _extra_class, "truncated-jpeg": _truncate, "extra-file": _extra_file}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_each_corruption_is_named_refused_and_repaired(shapes: Path, damage: str, capsys) -> None:
    before = _bytes(shapes)
    name = DAMAGE[damage](shapes)
    # Loading refuses, naming what is wrong and how to repair it.
    with pytest.raises(DataError) as info:
        load_image_datasets("shapes")
    assert name in str(info.value) and "data prepare" in str(info.value)
    # `data info` reports the damage instead of what meta.json claims.
    assert data_cli(["info"]) == 0
    out = capsys.readouterr().out
    assert "DAMAGED" in out and name in out
    # `data prepare` repairs it: the folder is again exactly what was generated.
    assert data_cli(["prepare", "--quiet", "--which", "shapes"]) == 0
    assert "repaired" in capsys.readouterr().err
    assert _bytes(shapes) == before
    assert verify_shapes(shapes).ok
    assert data_cli(["info"]) == 0 and "verified" in capsys.readouterr().out
    assert len(load_image_datasets("shapes").val) == 80


def test_training_on_damaged_data_is_a_one_line_error(shapes: Path, tmp_path: Path, capsys) -> None:
    _delete_val_class(shapes)
    code = train_cli.main(["--steps", "2", "--device", "cpu", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "val/star/" in lines[0] and "data prepare" in lines[0]


def test_a_same_size_corruption_is_found_by_checksum_and_names_the_file_when_read(shapes: Path) -> None:
    path = shapes / "val" / "hexagon" / "2.jpg"
    path.write_bytes(b"\0" * path.stat().st_size)  # same size: only the CRC-32 can tell
    report = verify_shapes(shapes)
    assert report.damaged == ["val/hexagon/2.jpg (contents changed)"]
    data = load_image_datasets("shapes")  # the cheap load-time check (sizes) passes...
    index = next(i for i, (p, _) in enumerate(data.val.samples) if Path(p) == path)
    with pytest.raises(DataError, match=str(path)):  # ...and decoding names the file
        data.val[index]
    repair_shapes(shapes)
    assert verify_shapes(shapes).ok


def _rot(path: Path) -> None:
    """Flip one bit inside the compressed pixels: same size, still decodes, different pixels (bit rot)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_rotted_bytes_that_still_decode_are_refused_where_they_are_read(shapes: Path, tmp_path: Path, capsys) -> None:
    """Seen: `data info` knew the file was damaged, and training used it without a word."""
    from course_lib.data.images import KeyedImageFolder

    path = shapes / "val" / "hexagon" / "2.jpg"
    _rot(path)
    unchecked = KeyedImageFolder(shapes / "val", transform=lambda image: image)
    index = next(i for i, (p, _) in enumerate(unchecked.samples) if Path(p) == path)
    unchecked[index]  # decodes: only the manifest can tell
    data = load_image_datasets("shapes")  # the load-time check (sizes) passes
    with pytest.raises(DataError, match="data prepare") as info:
        data.val[index]
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    code = train_cli.main(["--steps", "2", "--eval-every", "2", "--device", "cpu", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(path) in lines[0] and "data prepare" in lines[0], err


def test_junk_files_and_hidden_folders_are_ignored_everywhere_class_folders_are_listed(shapes: Path, tmp_path: Path,
                                                                                         capsys) -> None:
    """Seen: macOS `._*` twins (a `.jpg` name, no image inside) passed verification and then stopped training."""
    before = (len(load_image_datasets("shapes").train), len(load_image_datasets("shapes").val))
    for folder in (shapes / "train" / "circle", shapes / "val" / "star"):
        (folder / "._0.jpg").write_bytes(b"\x00\x05\x16\x07AppleDouble resource fork")
        (folder / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (shapes / "train" / ".DS_Store").write_bytes(b"Bud1")
    (shapes / "val" / ".Trashes").mkdir()
    (shapes / "val" / ".Trashes" / "0.jpg").write_bytes(b"not a class")
    assert verify_shapes(shapes).ok
    data = load_image_datasets("shapes")
    assert (len(data.train), len(data.val)) == before
    assert not any(Path(p).name.startswith(".") for p, _ in data.train.samples + data.val.samples)
    assert data.val.classes == sorted(data.class_names)
    assert data_cli(["info"]) == 0 and "verified" in capsys.readouterr().out
    code = train_cli.main(["--steps", "2", "--eval-every", "2", "--device", "cpu", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err


@pytest.mark.parametrize("meta", ['{"params": {"format"', "", "[]", '{"params": {}}'])
def test_a_cut_short_manifest_is_reported_by_data_info_and_regenerated_by_prepare(shapes: Path, capsys,
                                                                                  meta: str) -> None:
    """Seen: `data info` crashed with a traceback on a truncated meta.json."""
    (shapes / "meta.json").write_text(meta)
    assert data_cli(["info"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert "DAMAGED" in captured.out and "meta.json" in captured.out and "data prepare" in captured.out
    with pytest.raises(DataError, match="data prepare"):
        verify_shapes(shapes)
    assert data_cli(["prepare", "--quiet", "--which", "shapes"]) == 0
    assert verify_shapes(shapes).ok
