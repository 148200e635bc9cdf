"""The child side of grading: load one notebook's code, run its checks, record only *observations*.

``python -m course_lib.grading.worker NOTEBOOK EXERCISE OUT_DIR --channel SEED_FD,READY_FD [--extra DIR ...]``

It runs inside the sandbox (:mod:`course_lib.grading.sandbox`) started by :mod:`course_lib.grading.runner`.
The run's seed (which the checks draw their inputs from) is not on the command line, in the environment or in
any module while the notebook's cells load: once they have run, the worker writes ``ready`` on ``READY_FD`` and
the grader answers with the seed on ``SEED_FD`` (see the threat model in ``docs/grading.md``).
For check ``i`` it writes ``OUT_DIR/observations-i.pt``: the list of values the check's
:func:`~course_lib.grading.api.observe` calls got from the learner's code (or the exception they raised),
saved with ``torch.save``. Nothing here decides a verdict: the parent reads these files with
``torch.load(weights_only=True)`` and runs the checks again on them, so whatever the learner's code does to
this process (patch the checks, write fake files, exit early) can only change the observations, never
the judgement of them. Learner output goes to stdout/stderr, of which the parent keeps only the tail.
"""

from __future__ import annotations

import argparse
import importlib.abc
import json
import linecache
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from course_lib import atomic
from course_lib.grading import api, notebook, reference_use
from course_lib.grading.api import CELL_ERRORS, checks_for


class RefuseMPI(importlib.abc.MetaPathFinder):
    """``import mpi4py`` fails in the judging process, as it does where mpi4py is installed without an MPI library.

    Lightning looks for an MPI launcher whenever mpi4py is installed (``MPIEnvironment.detect`` imports
    ``mpi4py.MPI``, and that import starts MPI): inside the sandbox the start can abort the whole worker (it did on a
    GPU machine, and every Lightning check scored 0). A failed import reads to Lightning as "no MPI here", so it
    trains in this one process, whoever built the Trainer (a check or the learner's code) and whether or not mpi4py
    is installed. Graded exercises never use MPI.
    """

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "mpi4py" or name.startswith("mpi4py."):
            raise ModuleNotFoundError(f"No module named {name!r}: grading never starts MPI", name=name)
        return None


def refuse_mpi() -> None:
    """Install :class:`RefuseMPI` first on this process's import path (once)."""
    if not any(isinstance(finder, RefuseMPI) for finder in sys.meta_path):
        sys.meta_path.insert(0, RefuseMPI())


def observations_file(out_dir: Path, index: int) -> Path:
    return Path(out_dir) / f"observations-{index}.pt"


def reference_calls_file(out_dir: Path) -> Path:
    """The references the learner's code was seen using (:class:`~course_lib.grading.reference_use.Watch`)."""
    return Path(out_dir) / "reference-calls.json"


def load_namespace(nb: dict[str, Any]) -> dict[str, Any]:
    """Execute the set-up and exercise cells in order in a fresh namespace; remember which cells raised."""
    ns: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__, CELL_ERRORS: []}
    for index, code in notebook.graded_code(nb):
        filename = f"<cell {index}>"
        # Registering the source lets tracebacks and error messages quote the learner's line.
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            exec(compile(code, filename, "exec"), ns)
        except SystemExit as exc:
            ns[CELL_ERRORS].append((index, f"SystemExit: the cell called sys.exit({exc.code!r})"))
        except BaseException as exc:  # a broken cell fails its checks, it does not stop the others
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            ns[CELL_ERRORS].append((index, last))
    return ns


class ChannelError(RuntimeError):
    """The seed channel was read or closed by someone other than this worker."""


READY = b"ready\n"  # the one message a worker sends the grader


def receive_seed(channel: str, read: Callable[[int, int], bytes], write: Callable[[int, bytes], int]) -> int:
    """Say ``ready`` to the grader and read the seed it answers with (``read``/``write`` were taken before any
    learner code ran, so a notebook that replaces ``os.read`` does not see this)."""
    seed_fd, ready_fd = (int(fd) for fd in channel.split(","))
    write(ready_fd, READY)
    data = b""
    while not data.endswith(b"\n") and len(data) < 32:
        chunk = read(seed_fd, 32)
        if not chunk:
            break
        data += chunk
    try:
        return int(data.strip())
    except ValueError:
        raise ChannelError("the grader's seed never arrived: did the notebook read the grader's channel?") from None


def _report_uses(watch: reference_use.Watch, out_dir: Path) -> None:
    """Write what the watch saw so far (after loading and after every check: a notebook that exits later cannot take
    back what was seen)."""
    if watch.used:
        atomic.write_bytes(reference_calls_file(out_dir), json.dumps(sorted(watch.used)).encode())


def _save(records: list[dict[str, Any]], path: Path) -> None:
    atomic.torch_save(records, path)  # the parent sees a whole file or none


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.grading.worker")
    parser.add_argument("notebook", type=Path)
    parser.add_argument("exercise")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--extra", type=Path, action="append", default=[])
    parser.add_argument("--channel", required=True, help="SEED_FD,READY_FD from the grader")
    args = parser.parse_args(argv)
    refuse_mpi()  # before anything can import Lightning
    # Taken before the notebook's code runs: replacing os.read or this module's function cannot reach these.
    read, write, receive, set_seed = os.read, os.write, receive_seed, api.set_run_seed
    checks = checks_for(args.exercise, args.extra)  # imported before any learner code runs
    watch = reference_use.Watch(args.exercise, reference_use.watched_modules(args.exercise))
    api.watch_taken(watch.taken)
    try:
        nb = notebook.read(args.notebook)
    except notebook.NotebookError as exc:  # the parent has read it already; report and stop
        print(exc, file=sys.stderr)
        return 3
    ns = load_namespace(nb)
    _report_uses(watch, args.out_dir)
    try:
        set_seed(receive(args.channel, read, write))
    except (ChannelError, OSError, ValueError) as exc:
        print(f"grading stopped: {exc}", file=sys.stderr)
        return 4
    for index, check in enumerate(checks):
        records = api.start_recording()
        try:
            check.func(ns)
        except KeyboardInterrupt:
            raise
        except BaseException:  # the verdict is the parent's; only the observations matter here
            pass
        finally:
            api.stop_recording()
        try:
            _save(records, observations_file(args.out_dir, index))
        except Exception as exc:  # e.g. the output limit: this check has no observations
            print(f"could not save the observations of check {index}: {exc}", file=sys.stderr)
        _report_uses(watch, args.out_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    code = main()
    # Threads or processes the learner's code left running must not hold the grader up.
    os._exit(code)
