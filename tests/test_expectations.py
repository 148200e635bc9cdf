"""What each lesson must show on a tensor-core GPU (course_lib/perf/expectations.py): the table, its rendering in
docs/gpu.md, and the check gpu-check runs on the claim logs of the lessons it executed.

The claim logs here are written the way a lesson writes them (``lesson.explain`` with ``COURSE_CLAIM_LOG`` and the
notebook's name in ``JPY_SESSION_NAME``), from the verdicts the GPU evidence recorded on an H200 (lesson 05: bf16
3.14 ms vs fp32 2.84 ms per step, TF32 19.3 µs vs strict 30.1 µs per 256x256 call; lesson 14: bf16 17.7 µs vs fp32
23.4 µs per 512x512 call): each of those lessons' wrong conclusions is a named miss.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_lib import gpu_check, lesson
from course_lib.perf import claims, expectations
from course_lib.perf.compare import Measurement, verdict_from_times
from course_lib.perf.expectations import EXPECTATIONS, TF32_ALLOWED, TF32_STRICT, check_claims, check_folder

ROOT = Path(__file__).resolve().parents[1]
H100 = (9, 0)


def rounds(median: float) -> tuple[float, ...]:
    return tuple(median * (1 + 0.02 * k) for k in (-3, -2, -1, 0, 1, 2, 3))


def write_claims(folder: Path, lesson_name: str, verdicts: list[tuple[str, float, str, float]],
                 monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lesson's claim log as gpu-check's lessons part writes it: one explained verdict per (a, a_s, b, b_s)."""
    log = folder / f"{lesson_name}.claims.jsonl"
    monkeypatch.setenv(claims.ENV, str(log))
    monkeypatch.setenv("JPY_SESSION_NAME", f"{lesson_name}.ipynb")
    log.touch()  # a lesson that ran and showed nothing still has its log
    for a, a_s, b, b_s in verdicts:
        v = verdict_from_times(Measurement(a, rounds(a_s)), Measurement(b, rounds(b_s)))
        lesson.explain(v, faster="Faster.", slower="Slower.", too_close="Alike.")
    return log


