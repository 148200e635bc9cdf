"""Checks for exercise 14: ``save_checkpoint`` / ``load_checkpoint`` that make a killed run resume bit for bit.

The learner defines ``save_checkpoint(path, model, optimizer, scaler, data, step)`` and
``load_checkpoint(path, model, optimizer, scaler, data) -> step``. Each check runs the tiny training run of
:mod:`course_lib.grading.resume_harness` with *their* functions in the sandbox: interrupted after a step drawn from the
run's seed, then resumed. The grader runs the same configuration uninterrupted and compares the losses after the
resumption, the final weights and the GradScaler's scale bit for bit. Each check switches on one source of state
(optimizer, RNG, data position), so a missing piece costs its own points; a failing comparison is diagnosed by
replaying the reference with one piece left out, to name what was forgotten.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from course_lib.grading import resume_harness as harness
from course_lib.grading.api import CheckFailed, call, check_for, need, observe, run_seed
from course_lib.train.checkpoint import rng_state, set_rng_state

HOW_SAVE = "define `save_checkpoint(path, model, optimizer, scaler, data, step)`"
HOW_LOAD = "define `load_checkpoint(path, model, optimizer, scaler, data)` returning the step to continue from"


def _config(ns: Any, kind: str) -> tuple[harness.HarnessConfig, int]:
    """The run a check uses (its seed from this grading run) and the step it is interrupted after."""
    seed = 1000 + run_seed(ns) % 997
    if kind == "optimizer":  # no randomness, one batch: only weights, optimizer and step matter
        cfg = harness.HarnessConfig(seed=seed, steps=8, samples=4, shuffle=False, dropout=0.0, augment=False)
    elif kind == "rng":  # dropout and augmentation, one batch: the data position does not matter
        cfg = harness.HarnessConfig(seed=seed, steps=8, samples=4, shuffle=False)
    elif kind == "data":  # a shuffled order of 5 batches, no randomness; always interrupted mid-epoch
        cfg = harness.HarnessConfig(seed=seed, steps=10, samples=20, dropout=0.0, augment=False)
        return cfg, (3, 4, 7, 8)[run_seed(ns) % 4]
    else:  # everything at once, interrupted anywhere
        cfg = harness.HarnessConfig(seed=seed, steps=12, samples=20)
    return cfg, 3 + run_seed(ns) % (cfg.steps - 4)


def _resumed(ns: dict[str, Any], kind: str) -> dict[str, Any]:
    """Interrupt the learner's run after step k and resume it with their functions."""
    save = need(ns, "save_checkpoint", HOW_SAVE)
    load = need(ns, "load_checkpoint", HOW_LOAD)
    cfg, k = _config(ns, kind)
    with tempfile.TemporaryDirectory() as folder:
        result = call(harness.interrupted_run, cfg, Path(folder) / "checkpoint.pt", save, load, k)
    return {"before": [result.before[s] for s in sorted(result.before)], "start": result.resumed.start,
            "after": [result.resumed.losses[s] for s in sorted(result.resumed.losses)],
            "params": result.resumed.params}


def _forgetting(what: str) -> Callable[..., int]:
    """The reference load with one piece left out, for diagnosing a mismatch."""
    def load(path: Any, **objects: Any) -> int:
        fresh = rng_state()
        step = harness.reference_load(path, **objects)
        if what == "optimizer state":
            objects["optimizer"].state.clear()
        elif what == "random number generators":
            set_rng_state(fresh)
        elif what == "data position":
            objects["data"].load_state_dict({"epoch": objects["data"].epoch, "position": 0})
        return step
    return load


HINTS = {
    "optimizer state": "save optimizer.state_dict() and restore it with optimizer.load_state_dict(...): AdamW's "
                       "moments and step count are part of the run",
    "random number generators": "save torch.get_rng_state(), np.random.get_state() (all five fields: the cached "
                                "Gaussian too) and random.getstate() (and torch.cuda.get_rng_state_all() when a GPU "
                                "is present) and restore every one of them",
    "data position": "save data.state_dict() (epoch *and* position in the epoch) and restore it with "
                     "data.load_state_dict(...): the run was interrupted mid-epoch",
}


