"""Where a learner's notebook runs when it is graded: a bubblewrap sandbox on Linux, resource limits everywhere.

With bubblewrap (``bwrap``, Debian package ``bubblewrap``) the worker process sees a read-only view of
the system (``/usr``, ``/etc``, the Python installation, ``course_lib``, the course data cache), a fresh
``/tmp``, one writable scratch folder (its working directory, holding only its own copy of the notebook)
and one writable folder for its observations. It has no network, its own PID namespace (nothing it starts
outlives it; it cannot see or signal the grader), no capabilities and an unprivileged user id. Other
students' folders, the submissions and the CSV are simply not there.

Graded as root, a user namespace would map the sandbox's user to root on the host, and root-only files inside the
read-only mounts would be readable. So as root ``bwrap`` runs without a user namespace (root may create the other
namespaces itself) and the worker is started through ``setpriv`` as ``nobody`` (65534) with no capabilities, no
bounding set and ``no_new_privs``; the folders bwrap creates to mount things in are made ``0755`` so that user can
reach the interpreter (which may live under ``/root``), and the two writable folders are given to it.

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
    unprivileged = [*_setpriv(), "true"] if _drops_to_nobody() else ["true"]
    try:
        proc = subprocess.run([bwrap, *_isolation_flags(), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
                               "--perms", "0755", "--tmpfs", "/tmp", "--perms", "0755", "--dir", "/tmp/course-probe",
                               *unprivileged], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{bwrap} could not start ({exc})"
    if proc.returncode != 0:
        return f"{bwrap} cannot create a sandbox here ({' '.join(proc.stderr.split())[:200]})"
    return None


NOBODY = 65534


def _isolation_flags() -> list[str]:
    if _drops_to_nobody():  # no user namespace: setpriv drops root (and every capability) inside
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session"]
    return ["--unshare-all", "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--cap-drop", "ALL",
            "--die-with-parent", "--new-session"]


def _drops_to_nobody() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("setpriv") is not None


def _setpriv() -> list[str]:
    return [shutil.which("setpriv") or "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]


def unreadable_for_worker(folders: Iterable[Path]) -> str | None:
    """Why the worker could not read one of ``folders`` (instructor checks) when it runs as ``nobody``, or None."""
    if find_bwrap()[0] is None or not _drops_to_nobody():
        return None
    for folder in folders:
        for path in [Path(folder), *sorted(Path(folder).glob("*.py"))]:
            wanted = 0o005 if path.is_dir() else 0o004
            if path.stat().st_mode & wanted != wanted:
                return (f"{path} cannot be read by other users, and graded as root the sandbox runs learner code as "
                        f"'nobody', which must import the checks: run `chmod -R o+rX {folder}`")
    return None


def give_to_worker(*paths: Path) -> None:
    """Make the worker's writable folders (and the notebook copy) its own when it will run as ``nobody``."""
    if find_bwrap()[0] is not None and _drops_to_nobody():
        for path in paths:
            os.chown(path, NOBODY, NOBODY)


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
    user = "user nobody with no capabilities" + (" (dropped from root)" if _drops_to_nobody() else "")
    return bwrap, f"sandbox: bubblewrap (no network, read-only system, own PID namespace, scratch folder only, {user})"


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


class _Mounts:
    """bwrap's mount flags, in order. As ``nobody`` (graded as root) the folders bwrap creates above a mount point
    would be ``0700``, unreachable: each is made ``0755`` first (never inside a read-only mount, where the path
    exists), and a tmpfs is ``1777``, as ``/tmp`` is on any system."""

    def __init__(self, reachable: bool) -> None:
        self.flags: list[str] = []
        self.reachable = reachable
        self.made: set[Path] = {Path("/")}
        self.read_only: list[Path] = []

    def add(self, flag: str, *args: str) -> None:
        target = Path(args[-1])
        if self.reachable and flag in ("--ro-bind", "--ro-bind-try", "--bind", "--tmpfs"):
            for folder in reversed(target.parents):
                if folder not in self.made and not any(r == folder or r in folder.parents for r in self.read_only):
                    self.flags += ["--perms", "0755", "--dir", str(folder)]
                    self.made.add(folder)
            if flag == "--tmpfs":
                self.flags += ["--perms", "1777"]
        if flag.startswith("--ro-bind"):
            self.read_only.append(target)
        self.made.add(target)
        self.flags += [flag, *args]


