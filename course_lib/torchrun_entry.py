"""What every rank of ``%%torchrun`` / ``run_torchrun`` actually starts: the target, with whole-line output.

``torchrun --tee`` copies each rank's output from a log file to the console a line at a time. If a rank's output
is unbuffered, ``print("text")`` reaches the file as two writes, ``"text"`` and ``"\\n"``, and the copier can pick up
the half line, gluing another rank's line onto it. Line buffering writes every line whole, so tagged lines never
mix.

When the target is done, the rank flushes its output and leaves with ``os._exit``: a cell that tears down the
process group while its DDP model is still alive (a module-level ``model``, as notebook cells write them) can
otherwise abort during interpreter shutdown ("terminate called without an active exception"), when C++ threads
of the process group are destroyed in an arbitrary order. The exit code still says whether the target failed.

Usage (as the launcher builds it)::

    torchrun ... -m course_lib.torchrun_entry path/to/script.py [args...]
    torchrun ... -m course_lib.torchrun_entry -m package.module [args...]
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
import traceback
from collections.abc import Sequence

# Set by the ``%%torchrun`` magic: each rank says when it has started and runs the cell (a cell may print nothing
# for a while, and the learner should see that every rank is up).
STATUS_ENV = "COURSE_TORCHRUN_STATUS"
STARTED = "started: running the cell"


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or (args[0] == "-m" and len(args) < 2):
        raise SystemExit("usage: python -m course_lib.torchrun_entry (SCRIPT.py | -m MODULE) [ARGS...]")
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]
    if os.environ.get(STATUS_ENV) == "1":
        print(f"{STARTED} (process {os.getpid()})")
    code = 0
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = args
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as exc:  # sys.exit(...) in the target: keep its meaning
        if isinstance(exc.code, int):
            code = exc.code
        elif exc.code is not None:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
