"""The room's measurements (course_lib.room): a learner's bundle, and the instructor's class report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from course_lib import cli, room

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
    lesson, a, b = COMPARISONS[comparison]
    return {"format": 1, "lesson": lesson, "a": a, "b": b, "outcome": outcome, "ratio": ratio, "low": ratio * 0.9,
            "high": ratio * 1.1, "band": 0.1, "quantity": quantity, "unit": "call", "a_times": [1.0],
            "b_times": [ratio], "threads": 1, "sentence": "...", "time": "2026-12-03T08:00:00+00:00"}


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