def _diagnose(cfg: harness.HarnessConfig, k: int, after: list[float]) -> str | None:
    """Which single piece, when left out of the reference, reproduces the learner's resumed losses."""
    with tempfile.TemporaryDirectory() as folder:
        for what in HINTS:
            replay = harness.interrupted_run(cfg, Path(folder) / f"{what}.pt", harness.reference_save,
                                             _forgetting(what), k)
            if [replay.resumed.losses[s] for s in sorted(replay.resumed.losses)] == after:
                return what
    return None


def _judge_resumed(ns: Any, kind: str, what: str) -> None:
    """Compare the learner's interrupted-and-resumed run with the uninterrupted one, bit for bit."""
    seen = observe(ns, _resumed, kind)
    cfg, k = _config(ns, kind)
    truth = harness.uninterrupted(cfg)
    expected = [truth.losses[s] for s in range(1, cfg.steps + 1)]
    where = f"(a run of {cfg.steps} steps saving every {cfg.save_every}, interrupted after step {k})"
    if seen["before"] != expected[:k]:
        raise CheckFailed(f"before any interruption, the run with your save_checkpoint already differs from one "
                          f"without checkpoints {where}: saving must not change the run",
                          hint="do not draw random numbers while saving (tempfile names use their own generator)",
                          expected=expected[:k], got=seen["before"])
    start = cfg.last_save_before(k)
    if seen["start"] != start:
        raise CheckFailed(f"load_checkpoint returned step {seen['start']}, but the newest checkpoint {where} was "
                          f"saved after step {start}", hint="return the step you saved (the number of steps done), "
                          "unchanged: the loop continues with the step after it", expected=start, got=seen["start"])
    if seen["after"] != expected[start:]:
        first = next((start + 1 + i for i, (a, b) in enumerate(zip(seen["after"], expected[start:])) if a != b),
                     start + 1)
        culprit = _diagnose(cfg, k, seen["after"])
        message = (f"after resuming from step {start} {where}, the loss of step {first} is "
                   f"{seen['after'][first - start - 1]!r} instead of {expected[first - 1]!r}: the resumed run is not "
                   f"the uninterrupted one, bit for bit")
        if culprit:
            message += f"; it matches, bit for bit, a run that did not restore the {culprit}"
        raise CheckFailed(message, hint=HINTS.get(culprit or what, "restore the model, the optimizer, the scaler, "
                                                                   "every RNG and the data position"),
                          expected=expected[start:], got=seen["after"])
    if not all(torch.equal(a, b) for a, b in zip(seen["params"], truth.params)):
        raise CheckFailed(f"the resumed run's final weights differ from the uninterrupted run's {where}",
                          hint="restore model.state_dict() with model.load_state_dict(...)")


@check_for("14", "resumed run equals the uninterrupted one: weights, optimizer, step", points=2,
           parts=("14.1", "14.2", "14.3", "14.4"))
def optimizer_restored(ns: Any) -> None:
    _judge_resumed(ns, "optimizer", "optimizer state")


@check_for("14", "every RNG restored (dropout, random, numpy)", points=2, parts=("14.1", "14.2", "14.3", "14.4"))
def rng_restored(ns: Any) -> None:
    _judge_resumed(ns, "rng", "random number generators")


@check_for("14", "data position restored (interrupted mid-epoch)", points=1, parts=("14.1", "14.2", "14.3", "14.4"))
def data_position_restored(ns: Any) -> None:
    _judge_resumed(ns, "data", "data position")


@check_for("14", "a run interrupted anywhere resumes bit for bit", points=1, parts=("14.1", "14.2", "14.3", "14.4"))
def full_run_resumed(ns: Any) -> None:
    _judge_resumed(ns, "full", "everything")


def _scaler_stop(ns: Any) -> int:
    """The step after which the scaler check saves: this run's, at every phase of the growth interval of 3."""
    return 4 + run_seed(ns) % 4


