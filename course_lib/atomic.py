"""Replace a file in one step: a reader, or a run killed half-way, sees the old file or the new one, never half.

The recipe, written once here for every file the course writes that someone may read while it is written (a
checkpoint, a grading record, the generated data, a report, a settings file):

1. create a temporary file beside the target (``.<name>.<random>.tmp``: the same folder, because a rename is atomic
   only within one file system; hidden; unique, so two processes writing the same file never share it);
2. write into it (and, with ``fsync=True``, flush the bytes to the disk before any name points at them);
3. ``os.replace`` it over the target (atomic on POSIX and Windows);
4. on any failure before that (an exception, Ctrl-C), delete the temporary file: the target is untouched.

A run *killed* between 1 and 3 leaves the temporary file behind (nothing can delete it); its name ends in ``.tmp``
so a later owner of the folder can recognise and remove it (see ``course_lib.train.rundir``).

For a rename that survives a power cut, call :func:`fsync_directory` on the folder afterwards (the checkpoint does).

Files that are appended to or locked in place (metrics, claim log, lock files) cannot be replaced: they are opened
with :func:`open_no_follow`, which refuses a symbolic link at the path (a planted link would make the write land in
whatever file it points to, a notebook say). The temporary files above are created with ``O_EXCL``, which never
follows a link, and ``os.replace`` replaces a link itself, never its target.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

# The flags tempfile.mkstemp uses: create, never open an existing file, binary on Windows, not inherited by children.
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOINHERIT", 0)


# Not following a link at the last component of the path; 0 where the system lacks it (Windows: no symlink races).
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class LinkRefused(OSError):
    """A file the course writes in place is a symbolic link: refused, so the file it points to stays untouched."""

    def __str__(self) -> str:
        return str(self.strerror)


def link_refused(path: str | Path) -> LinkRefused:
    """The one-line error for a symbolic link found where the course writes a file in place."""
    return LinkRefused(errno.ELOOP, f"{path} is a symbolic link, and the course never writes through a link it did not "
                                    f"create (that would overwrite the file it points to); delete the link "
                                    f"(rm {path}) and run again.", str(path))


def open_no_follow(path: str | Path, flags: int, permissions: int = 0o644) -> int:
    """``os.open(path, flags)`` that refuses a symbolic link at ``path`` with :class:`LinkRefused`."""
    try:
        return os.open(path, flags | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), permissions)
    except OSError as exc:
        # ELOOP on Linux/macOS, EMLINK on FreeBSD; a link in a parent folder is the user's own layout: allowed.
        if exc.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise link_refused(path) from None
        raise


def open_append(path: str | Path, *, encoding: str = "utf-8") -> IO[str]:
    """``open(path, "a", encoding=encoding)`` that refuses a symbolic link at ``path`` (see the module docstring)."""
    fd = open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a", encoding=encoding)


_REASONS = {
    errno.EACCES: ("permission denied", "make it writable, or choose another place"),
    errno.EPERM: ("operation not permitted", "make it writable (immutable? see `lsattr`), or choose another place"),
    errno.EROFS: ("the file system is read-only", "choose a place on a writable file system"),
    errno.ENOSPC: ("no space left on the device", "free some space (`df -h` shows where), or choose another place"),
    errno.EDQUOT: ("the disk quota is used up", "free some space, or choose another place"),
    errno.ENOENT: ("a parent folder does not exist and cannot be created there", "create it, or choose another place"),
    errno.ENOTDIR: ("a parent of it is a file, not a folder", "move that file away, or choose another place"),
    errno.EISDIR: ("it is a folder, not a file", "choose a file path"),
    errno.EEXIST: ("a file of that name exists", "move it away, or choose another place"),
    errno.ELOOP: ("it is a symbolic link the course will not write through", "delete the link"),
}


def describe_os_error(exc: OSError) -> str:
    """Why ``exc`` happened, in words (``"the file system is read-only"``)."""
    return _REASONS.get(exc.errno or 0, (exc.strerror or type(exc).__name__, ""))[0]


def os_error_line(exc: OSError) -> str:
    """One line for a failed file operation: which file, why, and what to do (no errno numbers, no traceback)."""
    if type(exc).__module__ != "builtins":  # the course's own (LinkRefused, WriteError): already a sentence
        return " ".join(str(exc.strerror or exc).split())
    where = f"{exc.filename}: " if exc.filename else ""
    why, todo = _REASONS.get(exc.errno or 0, (exc.strerror or str(exc) or type(exc).__name__, ""))
    return f"{where}{why}" + (f"; {todo}." if todo else ".")


def temporary_path(path: Path) -> Path:
    """A fresh name for a temporary file beside ``path`` (the file is not created)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")


def _create_temporary(path: Path, permissions: int) -> tuple[int, Path]:
    while True:
        tmp = temporary_path(path)
        try:
            return os.open(tmp, _FLAGS, permissions), tmp
        except FileExistsError:  # 1 in 4 billion: draw another name
            continue
        except OSError as exc:  # name the folder that refused a new file, not the temporary name nobody chose
            raise OSError(exc.errno, exc.strerror, str(path.parent)) from None


def write_with(path: str | Path, write: Callable[[IO[Any]], object], *, encoding: str | None = None,
               newline: str | None = None, fsync: bool = False, permissions: int = 0o666) -> Path:
    """Call ``write(f)`` on a temporary file beside ``path``, then rename it over ``path``. Returns ``path``.

    ``f`` is a binary file, or a text file when ``encoding`` is given (``newline`` as for :func:`open`).
    ``fsync=True`` flushes the bytes to the disk before the rename. ``permissions`` is the new file's mode before
    the umask, as for :func:`os.open` (``0o600``: only its owner may read it). The folder must exist.
    If ``write`` (or anything before the rename) raises, the temporary file is deleted and ``path`` is untouched.
    """
    path = Path(path)
    fd, tmp = _create_temporary(path, permissions)
    try:
        with os.fdopen(fd, "wb" if encoding is None else "w", encoding=encoding, newline=newline) as f:
            write(f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_bytes(path: str | Path, data: bytes, **options: Any) -> Path:
    """``Path(path).write_bytes(data)``, atomically (``options`` as for :func:`write_with`)."""
    return write_with(path, lambda f: f.write(data), **options)


def write_text(path: str | Path, text: str, *, encoding: str = "utf-8", **options: Any) -> Path:
    """``Path(path).write_text(text, encoding)``, atomically (``options`` as for :func:`write_with`)."""
    return write_with(path, lambda f: f.write(text), encoding=encoding, **options)


def torch_save(obj: Any, path: str | Path, **options: Any) -> Path:
    """``torch.save(obj, path)``, atomically (``options`` as for :func:`write_with`)."""
    import torch  # here, not at the top: the lab launcher and the settings writer never load torch

    return write_with(path, lambda f: torch.save(obj, f), **options)


def fsync_directory(directory: str | Path) -> None:
    """Make a rename in ``directory`` durable (POSIX); a directory cannot be opened for fsync on Windows: skipped."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
