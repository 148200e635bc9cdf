"""Checkpoints that continue the *same* trajectory, written so that a crash can never destroy the last good one.

What a run needs to continue exactly where it stopped:

* model weights, optimizer state (AdamW's moments), GradScaler state (fp16's current scale), the step number
  (the learning rate is computed from it);
* every random number generator the run draws from: torch CPU (dropout), CUDA, numpy and Python's ``random``;
* where the data order was: epoch and samples consumed (the sampler's order is a function of seed and epoch);
* the resolved configuration, to refuse resuming a *different* experiment, and the metrics history so far.

Atomic save: the file is written under a temporary name in the same directory, flushed and ``fsync``-ed to disk,
then renamed over the old checkpoint with ``os.replace`` (atomic on POSIX and Windows), and the directory is
``fsync``-ed so the rename itself survives a power cut. Killed at any moment, the directory holds either the old
complete checkpoint or the new complete one, never half a file.

Loading uses ``torch.load(weights_only=True)``: a checkpoint holds only tensors and plain Python values, so the
restricted unpickler (which cannot run arbitrary code from a downloaded file) suffices. Everything is checked
before anything is modified: a failed load leaves the model, optimizer and files as they were.
"""

from __future__ import annotations

import errno
import os
import pickle
import random
import shutil
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch import nn

from course_lib import atomic, mode
from course_lib.distributed import unwrap
from course_lib.train.guard import NonFiniteError, nonfinite_tensors, optimizer_tensors