def h200_evidence(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_claims(folder, "05_mixed_precision", [("bf16", 3.14e-3, "fp32", 2.84e-3),
                                                (TF32_ALLOWED, 19.3e-6, TF32_STRICT, 30.1e-6)], monkeypatch)
    write_claims(folder, "14_ceiling", [("bf16", 17.7e-6, "fp32", 23.4e-6), ("1024x1024", 1.0, "64x64", 2.0)],
                 monkeypatch)


def test_the_h200_evidence_misses_each_expectation_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h200_evidence(tmp_path, monkeypatch)
    misses = {m.key: m for m in check_folder(tmp_path, H100)}
    assert set(misses) == {"05-autocast-step", "05-tf32", "14-bf16-matmul"}, misses
    assert misses["05-autocast-step"].kind == "slower" and "1.11x slower" in misses["05-autocast-step"].message
    assert misses["05-tf32"].kind == "short" and "1.56x faster" in str(misses["05-tf32"])
    assert misses["14-bf16-matmul"].kind == "short" and "at least 5x" in str(misses["14-bf16-matmul"])
    assert str(misses["05-tf32"]).startswith("05-tf32 (05_mixed_precision.ipynb): ")


def test_what_the_table_expects_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_claims(tmp_path, "05_mixed_precision", [("fp32", 30e-3, "bf16", 10e-3),  # either order matches
                                                  (TF32_ALLOWED, 3e-3, TF32_STRICT, 21e-3)], monkeypatch)
    write_claims(tmp_path, "14_ceiling", [("bf16", 1.5e-3, "fp32", 21e-3)], monkeypatch)
    assert check_folder(tmp_path, H100) == []


def test_only_what_applies_to_the_device_and_the_lessons_run_is_checked(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    h200_evidence(tmp_path, monkeypatch)
    t4 = {m.key for m in check_folder(tmp_path, (7, 5))}
    assert t4 == {"05-autocast-step"}  # no TF32, no bf16 tensor cores before compute capability 8.0
    assert check_folder(tmp_path, None) == []  # no CUDA GPU: nothing applies
    write_claims(tmp_path, "02_dataloader", [], monkeypatch)  # executed, without the pinned-copy verdict
    shown = {m.key: m.kind for m in check_folder(tmp_path, H100)}
    assert shown["02-pinned-copy"] == "not shown" and "07-cuda-graph" not in shown  # lesson 07 was not executed


def test_a_tie_and_a_claim_without_its_lesson_name(tmp_path: Path) -> None:
    tie = {"lesson": "", "a": "bf16", "b": "fp32", "outcome": "too_close", "ratio": 1.01}
    (tmp_path / "05_mixed_precision.claims.jsonl").write_text(json.dumps(tie) + "\nnot json\n")
    misses = check_folder(tmp_path, H100)
    kinds = {m.key: m.kind for m in misses}
    assert kinds == {"05-autocast-step": "too close", "05-tf32": "not shown"}
    assert check_claims([tie], lessons=[], capability=H100) == []


def test_docs_show_the_table_as_the_library_has_it() -> None:
    doc = (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- expectations table: generated from course_lib/perf/expectations.py -->\n(.*?)\n"
                      r"<!-- end of expectations table -->", doc, re.S)
    assert match, "docs/gpu.md has no expectations table between its markers"
    assert match.group(1) == expectations.markdown_table(), (
        "docs/gpu.md's expectations table differs from course_lib/perf/expectations.py: paste markdown_table()")


def test_every_expectation_names_a_lesson_and_the_verdicts_lessons_05_and_14_show() -> None:
    lessons = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    for e in EXPECTATIONS:
        assert e.lesson in lessons, e.key
        assert e.at_least >= 1 and e.why and e.shows
    for name in ("05_mixed_precision.ipynb", "14_ceiling.ipynb"):
        source = "\n".join("".join(c["source"]) for c in json.loads((ROOT / "notebooks" / name).read_text())["cells"])
        for e in (e for e in EXPECTATIONS if e.lesson == name):
            assert e.than in source and any(n in source for n in e.faster), (e.key, "contender names changed?")


# ------------------------------------------------------------------------------------------------ gpu-check's hook
def test_gpu_check_names_each_expectation_a_lesson_missed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h200_evidence(tmp_path, monkeypatch)
    monkeypatch.setattr(gpu_check, "cuda_capability", lambda: H100)
    missed = gpu_check.expectations_missed(tmp_path / "14_ceiling.claims.jsonl")
    assert len(missed) == 1 and missed[0].startswith("14-bf16-matmul (14_ceiling.ipynb): bf16 vs fp32: 1.32x faster")
    assert len(gpu_check.expectations_missed(tmp_path / "05_mixed_precision.claims.jsonl")) == 2
    monkeypatch.setattr(gpu_check, "cuda_capability", lambda: None)  # --without-gpu: nothing applies
    assert gpu_check.expectations_missed(tmp_path / "14_ceiling.claims.jsonl") == []


@pytest.mark.slow
def test_a_lesson_executed_by_gpu_check_fails_on_a_missed_expectation(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A real kernel runs a tiny notebook named like lesson 05 that shows bf16 slower than fp32, as the H200 run
    did: on a (pretended) compute capability 9.0 GPU the lesson fails, naming the expectation; on the CPU it passes."""
    import nbformat

    from course_lib import clock

    lessons, out = tmp_path / "notebooks", tmp_path / "out"
    lessons.mkdir()
    out.mkdir()
    source = ("from course_lib import lesson\nfrom course_lib.perf.compare import Measurement, verdict_from_times\n"
              "r = lambda m: tuple(m * (1 + 0.02 * k) for k in range(-3, 4))\n"
              "v = verdict_from_times(Measurement('bf16', r(3.14e-3)), Measurement('fp32', r(2.84e-3)))\n"
              "print(lesson.explain(v, faster='F.', slower='S.', too_close='T.'))")
    path = lessons / "05_mixed_precision.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)]), path)
    monkeypatch.setattr(gpu_check, "cuda_capability", lambda: H100)
    run = gpu_check.execute_full_mode(path, out, clock.now() + 120)
    assert run.status == gpu_check.FAILED and run.claims == 1 and not run.inconsistencies, run
    assert run.detail.startswith("2 expectation(s) not met: 05-autocast-step (05_mixed_precision.ipynb): bf16 vs "
                                 "fp32: 1.11x slower")
    log = (out / "05_mixed_precision.log").read_text()
    assert "expectation not met: 05-tf32 (05_mixed_precision.ipynb): no verdict" in log
    monkeypatch.setattr(gpu_check, "cuda_capability", lambda: None)
    assert gpu_check.execute_full_mode(path, out, clock.now() + 120).status == gpu_check.PASSED
