"""``python -m course_lib gpu-check`` (``make gpu-check``): every CUDA path of the course, exercised in one command.

Everything in the course runs on a laptop CPU, where its CUDA paths (fp16 with a GradScaler, bf16, TF32, pinned
memory, CUDA-event timing, GPU memory statistics, CUDA graphs, NCCL...) are skipped. On a machine with a CUDA GPU
this command runs them all, in under eight minutes, each part in a separate process with its own time limit, so a
crash, a hang or a failure costs that part's row and nothing else:

===============  ==========================================================================================
part             what runs
===============  ==========================================================================================
``data``         ``python -m course_lib data prepare --quiet``: the smoke-sized offline data the others use
``tests``        ``pytest -m gpu tests``: the ``gpu``-marked tests, one per CUDA path, each asserting behaviour
``notebooks``    every lesson (``notebooks/``) and solution (``solutions/``) notebook under nbval, smoke mode
``grading``      ``python -m course_lib check --notebooks solutions``: every solution graded
``bench``        ``python -m course_lib bench --quick --only gpu``: GPT-2 small tokens/s and MFU
``lessons``      lessons executed in full mode, one at a time, each claim log checked (``claims check``)
                and held to what the lesson must show on this GPU (``perf/expectations.py``)
===============  ==========================================================================================

``data`` runs first; ``tests``, ``notebooks`` and ``grading`` then run at the same time (they share the machine's
cores and the GPU); ``bench`` runs alone after them, so nothing else disturbs its numbers; ``lessons`` runs last,
alone, in whatever time the budget has left: the lessons a GPU changes most first, each started only with enough
time left and stopped at the limit, and those that do not fit are listed as not run (no failure). A part that would
start with too little of the overall budget left is skipped with that reason (``lessons``: not run).

It prints one table -- part, status, time, detail -- and writes it, with the benchmark's rows and each lesson's
result, to ``benchmarks/results/gpu-<device name>.md``; the executed lessons, their claim logs and logs go beside it,
to ``benchmarks/results/gpu-<device name>/``; each part's full output goes to ``.cache/gpu-check/<device>/<part>.log``.
Exit code 0 when every part passed. On a machine without a CUDA GPU it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_lib import atomic, clock
from course_lib.argparsing import CommandParser

ROOT = Path(__file__).resolve().parents[1]
PASSED, FAILED, TIMEOUT, SKIPPED = "passed", "FAILED", "timeout", "skipped"
NOT_RUN = "not run"  # an optional part, or a lesson, that the budget had no time left for: no failure
CUT_SHORT = "cut short"  # a lesson stopped at the part's time limit: no failure either
NOT_FAILED = (PASSED, NOT_RUN)
TOTAL_BUDGET_S = 470.0  # the whole command, table included, stays under eight minutes
LIMIT_ENV = "COURSE_GPU_CHECK_LIMIT_S"  # each part's own time limit, told to its process so it can stop in time
NO_GPU_LINE = ("gpu-check: no CUDA GPU visible here (torch.cuda.is_available() is False); nothing to check on this "
               "machine -- run `make gpu-check` on a machine with an NVIDIA GPU.")


# ------------------------------------------------------------------------------------------------ the parts
@dataclass(frozen=True)
class Part:
    """One row of the table: a command run in its own process, with a time limit and a way to read its output.

    ``summarise(output, returncode)`` returns ``(status, detail)``; parts with the same ``phase`` run at the same
    time, phases one after the other. An ``optional`` part runs in the time the others left: with too little, it is
    not run, which is no failure.
    """

    key: str
    title: str
    argv: tuple[str, ...]
    budget_s: float
    summarise: Callable[[str, int], tuple[str, str]]
    phase: int = 0
    optional: bool = False


@dataclass
class Row:
    """What a part did: status (passed / FAILED / timeout / skipped), seconds and a one-line detail."""

    part: str
    status: str
    seconds: float
    detail: str
    log: str = ""


def slug(device_name: str) -> str:
    """A file-name-safe form of a device name: ``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"``."""
    text = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return text or "unknown-device"


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _last_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    return _one_line(lines[-1]) if lines else "(no output)"


_PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)")


def summarise_pytest(output: str, returncode: int) -> tuple[str, str]:
    """Status and detail from a pytest run's output: the counts, which tests failed, why tests were skipped."""
    summary = ""
    for line in reversed(output.splitlines()):
        if re.search(r"\bin [\d.]+s\b", line) and _PYTEST_COUNTS.search(line):
            summary = ", ".join(f"{n} {what}" for n, what in _PYTEST_COUNTS.findall(line)
                                if not what.startswith(("warning", "deselected")))
            break
    failed = [line.split(" - ")[0].split(" ", 1)[1] for line in output.splitlines()
              if line.startswith(("FAILED ", "ERROR "))]
    skipped = []
    for line in output.splitlines():
        match = re.match(r"SKIPPED \[\d+\] [^:]+(?::\d+)?: (.*)", line)
        if match and match.group(1) not in skipped:
            skipped.append(match.group(1))
    parts = [summary or ("no tests ran" if returncode == 5 else _last_line(output))]
    if failed:
        parts.append("failed: " + ", ".join(failed[:6]) + (f" and {len(failed) - 6} more" if len(failed) > 6 else ""))
    if skipped:
        parts.append("skipped: " + "; ".join(skipped[:3]))
    return (PASSED if returncode == 0 else FAILED), _one_line("; ".join(parts), 600)


def summarise_grading(output: str, returncode: int) -> tuple[str, str]:
    """Status and detail from ``course_lib check``: its score line, and the checks that did not pass."""
    lines = [line for line in output.splitlines() if line.strip()]
    score = next((line for line in reversed(lines) if line.lower().startswith("score")), _last_line(output))
    # Result rows start with the part ("05", "14.1+2"); a row without "pass" is a check that failed or did not run.
    failing = [_one_line(line, 80) for line in lines
               if re.match(r"^\d\d(\.[\d+]+)?\s", line) and " pass " not in f" {line} "]
    detail = score if not failing else f"{score}; not passing: " + " | ".join(failing[:4])
    return (PASSED if returncode == 0 else FAILED), _one_line(detail, 600)


def summarise_command(output: str, returncode: int) -> tuple[str, str]:
    """Status from the exit code, detail from the last line of output."""
    return (PASSED if returncode == 0 else FAILED), _last_line(output)


