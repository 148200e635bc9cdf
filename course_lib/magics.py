"""``%%torchrun``: run a notebook cell as a multi-process ``torchrun`` job and stream every rank's output back.

A Jupyter kernel is one process; distributed training needs several. Starting them *inside* the kernel
(``mp.spawn``) breaks in notebooks: the children must re-import the cell's functions, which live in
``__main__`` of a kernel and cannot be pickled under ``spawn``, and a crashed rank can hang the kernel. So the
cell magic does what you would do in a terminal: write the cell to a script, launch::

    python -m torch.distributed.run --standalone --nproc_per_node=N script.py

in a fresh process group, and print each line as it arrives, tagged with the rank that printed it::

    %load_ext course_lib.magics

    %%torchrun -n 2 --timeout 120
    import course_lib.distributed as dist
    ctx = dist.setup()
    print(f"hello from rank {ctx.rank} of {ctx.world_size}")
    dist.teardown()

The cell runs as a plain script: it does not see the notebook's variables (import what it needs); the
environment (``COURSE_MODE``, ``COURSE_DATA_DIR``, ...) is inherited. If any rank fails, the magic raises
``TorchrunError`` with each rank's exit code and its own last lines; on timeout or when you interrupt the kernel
the whole job (launcher and all ranks) is killed.

``run_torchrun(code_or_path, nproc=2, timeout=...)`` is the same thing as a plain function.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from course_lib import atomic, heartbeat
from course_lib.torchrun_entry import STATUS_ENV

DEFAULT_TIMEOUT_S = 600.0
# The magic says it is still running after this many seconds without a line, and again every as many seconds
# (a cell can compute for minutes before it prints: the learner sees it is alive, and for how long).
SILENCE_S = 10.0
TAIL_LINES = 15  # per rank, in a failed job's message
# torchrun fills ${rank} for each worker; lines printed by torchrun itself carry no tag.
RANK_PREFIX_TEMPLATE = "[rank${rank}]: "
# Two ways to hand torchrun the template: newer launchers take an option; older ones (torch 2.11, for one) only read
# the environment variable, and pass an option they do not know on to every rank's Python, which exits 2.
PREFIX_OPTION = "--log-line-prefix-template"
PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"


class TorchrunError(RuntimeError):
    """A ``torchrun`` job failed (a rank exited non-zero) or ran past its timeout."""

    def __init__(self, message: str, returncode: int, output: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.output = output


def launcher_accepts(option: str) -> bool:
    """Whether the installed torch's launcher knows ``option``, asked of its own argument parser.

    The parser is handed ``option=probe script.py``; an option it knows comes back as a parsed value, one it does
    not comes back unparsed (torchrun would pass it on to the script). No version numbers are compared.
    """
    from torch.distributed.run import get_args_parser

    parsed, _ = get_args_parser().parse_known_args([f"{option}=probe", "script.py"])
    return getattr(parsed, option.lstrip("-").replace("-", "_"), None) == "probe"


def torchrun_command(
    script: str | os.PathLike[str],
    *,
    nproc: int,
    log_dir: str | os.PathLike[str],
    script_args: Sequence[str] = (),
    python: str | None = None,
    rdzv_endpoint: str | None = None,
) -> list[str]:
    """The launcher command line: one host, ``nproc`` processes, every output line tagged with its rank.

    ``script`` is a file, or ``"-m package.module"`` to run a module.

    ``--tee 3`` copies both stdout and stderr of each worker to the console with the prefix ``[rankR]: ``; the
    log files go to ``log_dir``. The prefix is passed as ``--log-line-prefix-template`` where the installed
    launcher has that option; older launchers take it from ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``, which
    :func:`run_torchrun` sets for every job.
    ``rdzv_endpoint`` (``HOST:PORT``) replaces ``--standalone`` with the multi-node style c10d rendezvous.

    Taught in lesson 09 (``notebooks/09_distributed.ipynb``).
    """
    cmd = [python or sys.executable, "-m", "torch.distributed.run"]
    if rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        cmd += ["--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", "--rdzv-id=course"]
    cmd += [f"--nproc_per_node={nproc}", "--tee=3", f"--log-dir={log_dir}"]
    if launcher_accepts(PREFIX_OPTION):
        cmd.append(f"{PREFIX_OPTION}={RANK_PREFIX_TEMPLATE}")
    # Every rank starts through course_lib.torchrun_entry, which makes its output line-buffered so that tagged
    # lines from different ranks never mix mid-line.
    cmd += ["-m", "course_lib.torchrun_entry"]
    target = str(script)
    if target.startswith("-m "):  # a module, as with `python -m`
        cmd += ["-m", target[3:].strip()]
    else:
        cmd.append(target)
    return cmd + list(script_args)


def _validate(nproc: int, timeout: float | None) -> None:
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc={nproc!r} must be a positive integer (processes on this machine), e.g. 2.")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout={timeout!r} must be a positive number of seconds, or None for no limit.")


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    """Reader thread: move lines from the child's pipe to a queue; ``None`` marks the end."""
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Stop the launcher and every rank: they share the process group started for the launcher."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _target(code_or_path: str | os.PathLike[str], tmp: Path) -> str | Path:
    """What torchrun starts: ``"-m module"`` as is, an existing ``.py`` file, or the code written to ``tmp/cell.py``."""
    if isinstance(code_or_path, str) and code_or_path.startswith("-m ") and "\n" not in code_or_path:
        return code_or_path
    looks_like_path = isinstance(code_or_path, os.PathLike) or (
        isinstance(code_or_path, str) and "\n" not in code_or_path and code_or_path.strip().endswith(".py")
    )
    if looks_like_path:
        path = Path(code_or_path)
        if not path.is_file():
            raise FileNotFoundError(f"script {str(path)!r} does not exist; pass code as a string or an existing .py "
                                    "path.")
        return path
    script = tmp / "cell.py"
    atomic.write_text(script, str(code_or_path))
    return script