FORMAT_VERSION = 1
REQUIRED_KEYS = ("format", "model", "step", "config")
# Fields that define the experiment: resuming with a different value would not continue the same run.
# ``steps`` may grow (train longer), other fields (eval_every, workers, device, out, compile...) may change freely.
TRAJECTORY_FIELDS = ("model", "dataset", "bs", "accum", "seed", "lr", "wd", "warmup", "clip", "amp_dtype")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used: missing, unreadable, truncated, or from a different experiment."""


class WriteError(OSError):
    """A file of the run could not be written (disk full, read-only, immutable...); the previous one is intact."""


def _free_space(folder: Path) -> str:
    try:
        return f"{shutil.disk_usage(folder).free / 1e6:.1f} MB free there"
    except OSError:
        return "free space unknown"


def write_error(path: Path, exc: BaseException) -> WriteError:
    """A :class:`WriteError` for a failed write of ``path``: what failed, why, and what to do."""
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code == errno.ENOSPC or "unexpected pos" in text or "No space left" in text:
        why = f"the disk is full ({_free_space(path.parent)})"
        todo = "free some space"
    elif code in (errno.EPERM, errno.EACCES):
        why = "permission denied (is the file or its folder read-only or immutable? see `ls -l` and `lsattr`)"
        todo = "make it writable again (e.g. `chattr -i`), or choose another --out"
    elif code == errno.EROFS:
        why = "the file system is read-only"
        todo = "choose another --out"
    else:
        why = f"{type(exc).__name__}: {text.splitlines()[0] if text else 'write failed'}"
        todo = "fix the cause"
    error = WriteError(code or errno.EIO, f"cannot write {path}: {why}. The previous version of the file is intact; "
                                          f"{todo}, then continue the run with --resume.")
    return error


# ------------------------------------------------------------------------------------------------- RNG states
def rng_state() -> dict[str, Any]:
    """Snapshot of every global RNG, as tensors and plain values (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured (CUDA only when it was saved and a GPU is present)."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------------------------------------------ save
def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> Path:
    """Run ``write(f)`` into a temporary file beside ``path``, fsync it, then rename it over ``path``.

    Either the whole new file is there or the old one is untouched: a kill at any moment never leaves half a
    checkpoint (the recipe is :func:`course_lib.atomic.write_with`). A failed write raises :class:`WriteError`.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # 0o600: only the owner may read a checkpoint (what tempfile.mkstemp gave it before).
        atomic.write_with(path, write, fsync=True, permissions=0o600)
    except BaseException as exc:
        # A full disk shows as ENOSPC, or as torch's zip writer failing ("unexpected pos"); both become one message.
        if isinstance(exc, OSError) and not isinstance(exc, WriteError) or (
                isinstance(exc, RuntimeError) and ("unexpected pos" in str(exc) or "write" in str(exc).lower())):
            raise write_error(path, exc) from exc
        raise
    atomic.fsync_directory(path.parent)  # the rename itself survives a power cut
    return path


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """``torch.save(obj, path)`` that either fully replaces ``path`` or leaves it untouched."""
    return atomic_write(path, lambda f: torch.save(obj, f))


def save_checkpoint(
    path: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: torch.amp.GradScaler | None = None,
    step: int = 0,
    config: Any = None,
    history: Sequence[dict[str, Any]] = (),
    data_state: dict[str, Any] | None = None,
    rng: dict[str, Any] | None = None,
) -> Path:
    """Write everything needed to continue training to ``path``, atomically. Returns the path.

    ``config`` is a :class:`TrainConfig` (its resolved values are stored) or a plain dict. ``rng`` defaults to a
    snapshot taken now. Call it on one process only (rank 0) under DDP.
    """
    if config is not None and not isinstance(config, dict):
        config = config.to_dict()
    weights = {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}
    optimizer_state = optimizer.state_dict() if optimizer is not None else None
    # Never replace a good checkpoint with a diverged one (see course_lib.train.guard).
    bad = nonfinite_tensors(list(weights.items()) + optimizer_tensors(optimizer_state))
    if bad:
        raise NonFiniteError(
            f"refusing to write checkpoint {path}: {len(bad)} tensor(s) hold inf/nan (e.g. {', '.join(bad[:3])}); "
            "the previous checkpoint is left as it was.", step=int(step), what="model state", value=None,
            tensors=tuple(bad))
    payload = {
        "format": FORMAT_VERSION,
        "mode": mode.mode(),  # model sizes and data depend on COURSE_MODE: resuming must use the same one
        "model": weights,
        "optimizer": optimizer_state,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "step": int(step),
        "config": dict(config) if config is not None else None,
        "rng": rng if rng is not None else rng_state(),
        "data": dict(data_state) if data_state is not None else None,
        "history": [dict(h) for h in history],
    }
    return atomic_torch_save(payload, path)


# ------------------------------------------------------------------------------------------------------ load
def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load and sanity-check a checkpoint file without applying it. Raises :class:`CheckpointError`.

    Taught in lesson 04 (``notebooks/04_template.ipynb``).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}: the file does not exist (start without resume first).")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated zip, garbage bytes, foreign pickle...
        # torch's own message suggests retrying with weights_only=False, i.e. running whatever code the file holds:
        # never repeat that advice for a file that failed these checks.
        if path.stat().st_size == 0:
            why = "it is empty (an interrupted copy, or a truncated or corrupted file)"
        elif not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut-off one has no directory
            why = "it is not a complete PyTorch checkpoint (truncated, corrupted, or another kind of file)"
        elif isinstance(exc, pickle.UnpicklingError):
            why = "it holds objects other than tensors and plain values, so it is not a checkpoint of this course"
        else:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            detail = "" if "weights_only" in first else f": {first}"
            why = f"it is corrupted ({type(exc).__name__}{detail})"
        raise CheckpointError(
            f"checkpoint {path} cannot be read: {why}. Start over with --overwrite (replaces it), or restore a backup."
        ) from None
    if not isinstance(payload, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(payload).__name__}, not a checkpoint dict.")
    missing = [k for k in REQUIRED_KEYS if k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint {path} is missing {missing}; it was not written by save_checkpoint.")
    if payload["format"] != FORMAT_VERSION:
        newer = isinstance(payload["format"], int) and payload["format"] > FORMAT_VERSION
        todo = ("it was written by a newer course_lib: update this copy (`git pull`, then `make setup`) to resume it"
                if newer else "it was written by an older course_lib, which this one cannot continue")
        raise CheckpointError(
            f"checkpoint {path} has format {payload['format']!r}; this code reads format {FORMAT_VERSION}, so {todo}; "
            f"or start a new run in another --out.")
    if not isinstance(payload["step"], int) or payload["step"] < 0:
        raise CheckpointError(f"checkpoint {path} has an invalid step {payload['step']!r}.")
    if handshake_guard_s() is not None:
        with atomic.open_append(_reads_file(path)) as reads:
            reads.write(f"{payload['step']}\n")
    return payload


# --- the reader handshake ---------------------------------------------------------------------------------------------
# A program that polls a run's checkpoints (kill it at the half-way one, say) races the run: on a busy machine the
# run can save the next checkpoint before the poller wakes up. With COURSE_CHECKPOINT_HANDSHAKE=<seconds> in the
# environment of the run and of the reader, the run holds after each checkpoint until read_checkpoint has read it
# twice (or that many seconds passed): a poller that decides on its first read, and kills, sees every checkpoint
# whatever the machine's load. Exercise 01's grader sets it.
HANDSHAKE_ENV = "COURSE_CHECKPOINT_HANDSHAKE"


def handshake_guard_s() -> float | None:
    """The handshake's guard in seconds from COURSE_CHECKPOINT_HANDSHAKE, or None when it is off (unset or empty)."""
    value = os.environ.get(HANDSHAKE_ENV, "").strip()
    if not value:
        return None
    try:
        guard = float(value)
    except ValueError:
        guard = -1.0
    if not guard > 0:
        raise ValueError(f"{HANDSHAKE_ENV}={value!r}: expected how many seconds a run may hold at a checkpoint "
                         "(a positive number), or unset it")
    return guard


def _reads_file(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".reads")


def hold_until_read(path: str | Path, step: int) -> bool:
    """Under the handshake, wait until read_checkpoint has read the checkpoint of ``step`` twice (or the guard passed);
    returns whether it was. Without COURSE_CHECKPOINT_HANDSHAKE it returns at once (False)."""
    guard = handshake_guard_s()
    if guard is None:
        return False
    reads, deadline = _reads_file(path), time.monotonic() + guard
    while time.monotonic() < deadline:
        try:
            if reads.read_text(encoding="utf-8").split().count(str(step)) >= 2:
                return True
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    return False


def check_mode(payload: dict[str, Any], path: str | Path) -> None:
    """Refuse a checkpoint written in another COURSE_MODE (cheap: the command line calls it before making data)."""
    saved_mode = payload.get("mode")
    if saved_mode is not None and saved_mode != mode.mode():
        raise CheckpointError(
            f"checkpoint {path} was written with COURSE_MODE={saved_mode}, but this process runs with "
            f"COURSE_MODE={mode.mode()} (model sizes and data depend on the mode). "
            f"Resume with COURSE_MODE={saved_mode}, or start a new run in another --out."
        )


def check_compatible(saved: dict[str, Any] | None, current: Any, path: str | Path, step: int = 0) -> None:
    """Refuse to continue a different experiment: every trajectory field must match; ``steps`` may only grow.

    ``saved`` is the checkpoint's config dict, ``current`` a :class:`TrainConfig` or dict, ``step`` the
    checkpoint's step. Raises :class:`CheckpointError` listing each differing field with both values.
    """
    if saved is None or current is None:
        return
    current = current if isinstance(current, dict) else current.to_dict()
    problems = [
        f"{name}: checkpoint has {saved[name]!r}, current config has {current[name]!r}"
        for name in TRAJECTORY_FIELDS
        if name in saved and name in current and saved[name] != current[name]
    ]
    if "steps" in current and current["steps"] < max(step, saved.get("steps", 0)):
        problems.append(f"steps: checkpoint has {saved.get('steps')!r} (at step {step}), current config has "
                        f"{current['steps']!r} (steps may only grow)")
    if problems:
        raise CheckpointError(
            f"checkpoint {path} belongs to a different run; " + "; ".join(problems)
            + ". Resume with the same values (only steps may grow), or use a new --out directory."
        )


def _check_model_state(state: dict[str, torch.Tensor], model: nn.Module, path: Path) -> None:
    expected = unwrap(model).state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in expected
        if k in state and tuple(state[k].shape) != tuple(expected[k].shape)
    ]
    if missing or unexpected or wrong:
        details = []
        if missing:
            details.append(f"missing {missing[:5]}")
        if unexpected:
            details.append(f"unexpected {unexpected[:5]}")
        if wrong:
            details.append(f"shape mismatch {wrong[:5]}")
        hint = (" A run started with another COURSE_MODE (smoke/full) has other model sizes: resume with the "
                f"COURSE_MODE it was started in (this process: COURSE_MODE={mode.mode()})." if wrong else "")
        raise CheckpointError(f"checkpoint {path} does not fit this model: " + "; ".join(details) + "." + hint)


