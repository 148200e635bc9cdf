"""``python -m course_lib doctor``: is this machine ready for the course, and what will the lessons measure on it?

Each check reports a status and, for every problem, the fix. A *blocking* problem (the course cannot run) makes
the command exit with 1; warnings (no GPU, no compiler for ``torch.compile``...) only change which lessons show
speed-ups -- every notebook still runs.

From a notebook: ``from course_lib.doctor import doctor; doctor()`` prints the same table and returns the checks.
"""

from __future__ import annotations

import importlib.metadata
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from course_lib.argparsing import CommandParser

OK, WARN, FAIL, INFO = "ok", "warn", "FAIL", "info"

_COMPILE_PROBE = (
    "import torch\n"
    "f = torch.compile(lambda x: torch.sin(x) * 2 + 1)\n"
    "x = torch.randn(64)\n"
    "assert torch.allclose(f(x), torch.sin(x) * 2 + 1)\n"
    "print('compiled')\n"
)


@dataclass
class Check:
    """One line of the report: what was checked, what was found, and how to fix it if needed."""

    name: str
    status: str
    detail: str
    fix: str = ""
    blocking: bool = False


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _check_python() -> Check:
    v = sys.version_info
    if v < (3, 10):
        return Check("python", FAIL, platform.python_version(), "install Python 3.10 or newer", blocking=True)
    return Check("python", OK, f"{platform.python_version()} ({sys.executable})")


def _check_torch() -> list[Check]:
    import torch

    checks = [Check("torch", OK, torch.__version__)]
    tv = _version("torchvision")
    checks.append(Check("torchvision", OK, tv) if tv else
                  Check("torchvision", FAIL, "not installed", "pip install -e '.[dev]' (see docs/developing.md)",
                        blocking=True))
    return checks


def _check_devices() -> list[Check]:
    import torch

    from course_lib.device import pick_device, supports_bf16
    from course_lib.perf.compile import tf32_status

    checks = []
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        checks.append(Check("devices", OK, f"CUDA x{len(names)}: {', '.join(names)} (CUDA {torch.version.cuda})"))
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        checks.append(Check("devices", OK, "Apple MPS"))
    else:
        checks.append(Check("devices", WARN, "CPU only (no CUDA GPU or MPS visible)",
                            "fine for the course (sizes are chosen for a laptop CPU); GPU-only lines are skipped"))
    device = pick_device("auto")
    bf16 = supports_bf16(device)
    detail = f"{'supported' if bf16 else 'not supported'} on {device.type}"
    if device.type == "cpu":
        detail += " (fast only with AVX512-BF16/AMX; the precision lesson measures it)"
    checks.append(Check("bf16 autocast", OK if bf16 else WARN, detail,
                        "" if bf16 else "use fp16 with a GradScaler on this GPU"))
    tf = tf32_status()
    checks.append(Check("TF32", OK if tf["available"] else INFO,
                        ("available; " if tf["available"] else "") + tf["explanation"]))
    return checks


def _check_compile(quick: bool, timeout_s: float) -> Check:
    from course_lib.perf.compile import compile_blocker

    blocker = compile_blocker("cpu")
    if blocker:
        return Check("torch.compile", WARN, blocker, "the compile lesson falls back to eager and says why")
    if quick:
        return Check("torch.compile", INFO, "not tried (--quick); no known blocker")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", _COMPILE_PROBE], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Check("torch.compile", WARN, f"a tiny compile did not finish in {timeout_s:.0f} s",
                     "first compiles are slow on small machines; the compile lesson may fall back to eager")
    seconds = time.perf_counter() - t0
    if proc.returncode != 0 or "compiled" not in proc.stdout:
        last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1][:200]
        return Check("torch.compile", WARN, f"a tiny compile failed: {last}",
                     "install a C++ compiler (gcc/g++, Xcode CLT, MSVC); lessons fall back to eager meanwhile")
    return Check("torch.compile", OK, f"works (tiny compile in a fresh process: {seconds:.1f} s)")


