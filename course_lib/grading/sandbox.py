"""Where a learner's notebook runs when it is graded: a bubblewrap sandbox on Linux, resource limits everywhere.

With bubblewrap (``bwrap``, Debian package ``bubblewrap``) the worker process sees a read-only view of
the system (``/usr``, ``/etc``, the Python installation, ``course_lib``, the course data cache), a fresh
``/tmp``, one writable scratch folder (its working directory, holding only its own copy of the notebook)
and one writable folder for its observations. It has no network, its own PID namespace (nothing it starts
outlives it; it cannot see or signal the grader), no capabilities and an unprivileged user id. Other
students' folders, the submissions and the CSV are simply not there.

Where ``bwrap`` is missing or cannot run (macOS, Windows, a container without user namespaces) the worker
runs as a plain process in its own session with the same resource limits; :func:`describe` says which,
once, in ``check``/``grade`` output. Limits (``setrlimit``, inherited by everything the worker starts):
memory (data segment), CPU time and the size of any file it writes (which caps printed output too).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

# Where the sandbox mounts things (fixed paths, so nothing about the grader's machine leaks in).
SCRATCH = "/scratch"
OUT = "/grading"
PACKAGE_ROOT = "/opt/course"


@dataclass(frozen=True)
class Limits:
    """Per-process resource limits for graded code."""

    memory_mb: int = 2048  # data segment (heap and anonymous memory) of each process
    cpu_s: int = 600  # CPU seconds of each process (threads add up)
    file_mb: int = 64  # largest file it may write: its printed output and its observations included


def _try_bwrap(bwrap: str) -> str | None:
    """``None`` when ``bwrap`` can start a sandbox like ours here, else why not."""
    try:
        proc = subprocess.run([bwrap, *_isolation_flags(), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
                               "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{bwrap} could not start ({exc})"
    if proc.returncode != 0:
        return f"{bwrap} cannot create a sandbox here ({' '.join(proc.stderr.split())[:200]})"
    return None


def _isolation_flags() -> list[str]:
    return ["--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL",
            "--die-with-parent", "--new-session"]


@functools.cache
def find_bwrap() -> tuple[str | None, str]:
    """``(path to a working bwrap or None, a sentence for the output)``. Tried once per process."""
    if sys.platform != "linux":
        return None, f"no sandbox on {sys.platform}: graded notebooks run as plain processes with resource limits"
    if os.environ.get("COURSE_GRADE_SANDBOX", "").lower() in ("0", "off", "no", "none"):
        return None, "sandbox turned off (COURSE_GRADE_SANDBOX=off): graded notebooks run as plain processes " \
                     "with resource limits and can read and write whatever this user can"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None, "bubblewrap (bwrap) is not installed: graded notebooks run as plain processes with resource " \
                     "limits and can read and write whatever this user can; install the 'bubblewrap' package"
    why = _try_bwrap(bwrap)
    if why:
        return None, why + ": graded notebooks run as plain processes with resource limits and can read and " \
                           "write whatever this user can"
    return bwrap, "sandbox: bubblewrap (no network, read-only system, own PID namespace, scratch folder only)"


def describe() -> str:
    """One plain sentence: how graded code is isolated on this machine."""
    return find_bwrap()[1]


def _python_roots() -> list[Path]:
    roots = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.executable).resolve().parent.parent}
    return sorted(roots)


def _site_packages() -> list[Path]:
    """The folders this interpreter imports installed packages from (and where their links point), never a folder
    holding the course itself: the worker sees the mounted ``course_lib`` and nothing else of the repository."""
    found: set[Path] = set()
    for entry in sys.path:
        folder = Path(entry) if entry else None
        if folder is None or not folder.is_dir() or (folder / "course_lib").exists():
            continue
        found.add(folder.resolve())
        for child in folder.iterdir():  # a borrowed environment may link its packages from elsewhere
            if child.is_symlink() and child.resolve().exists():
                found.add(child.resolve().parent)
    return sorted(p for p in found if not (p / "course_lib").exists())


def command(argv: list[str], *, scratch: Path, out_dir: Path, package_root: Path,
            readable: Iterable[Path] = ()) -> tuple[list[str], Callable[[str], str]]:
    """The command that runs ``argv`` (a ``python -m ...`` line) isolated, and a function that maps a host
    path (the scratch folder, the output folder, the package root) to the path the worker sees."""
    bwrap, _ = find_bwrap()
    if bwrap is None:
        return argv, lambda path: path
    flags = [bwrap, *_isolation_flags(), "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        link = Path("/") / name
        if link.is_symlink():
            flags += ["--symlink", os.readlink(link), str(link)]
        elif link.is_dir():
            flags += ["--ro-bind", str(link), str(link)]
    flags += ["--ro-bind", "/etc", "/etc", "--ro-bind-try", "/sys/devices/system/cpu", "/sys/devices/system/cpu"]
    flags += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    # After /tmp: a virtual environment may live there, and borrow another's site-packages through a path entry.
    for root in _python_roots() + _site_packages():
        if not str(root).startswith("/usr/"):
            flags += ["--ro-bind", str(root), str(root)]
    flags += ["--ro-bind", str(package_root / "course_lib"), f"{PACKAGE_ROOT}/course_lib"]
    for path in readable:  # after /tmp: an instructor's folder may live there
        if Path(path).exists():
            flags += ["--ro-bind", str(Path(path).resolve()), str(Path(path).resolve())]
    flags += [
              "--bind", str(scratch), SCRATCH, "--bind", str(out_dir), OUT, "--chdir", SCRATCH,
              "--setenv", "HOME", SCRATCH, "--setenv", "PYTHONPATH", PACKAGE_ROOT]
    mapping = {str(scratch): SCRATCH, str(out_dir): OUT, str(package_root): PACKAGE_ROOT}

    def inside(path: str) -> str:
        for host, mounted in mapping.items():
            if path == host or path.startswith(host + os.sep):
                return mounted + path[len(host):]
        return path

    program = argv[0]
    if program == sys.executable:  # the interpreter at a path the sandbox mounts (links resolved)
        program = str(Path(sys.prefix).resolve() / "bin" / Path(sys.executable).name)
    return flags + ["--", program, *[inside(a) for a in argv[1:]]], inside


def set_limits(limits: Limits) -> Callable[[], None]:
    """A ``preexec_fn`` that applies ``limits`` to the child (and so to everything it starts)."""
    import resource

    def apply() -> None:
        for which, value in ((resource.RLIMIT_DATA, limits.memory_mb << 20), (resource.RLIMIT_CPU, limits.cpu_s),
                             (resource.RLIMIT_FSIZE, limits.file_mb << 20), (resource.RLIMIT_CORE, 0)):
            try:
                resource.setrlimit(which, (value, value))
            except (ValueError, OSError):
                pass  # a platform without this limit

    return apply