def _scaler_after_load(ns: dict[str, Any], load_with_reference: bool = False) -> dict[str, Any]:
    """Save after a seeded step (every step saves), load into fresh objects: the GradScaler's state then."""
    if load_with_reference:
        save, load = harness.reference_save, harness.reference_load
    else:
        save = need(ns, "save_checkpoint", HOW_SAVE)
        load = need(ns, "load_checkpoint", HOW_LOAD)
    cfg = harness.HarnessConfig(seed=1000 + run_seed(ns) % 997, steps=8, samples=4, growth_interval=3,
                                save_every=1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "checkpoint.pt"
        try:
            harness.run(cfg, path, save, load, stop_after=_scaler_stop(ns))
        except harness.Interrupted:
            pass
        with harness.isolated():
            fresh = harness.build(cfg)
            call(load, path, **fresh.objects())
    state = fresh.scaler.state_dict()
    return {"scale": float(state["scale"]), "growth tracker": int(state["_growth_tracker"])}


@check_for("14", "GradScaler state restored", points=1, parts=("14.1", "14.2", "14.3", "14.4"))
def scaler_restored(ns: Any) -> None:
    seen = observe(ns, _scaler_after_load)
    expected = _scaler_after_load(ns, load_with_reference=True)
    if seen != expected:
        raise CheckFailed(f"after load_checkpoint the GradScaler does not continue where it was saved (after step "
                          f"{_scaler_stop(ns)}; its scale doubles every 3 overflow-free steps): its scale and growth "
                          "tracker were not restored",
                          hint="save scaler.state_dict() and restore it with scaler.load_state_dict(...)",
                          expected=expected, got=seen)


# ------------------------------------------------------------------------------------------- atomic write
class _Unpicklable:
    """Put where every checkpoint looks (an optimizer param group): serialising it fails half-way, after ``spy()``
    has noted where the file being written is."""

    def __init__(self, spy: Callable[[], None] = lambda: None) -> None:
        self.spy = spy

    def __reduce_ex__(self, protocol: Any) -> Any:
        self.spy()
        raise RuntimeError("simulated failure while the checkpoint was being written")


def _files(folder: Path, but: str = "") -> list[str]:
    """The files in ``folder`` (not folders: torch may create its compile cache folder in the temporary one)."""
    return sorted(p.name for p in folder.iterdir() if p.name != but and p.is_file())


def _atomic_config(ns: Any) -> tuple[harness.HarnessConfig, int]:
    """The atomic-write check's run and how many steps it trains before the good save (both from the seed)."""
    return harness.HarnessConfig(seed=1000 + run_seed(ns) % 997, steps=4, samples=4), 1 + run_seed(ns) % 3


def _weights_after(cfg: harness.HarnessConfig, steps: int) -> list[torch.Tensor]:
    """The model's weights after ``steps`` training steps of ``cfg`` (what the good and the new saves hold)."""
    with harness.isolated():
        parts = harness.build(cfg)
        for _ in range(steps):
            harness.train_step(parts, cfg.augment)
        return [p.detach().clone() for p in parts.model.parameters()]


def _failing_saves(ns: dict[str, Any]) -> dict[str, Any]:
    """Save a good checkpoint, then two saves that fail mid-write; what does ``load_checkpoint`` find after each?"""
    save = need(ns, "save_checkpoint", HOW_SAVE)
    load = need(ns, "load_checkpoint", HOW_LOAD)
    cfg, good_steps = _atomic_config(ns)
    out: dict[str, Any] = {}
    with harness.isolated(), tempfile.TemporaryDirectory() as folder, _system_temp(Path(folder) / "tmp") as system:
        (Path(folder) / "run").mkdir()
        path = Path(folder) / "run" / "checkpoint.pt"
        parts = harness.build(cfg)
        for _ in range(good_steps):
            harness.train_step(parts, cfg.augment)
        call(save, path, step=good_steps, **parts.objects())
        out["good"] = [p.detach().clone() for p in parts.model.parameters()]
        harness.train_step(parts, cfg.augment)  # the state the failing saves try to write
        out["new"] = [p.detach().clone() for p in parts.model.parameters()]
        def spy() -> None:  # while the failing save writes: which folder holds a new file?
            out["written beside the checkpoint"] = _files(path.parent, but=path.name)
            out["written in the system temp folder"] = _files(system)

        failures: list[tuple[str, Callable[[], None]]] = [
            ("serialisation", lambda: _poisoned_save(save, path, parts, good_steps + 1, spy))]
        if hasattr(signal, "SIGXFSZ") and threading.current_thread() is threading.main_thread():
            failures.append(("disk full", lambda: _size_limited_save(save, path, parts, good_steps + 1)))
        for name, failing in failures:
            try:
                failing()
                out[f"{name} raised"] = None
            except Exception as exc:  # the save is expected to fail; it must leave the old checkpoint intact
                out[f"{name} raised"] = f"{type(exc).__name__}: {exc}"[:200]
            fresh = harness.build(cfg)
            try:
                call(load, path, **fresh.objects())
                out[name] = [p.detach().clone() for p in fresh.model.parameters()]
            except Exception as exc:
                out[name] = f"{type(exc).__name__}: {exc}"[:300]
        out["left over"] = [*_files(path.parent, but=path.name), *(f"{system}/{n}" for n in _files(system))]
    return out


@contextlib.contextmanager
def _system_temp(folder: Path) -> Iterator[Path]:
    """``folder`` stands in for the system's temporary folder (what tempfile uses without ``dir=``) meanwhile."""
    folder.mkdir()
    saved = tempfile.tempdir
    tempfile.tempdir = str(folder)
    try:
        yield folder
    finally:
        tempfile.tempdir = saved


def _poisoned_save(save: Callable[..., Any], path: Path, parts: harness.Parts, step: int,
                   spy: Callable[[], None]) -> None:
    parts.optimizer.param_groups[0]["poison"] = _Unpicklable(spy)
    try:
        save(path, step=step, **parts.objects())
    finally:
        del parts.optimizer.param_groups[0]["poison"]


def _size_limited_save(save: Callable[..., Any], path: Path, parts: harness.Parts, step: int) -> None:
    """The file system refuses to grow any file past 2 KiB, as a full disk would, during the save."""
    import resource  # POSIX only, like SIGXFSZ (checked by the caller)

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), no signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, hard))
    try:
        save(path, step=step, **parts.objects())
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


