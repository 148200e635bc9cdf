"""gpu-check's logic, on the CPU: peaks, MFU arithmetic, the table, the summaries, isolation of parts, no-GPU path.

The GPU itself is exercised by tests/test_gpu_paths.py (marked ``gpu``) through ``make gpu-check``; their logic runs
on the CPU in tests/test_gpu_tests_in_step.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest
import torch

from course_lib import clock, gpu_check
from course_lib.gpu_check import (
    CUT_SHORT,
    FAILED,
    LIMIT_ENV,
    NOT_RUN,
    PASSED,
    SKIPPED,
    TIMEOUT,
    LessonRun,
    Part,
    Row,
    execute_full_mode,
    format_table,
    full_mode_order,
    run_full_lessons,
    run_parts,
    slug,
    summarise_bench,
    summarise_command,
    summarise_grading,
    summarise_lessons,
    summarise_pytest,
)
from course_lib.perf import mfu as mfu_mod
from course_lib.perf.mfu import (
    CONTENDERS,
    GPT2_SMALL,
    RECIPE,
    Contender,
    GPTBenchConfig,
    batch_for_memory,
    format_rows,
    gpt_flops_per_token,
    mfu,
    non_embedding_params,
    peak_flops,
    recipe_batch,
    run_gpt_bench,
)

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------ peaks, MFU
def test_peak_lookup_exact_substring_longest_match_and_unknown() -> None:
    assert peak_flops("H100 PCIe") == 756e12  # exactly a key
    assert peak_flops("NVIDIA H100 PCIe") == 756e12  # the PCIe card, not the SXM default
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA A100-SXM4-40GB") == 312e12  # "A100", not its prefix "A10"
    assert peak_flops("NVIDIA A10G") == 70e12 and peak_flops("NVIDIA A10") == 125e12
    assert peak_flops("NVIDIA L40S") == 362e12 and peak_flops("NVIDIA L4") == 121e12
    assert peak_flops("NVIDIA GH200 480GB") == 989e12 and peak_flops("NVIDIA H200 NVL") == 835e12
    assert peak_flops("NVIDIA GeForce RTX 4090") == 165.2e12 and peak_flops("Tesla T4") == 65e12
    assert peak_flops("nvidia h200") == 989e12  # case does not matter
    assert peak_flops("NVIDIA A100-SXM4-80GB", precision="fp32") == 19.5e12
    # Whole words only: an unknown "L4x" is not an L4, and an unknown GPU needs the flag.
    assert peak_flops("Mystery L4x") is None and peak_flops("Mystery GPU") is None
    assert peak_flops("Mystery GPU", 100.0) == 100e12
    assert peak_flops("Mystery GPU", 100.0, precision="fp32") is None  # the flag is the bf16/fp16 peak only
    with pytest.raises(ValueError, match="precision"):
        peak_flops("NVIDIA A100", precision="int8")
    with pytest.raises(ValueError, match="> 0"):
        peak_flops("NVIDIA A100", -1.0)


def test_mfu_arithmetic_from_a_fixed_flop_count() -> None:
    assert gpt_flops_per_token(1000, 2, 64, 128) == 6 * 1000 + 12 * 2 * 64 * 128
    assert mfu(tokens_per_s=1e5, flops_per_token=1e9, peak_flops=1e15) == pytest.approx(0.1)
    assert mfu(1e5, 1e9, None) is None
    with torch.device("meta"):  # GPT-2 small without allocating its 500 MB
        model = mfu_mod.TinyGPT(GPT2_SMALL)
    n = non_embedding_params(model)
    assert n == sum(p.numel() for p in model.parameters()) - 1024 * 768
    assert 123e6 < n < 125e6, n  # "124 M", the size nanoGPT reports MFU for
    fpt = gpt_flops_per_token(n, 12, 768, 1024)
    assert fpt == 6 * n + 12 * 12 * 768 * 1024
    # 150k tokens/s on an A100 is 0.15e6 * fpt / 312e12 of its peak.
    assert mfu(150e3, fpt, peak_flops("NVIDIA A100-SXM4-40GB")) == pytest.approx(150e3 * fpt / 312e12)


def test_batch_for_memory() -> None:
    assert [batch_for_memory(g) for g in (141, 80, 40, 24, 16, 8)] == [16, 16, 8, 4, 2, 1]


def test_recipe_batch_fills_the_memory_a_compiled_bf16_step_leaves() -> None:
    assert [recipe_batch(g) for g in (141, 80, 40, 24, 16)] == [64, 32, 16, 4, 1]
    assert all(recipe_batch(g) >= batch_for_memory(g) for g in (141, 80, 40, 24))  # the recipe's rows go larger


@pytest.mark.slow
def test_the_recipe_rows_run_at_their_own_batch_and_graphs_are_skipped_off_cuda(one_thread: None) -> None:
    cfg = _tiny(contenders=(CONTENDERS[0],) + RECIPE)
    result = run_gpt_bench(cfg, "cpu", log=lambda _: None)
    rows = {r["contender"]: r for r in result["rows"]}
    assert [r["contender"] for r in result["rows"]] == ["bf16 + compile", "bf16 + compile, batch for memory"]
    assert rows["bf16 + compile"]["batch"] == 2 and rows["bf16 + compile, batch for memory"]["batch"] == 4
    graphs = "bf16 + compile, batch for memory, CUDA graphs"
    assert result["skipped_contenders"] == {graphs: "CUDA graphs need a CUDA GPU"}
    table = format_rows(result)
    assert "| bf16 + compile, batch for memory | bf16 | 4 |" in table and "skipped: CUDA graphs need" in table
    assert result["best"] in rows


def test_bench_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="model"):
        GPTBenchConfig(model="gpt5")
    with pytest.raises(ValueError, match="rounds"):
        GPTBenchConfig(rounds=0)
    with pytest.raises(ValueError, match="batch"):
        GPTBenchConfig(batch=0)


# ------------------------------------------------------------------------------------- the GPU section, on the CPU
def _tiny(**kw: object) -> GPTBenchConfig:
    defaults = dict(model="tiny", warmup_steps=1, timed_steps=2, rounds=2, batch=2, compile_backend="eager")
    return GPTBenchConfig(**{**defaults, **kw})  # type: ignore[arg-type]


@pytest.mark.slow
def test_gpu_section_runs_every_contender_side_by_side_on_the_cpu(one_thread: None) -> None:
    result = run_gpt_bench(_tiny(), "cpu", peak_tflops=2.0, log=lambda _: None)
    rows = result["rows"]
    assert [r["contender"] for r in rows] == ["bf16 + compile", "bf16 eager", "fp32 eager"]
    assert [r["precision"] for r in rows] == ["bf16", "bf16", "fp32"] and result["rounds"] == 2
    for row in rows:
        assert row["tokens_per_s"] > 0 and len(row["tokens_per_s_rounds"]) == 2
    # MFU = tokens/s x FLOPs/token / peak, with the flag's peak for bf16 and no known fp32 peak on "cpu".
    assert rows[0]["mfu"] == pytest.approx(rows[0]["tokens_per_s"] * result["flops_per_token"] / 2e12)
    assert rows[2]["mfu"] is None and rows[0]["vs_first"] == 1.0
    assert len(result["verdicts"]) == 2 and result["tokens_per_s"] == rows[0]["tokens_per_s"]

    from course_lib.perf.bench import machine, to_markdown

    report = {"machine": machine(), "results": {"gpu_gpt": result}, "errors": {}, "argv": ["--only", "gpu"],
              "preset": "tiny", "shared_note": ""}
    md = to_markdown(report)
    assert "| (d) tiny on cpu, bf16 + compile:" in md and "6N + 12 L H Q T" in md
    text = gpu_check.to_markdown([Row("bench", PASSED, 3.0, "ok")], {"name": "cpu"}, wall_s=3.0, argv=[],
                                 bench=result, log_dir=Path("logs"))
    assert "| fp32 eager | fp32 |" in text and result["verdicts"][0] in text


@pytest.mark.slow
def test_a_contender_that_fails_does_not_sink_the_others(one_thread: None) -> None:
    cfg = _tiny(compile_backend="no-such-backend", timed_steps=1, rounds=1,
                contenders=(Contender("broken compile", "low", True), Contender("fp32 eager", "fp32", False)))
    result = run_gpt_bench(cfg, "cpu", log=lambda _: None)
    assert [r["contender"] for r in result["rows"]] == ["fp32 eager"]
    assert "broken compile" in result["failed"] and "no-such-backend" in result["failed"]["broken compile"]


def test_out_of_memory_halves_the_batch(monkeypatch: pytest.MonkeyPatch, one_thread: None) -> None:
    seen: list[int] = []

    def steps(self: object, n: int) -> None:
        seen.append(self.x.shape[0])  # type: ignore[attr-defined]
        if self.x.shape[0] > 1:  # type: ignore[attr-defined]
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(mfu_mod._Runner, "steps", steps)
    cfg = _tiny(batch=4, timed_steps=1, rounds=1, contenders=(Contender("fp32 eager", "fp32", False),))
    result = run_gpt_bench(cfg, "cpu", log=lambda _: None)
    assert result["batch"] == 1 and seen[:3] == [4, 2, 1]


def test_time_budget_stops_new_rounds_but_one_always_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mfu_mod._Runner, "steps", lambda self, n: None)
    ticks = iter(range(0, 10**6, 100))  # every reading of the clock is 100 s later than the one before
    cfg = _tiny(timed_steps=5, rounds=5, time_budget_s=50, contenders=(Contender("fp32 eager", "fp32", False),))
    monkeypatch.setattr(clock, "wall", lambda: float(next(ticks)))
    result = run_gpt_bench(cfg, "cpu", log=lambda _: None)
    assert result["rounds"] == 1 and len(result["rows"][0]["tokens_per_s_rounds"]) == 1


# ------------------------------------------------------------------------------------------------ the table, summaries
def test_slug() -> None:
    assert slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert slug("Tesla V100-SXM2-16GB") == "tesla-v100-sxm2-16gb"
    assert slug("  NVIDIA GeForce RTX 4090 (laptop)/x ") == "nvidia-geforce-rtx-4090-laptop-x"
    assert slug("***") == "unknown-device"


def test_format_table_escapes_and_totals() -> None:
    rows = [Row("tests", PASSED, 12.4, "3 passed"), Row("bench", FAILED, 40.0, "a | b\nsecond line")]
    table = format_table(rows).splitlines()
    assert table[0] == "| part | status | time | detail |" and table[1] == "|---|---|---|---|"
    assert table[2] == "| tests | passed | 12 s | 3 passed |"
    assert table[3] == "| bench | FAILED | 40 s | a \\| b second line |"
    assert table[4].startswith("| **all** | 1 of 2 not passed | 52 s")
    assert "| **all** | passed |" in format_table(rows[:1])


def test_summarise_pytest() -> None:
    ok = ("....s\n=== short test summary info ===\nSKIPPED [1] tests/test_gpu_paths.py:120: TF32 needs compute "
          "capability >= 8.0\n4 passed, 1 skipped, 2 deselected, 1 warning in 41.20s\n")
    status, detail = summarise_pytest(ok, 0)
    assert status == PASSED and detail == "4 passed, 1 skipped; skipped: TF32 needs compute capability >= 8.0"
    bad = ("FAILED notebooks/05_mixed_precision.ipynb::Cell 12\nERROR tests/test_gpu_paths.py::test_x - "
           "RuntimeError: boom\n====== 1 failed, 30 passed, 1 error in 200.00s (0:03:20) ======\n")
    status, detail = summarise_pytest(bad, 1)
    assert status == FAILED
    assert detail == ("1 failed, 30 passed, 1 error; failed: notebooks/05_mixed_precision.ipynb::Cell 12, "
                      "tests/test_gpu_paths.py::test_x")
    assert summarise_pytest("\n", 5) == (FAILED, "no tests ran")


def test_summarise_grading_and_command() -> None:
    out = ("part    check   result  points\n-----\n05.1    warm-up  pass    2/2\n07.1+2  exact groups  FAIL    0/1\n"
           "-----\nscore: 2/3 points (1/2 checks pass)\n")
    status, detail = summarise_grading(out, 1)
    assert status == FAILED and detail.startswith("score: 2/3 points") and "07.1+2 exact groups FAIL 0/1" in detail
    assert summarise_grading(out.replace("FAIL    0/1", "pass    1/1"), 0)[0] == PASSED
    assert summarise_command("generating\ndata ready\n\n", 0) == (PASSED, "data ready")
    assert summarise_command("", 2) == (FAILED, "(no output)")


def test_summarise_bench_reads_the_report(tmp_path: Path) -> None:
    summarise = summarise_bench(tmp_path)
    assert summarise("Traceback ... Boom", 1) == (FAILED, "no report written; Traceback ... Boom")
    section = {"model": "gpt2-small", "batch": 16, "peak_source": "datasheet table", "failed": {},
               "rows": [{"contender": "bf16 + compile", "tokens_per_s": 412345.6, "mfu": 0.4512},
                        {"contender": "fp32 eager", "tokens_per_s": 50000.0, "mfu": 0.61}]}
    (tmp_path / "latest.json").write_text(json.dumps({"results": {"gpu_gpt": section}, "errors": {}}))
    status, detail = summarise("", 0)
    assert status == PASSED
    assert detail == ("gpt2-small, batch 16: bf16 + compile 412,346 tokens/s, MFU 45.1%; "
                      "fp32 eager 50,000 tokens/s, MFU 61.0%")
    section["failed"] = {"bf16 + compile": "BackendCompilerFailed: no triton"}
    section["rows"] = section["rows"][1:]
    (tmp_path / "latest.json").write_text(json.dumps({"results": {"gpu_gpt": section}, "errors": {}}))
    status, detail = summarise("", 0)
    assert status == FAILED and "bf16 + compile failed: BackendCompilerFailed" in detail
    (tmp_path / "latest.json").write_text(json.dumps({"results": {}, "errors": {"gpu_gpt": "OutOfMemoryError: x"}}))
    assert summarise("", 1) == (FAILED, "OutOfMemoryError: x")


# ------------------------------------------------------------------------------------------------ isolation
def _py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


@pytest.mark.slow
def test_parts_are_isolated_a_failure_or_a_hang_costs_only_its_row(tmp_path: Path) -> None:
    child_pid_file = tmp_path / "grandchild.pid"
    hang = ("import subprocess, sys, time\n"
            f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            f"open({str(child_pid_file)!r}, 'w').write(str(p.pid))\n"
            "print('started', flush=True)\ntime.sleep(120)\n")
    parts = [
        Part("ok", "fine part", _py("print('all good')"), 30, summarise_command, phase=0),
        Part("bad", "failing part", _py("import sys; print('it broke'); sys.exit(3)"), 30, summarise_command, phase=0),
        Part("hang", "hanging part", _py(hang), 3, summarise_command, phase=0),
        Part("after", "later phase", _py("print('still ran')"), 30, summarise_command, phase=1),
    ]
    rows = run_parts(parts, log_dir=tmp_path / "logs", cwd=tmp_path, budget_s=60, min_start_s=0, log=lambda _: None)
    assert [(r.part, r.status) for r in rows] == [("fine part", PASSED), ("failing part", FAILED),
                                                   ("hanging part", TIMEOUT), ("later phase", PASSED)]
    assert rows[0].detail == "all good" and rows[1].detail == "it broke" and rows[3].detail == "still ran"
    assert "time limit (3 s)" in rows[2].detail and "started" in rows[2].detail
    assert (tmp_path / "logs" / "bad.log").read_text() == "it broke\n"
    # The hanging part's whole process group was stopped, its own child included.
    grandchild = int(child_pid_file.read_text())
    for _ in range(50):
        if not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the hanging part's child {grandchild} is still running")


def test_a_part_left_without_budget_is_skipped_with_the_reason(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    shift = [0.0]  # a clock that jumps 1000 s once the first phase is over: the budget is spent by then

    def log(message: str) -> None:
        if "first:" in message and "started" not in message:
            shift[0] = 1000.0

    parts = [Part("first", "first part", _py("print('done')"), 30, summarise_command, phase=0),
             Part("late", "late part", _py("print('x')"), 30, summarise_command, phase=1)]
    monkeypatch.setattr(clock, "wall", lambda: time.monotonic() + shift[0])
    rows = run_parts(parts, log_dir=tmp_path, cwd=tmp_path, budget_s=500, log=log)
    assert rows[0].status == PASSED
    assert rows[1].status == SKIPPED and "not started" in rows[1].detail and rows[1].seconds == 0
    assert not (tmp_path / "late.log").exists()


# ------------------------------------------------------------------------------------------------ lessons in full mode
def test_the_lessons_a_gpu_changes_most_run_first() -> None:
    lessons = [Path(f"notebooks/{n:02d}_x.ipynb") for n in range(15)]
    order = [p.name[:2] for p in full_mode_order(lessons)]
    assert order[:6] == ["05", "14", "07", "11", "08", "12"]
    assert order[6:] == ["00", "01", "02", "03", "04", "06", "09", "10", "13"] and sorted(order) == sorted(set(order))


def test_lessons_that_do_not_fit_the_budget_are_not_run_not_failed(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(clock, "wall", lambda: now[0])
    started: list[tuple[str, float]] = []

    def execute(lesson: Path, out_dir: Path, deadline: float) -> LessonRun:
        started.append((lesson.stem, deadline))
        now[0] += 100.0  # every lesson takes 100 s
        return LessonRun(lesson.stem, PASSED, 100.0, claims=3)

    lessons = [Path(f"{n:02d}_x.ipynb") for n in (5, 14, 7, 11)]
    runs = run_full_lessons(lessons, tmp_path, limit_s=300, execute=execute, log=lambda _: None)
    # 300 s less the 10 s reserve: starts at 0, 100 and 200 s (90 s left >= 30); at 300 s nothing is left.
    assert [(r.lesson, r.status) for r in runs] == [("05_x", PASSED), ("14_x", PASSED), ("07_x", PASSED),
                                                    ("11_x", NOT_RUN)]
    assert {deadline for _, deadline in started} == {290.0}, "every lesson is stopped at the part's limit"
    assert runs[3].detail == "0 s left of the part's 300 s"
    status, detail = summarise_lessons(tmp_path)("", 0)
    assert status == PASSED, detail
    assert detail == "3 passed (05, 14, 07), 1 not run (time budget); 9 claims checked, 0 inconsistent"


def test_a_failed_lesson_or_an_inconsistent_claim_fails_the_part(tmp_path: Path) -> None:
    runs = [LessonRun("05_mixed_precision", PASSED, 30.0, claims=4),
            LessonRun("14_ceiling", FAILED, 50.0, "1 inconsistent claim(s): line 3: the rounds give 'slower'",
                      claims=6, inconsistencies=["line 3: the rounds give 'slower'"]),
            LessonRun("07_compile_profiler", CUT_SHORT, 40.0, "stopped at the part's time limit", claims=1),
            LessonRun("11_capstone", NOT_RUN, 0.0, "12 s left of the part's 300 s")]
    (tmp_path / "lessons.json").write_text(json.dumps([vars(r) for r in runs]))
    status, detail = summarise_lessons(tmp_path)("", 1)
    assert status == FAILED
    assert detail == ("1 passed (05), 1 FAILED (14), 1 cut short (07), 1 not run (time budget); 11 claims checked, "
                      "1 inconsistent; 14_ceiling: 1 inconsistent claim(s): line 3: the rounds give 'slower'")
    assert summarise_lessons(tmp_path / "nothing")("Traceback ... boom", 1) == (FAILED,
                                                                               "no results written; Traceback ... boom")
    text = gpu_check.to_markdown([Row("lessons in full mode", FAILED, 120.0, detail)], {"name": "cpu"}, wall_s=1.0,
                                 argv=[], bench=None, log_dir=Path("logs"), lessons=[vars(r) for r in runs],
                                 lessons_dir=tmp_path)
    assert "## Lessons in full mode" in text and "| 14_ceiling | FAILED | 50 s | 6, 1 inconsistent |" in text
    assert "| 11_capstone | not run | 0 s |  | 12 s left of the part's 300 s |" in text


def _notebook(path: Path, *sources: str) -> Path:
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources]), path)
    return path


@pytest.mark.slow
def test_a_lesson_in_full_mode_is_executed_saved_logged_and_its_claims_checked(tmp_path: Path) -> None:
    """Real kernels on tiny notebooks: a lesson that passes, one whose claim log is inconsistent, one that raises,
    and one still running at the limit."""
    lessons, out = tmp_path / "notebooks", tmp_path / "out"
    lessons.mkdir()
    out.mkdir()
    ok = _notebook(lessons / "01_ok.ipynb",
                   "import os\nprint(os.environ['COURSE_MODE'], os.environ['JPY_SESSION_NAME'])")
    bad_claim = _notebook(lessons / "02_claim.ipynb",
                          "import json, os\nlog = open(os.environ['COURSE_CLAIM_LOG'], 'a')\n"
                          "log.write(json.dumps({'a': 'x'}) + '\\n')")
    error = _notebook(lessons / "03_error.ipynb", "raise ValueError('boom')")
    slow = _notebook(lessons / "04_slow.ipynb", "import time\ntime.sleep(600)")

    run = execute_full_mode(ok, out, clock.now() + 120)
    assert (run.status, run.claims, run.detail) == (PASSED, 0, "")
    saved = nbformat.read(out / "01_ok.ipynb", as_version=4)
    assert saved.cells[0].outputs[0].text == "full 01_ok.ipynb\n", "full mode, the lesson named"
    assert "claims check 01_ok.claims.jsonl: 0 claim(s), 0 inconsistencies" in (out / "01_ok.log").read_text()

    run = execute_full_mode(bad_claim, out, clock.now() + 120)
    assert run.status == FAILED and run.claims == 1
    assert run.inconsistencies == ["line 1: missing b, outcome, ratio, quantity, a_times, b_times, sentence, band"]
    assert "1 inconsistent claim(s)" in run.detail

    run = execute_full_mode(error, out, clock.now() + 120)
    assert run.status == FAILED and run.detail == "ValueError: boom"
    assert "raise ValueError('boom')" in (out / "03_error.log").read_text() and (out / "03_error.ipynb").is_file()

    run = execute_full_mode(slow, out, clock.now() + 8)
    assert run.status == CUT_SHORT and run.seconds < 60, run
    assert (out / "04_slow.ipynb").is_file()


def test_each_part_is_told_its_time_limit(tmp_path: Path) -> None:
    part = Part("limit", "says its limit", _py(f"import os; print(os.environ[{LIMIT_ENV!r}])"), 42, summarise_command)
    rows = run_parts([part], log_dir=tmp_path, cwd=tmp_path, budget_s=500, log=lambda _: None)
    assert rows[0].detail == "42"


def test_an_optional_part_left_without_time_is_not_run_which_is_no_failure(tmp_path: Path) -> None:
    parts = [Part("lessons", "lessons in full mode", _py("print('x')"), 300, summarise_command, optional=True)]
    rows = run_parts(parts, log_dir=tmp_path, cwd=tmp_path, budget_s=5, min_start_s=10, log=lambda _: None)
    assert rows[0].status == NOT_RUN and rows[0].detail.startswith("not started: 5 s left")
    assert "| **all** | passed |" in format_table([Row("tests", PASSED, 1.0, "ok"), rows[0]])


def test_the_lessons_part_runs_last_alone_and_optional(tmp_path: Path) -> None:
    parts = gpu_check.default_parts(tmp_path / "logs", lessons_dir=tmp_path / "gpu-x", lessons=["05", "14"])
    lessons = parts[-1]
    assert lessons.key == "lessons" and lessons.optional
    assert lessons.phase > max(p.phase for p in parts[:-1]), "after the benchmark, nothing running beside it"
    assert lessons.argv[-6:] == ("lessons", "--out", str(tmp_path / "gpu-x"), "--lessons", "05", "14")


def test_the_lessons_command_lists_every_lesson_as_not_run_when_no_time_is_left(tmp_path: Path) -> None:
    out = tmp_path / "gpu-x"
    out.mkdir()
    (out / "01_bottleneck.ipynb").write_text("{}")  # an earlier run's
    proc = subprocess.run([sys.executable, "-m", "course_lib", "gpu-check", "lessons", "--out", str(out), "--lessons",
                           "14", "5"], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**_env_without_gpu(), LIMIT_ENV: "20"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = json.loads((out / "lessons.json").read_text())
    assert [(r["lesson"], r["status"]) for r in runs] == [("14_ceiling", NOT_RUN), ("05_mixed_precision", NOT_RUN)]
    assert not (out / "01_bottleneck.ipynb").exists(), "an earlier run's notebook must not pass for this run's"


# ------------------------------------------------------------------------------------------------ the command
def _env_without_gpu() -> dict[str, str]:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}


@pytest.mark.slow
def test_without_a_gpu_the_command_says_so_in_one_line_and_exits_0(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "course_lib", "gpu-check", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=REPO, env=_env_without_gpu(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [gpu_check.NO_GPU_LINE]
    assert not (tmp_path / "out").exists(), "nothing is run or written without a GPU"


def test_bad_arguments_are_rejected_before_any_work() -> None:
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(["--peak-tflops", "-3"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        gpu_check.main(["--only", "everything"])
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(["--lessons", "99"])
    assert exc.value.code == 2


@pytest.mark.slow
def test_the_real_parts_are_wired_up_on_the_cpu(tmp_path: Path) -> None:
    """``--without-gpu`` runs the real commands here: the GPU tests skip (reason shown), the benchmark skips."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "course_lib", "gpu-check", "--without-gpu", "--only", "tests",
                           "bench", "--out", str(out)], capture_output=True, text=True, cwd=REPO,
                          env=_env_without_gpu(), timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = (out / "gpu-cpu-without-gpu.md").read_text()
    assert "| gpu-marked tests (pytest -m gpu) | passed |" in table
    assert "skipped: needs a CUDA GPU" in table
    assert "| benchmark GPU section (GPT-2 small, MFU) | passed |" in table and "no CUDA GPU" in table
    assert "| part | status | time | detail |" in proc.stdout
