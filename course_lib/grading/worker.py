"""The child side of isolated grading: load one notebook's code into a fresh namespace, run its checks.

``python -m course_lib.grading.worker NOTEBOOK EXERCISE RESULTS [--extra DIR ...]``

It is started by :mod:`course_lib.grading.runner` in a temporary working directory and writes
one JSON object per line to ``RESULTS``: ``{"index": i, "result": {...}}`` for each check as
soon as it finishes (so a process that dies half-way still reports what it completed), or
``{"fatal": "..."}`` when the notebook cannot be read. Learner output goes to stdout/stderr,
which the parent keeps only to quote the end of it in a failure message.
"""

from __future__ import annotations

import argparse
import json
import linecache
import os
import sys
import traceback
from pathlib import Path
from typing import IO, Any, Sequence

from course_lib.grading import notebook
from course_lib.grading.api import CELL_ERRORS, checks_for, run_check


def _emit(stream: IO[str], record: dict[str, Any]) -> None:
    stream.write(json.dumps(record) + "\n")
    stream.flush()
    os.fsync(stream.fileno())


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.grading.worker")
    parser.add_argument("notebook", type=Path)
    parser.add_argument("exercise")
    parser.add_argument("results", type=Path)
    parser.add_argument("--extra", type=Path, action="append", default=[])
    args = parser.parse_args(argv)
    # Load the checks before any learner code runs, and hold our own handle on the results file.
    checks = checks_for(args.exercise, args.extra)
    with open(args.results, "a", encoding="utf-8") as out:
        try:
            nb = notebook.read(args.notebook)
        except notebook.NotebookError as exc:
            _emit(out, {"fatal": str(exc)})
            return 0
        ns = load_namespace(nb)
        for index, check in enumerate(checks):
            _emit(out, {"index": index, "result": run_check(check, ns).to_dict()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