def _child_env(env: dict[str, str] | None) -> dict[str, str]:
    """This process's environment for the job: one thread per rank unless set, unbuffered output, the rank prefix
    for launchers that read it from the environment (where the option is also passed, it wins), plus ``env``."""
    child_env = dict(os.environ)
    child_env.setdefault("OMP_NUM_THREADS", "1")
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env[PREFIX_ENV] = RANK_PREFIX_TEMPLATE
    child_env.update(env or {})
    return child_env


def _launch(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """Start the launcher in its own process group (one ``killpg`` stops it and every rank), output piped."""
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, bufsize=1, env=env, start_new_session=True)


def _stream(proc: subprocess.Popen[str], nproc: int, timeout: float | None,
            on_line: Callable[[str], None] | None,
            on_silence: Callable[[float, float], None] | None = None) -> list[str]:
    """Collect the job's output lines as they arrive (handing each to ``on_line``) until it closes its output.

    ``on_silence(elapsed, silent)`` is called after :data:`SILENCE_S` seconds without a line, and again every
    :data:`SILENCE_S` seconds while the job stays silent (seconds since the start, and since the last line).

    Past ``timeout`` the whole job is killed and :class:`TorchrunError` raised; any exception (the timeout, or
    ``KeyboardInterrupt`` from the notebook) kills the job before it propagates.
    """
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
    reader.start()
    collected: list[str] = []
    started = last_heard = last_said = time.monotonic()
    deadline = None if timeout is None else started + timeout
    try:
        while True:
            wait = 0.2 if deadline is None else min(0.2, max(0.0, deadline - time.monotonic()))
            try:
                line = lines.get(timeout=wait)
            except queue.Empty:
                now = time.monotonic()
                if on_silence is not None and now - max(last_heard, last_said) >= SILENCE_S:
                    last_said = now
                    on_silence(now - started, now - last_heard)
                if deadline is not None and time.monotonic() >= deadline:
                    _kill_group(proc)
                    output = "".join(collected)
                    raise TorchrunError(
                        f"torchrun job killed after its timeout of {timeout} s.\n{failure_report(output, nproc)}",
                        returncode=proc.returncode if proc.returncode is not None else -1,
                        output=output,
                    ) from None
                continue
            if line is None:
                return collected
            last_heard = time.monotonic()
            collected.append(line)
            if on_line is not None:
                on_line(line)
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        reader.join(timeout=5)