def load_checkpoint(
    path: str | Path,
    *,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: torch.amp.GradScaler | None = None,
    config: Any = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Read ``path``, check it against ``config`` and ``model``, then restore into the objects given.

    Returns the checkpoint dict (``step``, ``history``, ``data``, ``config``...). Raises :class:`CheckpointError`
    for a missing/corrupted file, a config from a different experiment (naming each differing field with both
    values) or weights that do not fit the model; in every such case nothing has been modified.
    """
    path = Path(path)
    payload = read_checkpoint(path)
    # 1. Check everything first...
    check_mode(payload, path)
    check_compatible(payload["config"], config, path, step=payload["step"])
    if model is not None:
        _check_model_state(payload["model"], model, path)
    bad = nonfinite_tensors(list(payload["model"].items()) + optimizer_tensors(payload.get("optimizer")))
    if bad:
        raise CheckpointError(
            f"checkpoint {path} holds inf/nan in {len(bad)} tensor(s) (e.g. {', '.join(bad[:3])}): it was written "
            f"after the run diverged, and resuming would only continue the divergence. Start over with --overwrite "
            f"and a lower --lr (or resume from a backup of an earlier checkpoint)."
        )
    if optimizer is not None and payload.get("optimizer") is not None:
        saved_groups = payload["optimizer"]["param_groups"]
        if len(saved_groups) != len(optimizer.param_groups) or any(
            len(s["params"]) != len(g["params"]) for s, g in zip(saved_groups, optimizer.param_groups)
        ):
            raise CheckpointError(
                f"checkpoint {path}: the optimizer state has different parameter groups than this optimizer.")
    # 2. ...then apply.
    if model is not None:
        unwrap(model).load_state_dict(payload["model"])
    if optimizer is not None and payload.get("optimizer") is not None:
        optimizer.load_state_dict(payload["optimizer"])
    if scaler is not None and payload.get("scaler") is not None:
        scaler.load_state_dict(payload["scaler"])
    if restore_rng and payload.get("rng") is not None:
        set_rng_state(payload["rng"])
    payload.setdefault("history", [])
    return payload


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Replace a small text file atomically (the same recipe as the checkpoint)."""
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))
