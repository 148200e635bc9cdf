"""What every rank of ``%%torchrun`` / ``run_torchrun`` actually starts: the target, with whole-line output.

``torchrun --tee`` copies each rank's output from a log file to the console a line at a time. If a rank's output
is unbuffered, ``print("text")`` reaches the file as two writes, ``"text"`` and ``"\\n"``, and the copier can pick up
the half line, gluing another rank's line onto it. Line buffering writes every line whole, so tagged lines never
mix. Usage (as the launcher builds it)::

    torchrun ... -m course_lib.torchrun_entry path/to/script.py [args...]
    torchrun ... -m course_lib.torchrun_entry -m package.module [args...]
"""

from __future__ import annotations

import runpy
import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or (args[0] == "-m" and len(args) < 2):
        raise SystemExit("usage: python -m course_lib.torchrun_entry (SCRIPT.py | -m MODULE) [ARGS...]")
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
