"""The room's measurements (course_lib.room): a learner's bundle, and the instructor's class report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from course_lib import cli, room
from course_lib.perf.claims import problems
from course_lib.perf.compare import Verdict, decide

MACHINES = {  # name: (description changes, {comparison: (outcome, ratio, quantity)})
    "ana": ({}, {"loop": ("faster", 80.0, "wall"), "workers": ("faster", 1.6, "wall")}),
    "ben": ({}, {"loop": ("faster", 95.0, "wall"), "workers": ("faster", 1.4, "wall")}),
    "cai": ({}, {"loop": ("faster", 60.0, "wall"), "workers": ("faster", 1.5, "wall")}),
    "dev": ({"usable_cores": 1}, {"loop": ("faster", 70.0, "wall"), "workers": ("slower", 0.7, "wall")}),
    "eli": ({}, {"loop": ("faster", 40.0, "cpu"), "workers": ("too_close", 1.02, "cpu")}),
}
COMPARISONS = {"loop": ("00_welcome.ipynb", "torch.sum", "the Python loop"),
               "workers": ("02_dataloader.ipynb", "workers=2", "workers=0")}


def _claim(comparison: str, outcome: str, ratio: float, quantity: str) -> dict:
    """A claim as a lesson logs it: rounds that give ``ratio``, and the verdict and sentence they re-derive to."""
    lesson, a, b = COMPARISONS[comparison]
    a_times, b_times = [1.0, 1.0, 1.0], [ratio, ratio, ratio]
    derived, ratio, low, high = decide(a_times, b_times, band=0.1, quantity=quantity)
    assert derived == outcome, (comparison, ratio)
    verdict = Verdict(a=a, b=b, outcome=derived, ratio=ratio, low=low, high=high, quantity=quantity,
                      a_times=tuple(a_times), b_times=tuple(b_times), band=0.1, unit="call", threads=1)
    claim = {"format": 1, "lesson": lesson, "a": a, "b": b, "outcome": outcome, "ratio": ratio, "low": low,
             "high": high, "band": 0.1, "quantity": quantity, "unit": "call", "a_times": a_times,
             "b_times": b_times, "threads": 1, "sentence": f"On this machine {verdict.headline()}.",
             "time": "2026-12-03T08:00:00+00:00"}
    assert problems(claim) == []
    return claim


def _room(folder: Path) -> Path:
    """Five machines' bundles, as `progress export` writes them, plus a damaged file and a foreign one."""
    folder.mkdir()
    base = {"cores": 4, "usable_cores": 4, "machine": "x86_64", "system": "Linux", "device": "cpu",
            "torch": "2.9.0", "python": "3.12.1", "mode": "full", "course": "0.1.0"}
    for name, (changes, results) in MACHINES.items():
        bundle = {"format": 1, "kind": "course-room-bundle", "name": name, "machine": {**base, **changes},
                  "claims": [_claim(c, *r) for c, r in results.items()]}
        (folder / f"{name}.json").write_text(json.dumps(bundle))
    (folder / "broken.json").write_text("{ half a file")
    (folder / "notes.json").write_text(json.dumps({"todo": ["buy milk"]}))
    return folder