def command(argv: list[str], *, scratch: Path, out_dir: Path, package_root: Path,
            readable: Iterable[Path] = ()) -> tuple[list[str], Callable[[str], str]]:
    """The command that runs ``argv`` (a ``python -m ...`` line) isolated, and a function that maps a host
    path (the scratch folder, the output folder, the package root) to the path the worker sees."""
    bwrap, _ = find_bwrap()
    if bwrap is None:
        return argv, lambda path: path
    mounts = _Mounts(reachable=_drops_to_nobody())
    mounts.add("--ro-bind", "/usr", "/usr")
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        link = Path("/") / name
        if link.is_symlink():
            mounts.add("--symlink", os.readlink(link), str(link))
        elif link.is_dir():
            mounts.add("--ro-bind", str(link), str(link))
    mounts.add("--ro-bind", "/etc", "/etc")
    mounts.add("--ro-bind-try", "/sys/devices/system/cpu", "/sys/devices/system/cpu")
    mounts.add("--proc", "/proc")
    mounts.add("--dev", "/dev")
    mounts.add("--tmpfs", "/tmp")
    # After /tmp: a virtual environment may live there, and borrow another's site-packages through a path entry.
    for root in _python_roots() + _site_packages():
        if not str(root).startswith("/usr/"):
            mounts.add("--ro-bind", str(root), str(root))
    mounts.add("--ro-bind", str(package_root / "course_lib"), f"{PACKAGE_ROOT}/course_lib")
    for path in readable:  # after /tmp: an instructor's folder may live there
        if Path(path).exists():
            mounts.add("--ro-bind", str(Path(path).resolve()), str(Path(path).resolve()))
    mounts.add("--bind", str(scratch), SCRATCH)
    mounts.add("--bind", str(out_dir), OUT)
    flags = [bwrap, *_isolation_flags(), *mounts.flags,
             "--chdir", SCRATCH, "--setenv", "HOME", SCRATCH, "--setenv", "PYTHONPATH", PACKAGE_ROOT]
    mapping = {str(scratch): SCRATCH, str(out_dir): OUT, str(package_root): PACKAGE_ROOT}

    def inside(path: str) -> str:
        for host, mounted in mapping.items():
            if path == host or path.startswith(host + os.sep):
                return mounted + path[len(host):]
        return path

    program = argv[0]
    if program == sys.executable:  # the interpreter at a path the sandbox mounts (links resolved)
        program = str(Path(sys.prefix).resolve() / "bin" / Path(sys.executable).name)
    unprivileged = _setpriv() if _drops_to_nobody() else []
    return flags + ["--", *unprivileged, program, *[inside(a) for a in argv[1:]]], inside


# The grader's own process: it decodes what sandboxed children wrote and judges it. Observations are bounded before
# any judge reads them (runner._bounded); this is the backstop, so a decoding bug ends in MemoryError, not the machine
# swapping or the OOM killer choosing a process.
GRADER_MEMORY_MB = 8192


def limit_own_memory(megabytes: int = GRADER_MEMORY_MB) -> None:
    """Lower this process's data-segment limit to ``megabytes`` (never raise it); silently nothing where unsupported."""
    try:
        import resource
    except ImportError:  # Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    wanted = megabytes << 20
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if soft == resource.RLIM_INFINITY or soft > wanted:
        try:
            resource.setrlimit(resource.RLIMIT_DATA, (wanted, hard))
        except (ValueError, OSError):
            pass


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
