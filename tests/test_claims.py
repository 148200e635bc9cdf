"""The claim log (COURSE_CLAIM_LOG) and `python -m course_lib claims check`, which re-derives every verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from course_lib import cli, lesson
from course_lib.perf import claims
from course_lib.perf.compare import Measurement, verdict_from_counts, verdict_from_times

FASTER = (Measurement("A", (1.0, 1.1, 0.9, 1.0, 1.05)), Measurement("B", (2.0, 2.1, 1.9, 2.2, 2.0)))
BRANCHES = dict(faster="{a} wins.", slower="{a} lost.", too_close="A tie.")


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "claims.jsonl"
    monkeypatch.setenv(claims.ENV, str(path))
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/course/notebooks/02_dataloader.ipynb")
    return path


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_every_verdict_shown_is_logged_once_with_the_text_shown(log: Path) -> None:
    v = verdict_from_times(*FASTER)
    shown = lesson.explain(v, **BRANCHES)
    alone = lesson.state(v)
    v.sentence()  # computed, not shown
    count = verdict_from_counts("fused", 3, "eager", 12, count="kernels launched")
    lesson.state(count)
    first, second, third = lines(log)
    assert first["sentence"] == shown and second["sentence"] == alone and third["quantity"] == "kernels launched"
    assert set(claims.FIELDS) <= set(first)
    assert first["lesson"] == "02_dataloader.ipynb" and first["format"] == claims.FORMAT
    assert (first["a"], first["b"], first["outcome"], first["quantity"]) == ("A", "B", "faster", "wall")
    assert first["ratio"] == pytest.approx(2.0, rel=0.05) and len(first["a_times"]) == len(first["b_times"]) == 5
    assert claims.check_file(log) == (3, [])
    assert cli.main(["claims", "check", str(log)]) == 0
    assert claims.summary([log]) == [{"lesson": "02_dataloader.ipynb", "decided": 3, "too_close": 0,
                                      "quantities": {"wall": 2, "kernels launched": 1}}]
    assert cli.main(["claims", "summary", str(log)]) == 0


def test_nothing_is_written_without_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(claims.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    lesson.explain(verdict_from_times(*FASTER), **BRANCHES)
    assert list(tmp_path.iterdir()) == []


def _tamper(claim: dict, **changes) -> dict:
    return {**claim, **changes}


@pytest.mark.parametrize("change,expected", [
    (dict(outcome="slower"), "the rounds give 'faster'"),
    (dict(outcome="busy"), "is not one of"),
    (dict(ratio=1.5), "ratio"),
    (dict(a_times=[2.0, 2.1, 1.9, 2.2, 2.0], b_times=[1.0, 1.1, 0.9, 1.0, 1.05]), "the rounds give 'slower'"),
    (dict(b_times=[2.0]), "equal, non-zero length"),
    (dict(a_times=[1.0, 0.0, 1.0, 1.0, 1.0]), "cannot be judged"),
    (dict(sentence="On this machine A was 0.5x slower than B."), "does not state the verdict"),
    (dict(sentence="On this machine A was 2.0x faster than B."), "does not state the verdict"),  # no quantity
    (dict(quantity="cpu"), "does not state the verdict"),  # the sentence says wall-clock time
], ids=lambda x: str(x)[:40])
def test_each_inconsistency_is_found(log: Path, change: dict, expected: str) -> None:
    lesson.explain(verdict_from_times(*FASTER), **BRANCHES)
    (good,) = lines(log)
    log.write_text(json.dumps(good) + "\n" + json.dumps(_tamper(good, **change)) + "\n", encoding="utf-8")
    count, found = claims.check_file(log)
    assert count == 2 and len(found) >= 1 and all(f.startswith("line 2") for f in found)
    assert any(expected in f for f in found), found
    assert cli.main(["claims", "check", str(log)]) == 1


def test_malformed_lines_and_missing_files_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1\n[1, 2]\n{"a": "x"}\n', encoding="utf-8")
    count, found = claims.check_file(path)
    assert count == 3 and [f.split(":")[0] for f in found] == ["line 1", "line 2", "line 3"]
    assert "not JSON" in found[0] and "not a JSON object" in found[1] and "missing" in found[2]
    assert cli.main(["claims", "check", str(tmp_path / "absent.jsonl")]) == 1
    assert "no such file" in capsys.readouterr().out