@check_for("14", "a save that fails mid-write keeps the previous checkpoint, leaves no temporary file", points=2,
           parts=("14.1", "14.2", "14.3", "14.4"))
def atomic_write(ns: Any) -> None:
    seen = observe(ns, _failing_saves)
    cfg, good_steps = _atomic_config(ns)
    for key, steps in (("good", good_steps), ("new", good_steps + 1)):
        if not all(torch.equal(a, b) for a, b in zip(seen[key], _weights_after(cfg, steps))):
            raise CheckFailed(f"the weights the check trained ({steps} steps of this run) were not recorded: did "
                              "the exercise cell change the training harness?", expected=f"{key} weights after {steps}"
                              " steps")
    for name in ("serialisation", "disk full"):
        if name not in seen:
            continue  # the disk-full case needs POSIX and the main thread
        got = seen[name]
        # A save that did not fail (it wrote no poisoned object, or swallowed the error) may have replaced the file.
        allowed = [seen["good"]] if seen[f"{name} raised"] else [seen["good"], seen["new"]]
        if isinstance(got, str) or not any(all(torch.equal(a, b) for a, b in zip(got, ok)) for ok in allowed):
            what = (f"load_checkpoint then failed with {got}" if isinstance(got, str)
                    else "load_checkpoint then restored other weights than the last good checkpoint's")
            raise CheckFailed(
                f"a save that failed half-way ({name}: {seen[f'{name} raised'] or 'no error raised'}) destroyed the "
                f"previous checkpoint: {what}",
                hint="write to a temporary file in the same folder (tempfile.mkstemp(dir=path.parent)), flush and "
                     "os.fsync it, then os.replace(tmp, path); on failure delete the temporary file",
                expected="the previous checkpoint, intact", got=what)
    elsewhere = seen.get("written in the system temp folder")
    if elsewhere:
        raise CheckFailed(
            "save_checkpoint wrote its temporary file in the system's temporary folder, not beside the checkpoint: "
            "os.replace is atomic only within one file system, and the temporary folder is often another one (a "
            "RAM disk), where the rename fails or becomes a copy that a crash can cut in half",
            hint="create it in the checkpoint's folder: tempfile.mkstemp(dir=path.parent)",
            expected="the temporary file in the checkpoint's folder", got=f"{elsewhere} in the temporary folder")
    if seen.get("left over"):
        raise CheckFailed(
            "a save that failed left its temporary file behind: every failed save would leave another one, until "
            "the disk is full",
            hint="when anything fails, delete the temporary file and re-raise (try: ... except BaseException: "
                 "os.unlink(tmp); raise)",
            expected="no file but the checkpoint", got=seen["left over"])