def bench_result(out_dir: Path) -> dict[str, Any] | None:
    """The benchmark's GPU section from ``latest.json`` in ``out_dir`` (``None`` when it was not written)."""
    try:
        report = json.loads((out_dir / "latest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    section = report.get("results", {}).get("gpu_gpt")
    error = report.get("errors", {}).get("gpu_gpt")
    return {"error": error} if error else section


def _measured_peaks(bench: dict[str, Any]) -> str:
    peaks = bench.get("measured_peaks") or {}
    return ", ".join(f"{dtype} {flops / 1e12:,.0f} TFLOP/s" for dtype, flops in peaks.items()) or "not measured"


def summarise_bench(out_dir: Path) -> Callable[[str, int], tuple[str, str]]:
    """A summariser that reads the GPU section's tokens/s and MFU for each contender from the JSON report."""

    def summarise(output: str, returncode: int) -> tuple[str, str]:
        section = bench_result(out_dir)
        if section is None:
            return FAILED, f"no report written; {_last_line(output)}"
        if "error" in section:
            return FAILED, _one_line(section["error"])
        if "skipped" in section:
            return (PASSED if returncode == 0 else FAILED), section["skipped"]
        cells = []
        for row in section["rows"]:
            mfu = f", MFU {row['mfu']:.1%}" if row["mfu"] is not None else ""
            cells.append(f"{row['contender']} {row['tokens_per_s']:,.0f} tokens/s{mfu}")
        failed = section.get("failed", {})
        cells += [f"{name} failed: {_one_line(err, 120)}" for name, err in failed.items()]
        detail = f"{section['model']}, batch {section['batch']}: " + "; ".join(cells)
        if section["rows"] and section["rows"][0]["mfu"] is None:
            detail += f" ({section['peak_source']})"
        ok = returncode == 0 and not failed
        return (PASSED if ok else FAILED), detail

    return summarise


# ------------------------------------------------------------------------------------------------ lessons, full mode
# The lessons whose numbers a GPU changes most run first (precision, the ceiling, compile, the capstone, latency and
# memory, the tuning techniques); the others follow in course order, as far as the time goes.
FULL_MODE_FIRST = ("05", "14", "07", "11", "08", "12")
LESSON_MIN_START_S = 30.0  # no lesson starts with less time left: the kernel's start and set-up cell alone take seconds
LESSONS_RESERVE_S = 10.0  # kept back from the part's limit: the last kernel's shutdown and the summary
LESSONS_LIMIT_S = 300.0  # the part's limit when it runs on its own (`gpu-check lessons` without gpu-check around it)
LESSONS_SUMMARY = "lessons.json"
MACHINE_FILE = "machine.json"  # beside the executed lessons: what ran them (the site's GPU pages say it)


def course_lessons(root: Path = ROOT) -> list[Path]:
    """The lessons (``notebooks/NN_topic.ipynb``), in course order."""
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def full_mode_order(lessons: Sequence[Path], first: Sequence[str] = FULL_MODE_FIRST) -> list[Path]:
    """``lessons`` with those numbered in ``first`` in front, in that order; the others after, as they came."""
    front = [lesson for number in first for lesson in lessons if lesson.name[:2] == number]
    return front + [lesson for lesson in lessons if lesson not in front]


@dataclass
class LessonRun:
    """One lesson of the full-mode part: its status (passed / FAILED / cut short / not run), seconds, a one-line
    detail, and its claim log's count and inconsistencies (``python -m course_lib claims check``)."""

    lesson: str
    status: str
    seconds: float
    detail: str = ""
    claims: int = 0
    inconsistencies: list[str] = field(default_factory=list)


def execute_full_mode(lesson: Path, out_dir: Path, deadline: float) -> LessonRun:
    """Execute ``lesson`` in full mode into ``out_dir``, no cell running past ``deadline``; then check its claims.

    The executed notebook is written whatever happened (what ran, up to the error or the limit), beside its claim
    log (``<lesson>.claims.jsonl``) and a log (``<lesson>.log``: the error in full, the claims check's lines).
    """
    import nbformat
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    from course_lib.nbrun import NotebookRunner, unattended_env
    from course_lib.perf import claims

    claim_log = out_dir / f"{lesson.stem}.claims.jsonl"
    claim_log.unlink(missing_ok=True)
    nb = nbformat.read(lesson, as_version=4)
    client = NotebookRunner(nb, kernel_name="python3", resources={"metadata": {"path": str(lesson.parent)}},
                            timeout_func=lambda _cell: max(1, int(deadline - clock.now())))
    started = clock.now()
    status, detail, error = PASSED, "", ""
    try:
        client.execute(env={**unattended_env(lesson), "COURSE_MODE": "full", claims.ENV: str(claim_log)})
    except CellTimeoutError as exc:
        status, detail, error = CUT_SHORT, "stopped at the part's time limit", str(exc)
    except CellExecutionError as exc:
        status, detail, error = FAILED, _one_line(f"{exc.ename}: {exc.evalue}", 200), str(exc)
    except DeadKernelError as exc:
        status, detail, error = FAILED, _one_line(f"the kernel died: {exc}", 200), str(exc)
    seconds = clock.now() - started
    atomic.write_with(out_dir / lesson.name, lambda f: nbformat.write(nb, f), encoding="utf-8")
    count, found = claims.check_file(claim_log) if claim_log.is_file() else (0, [])
    if found:
        status, detail = FAILED, "; ".join(filter(None, [detail, f"{len(found)} inconsistent claim(s): {found[0]}"]))
    missed = expectations_missed(claim_log) if status == PASSED and claim_log.is_file() else []
    if missed:
        status, detail = FAILED, f"{len(missed)} expectation(s) not met: {missed[0]}"
    lines = [f"{lesson.name}: {status} in {seconds:.0f} s (full mode){': ' + detail if detail else ''}"]
    lines += [error] if error else []
    lines.append(f"claims check {claim_log.name}: {count} claim(s), {len(found)} inconsistencies")
    lines += found
    lines += [f"expectation not met: {m}" for m in missed]
    atomic.write_text(out_dir / f"{lesson.stem}.log", "\n".join(lines) + "\n")
    return LessonRun(lesson.stem, status, seconds, _one_line(detail, 300), count, found)


def machine_record() -> dict[str, Any]:
    """The machine, software and course that execute the lessons, and the date: :data:`MACHINE_FILE`'s content."""
    import platform

    from course_lib import bootstrap

    return {**device_description(), "python": platform.python_version(), "course": bootstrap.identity(),
            "mode": "full", "date": _dt.date.today().isoformat()}


def cuda_capability() -> tuple[int, int] | None:
    """GPU 0's compute capability, ``None`` without a CUDA GPU."""
    import torch

    return tuple(torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else None


def expectations_missed(claim_log: Path) -> list[str]:
    """What the lesson of ``claim_log`` must show on this GPU and did not (course_lib/perf/expectations.py)."""
    from course_lib.perf import expectations

    shown, lesson = expectations.read_claim_log(claim_log)
    return [str(m) for m in expectations.check_claims(shown, lessons=[lesson], capability=cuda_capability())]


def run_full_lessons(lessons: Sequence[Path], out_dir: Path, *, limit_s: float,
                     execute: Callable[[Path, Path, float], LessonRun] = execute_full_mode,
                     log: Callable[[str], None] = print) -> list[LessonRun]:
    """Execute ``lessons`` in full mode one after another (``execute``) within ``limit_s`` seconds.

    A lesson starts only with ``LESSON_MIN_START_S`` left before the limit (less ``LESSONS_RESERVE_S``) and is
    stopped there; the lessons that do not fit are listed as not run. ``out_dir/lessons.json`` holds every lesson's
    :class:`LessonRun`, rewritten after each one.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    deadline = clock.now() + limit_s - LESSONS_RESERVE_S
    runs: list[LessonRun] = []
    for lesson in lessons:
        left = deadline - clock.now()
        if left < LESSON_MIN_START_S:
            runs.append(LessonRun(lesson.stem, NOT_RUN, 0.0, f"{max(0.0, left):.0f} s left of the part's "
                                                             f"{limit_s:.0f} s"))
        else:
            log(f"[lessons] {lesson.name}: started ({left:.0f} s left)")
            runs.append(execute(lesson, out_dir, deadline))
            log(f"[lessons] {lesson.name}: {runs[-1].status} ({runs[-1].seconds:.0f} s) {runs[-1].detail}")
        atomic.write_text(out_dir / LESSONS_SUMMARY, json.dumps([vars(r) for r in runs], indent=1) + "\n")
    return runs


def read_lesson_runs(out_dir: Path) -> list[dict[str, Any]] | None:
    """The lessons part's results from ``out_dir/lessons.json`` (``None`` when it was not written)."""
    try:
        runs = json.loads((out_dir / LESSONS_SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return runs if isinstance(runs, list) else None


def summarise_lessons(out_dir: Path) -> Callable[[str, int], tuple[str, str]]:
    """A summariser that reads the lessons part's results: counts by status, which failed and why, the claims."""

    def summarise(output: str, returncode: int) -> tuple[str, str]:
        runs = read_lesson_runs(out_dir)
        if runs is None:
            return FAILED, f"no results written; {_last_line(output)}"
        by_status: dict[str, list[str]] = {}
        for run in runs:
            by_status.setdefault(run["status"], []).append(run["lesson"][:2])
        counts = [f"{len(names)} {status} ({', '.join(names)})" for status, names in by_status.items()
                  if status != NOT_RUN]
        if NOT_RUN in by_status:
            counts.append(f"{len(by_status[NOT_RUN])} not run (time budget)")
        failed = [f"{run['lesson']}: {run['detail']}" for run in runs if run["status"] == FAILED]
        claims_total = sum(run["claims"] for run in runs)
        inconsistent = sum(len(run["inconsistencies"]) for run in runs)
        detail = f"{', '.join(counts) or 'no lessons'}; {claims_total} claims checked, {inconsistent} inconsistent"
        if failed:
            detail += "; " + " | ".join(failed)
        return (PASSED if returncode == 0 and not failed else FAILED), _one_line(detail, 600)

    return summarise


def lessons_main(argv: Sequence[str]) -> int:
    """``python -m course_lib gpu-check lessons --out DIR [--lessons NN ...]``: the lessons part on its own."""
    parser = CommandParser(prog="python -m course_lib gpu-check lessons",
                           description="Execute lessons in full mode and check their claim logs.")
    parser.add_argument("--out", type=Path, required=True, help="folder for the executed lessons and their logs")
    parser.add_argument("--lessons", nargs="+", default=[], help="lesson numbers (default: all, GPU-heavy first)")
    args = parser.parse_args(argv)
    lessons = select_lessons(parser, args.lessons)
    limit_s = float(os.environ.get(LIMIT_ENV) or LESSONS_LIMIT_S)
    started = clock.now()
    for stale in [*args.out.glob("*.ipynb"), *args.out.glob("*.claims.jsonl"), *args.out.glob("*.log"),
                  args.out / LESSONS_SUMMARY, args.out / MACHINE_FILE]:
        stale.unlink(missing_ok=True)  # the report must never show an earlier run's lessons
    if cuda_capability() is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic.write_text(args.out / MACHINE_FILE, json.dumps(machine_record(), indent=1) + "\n")
    os.environ["COURSE_MODE"] = "full"  # this process prepares the full-size data the lessons read
    from course_lib.data.cli import prepare

    if limit_s - LESSONS_RESERVE_S >= LESSON_MIN_START_S and prepare(["shapes", "text"], quiet=True) != 0:
        print("[lessons] the full-size data could not be prepared (see above)")
        return 1
    runs = run_full_lessons(lessons, args.out, limit_s=limit_s - (clock.now() - started))
    return 1 if any(run.status == FAILED for run in runs) else 0


def select_lessons(parser: argparse.ArgumentParser, numbers: Sequence[str]) -> list[Path]:
    """The lessons numbered ``numbers`` in that order (all, GPU-heavy first, when empty); an unknown number is a
    parser error naming the lessons there are."""
    lessons = course_lessons()
    known = {lesson.name[:2]: lesson for lesson in lessons}
    unknown = [n for n in numbers if n.zfill(2) not in known]
    if unknown:
        parser.error(f"--lessons {' '.join(unknown)}: no such lesson; the lessons are {', '.join(known)}")
    return [known[n.zfill(2)] for n in numbers] if numbers else full_mode_order(lessons)


def default_parts(log_dir: Path, *, lessons_dir: Path, lessons: Sequence[str] = (),
                  peak_tflops: float | None = None, workers: int | None = None,
                  python: str = sys.executable) -> list[Part]:
    """The six parts with their commands and time budgets in seconds.

    The whole stays under eight minutes: data (60) + the longest of the three parts running together (240) + the
    benchmark (what is left of the overall budget, at most 200) + the lessons in full mode (what is left after that,
    at most 300; ``lessons`` chooses them by number, all by default).
    """
    workers = workers or max(1, min(8, (os.cpu_count() or 2) // 2))
    parallel = ("-n", str(workers), "--dist", "loadfile") if importlib.util.find_spec("xdist") else ()
    pytest = (python, "-m", "pytest", "-p", "no:cacheprovider", "-q")
    # The library's tests need no notebook plugin: without it (and its options) pytest starts seconds sooner.
    without_notebooks = ("-p", "no:nbval", "-o", "addopts=-ra")
    bench_out = log_dir / "bench"
    bench = (python, "-m", "course_lib", "bench", "--quick", "--only", "gpu", "--out", str(bench_out))
    if peak_tflops is not None:
        bench += ("--peak-tflops", str(peak_tflops))
    return [
        Part("data", "smoke data", (python, "-m", "course_lib", "data", "prepare", "--quiet"), 60,
             summarise_command, phase=0),
        Part("tests", "gpu-marked tests (pytest -m gpu)", (*pytest, *without_notebooks, "-m", "gpu", "tests"),
             240, summarise_pytest, phase=1),
        Part("notebooks", "lesson + solution notebooks (nbval, smoke)",
             (*pytest, *parallel, "notebooks", "solutions"), 240, summarise_pytest, phase=1),
        Part("grading", "grading every solution (course_lib check)",
             (python, "-m", "course_lib", "check", "--notebooks", "solutions"), 240, summarise_grading, phase=1),
        Part("bench", "benchmark GPU section (GPT-2 small, MFU)", bench, 200, summarise_bench(bench_out), phase=2),
        Part("lessons", "lessons in full mode (claims checked)",
             (python, "-m", "course_lib", "gpu-check", "lessons", "--out", str(lessons_dir),
              *(("--lessons", *lessons) if lessons else ())),
             300, summarise_lessons(lessons_dir), phase=3, optional=True),
    ]


# ------------------------------------------------------------------------------------------------ running them
@dataclass
class _Running:
    part: Part
    proc: subprocess.Popen
    log_path: Path
    started: float
    timeout: float
    log_file: Any = field(repr=False, default=None)


def _stop(proc: subprocess.Popen) -> None:
    """End the part's whole process group (pytest-xdist workers, notebook kernels, torchrun ranks)."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _finish(run: _Running, seconds: float, timed_out: bool) -> Row:
    run.log_file.close()
    output = run.log_path.read_text(encoding="utf-8", errors="replace")
    if timed_out:
        return Row(run.part.title, TIMEOUT, seconds,
                   _one_line(f"stopped at its time limit ({run.timeout:.0f} s); last output: {_last_line(output)}"),
                   str(run.log_path))
    try:
        status, detail = run.part.summarise(output, run.proc.returncode)
    except Exception as exc:  # a summary that cannot be read is a failed row, not a crash
        status, detail = FAILED, f"exit code {run.proc.returncode}; output not understood ({exc})"
    return Row(run.part.title, status, seconds, detail, str(run.log_path))


def run_parts(parts: Sequence[Part], *, log_dir: Path, cwd: Path = ROOT, env: dict[str, str] | None = None,
              budget_s: float = TOTAL_BUDGET_S, min_start_s: float = 10.0,
              log: Callable[[str], None] = print) -> list[Row]:
    """Run ``parts`` phase by phase (a phase's parts at the same time); one :class:`Row` per part, in order.

    Each part's time limit is its own budget or what is left of ``budget_s``, whichever is smaller (the part's process
    finds it in ``COURSE_GPU_CHECK_LIMIT_S``); a part whose limit would be under ``min_start_s`` is not started.
    Nothing a part does (fail, crash, hang) stops the others.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    deadline = clock.now() + budget_s
    rows: dict[str, Row] = {}
    for phase in sorted({p.phase for p in parts}):
        running: list[_Running] = []
        for part in (p for p in parts if p.phase == phase):
            timeout = min(part.budget_s, deadline - clock.now())
            if timeout < min_start_s:
                rows[part.key] = Row(part.title, NOT_RUN if part.optional else SKIPPED, 0.0,
                                     f"not started: {max(0.0, timeout):.0f} s left of the {budget_s:.0f} s budget")
                continue
            log_path = log_dir / f"{part.key}.log"
            log_path.unlink(missing_ok=True)  # a fresh log, and never one written through a planted link
            log_file = atomic.open_append(log_path)  # closed in _finish
            try:
                proc = subprocess.Popen(part.argv, cwd=cwd, env={**(os.environ if env is None else env),
                                                                 LIMIT_ENV: f"{timeout:.0f}"},
                                        stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
            except OSError as exc:
                log_file.close()
                rows[part.key] = Row(part.title, FAILED, 0.0, f"could not start {part.argv[0]}: {exc}", str(log_path))
                continue
            log(f"[gpu-check] {part.key}: started (limit {timeout:.0f} s)")
            running.append(_Running(part, proc, log_path, clock.now(), timeout, log_file))
        try:
            while running:
                for run in list(running):
                    elapsed = clock.now() - run.started
                    if run.proc.poll() is not None or elapsed > run.timeout:
                        timed_out = run.proc.returncode is None
                        if timed_out:
                            _stop(run.proc)
                        row = _finish(run, elapsed, timed_out)
                        rows[run.part.key] = row
                        running.remove(run)
                        log(f"[gpu-check] {run.part.key}: {row.status} ({row.seconds:.0f} s)")
                if running:
                    time.sleep(0.2)
        except BaseException:  # Ctrl-C included: parts run in their own sessions and would outlive us
            for run in running:
                _stop(run.proc)
                run.log_file.close()
            raise
    return [rows[p.key] for p in parts]


# ------------------------------------------------------------------------------------------------ the report
def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def format_table(rows: Sequence[Row]) -> str:
    """The Markdown table: part, status, time, detail (pipes escaped, newlines folded)."""
    lines = ["| part | status | time | detail |", "|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {_cell(row.part)} | {_cell(row.status)} | {row.seconds:.0f} s | {_cell(row.detail)} |")
    total = sum(r.seconds for r in rows)
    failed = [r for r in rows if r.status not in NOT_FAILED]
    lines.append(f"| **all** | {'passed' if not failed else f'{len(failed)} of {len(rows)} not passed'} | "
                 f"{total:.0f} s (parts summed) | |")
    return "\n".join(lines)


def device_description() -> dict[str, Any]:
    """Name, compute capability and memory of GPU 0, with the torch and CUDA versions."""
    import torch

    props = torch.cuda.get_device_properties(0)
    return {"name": torch.cuda.get_device_name(0), "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1), "count": torch.cuda.device_count(),
            "torch": torch.__version__, "cuda": torch.version.cuda}


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path  # no home paths in the report


def format_lessons(runs: Sequence[dict[str, Any]], lessons_dir: Path) -> list[str]:
    """The report's section on the lessons executed in full mode: one row per lesson."""
    lines = ["## Lessons in full mode", "",
             f"Executed one at a time with `COURSE_MODE=full` and `COURSE_CLAIM_LOG`, the lessons a GPU changes most "
             f"first, as many as the time budget allowed; each claim log re-derived by `python -m course_lib claims "
             f"check`. The executed notebooks, claim logs and logs: `{_shown(lessons_dir)}/`.", "",
             "| lesson | status | time | claims | detail |", "|---|---|---|---|---|"]
    for run in runs:
        claims_cell = f"{run['claims']}, {len(run['inconsistencies'])} inconsistent" if run["status"] != NOT_RUN else ""
        lines.append(f"| {_cell(run['lesson'])} | {_cell(run['status'])} | {run['seconds']:.0f} s | {claims_cell} | "
                     f"{_cell(run['detail'])} |")
    return lines + [""]


def to_markdown(rows: Sequence[Row], device: dict[str, Any], *, wall_s: float, argv: Sequence[str],
                bench: dict[str, Any] | None, log_dir: Path, lessons: Sequence[dict[str, Any]] | None = None,
                lessons_dir: Path | None = None) -> str:
    """The whole report: the machine, the table, the benchmark's rows, the lessons run in full mode (``lessons``,
    written to ``lessons_dir``) and where the logs are."""
    lines = [
        f"# GPU check: {device['name']}", "",
        f"Run {_dt.datetime.now().isoformat(timespec='seconds')} with `python -m course_lib gpu-check"
        f"{' ' + ' '.join(argv) if argv else ''}` in {wall_s:.0f} s wall-clock. Device: {device['name']} "
        f"x{device.get('count', 1)}, compute capability {device.get('capability')}, {device.get('memory_gib')} GiB; "
        f"torch {device.get('torch')}, CUDA {device.get('cuda')}.", "",
        format_table(rows), "",
    ]
    if bench and bench.get("rows"):
        from course_lib.perf.mfu import format_rows

        lines += ["## Benchmark GPU section", "",
                  f"{bench['model']} ({bench['n_params_non_embedding'] / 1e6:.1f} M parameters without position "
                  f"embeddings), batch {bench['batch']} x {bench['seq_len']} tokens, random tokens, fused AdamW; "
                  f"{bench['rounds']} interleaved rounds of {bench['steps_per_round']} steps after "
                  f"{bench['warmup_steps']} warm-up steps. MFU = tokens/s x (6N + 12 L H Q T) / peak; "
                  f"peak: {bench['peak_source']}; measured peak: the best matmul this GPU reached in its own sweep "
                  f"({_measured_peaks(bench)}).", "", format_rows(bench), ""]
        lines += [f"- {sentence}" for sentence in bench.get("verdicts", [])]
        lines.append("")
    if lessons and lessons_dir is not None:
        lines += format_lessons(lessons, lessons_dir)
    lines.append(f"Full output of each part: `{_shown(log_dir)}/<part>.log`.")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ CLI
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = CommandParser(prog="python -m course_lib gpu-check", description=__doc__.splitlines()[0])
    if argv[:1] == ["lessons"]:  # the lessons part's own process (see default_parts)
        return lessons_main(argv[1:])
    keys = ("data", "tests", "notebooks", "grading", "bench", "lessons")
    parser.add_argument("--only", nargs="+", choices=keys, help="run only these parts (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results",
                        help="folder for gpu-<device>.md (default: benchmarks/results)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's dense bf16 (fp16 before Ampere) peak TFLOP/s, when it is not in the table")
    parser.add_argument("--budget", type=float, default=TOTAL_BUDGET_S,
                        help=f"seconds for everything (default {TOTAL_BUDGET_S:.0f}: under eight minutes)")
    parser.add_argument("--workers", type=int, default=None, help="pytest-xdist processes for the notebooks")
    parser.add_argument("--lessons", nargs="+", default=[],
                        help="the lessons to execute in full mode, by number (default: all, GPU-heavy first)")
    parser.add_argument("--without-gpu", action="store_true",
                        help="run the parts even without a GPU (checks the wiring: GPU tests and the benchmark skip)")
    args = parser.parse_args(argv)
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        parser.error(f"--peak-tflops={args.peak_tflops} must be > 0")
    if args.budget <= 0:
        parser.error(f"--budget={args.budget} must be > 0 (seconds)")
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers={args.workers} must be >= 1")
    select_lessons(parser, args.lessons)  # an unknown number is refused before any work

    import torch

    if not torch.cuda.is_available() and not args.without_gpu:
        print(NO_GPU_LINE)
        return 0
    if not all((ROOT / d).is_dir() for d in ("tests", "notebooks", "solutions")):
        parser.error(f"{ROOT} has no tests/, notebooks/ and solutions/: run gpu-check from a checkout of the course")
    device = device_description() if torch.cuda.is_available() else {"name": "cpu (--without-gpu)"}
    log_dir = ROOT / ".cache" / "gpu-check" / slug(device["name"])
    lessons_dir = args.out / f"gpu-{slug(device['name'])}"
    parts = [p for p in default_parts(log_dir, lessons_dir=lessons_dir, lessons=args.lessons,
                                      peak_tflops=args.peak_tflops, workers=args.workers)
             if not args.only or p.key in args.only]
    for stale in (log_dir / "bench" / "latest.json", lessons_dir / LESSONS_SUMMARY):
        stale.unlink(missing_ok=True)  # the report must never show an earlier run's numbers
    # What `make test` and tests/conftest.py set: smoke sizes, the repository's data cache, no GUI backend.
    env = {**os.environ, "COURSE_MODE": "smoke", "COURSE_DATA_DIR": str(ROOT / ".cache" / "data"),
           "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    print(f"[gpu-check] {device['name']}: {', '.join(p.key for p in parts)}; logs in {log_dir}")
    t0 = time.monotonic()
    rows = run_parts(parts, log_dir=log_dir, env=env, budget_s=args.budget)
    bench = bench_result(log_dir / "bench") if any(p.key == "bench" for p in parts) else None
    report = to_markdown(rows, device, wall_s=time.monotonic() - t0, argv=argv, bench=bench, log_dir=log_dir,
                         lessons=read_lesson_runs(lessons_dir), lessons_dir=lessons_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    out_file = args.out / f"gpu-{slug(device['name'])}.md"
    atomic.write_text(out_file, report)  # an interrupted run never leaves half a table
    print()
    print(format_table(rows))
    print(f"\nwritten: {out_file}")
    return 0 if all(r.status in NOT_FAILED for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