def _check_workers() -> list[Check]:
    from course_lib.perf.loaders import recommend_workers, usable_cores

    method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_context().get_start_method()
    # fork: the default on Linux up to Python 3.13; forkserver: on Linux from 3.14; spawn: macOS and Windows.
    note = ("workers are forked from this process" if method == "fork" else
            f"workers ({'fresh interpreters' if method == 'spawn' else 'forked from a clean server process'}) "
            "re-import your code: keep datasets/collate_fns in modules and guard scripts with "
            "`if __name__ == '__main__':`")
    return [
        Check("start method", INFO, f"{method}: {note}"),
        Check("CPU cores", OK, f"{usable_cores()} usable ({os.cpu_count()} in the machine); suggested num_workers "
                               f"to start measuring from: {recommend_workers()}"),
    ]


def _check_data() -> list[Check]:
    from course_lib.mode import data_dir, mode

    root = data_dir()
    checks = []
    if root.exists():
        entries = sorted(p.name for p in root.iterdir())
        detail = f"{root}: " + (", ".join(entries) if entries else "empty (generated on first use)")
        writable = os.access(root, os.W_OK)
        checks.append(Check("dataset cache", OK if writable else FAIL, detail,
                            "" if writable else f"make {root} writable or set COURSE_DATA_DIR", blocking=not writable))
    else:
        checks.append(Check("dataset cache", INFO, f"{root} does not exist yet (created on first use)",
                            "pre-generate with `python -m course_lib data` before a workshop"))
    checks.append(Check("mode", INFO, f"COURSE_MODE={mode()}"))
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 2**30
    if free_gb < 0.2:
        checks.append(Check("free disk", FAIL, f"{free_gb:.2f} GiB free at {probe}",
                            "free some space or point COURSE_DATA_DIR elsewhere", blocking=True))
    elif free_gb < 2:
        checks.append(Check("free disk", WARN, f"{free_gb:.2f} GiB free at {probe}",
                            "the generated datasets and checkpoints need about 1-2 GiB in full mode"))
    else:
        checks.append(Check("free disk", OK, f"{free_gb:.1f} GiB free at {probe}"))
    return checks


def _check_notebook_tools() -> list[Check]:
    checks = []
    for dist, why in (("jupyterlab", "to open the notebooks"), ("ipywidgets", "for the interactive playgrounds"),
                      ("lightning", "for the Lightning lessons")):
        v = _version(dist)
        checks.append(Check(dist, OK, v) if v else
                      Check(dist, WARN, f"not installed ({why})", "pip install -e '.[dev]'"))
    return checks


def doctor(quick: bool = False, show: bool = True, compile_timeout_s: float = 180.0) -> list[Check]:
    """Run every check and (with ``show``) print the table; returns the list of :class:`Check`.

    Taught in lesson 00 (``notebooks/00_welcome.ipynb``).
    """
    checks = [_check_python(), *_check_torch(), *_check_devices(), _check_compile(quick, compile_timeout_s),
              *_check_workers(), *_check_data(), *_check_notebook_tools()]
    if show:
        print(format_checks(checks))
    return checks


def format_checks(checks: Sequence[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"[{c.status:>4}] {c.name:<{width}}  {c.detail}")
        if c.fix and c.status in (WARN, FAIL):
            lines.append(f"       {'':<{width}}  fix: {c.fix}")
    blocking = [c for c in checks if c.blocking]
    lines.append("")
    lines.append("Blocking problems: " + (", ".join(c.name for c in blocking) if blocking else "none -- ready."))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser(prog="python -m course_lib doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the (slow) trial compile in a subprocess")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON instead of a table")
    parser.add_argument("--compile-timeout", type=float, default=180.0, help="seconds allowed for the trial compile")
    args = parser.parse_args(list(argv) if argv is not None else None)
    checks = doctor(quick=args.quick, show=not args.json, compile_timeout_s=args.compile_timeout)
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    return 1 if any(c.blocking for c in checks) else 0


if __name__ == "__main__":
    raise SystemExit(main())