def run_torchrun(
    code_or_path: str | os.PathLike[str],
    nproc: int = 2,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    *,
    script_args: Sequence[str] = (),
    on_line: Callable[[str], None] | None = None,
    env: dict[str, str] | None = None,
    rdzv_endpoint: str | None = None,
    on_silence: Callable[[float, float], None] | None = None,
) -> tuple[int, str]:
    """Run Python code under ``torchrun``; return ``(returncode, output)``.

    ``code_or_path``: source code (a string), the path of a ``.py`` file, or ``"-m package.module"`` (e.g.
    ``run_torchrun("-m course_lib.ddp_demo", script_args=["--strategy", "fsdp"])``).

    * ``output`` is stdout and stderr of the launcher and every rank, interleaved as they arrived; rank lines
      start with ``[rankR]: ``.
    * ``on_line`` is called with each line as it arrives (the cell magic prints it); default: nothing.
      ``on_silence(elapsed, silent)`` after every :data:`SILENCE_S` seconds without a line (see :func:`_stream`).
    * ``timeout`` (seconds, ``None`` for none): past it, the whole job is killed and ``TorchrunError`` raised.
      ``KeyboardInterrupt`` (interrupting the kernel) also kills the whole job, then propagates.
    * ``env`` is added to this process's environment (which the ranks inherit). Ranks write whole lines as soon
      as they end (see :mod:`course_lib.torchrun_entry`), so output arrives live, and ``OMP_NUM_THREADS``
      defaults to 1 per rank (what torchrun would set anyway).

    A non-zero return code is *returned*, not raised: the caller decides (the magic raises).
    """
    _validate(nproc, timeout)
    with tempfile.TemporaryDirectory(prefix="course_torchrun_") as tmp:
        target = _target(code_or_path, Path(tmp))
        cmd = torchrun_command(target, nproc=nproc, log_dir=Path(tmp) / "logs", script_args=script_args,
                               rdzv_endpoint=rdzv_endpoint)
        proc = _launch(cmd, _child_env(env))
        try:
            collected = _stream(proc, nproc, timeout, on_line, on_silence)
            returncode = proc.wait()
        except BaseException:  # e.g. interrupted while waiting for the exit code
            _kill_group(proc)
            raise
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
    return returncode, "".join(collected)