def test_the_class_report_draws_the_room_and_names_who_differs_and_why(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    folder = _room(tmp_path / "room")
    assert cli.main(["class", "report", str(folder), "--out", str(tmp_path / "report")]) == 0
    err = capsys.readouterr().err
    assert "broken.json: skipped, not JSON" in err and "notes.json: skipped, not a bundle" in err
    table = (tmp_path / "report" / "class-report.md").read_text()
    assert "(5 machines)" in table
    workers = next(line for line in table.splitlines() if "workers=2 vs workers=0" in line)
    assert "| 5 | 0.70x, 1.40x, 1.60x | faster |" in workers
    assert "dev: slower (1 usable core(s) (most: 4))" in workers
    assert "eli: too_close (a busy machine: its verdict rested on CPU time)" in workers
    loop = next(line for line in table.splitlines() if "torch.sum vs the Python loop" in line)
    assert loop.endswith("| faster | - |")  # every machine agrees
    assert (tmp_path / "report" / "class-report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_empty_or_missing_room_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert cli.main(["class", "report", str(tmp_path / "empty")]) == 1
    assert "no verdicts to compare" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["class", "report", str(tmp_path / "nowhere")])
    assert "not a folder" in capsys.readouterr().err


def test_a_learner_exports_their_claims_with_their_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "claims.jsonl"
    log.write_text("\n".join(json.dumps(_claim("loop", "faster", 50.0, "wall")) for _ in range(3)) + "\n")
    monkeypatch.setenv("COURSE_CLAIM_LOG", str(log))
    out = tmp_path / "me.json"
    assert cli.main(["progress", "export", "--out", str(out), "--name", "ana"]) == 0
    bundle = json.loads(out.read_text())
    assert bundle["name"] == "ana" and len(bundle["claims"]) == 3
    assert {"cores", "usable_cores", "device", "torch", "mode"} <= set(bundle["machine"])
    bundles, skipped = room.load_bundles(tmp_path)
    assert [b["name"] for b in bundles] == ["ana"] and skipped == []
    monkeypatch.delenv("COURSE_CLAIM_LOG")
    with pytest.raises(SystemExit):
        cli.main(["progress", "export", "--out", str(out)])
    assert "COURSE_CLAIM_LOG is not set" in capsys.readouterr().err


def _bundle(folder: Path, file: str, name: str, results: dict, **changes: object) -> None:
    base = {"cores": 4, "usable_cores": 4, "machine": "x86_64", "system": "Linux", "device": "cpu",
            "torch": "2.9.0", "python": "3.12.1", "mode": "full", "course": "0.1.0", **changes}
    claims = [c if isinstance(c, dict) else _claim(*c) for c in results]
    (folder / file).write_text(json.dumps({"format": 1, "kind": "course-room-bundle", "name": name,
                                           "machine": base, "claims": claims}))


def _line(folder: Path, out: Path, comparison: str) -> str:
    assert cli.main(["class", "report", str(folder), "--out", str(out)]) == 0
    return next(line for line in (out / "class-report.md").read_text().splitlines() if comparison in line)


def test_bundles_from_machines_with_one_host_name_are_each_a_machine(tmp_path: Path) -> None:
    """Seen: a lab's identical images all called themselves "lab-pc"; the last file won, with no warning."""
    folder = tmp_path / "room"
    folder.mkdir()
    _bundle(folder, "a.json", "lab-pc", [("loop", "faster", 80.0, "wall")])
    _bundle(folder, "b.json", "lab-pc", [("loop", "faster", 90.0, "wall")])
    _bundle(folder, "c.json", "lab-pc", [("loop", "slower", 0.5, "wall")], usable_cores=1)
    line = _line(folder, tmp_path / "out", "torch.sum vs the Python loop")
    assert "| 3 |" in line and "(3 machines)" in (tmp_path / "out" / "class-report.md").read_text()
    assert "lab-pc (c.json): slower" in line


def test_a_ratio_far_from_the_room_is_marked_though_its_verdict_agrees(tmp_path: Path) -> None:
    """Seen: a laptop at 2.94x in a room at 114x, both "faster", was not marked."""
    folder = tmp_path / "room"
    folder.mkdir()
    for name, ratio in (("ana", 114.0), ("ben", 120.0), ("cai", 100.0), ("dev", 2.94)):
        _bundle(folder, f"{name}.json", name, [("loop", "faster", ratio, "wall")],
                **({"device": "mps"} if name == "dev" else {}))
    line = _line(folder, tmp_path / "out", "torch.sum vs the Python loop")
    assert "| 2.94x, 106.77x, 120.00x | faster |" in line
    assert "dev: 2.94x, 36.3x below the room's median (device mps (most: cpu))" in line
    assert "ana" not in line.split("| faster |")[1]  # within 3x of the median: not marked
    assert room.median_ratio([room.Claim("x", {}, "faster", r, "wall") for r in (2.0, 8.0)]) == pytest.approx(4.0)


def test_an_even_split_is_said_as_a_tie(tmp_path: Path) -> None:
    """Seen: a 1-1 split called the verdict of the file that sorts first the "majority"."""
    folder = tmp_path / "room"
    folder.mkdir()
    _bundle(folder, "a.json", "ana", [("workers", "slower", 0.7, "wall")])
    _bundle(folder, "b.json", "ben", [("workers", "faster", 1.5, "wall")])
    line = _line(folder, tmp_path / "out", "workers=2 vs workers=0")
    assert "| tie (1 faster, 1 slower) | - |" in line


def test_a_claim_that_does_not_re_derive_is_not_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Seen: claims were taken as logged, without the `claims check` re-derivation."""
    folder = tmp_path / "room"
    folder.mkdir()
    forged = {**_claim("workers", "slower", 0.7, "wall"), "outcome": "faster", "ratio": 3.0}  # edited by hand
    _bundle(folder, "a.json", "ana", [("workers", "faster", 1.5, "wall")])
    _bundle(folder, "b.json", "ben", [("workers", "faster", 1.6, "wall")])
    _bundle(folder, "c.json", "cai", [forged])
    line = _line(folder, tmp_path / "out", "workers=2 vs workers=0")
    assert "| 2 |" in line and "cai" not in line
    report = (tmp_path / "out" / "class-report.md").read_text()
    assert "cai: 02_dataloader.ipynb: workers=2 vs workers=0: not counted, the rounds give 'slower'" in report
    assert "not counted" in capsys.readouterr().err


def test_the_class_report_shows_the_rooms_progress_from_the_bundles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Each learner's `progress export` carries their journal: the report adds one row per machine."""
    from course_lib import journal

    room_dir = tmp_path / "room"
    room_dir.mkdir()
    log = tmp_path / "claims.jsonl"
    log.write_text(json.dumps(_claim("loop", "faster", 50.0, "wall")) + "\n")
    monkeypatch.setenv("COURSE_CLAIM_LOG", str(log))
    monkeypatch.setenv("COURSE_PROGRESS_FILE", str(tmp_path / "ana-progress.json"))
    monkeypatch.setenv("COURSE_UNATTENDED", "0")
    journal.lesson_run("notebooks/01_bottleneck.ipynb")
    journal.lesson_run("notebooks/02_dataloader.ipynb")
    journal.prediction_answered("q1", "faster", True, notebook="notebooks/01_bottleneck.ipynb")
    journal.prediction_answered("q2", "slower", False, notebook="notebooks/02_dataloader.ipynb")
    journal.exercise_checked("05", 3, 5)
    assert cli.main(["progress", "export", "--out", str(room_dir / "ana.json"), "--name", "ana"]) == 0
    _bundle(room_dir, "ben.json", "ben", [("loop", "faster", 60.0, "wall")])  # exported before progress was
    assert cli.main(["class", "report", str(room_dir), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "class-report.md").read_text()
    progress = report.split("# The room's progress", 1)[1]
    assert "| ana | 2 | 2 (1) | 1 | 3/5 |" in progress
    assert "| ben | not in this bundle" in progress
