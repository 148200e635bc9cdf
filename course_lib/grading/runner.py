"""The parent side of isolated grading: one fresh process per notebook, a timeout, structured results.

Nothing in a learner's notebook is trusted: not its outputs, not its kernel state, not its
behaviour. For each notebook :func:`grade_notebook` starts ``course_lib.grading.worker`` in a
new process group inside a temporary working directory (removed afterwards), in smoke mode,
waits at most ``timeout_s`` seconds, and reads the JSON lines it wrote. Whatever happens — a
hang, ``os._exit``, a segfault, an unreadable file — every check gets a :class:`CheckResult`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Mapping

import course_lib
from course_lib.grading.api import Check, CheckResult, checks_for, normalise_exercise
from course_lib.grading.notebook import NOTEBOOK_NAME

DEFAULT_TIMEOUT_S = 300.0
_PACKAGE_ROOT = str(Path(course_lib.__file__).resolve().parents[1])


def find_notebooks(folder: Path) -> dict[str, Path]:
    """``{"05": folder/05_accumulation.ipynb, ...}`` for every NN_topic.ipynb in ``folder``."""
    found: dict[str, Path] = {}
    for path in sorted(Path(folder).glob("*.ipynb")):
        match = NOTEBOOK_NAME.match(path.name)
        if match:
            found.setdefault(match["number"], path)
    return found


def _failed(check: Check, message: str, hint: str | None = None) -> CheckResult:
    return CheckResult(check.exercise, check.name, check.points, passed=False, message=message, hint=hint,
                       source=check.source)


def _tail(path: Path, chars: int = 300) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""
    return " ".join(text[-chars:].split())


def _child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["COURSE_MODE"] = env.get("COURSE_GRADE_MODE", "smoke")  # checks test behaviour, not scale
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
    env.setdefault("MPLBACKEND", "Agg")
    env.setdefault("OMP_NUM_THREADS", str(threads))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def grade_notebook(path: Path | None, exercise: str | int, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                   extra_dirs: Iterable[Path] = (), threads: int = 1) -> list[CheckResult]:
    """Grade one notebook in an isolated process; one result per check of ``exercise``, always."""
    number = normalise_exercise(exercise)
    extra_dirs = [Path(d).resolve() for d in extra_dirs]
    checks = checks_for(number, extra_dirs)
    if path is None or not Path(path).is_file():
        return [_failed(c, f"no notebook for exercise {number} was found", hint="save it as NN_topic.ipynb")
                for c in checks]
    # Two folders: the learner's code runs in `workdir`; its results go to `private`, out of the way of code that
    # cleans up (or vandalises) its working directory.
    workdir = Path(tempfile.mkdtemp(prefix=f"course-grade-{number}-"))
    private = Path(tempfile.mkdtemp(prefix=f"course-grade-{number}-results-"))
    try:
        copy = workdir / Path(path).name
        shutil.copyfile(path, copy)
        results_file, log_file = private / "results.jsonl", private / "output.log"
        results_file.touch()
        command = [sys.executable, "-m", "course_lib.grading.worker", str(copy), number, str(results_file)]
        for directory in extra_dirs:
            command += ["--extra", str(directory)]
        with open(log_file, "wb") as log:
            proc = subprocess.Popen(command, cwd=workdir, env=_child_env(threads), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                returncode: int | None = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                # The whole group: learner code may have started processes of its own.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
        results = _collect(checks, results_file, log_file, returncode, timeout_s)
        for result in results:  # name the learner's file, not the temporary copy
            result.message = result.message.replace(str(copy), str(path))
        return results
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


def _collect(checks: list[Check], results_file: Path, log_file: Path, returncode: int | None,
             timeout_s: float) -> list[CheckResult]:
    done: dict[int, CheckResult] = {}
    fatal = None
    try:
        lines = results_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:  # removed by the learner's code: nothing it reported counts
        lines = []
    for line in lines:
        try:
            record = json.loads(line)
            if "fatal" in record:
                fatal = str(record["fatal"])
            elif 0 <= int(record["index"]) < len(checks):
                # Name and points come from the parent's own list, never from the child's report.
                check = checks[int(record["index"])]
                result = CheckResult.from_dict(record["result"])
                result.exercise, result.name, result.points, result.source = (
                    check.exercise, check.name, check.points, check.source)
                done[int(record["index"])] = result
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a killed process
    if fatal:
        reason, hint = fatal, "open the notebook in Jupyter and save it again"
    elif returncode is None:
        reason = f"timed out after {timeout_s:g} s before this check finished"
        hint = "look for an infinite loop, or long work in an exercise cell (keep those cells to definitions)"
    else:
        output = _tail(log_file)
        reason = f"the grading process ended early (exit code {returncode})"
        hint = "does your code call os._exit, kill its own process or crash the interpreter?" + (
            f" last output: {output}" if output else "")
    return [done.get(i) or _failed(c, reason, hint) for i, c in enumerate(checks)]


def grade_notebooks(notebooks: Mapping[str, Path | None], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                    extra_dirs: Iterable[Path] = (), jobs: int | None = None) -> dict[str, list[CheckResult]]:
    """Grade several notebooks (``{number: path or None}``), ``jobs`` processes at a time."""
    extra = list(extra_dirs)
    for number in notebooks:  # import every check module once, here, before threads start
        checks_for(number, extra)
    jobs = max(1, jobs or min(len(notebooks), os.cpu_count() or 1))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {n: pool.submit(grade_notebook, p, n, timeout_s=timeout_s, extra_dirs=extra, threads=threads)
                   for n, p in notebooks.items()}
        return {n: f.result() for n, f in futures.items()}