# ------------------------------------------------------------------------------------------- clear errors
def _bad_names(ns: Any) -> dict[str, str]:
    """This run's file names for the missing and the truncated checkpoint (the error must name them)."""
    tag = run_seed(ns) % 1_000_003
    return {"missing": f"run{tag}-missing.pt", "truncated": f"run{tag}-truncated.pt"}


def _bad_files(ns: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """Load a missing and a truncated (at a seeded length) checkpoint: what is raised, and does the model stay
    untouched?"""
    save = need(ns, "save_checkpoint", HOW_SAVE)
    load = need(ns, "load_checkpoint", HOW_LOAD)
    cfg = harness.HarnessConfig(seed=1000 + run_seed(ns) % 997, steps=2, samples=4)
    out: dict[str, Any] = {}
    with harness.isolated(), tempfile.TemporaryDirectory() as folder:
        good = Path(folder) / "good.pt"
        parts = harness.build(cfg)
        harness.train_step(parts, cfg.augment)
        call(save, good, step=1, **parts.objects())
        truncated = Path(folder) / names["truncated"]
        keep = (20 + run_seed(ns) % 61) / 100  # 20% to 80% of the file
        truncated.write_bytes(good.read_bytes()[: max(1, int(os.path.getsize(good) * keep))])
        for name, path in (("missing", Path(folder) / names["missing"]), ("truncated", truncated)):
            fresh = harness.build(cfg)
            before = [p.detach().clone() for p in fresh.model.parameters()]
            try:
                step = load(path, **fresh.objects())
                out[name] = {"raised": None, "returned": repr(step)[:80]}
            except Exception as exc:
                message = str(exc)
                if path.name in message and len(message) > 400:  # keep the file's name in what is recorded
                    start = max(0, message.index(path.name) - 200)
                    message = "..." + message[start:start + 400]
                out[name] = {"raised": type(exc).__name__, "message": message[:400]}
            out[name]["untouched"] = all(torch.equal(a, b) for a, b in zip(before, fresh.model.parameters()))
    return out


@check_for("14", "a missing or truncated checkpoint is a clear error", points=1, parts=("14.1", "14.2", "14.3"))
def clear_errors(ns: Any) -> None:
    names = _bad_names(ns)
    seen = observe(ns, _bad_files, names)
    if sorted(seen) != sorted(names):
        raise CheckFailed("the observations do not match this run's files", expected=sorted(names), got=sorted(seen))
    for name, got in seen.items():
        if got["raised"] is None:
            raise CheckFailed(f"load_checkpoint of a {name} file returned {got['returned']} instead of raising: a "
                              "resume that silently starts over loses the run without telling anyone",
                              hint="let the error propagate (or raise your own naming the file)",
                              expected="an exception naming the file", got=f"returned {got['returned']}")
        if got["raised"] == "NotImplementedError":
            raise CheckFailed(f"not attempted yet: {got['message']}")
        if names[name] not in got["message"]:
            raise CheckFailed(f"the error for a {name} checkpoint does not name the file: {got['raised']}: "
                              f"{got['message']}", hint="raise e.g. RuntimeError(f'checkpoint {path} cannot be read "
                              "(truncated or corrupted)') from the original error",
                              expected=f"the file name {names[name]!r} in the message", got=got["message"])
        if not got["untouched"]:
            raise CheckFailed(f"loading a {name} checkpoint changed the model before failing",
                              hint="read and check the whole file before restoring anything")
