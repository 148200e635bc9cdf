"""A run folder belongs to one run at a time: no silent overwrite, no two writers.

Two ways to lose a run without a word, both closed here:

* **Starting fresh into a folder that holds a run** (forgetting ``--resume``) would empty its ``metrics.jsonl`` and
  replace its checkpoint. A folder *holds a run* when it has a checkpoint; a fresh start there is refused unless
  the caller says ``resume`` (continue it) or ``overwrite`` (throw it away, explicitly).
* **Two processes writing one folder** would interleave their metrics and race on the checkpoint. The folder's
  lock file ``.lock`` is held with ``fcntl.flock`` for the whole run and records the holder's PID. The kernel
  releases a ``flock`` when its process dies, however it dies (``SIGKILL`` included), so a lock left behind by a
  killed run is recognised as stale and taken over; a live holder is named in the refusal.

Claims are re-entrant within one process (the command line claims the folder before loading any data, and
:func:`course_lib.train.train` claims it again): the inner claim just joins the outer one.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from course_lib import atomic

try:  # POSIX; elsewhere the PID recorded in the lock file is checked instead
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".lock"


class RunFolderError(RuntimeError):
    """The run folder cannot be used as asked (holds a run, is locked, is not writable); nothing was changed."""


def _stale_temporaries(folder: Path) -> list[Path]:
    """Temporary files an atomic write leaves when it is killed between creating and renaming them."""
    return sorted(p for p in folder.glob(".*.tmp") if p.is_file())


class RunFolder:
    """The claim of one process on one run folder (see the module docstring). Use :func:`claim_run_folder`."""

    def __init__(self, folder: Path, checkpoint: Path) -> None:
        self.folder = folder
        self.checkpoint = checkpoint
        self.depth = 0
        self.created_folder = False
        self.stale_note: str | None = None
        self._fd: int | None = None

    # ----------------------------------------------------------------------------------------------- claiming
    def acquire(self, *, resume: bool, overwrite: bool) -> None:
        folder = self.folder
        if folder.exists() and not folder.is_dir():
            raise RunFolderError(
                f"--out {folder} is a file, not a folder; pass a folder path for the run (it is created if missing)."
            )
        if not resume and not overwrite and self.checkpoint.is_file():
            raise RunFolderError(
                f"--out {folder} already holds a run (checkpoint {self.checkpoint.name}); starting a fresh run there "
                f"would replace it. Continue it with --resume, start over with --overwrite (deletes that run), or "
                f"choose another --out."
            )
        if not folder.exists():
            try:
                folder.mkdir(parents=True)
                self.created_folder = True
            except FileExistsError:
                pass
            except OSError as exc:
                raise RunFolderError(
                    f"--out {folder} cannot be created ({atomic.describe_os_error(exc)}); choose a folder you can "
                    f"write to, e.g. --out runs/train."
                ) from None
        self._lock()

    def _lock(self) -> None:
        path = self.folder / LOCK_FILE
        for _attempt in range(20):
            fd, previous = self._open_and_lock(path)
            # The holder we waited for may have deleted the file between our open and our lock: then we locked a
            # file nobody else can see. Only a lock on the file that is at the path now counts.
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:  # pragma: no cover - 20 holders in a row released while we looked
            raise RunFolderError(_held_message(self.folder, _read_lock_file(path)))
        held_by_dead = bool(previous.get("pid"))
        if held_by_dead:
            self.stale_note = (f"took over the stale lock of PID {previous.get('pid')} (that process is gone; it was "
                               f"probably killed)")
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd
        # Only the lock holder may touch the folder's files: leftovers of a killed atomic write go now.
        for leftover in _stale_temporaries(self.folder):
            leftover.unlink(missing_ok=True)

    def _open_and_lock(self, path: Path) -> tuple[int, dict[str, Any]]:
        try:
            # Never through a link: a planted `.lock -> notebook` would have the PID record overwrite the notebook.
            fd = atomic.open_no_follow(path, os.O_RDWR | os.O_CREAT, 0o644)
        except atomic.LinkRefused:
            self._forget_created_folder()
            raise RunFolderError(
                f"--out {self.folder}: its lock file {path} is a symbolic link, and a run never writes through a link "
                f"(that would overwrite the file it points to); delete the link (rm {path}) or choose another --out."
            ) from None
        except OSError as exc:
            self._forget_created_folder()
            reason = "no new files can be created there" if exc.errno == errno.ENOENT else atomic.describe_os_error(exc)
            raise RunFolderError(
                f"--out {self.folder} is not writable ({reason}: cannot create {path.name} there); "
                f"choose a folder you can write to, e.g. --out runs/train."
            ) from None
        previous = _read_lock(fd)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                raise RunFolderError(_held_message(self.folder, _read_lock_file(path) or previous)) from None
        else:  # pragma: no cover - Windows: trust the recorded PID
            pid = previous.get("pid")
            if pid and pid != os.getpid() and _process_alive(int(pid)):
                os.close(fd)
                raise RunFolderError(_held_message(self.folder, previous))
        return fd, previous

    def start_fresh(self, paths: list[Path]) -> None:
        """Delete ``paths`` (the previous run's files) for an explicit overwrite; call while holding the lock."""
        for path in paths:
            path.unlink(missing_ok=True)

    # ---------------------------------------------------------------------------------------------- releasing
    def release(self, *, failed: bool = False) -> None:
        if self._fd is None:
            return
        try:
            (self.folder / LOCK_FILE).unlink(missing_ok=True)
        except OSError:
            pass  # a lock file we cannot remove is stale from now on: the flock is released below
        os.close(self._fd)  # releases the flock
        self._fd = None
        if failed:
            self._forget_created_folder()

    def _forget_created_folder(self) -> None:
        """A run that failed before writing anything leaves no empty folder behind."""
        if self.created_folder:
            try:
                self.folder.rmdir()  # only succeeds when empty
            except OSError:
                pass


_HELD: dict[Path, RunFolder] = {}


def _read_lock(fd: int) -> dict[str, Any]:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        value = json.loads(text) if text.strip() else {}
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def _read_lock_file(path: Path) -> dict[str, Any]:
    try:
        fd = atomic.open_no_follow(path, os.O_RDONLY)
    except OSError:
        return {}
    try:
        return _read_lock(fd)
    finally:
        os.close(fd)


def _held_message(folder: Path, holder: dict[str, Any]) -> str:
    who = f"process {holder['pid']}" if holder.get("pid") else "another process"
    if holder.get("host") and holder["host"] != socket.gethostname():
        who += f" on {holder['host']}"
    since = f" since {holder['since']}" if holder.get("since") else ""
    return (
        f"--out {folder} is in use: {who} is writing a run there{since} (lock file {folder / LOCK_FILE}). "
        f"Two runs in one folder would mix their metrics and checkpoints; wait for it to finish, stop it, or choose "
        f"another --out."
    )


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def claim_run_folder(folder: str | Path, checkpoint: str | Path | None = None, *, resume: bool = False,
                     overwrite: bool = False) -> RunFolder:
    """Claim ``folder`` for this process (re-entrant); raise :class:`RunFolderError` when it cannot be used.

    ``checkpoint`` (default ``<folder>/ckpt.pt``) is what "the folder holds a run" means. Release with
    :func:`release_run_folder` (``with run_folder(...)`` does both).
    """
    folder = Path(folder)
    key = Path(os.path.abspath(folder))
    held = _HELD.get(key)
    if held is None:
        held = RunFolder(folder, Path(checkpoint) if checkpoint is not None else folder / "ckpt.pt")
        held.acquire(resume=resume, overwrite=overwrite)
        _HELD[key] = held
    held.depth += 1
    return held


def release_run_folder(claim: RunFolder, *, failed: bool = False) -> None:
    """Undo one :func:`claim_run_folder`; the last release unlocks the folder."""
    claim.depth -= 1
    if claim.depth <= 0:
        _HELD.pop(Path(os.path.abspath(claim.folder)), None)
        claim.release(failed=failed)


class run_folder:  # lower case: used as a context manager, like open()
    """``with run_folder(out, ckpt, resume=..., overwrite=...) as claim:`` claims and always releases."""

    def __init__(self, folder: str | Path, checkpoint: str | Path | None = None, *, resume: bool = False,
                 overwrite: bool = False) -> None:
        self.args = (folder, checkpoint)
        self.kwargs = {"resume": resume, "overwrite": overwrite}
        self.claim: RunFolder | None = None

    def __enter__(self) -> RunFolder:
        self.claim = claim_run_folder(*self.args, **self.kwargs)
        return self.claim

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        assert self.claim is not None
        release_run_folder(self.claim, failed=exc_type is not None)
