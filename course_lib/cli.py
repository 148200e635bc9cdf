"""One entry point for the whole course: ``python -m course_lib <command>`` (or ``course <command>``).

Each command lives in the module that implements it and is imported only when
asked for, so ``course doctor`` does not pay for importing the grader.

:func:`main` is the one error boundary of every command: a failure the learner can fix (a bad environment value,
a damaged dataset, a full disk, a read-only or missing folder) ends in one ``error:`` line saying which value or
file, why, and what to do, with exit code 2; Ctrl-C ends in one line with exit code 130. Never a traceback for
those; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence

from course_lib import atomic, mode

EXIT_BAD_INPUT, EXIT_INTERRUPTED = 2, 130

# command -> ("module:function", one-line help). Each function takes argv and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("course_lib.train.cli:main", "train with the resumable template (--help lists every config field)"),
    "data": ("course_lib.data.cli:main", "generate or inspect the offline datasets (run once before a workshop)"),
    "doctor": ("course_lib.doctor:main", "check this machine: versions, devices, bf16/TF32, compile, workers, data"),
    "claims": ("course_lib.perf.claims:main", "check a claim log (COURSE_CLAIM_LOG): every verdict re-derived"),
    "bench": ("course_lib.perf.bench:main", "run the benchmark table (ratios measured side by side)"),
    "gpu-check": ("course_lib.gpu_check:main", "on a CUDA GPU: every GPU path, notebook and grader in < 8 min"),
    "build-exercises": ("course_lib.grading.build:main", "regenerate exercises/ from solutions/"),
    "check": ("course_lib.grading.check:main", "grade your own exercises/ and print a score table"),
    "progress": ("course_lib.room:progress_main", "your lessons, predictions and checks; `export`: for the room"),
    "class": ("course_lib.room:class_main", "instructor: `class report FOLDER`, the room's measurements side by side"),
    "collect": ("course_lib.grading.collect:main", "instructor: a Canvas or Moodle download into the class layout"),
    "grade": ("course_lib.grading.grade:main", "instructor: grade a folder of student submissions into a CSV"),
    "site": ("course_lib.website:main", "build the course website: lessons executed with their outputs (COURSE_MODE)"),
    "lab": ("course_lib.lab:main", "launch JupyterLab on the welcome notebook (127.0.0.1, with a token)"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: python -m course_lib <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `python -m course_lib <command> --help` for a command's options."]
    return "\n".join(lines)


def _load(target: str) -> Callable[[Sequence[str]], int]:
    module_name, func_name = target.split(":")
    return getattr(importlib.import_module(module_name), func_name)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"course_lib: unknown command {command!r}.\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        result = _load(COMMANDS[command][0])(rest)
    except KeyboardInterrupt:
        print(f"\nerror: interrupted (Ctrl-C); `{command}` stopped before it finished: run it again.",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `course progress | head`: the reader has what it wanted; nothing went wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit stays quiet
        return 0
    except Exception as exc:
        line = expected_error_line(exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return int(result or 0)


def expected_error_line(exc: BaseException) -> str | None:
    """One line for a failure the learner can fix (see the module docstring); None for anything else."""
    from course_lib.data.errors import DataError, DatasetUnavailable

    if isinstance(exc, (mode.SettingError, DataError, DatasetUnavailable)):
        return " ".join(str(exc).split())
    if isinstance(exc, OSError):
        return atomic.os_error_line(exc) + mode.data_dir_hint(exc.filename)
    return None
