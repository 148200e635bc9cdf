"""The parent side of grading: a sandboxed child observes, this process judges.

Nothing in a learner's notebook is trusted: not its outputs, not its kernel state, not its behaviour, not
what its process reports. For each notebook :func:`grade_notebook`

1. reads the notebook itself (an unreadable file is ``invalid notebook``, no process is started);
2. copies it into a fresh scratch folder and starts ``course_lib.grading.worker`` there, isolated by
   :mod:`course_lib.grading.sandbox` (bubblewrap where available) with resource limits and a timeout;
3. reads, for each check, the observations the child saved (``torch.load(weights_only=True)``: plain data
   only, size-capped, never following links) and runs the check *again here* on them
   (:class:`~course_lib.grading.api.Replay`): only this verdict counts.

Whatever the child does (hang, ``os._exit``, crash, write fake files, patch the checks, print fake results),
every check gets a :class:`CheckResult`, and a forged or missing observation can only fail a check.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import course_lib
from course_lib.grading import notebook, sandbox
from course_lib.grading.api import Check, CheckResult, Replay, checks_for, normalise_exercise, printable, run_check
from course_lib.grading.notebook import NOTEBOOK_NAME
from course_lib.grading.reference_use import REFERENCES, reference_uses
from course_lib.grading.worker import READY, observations_file, reference_calls_file

DEFAULT_TIMEOUT_S = 300.0
_PACKAGE_ROOT = Path(course_lib.__file__).resolve().parents[1]

# Grading status of one notebook (a CSV column).
GRADED, TIMED_OUT, ENDED_EARLY, INVALID, MISSING = "graded", "timed out", "ended early", "invalid notebook", "missing"
REFUSED = "refused (a link)"
INTERFERED = "interfered with grading"
INTERRUPTED = "not graded (interrupted)"

# The sandboxed children running now (grading runs in threads): Ctrl-C ends them all at once (stop_all), and a child
# that starts after that is ended as soon as it is registered.
_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


@dataclass
class NotebookGrade:
    """Everything the grader found out about one notebook."""

    exercise: str
    results: list[CheckResult]
    status: str = GRADED
    uses_reference: list[str] = field(default_factory=list)  # course_lib functions the exercise code uses
    output_tail: str = ""
    seed: int = 0  # the inputs' seed of this grading run
    observations: list[list[dict[str, Any]] | None] = field(default_factory=list)  # per check, as loaded
    note: str = ""  # said in the report beside the score (e.g. which renamed copy was graded)

    @property
    def earned(self) -> int:
        return sum(r.earned for r in self.results)

    @property
    def points(self) -> int:
        return sum(r.points for r in self.results)


# What browsers, file managers and platforms make of NN_topic.ipynb: a second download "(1)", again "(1) (1)";
# Windows' " - Copy"; macOS's " copy 2"; Colab's "Copy of "; Canvas's resubmission "-1".
RENAMED_COPY = re.compile(r"^(?:Copy of )*(?P<number>\d\d)_(?P<topic>[A-Za-z0-9_]+)"
                          r"(?: ?\(\d+\)| - Copy| copy(?: \d+)?|-\d+)*\.ipynb$")


def find_notebooks(folder: Path) -> dict[str, Path]:
    """``{"05": folder/05_accumulation.ipynb, ...}`` for every NN_topic.ipynb in ``folder``.

    Where only a renamed copy was handed in (``05_accumulation (1).ipynb``, as a browser saves a second download),
    that copy is taken, the most recently saved one if there are several: see :func:`renamed_note`.
    """
    found: dict[str, Path] = {}
    copies: dict[str, list[Path]] = {}
    for path in sorted(Path(folder).glob("*.ipynb")):
        match = NOTEBOOK_NAME.match(path.name)
        if match:
            found.setdefault(match["number"], path)
        elif match := RENAMED_COPY.match(path.name):
            copies.setdefault(match["number"], []).append(path)
    for number, paths in copies.items():
        if number not in found:
            found[number] = max(paths, key=lambda p: (p.lstat().st_mtime, p.name))
    return found


def renamed_note(path: Path) -> str:
    """A line for the report when ``path`` is a renamed copy rather than the notebook's own name."""
    if NOTEBOOK_NAME.match(path.name):
        return ""
    match = RENAMED_COPY.match(path.name)
    wanted = f"{match['number']}_{match['topic']}.ipynb" if match else "NN_topic.ipynb"
    return f"graded {path.name!r}, a renamed copy: hand it in as {wanted}"