# A rank's tag, whatever the launcher made of it: "[rank1]: " (the course's template), "[default1]:" (torchrun's own).
_RANK_TAG = re.compile(r"\[[A-Za-z_][\w-]*?(\d+)\]:")
# torchrun's logger: "E1204 18:36:22.022000 498 torch/distributed/elastic/multiprocessing/api.py:986] failed ..."
_LAUNCHER_LOG = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")
# One entry of torchrun's failure report ("Failures:" / "Root Cause"): "  rank      : 1 (local_rank: 1)" and,
# on the next line, "  exitcode  : 2 (pid: 564)".
_REPORTED_FAILURE = re.compile(r"^\s*rank\s*:\s*(\d+)\b.*\n\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE)


def _lines_by_rank(output: str) -> tuple[dict[int, list[str]], list[str]]:
    """Split a job's output into each rank's lines (by their tag) and the untagged lines not from the launcher.

    The launcher's own lines are left out: its log lines, and its closing traceback and failure report (from its
    last ``Traceback`` before ``ChildFailedError`` to the end), which only repeat the exit codes.
    """
    lines = output.splitlines(keepends=True)
    tagged = [_RANK_TAG.match(line) for line in lines]
    untagged = [i for i, tag in enumerate(tagged) if tag is None]
    report_start = len(lines)
    closing = [i for i in untagged if "ChildFailedError" in lines[i]]
    if closing:
        tracebacks = [i for i in untagged if i < closing[-1] and lines[i].startswith("Traceback (most recent call")]
        report_start = tracebacks[-1] if tracebacks else closing[-1]
    by_rank: dict[int, list[str]] = {}
    other: list[str] = []
    for i, (line, tag) in enumerate(zip(lines, tagged)):
        if tag is not None:
            by_rank.setdefault(int(tag.group(1)), []).append(line)
        elif i < report_start and not _LAUNCHER_LOG.match(line) and line.strip():
            other.append(line)
    return by_rank, other


def _reported_exit_codes(output: str) -> dict[int, int]:
    """``{rank: exit code}`` for each rank in torchrun's failure report (the ranks it saw fail)."""
    untagged = "".join(line for line in output.splitlines(keepends=True) if not _RANK_TAG.match(line))
    return {int(rank): int(code) for rank, code in _REPORTED_FAILURE.findall(untagged)}


def _exit_code_words(code: int) -> str:
    if code < 0:
        try:
            return f"exit code {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exit code {code}"


def failure_report(output: str, nproc: int, n: int = TAIL_LINES) -> str:
    """What to read in a failed job's output: each rank's exit code and its own last ``n`` lines, failed ranks first.

    Lines belong to a rank by their tag in any form (``[rank1]: ``, ``[default1]:``); exit codes come from
    torchrun's failure report. Its closing traceback is left out (it stays in ``TorchrunError.output``): it only
    repeats the codes, and would crowd out the rank's own error. Untagged lines from elsewhere come last.
    """
    by_rank, other = _lines_by_rank(output)
    codes = _reported_exit_codes(output)
    ranks = sorted(set(range(nproc)) | by_rank.keys() | codes.keys(), key=lambda rank: (rank not in codes, rank))
    parts = []
    if codes:
        parts.append("Each rank's exit code (torchrun's failure report): " + "; ".join(
            f"rank {rank}: {_exit_code_words(codes[rank])}" if rank in codes
            else f"rank {rank}: not reported (it finished, or was stopped when another rank failed)"
            for rank in ranks) + ".\n")
    for rank in ranks:
        lines = by_rank.get(rank, [])
        tail = "".join(deque(lines, maxlen=n)) if lines else "(it printed nothing)\n"
        parts.append(f"--- rank {rank}, last lines ---\n{tail}")
    if other:
        parts.append(f"--- lines from no rank ---\n{''.join(deque(other, maxlen=n))}")
    return "".join(parts)


def _parse_magic_line(line: str) -> tuple[int, float | None, list[str]]:
    """Parse ``-n N [--timeout S] [-- script args]`` (argparse, so ``--help`` and errors read as usual)."""
    import argparse

    parser = argparse.ArgumentParser(prog="%%torchrun", add_help=True)
    parser.add_argument("-n", "--nproc", "--nproc_per_node", type=int, default=2, dest="nproc",
                        help="processes to start on this machine (default 2)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds before the whole job is killed (default {DEFAULT_TIMEOUT_S:g}; 0 = none)")
    parser.add_argument("script_args", nargs="*", help="arguments passed to the cell (sys.argv[1:])")
    try:
        args = parser.parse_args(shlex.split(line))
    except SystemExit as exc:
        raise ValueError(f"%%torchrun {line!r}: bad arguments (usage: %%torchrun -n 2 [--timeout S]).") from exc
    return args.nproc, (None if args.timeout == 0 else args.timeout), list(args.script_args)


def torchrun_cell(line: str, cell: str) -> None:
    """The body of ``%%torchrun``: run the cell, print lines live, raise ``TorchrunError`` if a rank failed."""
    nproc, timeout, script_args = _parse_magic_line(line)
    _validate(nproc, timeout)

    def show(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    began = time.monotonic()  # the cell's start (the job's starts after torch is imported here, the first time)

    def still_running(_elapsed: float, silent: float) -> None:
        show(f"torchrun: {time.monotonic() - began:.0f} s in, still running ({silent:.0f} s since the last line)"
             + (f"; it stops at {timeout:.0f} s" if timeout is not None else "") + "\n")

    # Said before anything starts: the launcher and each rank import torch first, which takes seconds.
    show(f"torchrun: starting {nproc} process{'es' if nproc != 1 else ''} on this machine (each imports torch "
         "first, a few seconds); each rank says when it runs the cell.\n")
    with heartbeat.working_on("torchrun", reports_itself=True):  # it prints its own "still running" lines
        returncode, output = run_torchrun(cell, nproc=nproc, timeout=timeout, script_args=script_args, on_line=show,
                                          env={STATUS_ENV: "1"}, on_silence=still_running)
    if returncode != 0:
        raise TorchrunError(
            f"torchrun exited with code {returncode} (a rank failed).\n{failure_report(output, nproc)}",
            returncode=returncode,
            output=output,
        )


def load_ipython_extension(ipython: object) -> None:
    """Called by ``%load_ext course_lib.magics``: registers the ``%%torchrun`` cell magic."""
    register = ipython.register_magic_function  # type: ignore[attr-defined]
    register(torchrun_cell, magic_kind="cell", magic_name="torchrun")
