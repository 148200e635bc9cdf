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
``TorchrunError`` with the exit code and the last lines; on timeout or when you interrupt the kernel the whole
job (launcher and all ranks) is killed.

``run_torchrun(code_or_path, nproc=2, timeout=...)`` is the same thing as a plain function.
"""

from __future__ import annotations

import os
import queue
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

from course_lib import atomic

DEFAULT_TIMEOUT_S = 600.0
TAIL_LINES = 30
# torchrun fills ${rank} for each worker; lines printed by torchrun itself carry no tag.
RANK_PREFIX_TEMPLATE = "[rank${rank}]: "


class TorchrunError(RuntimeError):
    """A ``torchrun`` job failed (a rank exited non-zero) or ran past its timeout."""

    def __init__(self, message: str, returncode: int, output: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.output = output


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

    ``--tee 3`` copies both stdout and stderr of each worker to the console with the prefix
    ``[rankR]: `` (``--log-line-prefix-template``); the log files go to ``log_dir``.
    ``rdzv_endpoint`` (``HOST:PORT``) replaces ``--standalone`` with the multi-node style c10d rendezvous.

    Taught in lesson 09 (``notebooks/09_distributed.ipynb``).
    """
    cmd = [python or sys.executable, "-m", "torch.distributed.run"]
    if rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        cmd += ["--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", "--rdzv-id=course"]
    cmd += [
        f"--nproc_per_node={nproc}",
        "--tee=3",
        f"--log-dir={log_dir}",
        f"--log-line-prefix-template={RANK_PREFIX_TEMPLATE}",
    ]
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
    """This process's environment for the job: one thread per rank unless set, unbuffered output, plus ``env``."""
    child_env = dict(os.environ)
    child_env.setdefault("OMP_NUM_THREADS", "1")
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env.update(env or {})
    return child_env


def _launch(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """Start the launcher in its own process group (one ``killpg`` stops it and every rank), output piped."""
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, bufsize=1, env=env, start_new_session=True)


def _stream(proc: subprocess.Popen[str], timeout: float | None, on_line: Callable[[str], None] | None) -> list[str]:
    """Collect the job's output lines as they arrive (handing each to ``on_line``) until it closes its output.

    Past ``timeout`` the whole job is killed and :class:`TorchrunError` raised; any exception (the timeout, or
    ``KeyboardInterrupt`` from the notebook) kills the job before it propagates.
    """
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
    reader.start()
    collected: list[str] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            wait = 0.2 if deadline is None else min(0.2, max(0.0, deadline - time.monotonic()))
            try:
                line = lines.get(timeout=wait)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    _kill_group(proc)
                    output = "".join(collected)
                    raise TorchrunError(
                        f"torchrun job killed after its timeout of {timeout} s; last lines:\n{_tail(output)}",
                        returncode=proc.returncode if proc.returncode is not None else -1,
                        output=output,
                    ) from None
                continue
            if line is None:
                return collected
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
) -> tuple[int, str]:
    """Run Python code under ``torchrun``; return ``(returncode, output)``.

    ``code_or_path``: source code (a string), the path of a ``.py`` file, or ``"-m package.module"`` (e.g.
    ``run_torchrun("-m course_lib.ddp_demo", script_args=["--strategy", "fsdp"])``).

    * ``output`` is stdout and stderr of the launcher and every rank, interleaved as they arrived; rank lines
      start with ``[rankR]: ``.
    * ``on_line`` is called with each line as it arrives (the cell magic prints it); default: nothing.
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
            collected = _stream(proc, timeout, on_line)
            returncode = proc.wait()
        except BaseException:  # e.g. interrupted while waiting for the exit code
            _kill_group(proc)
            raise
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
    return returncode, "".join(collected)


def _tail(output: str, n: int = TAIL_LINES) -> str:
    """The last ``n`` lines the ranks printed (the launcher's own traceback only repeats the exit code)."""
    lines = output.splitlines(keepends=True)
    rank_lines = [line for line in lines if line.startswith("[rank")]
    return "".join(deque(rank_lines or lines, maxlen=n))


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

    returncode, output = run_torchrun(cell, nproc=nproc, timeout=timeout, script_args=script_args, on_line=show)
    if returncode != 0:
        raise TorchrunError(
            f"torchrun exited with code {returncode} (a rank failed); last lines:\n{_tail(output)}",
            returncode=returncode,
            output=output,
        )


def load_ipython_extension(ipython: object) -> None:
    """Called by ``%load_ext course_lib.magics``: registers the ``%%torchrun`` cell magic."""
    register = ipython.register_magic_function  # type: ignore[attr-defined]
    register(torchrun_cell, magic_kind="cell", magic_name="torchrun")