def failed_result(check: Check, message: str, hint: str | None = None) -> CheckResult:
    return CheckResult(check.exercise, check.name, check.points, passed=False, message=message, hint=hint,
                       source=check.source, parts=check.parts)


def _read_capped(path: Path, limit: int) -> bytes | None:
    """The bytes of a regular file the child wrote, never following a link, at most ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return handle.read(limit + 1)[:limit]


def _tail(path: Path, chars: int = 300) -> str:
    try:  # the parent's own log file: read only its end
        with open(path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - 4 * chars))
            data = handle.read(4 * chars)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace").strip()
    return printable(" ".join(text[-chars:].split()))


def _grade_mode() -> str:
    return os.environ.get("COURSE_GRADE_MODE", "smoke")


def _child_env(threads: int) -> dict[str, str]:
    """A small, explicit environment: nothing of the grader's (tokens, paths) leaks into learner code."""
    keep = ("LANG", "LC_ALL", "TZ", "COURSE_DATA_DIR", "CUDA_VISIBLE_DEVICES")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update({
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
        "COURSE_MODE": _grade_mode(),  # checks test behaviour, not scale
        "PYTHONPATH": str(_PACKAGE_ROOT),
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": str(threads),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def _data_dirs() -> list[Path]:
    from course_lib.mode import data_dir

    return [data_dir()]


def _observe(path: Path, number: str, checks: list[Check], extra_dirs: list[Path], *, timeout_s: float,
             threads: int, limits: sandbox.Limits, workdir: Path, seed: int) -> tuple[int | None, Path, Path, bytes]:
    """Run the worker on a scratch copy of ``path``; return (exit code or None on timeout, out dir, log, what the
    child said on the ready pipe: exactly ``READY`` from an undisturbed worker that got as far as the checks)."""
    scratch, out_dir = workdir / "scratch", workdir / "observations"
    scratch.mkdir()
    out_dir.mkdir()
    copy = scratch / Path(path).name
    shutil.copyfile(path, copy)
    sandbox.give_to_worker(scratch, out_dir, copy)
    log_file = workdir / "output.log"
    seed_read, seed_write = os.pipe()  # the seed goes down this one once the notebook has loaded ...
    ready_read, ready_write = os.pipe()  # ... which the worker says on this one
    pipe = _Pipes([seed_read, seed_write, ready_read, ready_write])
    argv = [sys.executable, "-m", "course_lib.grading.worker", str(copy), number, str(out_dir),
            "--channel", f"{seed_read},{ready_write}"]
    for directory in extra_dirs:
        argv += ["--extra", str(directory)]
    command, inside = sandbox.command(argv, scratch=scratch, out_dir=out_dir, package_root=_PACKAGE_ROOT,
                                      readable=[*extra_dirs, *_data_dirs()])
    env = _child_env(threads)
    if command is not argv:  # in the sandbox: its own home, the package at its mounted path
        env.update(HOME=inside(str(scratch)), PYTHONPATH=sandbox.PACKAGE_ROOT, TMPDIR="/tmp")
    else:
        env.update(HOME=str(scratch), TMPDIR=str(scratch))
    heard = b""
    try:
        with open(log_file, "wb") as log:
            proc = subprocess.Popen(command, cwd=scratch, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    pass_fds=(seed_read, ready_write), preexec_fn=sandbox.set_limits(limits))
            pipe.close(seed_read, ready_write)  # the child's ends
            with _LIVE_LOCK:
                _LIVE.add(proc)
                if _STOPPING.is_set():  # stop_all ran while this one was being started
                    _kill_group(proc)
            deadline = time.monotonic() + timeout_s
            try:
                heard = _hand_over_seed(proc, pipe, ready_read, seed_write, seed, deadline, out_dir)
                returncode: int | None = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                _kill_group(proc)
                proc.wait()
                with _LIVE_LOCK:
                    _LIVE.discard(proc)
    finally:
        pipe.close_all()
    return returncode, out_dir, log_file, heard


def stop_all() -> None:
    """End every sandboxed child now, and any started from now on (their threads then finish quickly); for Ctrl-C
    during ``grade``. :func:`allow_starts` undoes it."""
    _STOPPING.set()
    with _LIVE_LOCK:
        running = list(_LIVE)
    for proc in running:
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group (with bubblewrap, its whole PID namespace goes with it)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def allow_starts() -> None:
    """Let sandboxed children run again after :func:`stop_all` (a new grading in the same process)."""
    _STOPPING.clear()


class _Pipes:
    """File descriptors closed exactly once (grading runs in threads: a second close could hit another's fd)."""

    def __init__(self, fds: list[int]) -> None:
        self.open = set(fds)

    def close(self, *fds: int) -> None:
        for fd in fds:
            if fd in self.open:
                self.open.discard(fd)
                os.close(fd)

    def close_all(self) -> None:
        self.close(*list(self.open))


def _hand_over_seed(proc: subprocess.Popen, pipe: _Pipes, ready_read: int, seed_write: int, seed: int,
                    deadline: float, out_dir: Path) -> bytes:
    """Send ``seed`` (then close its pipe) when the child says ``ready``; keep listening until the child ends or
    the deadline, and return all it said (at most 1 KiB). Listening to the end is how interference is seen: a
    notebook that said ``ready`` itself while loading, to learn the seed early, makes the worker say it twice.

    Whatever is in ``out_dir`` when ``ready`` arrives was written while the notebook loaded, before the seed
    existed for it: it is deleted unread, so only what the checks record for this seed is judged."""
    heard = b""
    while (remaining := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([ready_read], [], [], min(remaining, 0.5))
        if readable:
            chunk = os.read(ready_read, 1024)
            if not chunk:  # every holder of the write end is gone: the child has ended
                break
            heard = (heard + chunk)[:1024]
            if READY in heard and seed_write in pipe.open:
                for early in out_dir.iterdir():
                    if early.is_file() or early.is_symlink():
                        early.unlink()
                    else:
                        shutil.rmtree(early, ignore_errors=True)
                os.write(seed_write, f"{seed}\n".encode())
                pipe.close(seed_write)  # a second reader gets nothing: the worker fails rather than waits
        elif proc.poll() is not None:
            break
    return heard


def _seen_using(out_dir: Path, number: str) -> list[str]:
    """The references the worker saw the learner's code use (names the worker may report, nothing else)."""
    data = _read_capped(reference_calls_file(out_dir), 64 << 10)
    try:
        names = json.loads(data) if data else []
    except ValueError:
        return []
    if not isinstance(names, list):
        return []
    own_helpers = f"course_lib.grading.checks.ex{number}_"
    known = [n for n in names if isinstance(n, str) and (n in REFERENCES.get(number, ()) or n.startswith(own_helpers))]
    return known[:50]


# What one check's observations may decode to: the file's size is capped by the sandbox, but a tensor's shape and
# strides are only numbers in it (a 2.6 KB file of zero-stride views decoded to 1.3 GB once a judge touched it).
MAX_OBSERVED_ELEMENTS = 1 << 24  # 64 MiB of float32 over all tensors of one check: far above what any check records


class OversizedObservation(ValueError):
    """A recorded tensor is a broadcast view (a zero stride) or the tensors hold more than the grader reads."""


def _bounded(records: Any) -> None:
    """Raise :class:`OversizedObservation` unless every tensor in ``records`` owns its elements and they are few."""
    total, stack = 0, [records]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            if any(stride == 0 and size > 1 for size, stride in zip(value.shape, value.stride())):
                raise OversizedObservation("a recorded tensor is a broadcast view (zero stride)")
            total += value.numel()
            if total > MAX_OBSERVED_ELEMENTS or value.untyped_storage().nbytes() < value.numel() * value.element_size():
                raise OversizedObservation(f"the recorded tensors hold over {MAX_OBSERVED_ELEMENTS} elements")
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)


def _load_observations(out_dir: Path, index: int, limit: int) -> list[dict[str, Any]] | None:
    """One check's records, or None when the file is missing, unreadable, not a list, or decodes to more than the
    grader reads (:func:`_bounded`): every case fails the check, none allocates more than the file and the cap."""
    data = _read_capped(observations_file(out_dir, index), limit)
    if data is None:
        return None
    import io

    try:
        records = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        _bounded(records)
    except Exception:
        return None
    return records if isinstance(records, list) else None


def grade_notebook(path: Path | None, exercise: str | int, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                   extra_dirs: Iterable[Path] = (), threads: int = 1,
                   limits: sandbox.Limits | None = None) -> NotebookGrade:
    """Grade one notebook: observed in a sandboxed process, judged here; one result per check, always."""
    number = normalise_exercise(exercise)
    extra_dirs = [Path(d).resolve() for d in extra_dirs]
    checks = checks_for(number, extra_dirs)
    if path is None or not Path(path).is_file():
        return NotebookGrade(number, [failed_result(c, f"no notebook for exercise {number} was found",
                                              hint="save it as NN_topic.ipynb") for c in checks], MISSING)
    try:
        nb = notebook.read(Path(path))
    except notebook.NotebookError as exc:
        return NotebookGrade(number, [failed_result(c, str(exc), exc.hint) for c in checks], INVALID)
    uses = reference_uses(nb, number)
    limits = limits or sandbox.Limits(cpu_s=int(timeout_s * max(1, threads)) + 30)
    workdir = Path(tempfile.mkdtemp(prefix=f"course-grade-{number}-"))
    seed = secrets.randbelow(2**31)
    try:
        returncode, out_dir, log_file, heard = _observe(Path(path), number, checks, extra_dirs, timeout_s=timeout_s,
                                                        threads=threads, limits=limits, workdir=workdir, seed=seed)
        tail = _tail(log_file)
        uses = sorted(set(uses) | set(_seen_using(out_dir, number)))
        if heard not in (b"", READY):  # only the worker speaks on that pipe, once: the notebook's code did too
            why = ("the notebook's code wrote to or read from the grader's own channel while it loaded (to learn "
                   "the inputs of the checks early?): nothing it recorded is judged")
            return NotebookGrade(number, [failed_result(c, why, "remove the code that touches the grader's file "
                                                         "descriptors") for c in checks], INTERFERED,
                                 uses_reference=uses, output_tail=tail, seed=seed,
                                 observations=[None] * len(checks))
        if returncode is None:
            status = TIMED_OUT
            missing = f"timed out after {timeout_s:g} s before this check finished"
            hint = "look for an infinite loop, or long work in an exercise cell (keep those cells to definitions)"
        else:
            status = GRADED
            missing = f"the grading process ended before this check was observed (exit code {returncode})"
            hint = "does your code call os._exit or sys.exit, kill its own process, use too much memory or print " \
                   "too much?" + (f" last output: {tail}" if tail else "")
        if heard != READY:  # the handshake never happened: what the notebook wrote while it loaded is not judged
            missing = (f"the grading process ended before the grader handed it this run's inputs (exit code "
                       f"{returncode}): it never got as far as the checks" if returncode is not None else
                       f"timed out after {timeout_s:g} s while the notebook was still loading, before the checks")
        results, observations = [], []
        for index, check in enumerate(checks):
            records = _load_observations(out_dir, index, limits.file_mb << 20) if heard == READY else None
            observations.append(records)
            if records is None:
                results.append(failed_result(check, missing, hint))
                if returncode is not None:
                    status = ENDED_EARLY
                continue
            # Judged in the mode the child observed in (smoke unless COURSE_GRADE_MODE says otherwise): the checks
            # build their references with the same by_mode sizes as the observed runs.
            result = run_check(check, Replay(records, missing=missing, seed=seed, mode=_grade_mode()))
            results.append(result)
        for result in results:  # name the learner's file, not the temporary copy
            result.message = result.message.replace(str(workdir / "scratch" / Path(path).name), str(path))
            result.message = result.message.replace(f"{sandbox.SCRATCH}/{Path(path).name}", str(path))
        return NotebookGrade(number, results, status, uses_reference=uses, output_tail=tail, seed=seed,
                             observations=observations)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def grade_notebooks(notebooks: Mapping[str, Path | None], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                    extra_dirs: Iterable[Path] = (), jobs: int | None = None) -> dict[str, NotebookGrade]:
    """Grade several notebooks (``{number: path or None}``), ``jobs`` sandboxed processes at a time (their
    verdicts are judged one at a time: :func:`~course_lib.grading.api.isolated_check`)."""
    extra = list(extra_dirs)
    for number in notebooks:  # import every check module once, here, before threads start
        checks_for(number, extra)
    jobs = max(1, jobs or min(len(notebooks), os.cpu_count() or 1))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {n: pool.submit(grade_notebook, p, n, timeout_s=timeout_s, extra_dirs=extra, threads=threads)
                   for n, p in notebooks.items()}
        return {n: f.result() for n, f in futures.items()}
