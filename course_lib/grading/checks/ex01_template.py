"""Checks for exercise 01: config overrides from the command line, and a killed run that resumes exactly."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import signal
import tempfile
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed


@dataclass
class _Probe:
    """A config the notebook never shows; ``from __future__ import annotations`` makes every type a string."""

    name: str = "probe"
    depth: int = 3
    rate: float = 0.5
    fast: bool = False
    limit: int | None = None
    scale: float | None = 1.0
    warm_steps: int = 2
    keep_last: bool = True


def _fields(value: Any) -> Any:
    """A parsed config as data: each field's value and exact type name (or what came back instead)."""
    if not isinstance(value, _Probe):
        return {"not a config": one_line(value)}
    return {f.name: [getattr(value, f.name), type(getattr(value, f.name)).__name__] for f in dataclasses.fields(_Probe)}


def _type_cases(seed: int) -> list[tuple[list[str], _Probe]]:
    """Command lines and the configs they mean; the numbers differ in every grading run."""
    depth, warm, limit = 4 + seed % 50, 10 + seed % 30, 20 + seed % 70
    rate = round(0.05 + seed % 89 / 100, 2)
    return [
        ([], _Probe()),
        (["--depth", str(depth), "--rate", str(rate)], _Probe(depth=depth, rate=rate)),
        (["--name", f"run-{seed % 9}", "--warm-steps", str(warm)], _Probe(name=f"run-{seed % 9}", warm_steps=warm)),
        (["--fast"], _Probe(fast=True)),
        (["--fast", "--no-fast"], _Probe(fast=False)),
        (["--no-keep-last", "--depth", str(depth)], _Probe(keep_last=False, depth=depth)),  # a switch, then a flag
        (["--limit", str(limit), "--scale", "none"], _Probe(limit=limit, scale=None)),
        (["--limit", "none", "--rate", "1e-3"], _Probe(limit=None, rate=1e-3)),
    ]


def _parsed(ns: dict[str, Any], cases: list[tuple[list[str], _Probe]]) -> list[Any]:
    parse = need(ns, "parse_overrides", "define `parse_overrides(argv, cls=TrainConfig)` in the exercise cell")
    return [_fields(call(parse, list(argv), _Probe)) for argv, _ in cases]


@check_for("01", "overrides parsed with the fields' types", parts=("01.1",))
def override_types(ns: dict[str, Any]) -> None:
    cases = _type_cases(run_seed(ns))
    for (argv, expected), got in zip(cases, observe(ns, _parsed, cases)):
        if got != _fields(expected):
            hint = "convert each value with the field's type (typing.get_type_hints(cls): with `from __future__ " \
                   "import annotations`, field.type is only a string)"
            if "--warm-steps" in argv and got.get("warm_steps", [None])[0] != expected.warm_steps:
                hint = "flags use dashes for underscores: --warm-steps sets warm_steps"
            if "--fast" in argv and got.get("fast", [None])[0] != expected.fast:
                hint = "booleans are switches: --fast sets True, --no-fast sets False"
            if "--no-keep-last" in argv and got.get("keep_last", [None])[0] is not False:
                hint = "--no-keep-last sets keep_last to False (dashes for underscores after --no- too)"
            wrong = {k: v for k, v in got.items() if _fields(expected).get(k) != v}
            raise CheckFailed(f"parse_overrides({argv}) built the wrong config", hint=hint,
                              expected={k: _fields(expected).get(k) for k in wrong}, got=wrong)


# Misspelt flags, none of them part of a real flag's name (an error message may list the real ones).
_MISSPELT = ("dpeth", "detph", "rtae", "rtea", "lmiit", "scael", "wram-steps", "fsat")


def _error_cases(seed: int) -> list[tuple[list[str], str]]:
    """Malformed command lines; the misspelt flag and the values differ in every grading run."""
    value = str(3 + seed % 40)
    return [([f"--{_MISSPELT[seed % len(_MISSPELT)]}", value], "a misspelt flag"),
            (["--depth"], "a flag without its value"), (["--depth", "seven"], "a value of the wrong type"),
            ([value], "a value without a flag"),
            (["--rate", "1e-3", "--depth"], "a flag without its value, last after others"),  # not at position 0
            # A str field would take "--fast" as its value: the argument after --name (argv[i + 1], not argv[1]) is
            # the one to look at.
            (["--rate", "1e-3", "--name", "--fast"], "a flag followed by another flag where its value should be")]


def _errors(ns: dict[str, Any], cases: list[tuple[list[str], str]]) -> list[list[str]]:
    parse = need(ns, "parse_overrides", "define `parse_overrides(argv, cls=TrainConfig)` in the exercise cell")
    outcomes = []
    for argv, _ in cases:
        try:
            got = parse(list(argv), _Probe)
        except ValueError as exc:
            outcomes.append(["ValueError", str(exc)])
        except SystemExit as exc:
            outcomes.append(["SystemExit", str(exc.code)])
        except Exception as exc:
            outcomes.append([type(exc).__name__, str(exc)])
        else:
            outcomes.append(["returned", one_line(got)])
    return outcomes


@check_for("01", "unknown or malformed flags are errors", parts=("01.1",))
def override_errors(ns: dict[str, Any]) -> None:
    cases = _error_cases(run_seed(ns))
    for (argv, why), (kind, text) in zip(cases, observe(ns, _errors, cases)):
        if kind == "ValueError":
            misspelt = argv[0][2:]
            if why == "a misspelt flag" and misspelt not in text:
                raise CheckFailed("the error for an unknown flag should name it", expected=f"...{misspelt}...",
                                  got=text)
            continue
        if kind == "SystemExit":
            raise CheckFailed(f"{why} ({argv}) should raise ValueError, not exit the program",
                              hint="argparse exits on errors: raise ValueError yourself")
        raise CheckFailed(f"{why} ({argv}) should raise ValueError; silently ignoring it trains the wrong run"
                          if kind == "returned" else f"{why} ({argv}) should raise ValueError, not {kind}: {text}",
                          expected="ValueError", got=text if kind == "returned" else kind)


def _round_trip_configs(seed: int) -> list[Any]:
    """Two configs the notebook does not show; the numbers differ in every grading run."""
    from course_lib.train.config import TrainConfig

    return [TrainConfig(lr=round(0.01 + seed % 97 / 1000, 3), steps=30 + seed % 20, eval_every=15, clip=0.5,
                        out=f"elsewhere/run{seed % 10}", seed=4 + seed % 1000),
            TrainConfig(steps=9 + seed % 5, bs=3 + seed % 4, compile=True, model="net", warmup=0)]


def _argvs(ns: dict[str, Any], configs: list[Any]) -> list[Any]:
    to_argv = need(ns, "to_argv", "define `to_argv(cfg)` in the exercise cell")
    out = []
    for cfg in configs:
        argv = call(to_argv, cfg)
        out.append(list(argv) if isinstance(argv, (list, tuple)) and all(isinstance(a, str) for a in argv)
                   else one_line(argv))
    return out


@check_for("01", "config round-trips through the course CLI", parts=("01.2",))
def argv_round_trip(ns: dict[str, Any]) -> None:
    from course_lib.train.cli import build_parser, config_from_args

    configs = _round_trip_configs(run_seed(ns))
    for cfg, argv in zip(configs, observe(ns, _argvs, configs)):
        if not isinstance(argv, list):
            raise CheckFailed("to_argv should return a list of strings for subprocess", got=argv)
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):  # argparse reports a bad flag on stderr, then exits
                parsed = config_from_args(build_parser().parse_args(argv))
        except SystemExit:
            raise CheckFailed(
                "`python -m course_lib.train` rejects the arguments to_argv made (the course CLI, not your code, "
                "stopped here)", hint="one --flag per field (dashes), --x/--no-x for booleans, 'none' for None",
                got=" ".join(errors.getvalue().split())[-200:] or argv) from None
        if parsed != cfg:
            diff = {k: (v, getattr(parsed, k)) for k, v in cfg.to_dict().items() if getattr(parsed, k) != v}
            raise CheckFailed("`python -m course_lib.train` would not run this config",
                              hint="one --flag per field (dashes), --x/--no-x for booleans",
                              expected="same config", got=f"differs in (want, got): {diff}")


def _probe_configs(seed: int) -> list[_Probe]:
    """Configs of the grader's own dataclass: a two-word switch (keep_last) off and on, None and numbers drawn per
    run."""
    return [_Probe(name=f"run-{seed % 9}", depth=4 + seed % 50, rate=round(0.05 + seed % 89 / 100, 2), fast=True,
                   limit=None, scale=round(0.5 + seed % 13 / 4, 2), warm_steps=10 + seed % 30, keep_last=False),
            _Probe(fast=False, limit=20 + seed % 70, scale=None, keep_last=True)]


def _strict_parser(cls: type) -> argparse.ArgumentParser:
    """The course CLI's conventions for any dataclass (``--some-name VALUE``, ``--x``/``--no-x``, ``none``), with no
    abbreviations: ``--no-`` is not a flag even where argparse would guess which one it begins."""
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(prog="to_argv's output", add_help=False, allow_abbrev=False)
    for f in dataclasses.fields(cls):
        flag, hint = "--" + f.name.replace("_", "-"), hints[f.name]
        if hint is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS)
            continue
        base = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
        optional = type(None) in typing.get_args(hint)
        parser.add_argument(flag, default=argparse.SUPPRESS, type=lambda text, base=base[0], optional=optional:
                            None if optional and text.lower() == "none" else base(text))
    return parser


@check_for("01", "to_argv: one full flag per field, for any config", parts=("01.2",))
def argv_conventions(ns: dict[str, Any]) -> None:
    configs = _probe_configs(run_seed(ns))
    parser = _strict_parser(_Probe)
    for cfg, argv in zip(configs, observe(ns, _argvs, configs)):
        if not isinstance(argv, list):
            raise CheckFailed("to_argv should return a list of strings for subprocess", got=argv)
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                parsed = vars(parser.parse_args(argv))
        except SystemExit:
            raise CheckFailed(
                f"to_argv({cfg}) wrote a flag that is not a field's own, in full",
                hint="every field the same way, whatever the config: --some-name (dashes), --x or --no-x for a "
                     "bool (dashes after --no- too: keep_last is --no-keep-last), 'none' for None",
                got=(errors.getvalue().strip().splitlines() or [argv])[-1]) from None
        got = {k: parsed.get(k, "(no flag)") for k in (f.name for f in dataclasses.fields(_Probe))}
        wrong = {k: v for k, v in got.items() if v != getattr(cfg, k)}
        if wrong:
            raise CheckFailed(f"to_argv({cfg}) does not give back the same config", hint="one --flag per field",
                              expected={k: getattr(cfg, k) for k in wrong}, got=wrong)


def _comparable(history: Any) -> list[tuple[Any, ...]]:
    keys = ("step", "loss", "lr", "grad_norm", "val_loss", "val_acc")
    return [tuple(r.get(k) for k in keys) for r in history]


def _same(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    if len(a) != len(b):
        return False
    for ra, rb in zip(a, b):
        for x, y in zip(ra, rb):
            if (x is None) != (y is None):
                return False
            if x is not None and not math.isclose(float(x), float(y), rel_tol=1e-5, abs_tol=1e-7):
                return False
    return True


# Two runs the notebook does not show: checkpoints every 4 steps of 9 (half-way = 9 // 2 = 4; 9 / 2 = 4.5 would wait
# for step 8), every 3 of 10 (the first checkpoint at or past half-way is step 6, not 10 // 2). The first run's folder
# holds the last checkpoint of an earlier run (step 9) when kill_at_halfway is called.
def _runs(seed: int) -> tuple[dict[str, Any], ...]:
    """The two runs; their training seed and learning rate (so every metric) differ in every grading run."""
    return (dict(steps=9, eval_every=4, log_every=1, bs=8, device="cpu", seed=3 + seed % 1000, lr=3e-3),
            dict(steps=10, eval_every=3, log_every=1, bs=8, device="cpu", seed=5 + seed % 1000,
                 lr=round(1e-3 + seed % 7 * 5e-4, 5)))
_MARK = "written_before_the_kill"


def _halfway(run: dict[str, Any]) -> int:
    every = run["eval_every"]
    return -(-(run["steps"] // 2) // every) * every


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """One intra-op thread here and in the training processes started meanwhile: sums then add up in the same order
    in the sandbox and in the grader, so the runs compare exactly whatever the machine's and the grader's threads."""
    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    precision = torch.get_float32_matmul_precision()
    torch.set_num_threads(1)
    torch.set_float32_matmul_precision("highest")  # as in a fresh training process, whatever ran here before
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(precision)
        if env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env


def _stale_checkpoint(path: Path, step: int) -> None:
    """A checkpoint left over from an earlier run in ``path``: read_checkpoint reads its ``step``."""
    from course_lib.train.checkpoint import FORMAT_VERSION, atomic_torch_save

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_torch_save({"format": FORMAT_VERSION, "model": {}, "step": step, "config": None}, path)


def _kill_and_resume(ns: dict[str, Any], run: dict[str, Any], stale_step: int | None = None) -> dict[str, Any]:
    kill = need(ns, "kill_at_halfway", "define `kill_at_halfway(cfg)` in the exercise cell")
    resume = need(ns, "resume", "define `resume(cfg)` in the exercise cell")
    from course_lib.train.checkpoint import HANDSHAKE_ENV, atomic_torch_save, read_checkpoint
    from course_lib.train.config import TrainConfig

    with tempfile.TemporaryDirectory() as tmp, _one_thread():
        cfg = TrainConfig(**run, out=str(Path(tmp) / "interrupted"))
        if stale_step is not None:
            _stale_checkpoint(Path(cfg.out) / "ckpt.pt", stale_step)
        # The run holds at each checkpoint until read_checkpoint has read it twice: a poller that kills on its
        # first read of the half-way checkpoint always sees it, however busy the machine (checkpoint.py).
        os.environ[HANDSHAKE_ENV] = "20"  # seconds: a reader that never calls read_checkpoint is only slowed
        try:
            step = call(kill, cfg)
        finally:
            os.environ.pop(HANDSHAKE_ENV, None)
        ckpt = Path(cfg.out) / "ckpt.pt"
        on_disk = read_checkpoint(ckpt)["step"] if ckpt.exists() else None
        if stale_step is not None and step == stale_step:  # it stopped at the leftover: there is no run to resume
            return {"step": step, "on_disk": on_disk, "history": "not resumed", "marked": 0}
        if ckpt.exists():
            # Mark the records the killed run saved: a real resume returns them, a fresh run recomputes them.
            state = torch.load(ckpt, weights_only=False)
            for record in state.get("history", []):
                record[_MARK] = True
            atomic_torch_save(state, ckpt)
        history = call(resume, cfg)
    if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
        return {"step": step if isinstance(step, int) else one_line(step), "on_disk": on_disk,
                "history": one_line(history), "marked": 0}
    return {"step": step if isinstance(step, int) else one_line(step), "on_disk": on_disk,
            "history": _comparable(history), "marked": sum(bool(r.get(_MARK)) for r in history)}


@check_for("01", "killed half-way, resumed: same metrics as an uninterrupted run", points=2,
           parts=("01.2", "01.3", "01.4"))
def kill_and_resume(ns: dict[str, Any]) -> None:
    from course_lib.train import run as train_run
    from course_lib.train.config import TrainConfig

    for k, run in enumerate(_runs(run_seed(ns))):
        stale = run["steps"] if k == 0 else None
        got = observe(ns, _kill_and_resume, run, stale)
        shown = f"steps={run['steps']}, a checkpoint every {run['eval_every']}"
        if stale is not None and got["step"] == stale:
            raise CheckFailed(
                f"kill_at_halfway returned the step of a checkpoint left over from an earlier run in cfg.out ({shown}, "
                f"the leftover at step {stale})",
                hint="delete Path(cfg.out) / 'ckpt.pt' before starting the process (unlink(missing_ok=True)): the "
                     "poll reads the old file first, and the training CLI refuses a folder that holds a run",
                expected=_halfway(run), got=got["step"])
        if got["step"] != _halfway(run) or got["on_disk"] != got["step"]:
            raise CheckFailed(
                f"kill_at_halfway should return the step of the checkpoint it stopped at ({shown})",
                hint="poll read_checkpoint(...)['step'] until it reaches cfg.steps // 2, kill, and return the step "
                     "read from the checkpoint (not a number you compute)" + (
                         f"; cfg.steps // 2 is a whole step ({run['steps']} // 2 = {run['steps'] // 2}): "
                         f"{run['steps']} / 2 = {run['steps'] / 2} waits for a later checkpoint"
                         if isinstance(got["step"], int) and got["step"] > _halfway(run) and run["steps"] % 2 else ""),
                expected=_halfway(run), got={"returned": got["step"], "checkpoint on disk": got["on_disk"]})
        if not isinstance(got["history"], list) or not got["history"]:
            raise CheckFailed("resume(cfg) should return the run's history (a list of metric dicts)",
                              got=got["history"])
        # The reference run's progress is not the grader's output.
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()), _one_thread():
            want = _comparable(train_run(TrainConfig(**run, out=str(Path(tmp) / "reference"))))
        history = [tuple(r) for r in got["history"]]
        if not _same(want, history):
            first = next((i for i, (a, b) in enumerate(zip(want, history)) if not _same([a], [b])),
                         min(len(want), len(history)))
            raise CheckFailed("the resumed run does not continue the uninterrupted one exactly",
                              hint="resume from the checkpoint with the same config (course_lib.train.run(cfg, "
                                   "resume=True)); do not start a fresh run or change seeds",
                              expected=want[first] if first < len(want) else "no more records",
                              got=history[first] if first < len(history) else "no more records")
        if got["marked"] == 0:
            raise CheckFailed(
                "resume(cfg) started a fresh run: the history it returned does not come from the checkpoint (the "
                "numbers match only because training is deterministic)",
                hint="continue from the checkpoint: course_lib.train.run(cfg, resume=True)")


class _Interrupted(KeyboardInterrupt):
    """The grader's Ctrl-C: raised where kill_at_halfway reads its first checkpoint."""


def _interrupt_run(seed: int) -> dict[str, Any]:
    """A run whose first checkpoint is at step 4 of 8; its training seed differs in every grading run."""
    return dict(steps=8, eval_every=4, log_every=1, bs=8, device="cpu", seed=7 + seed % 1000, lr=3e-3)


def _our_child(pid: int) -> str:
    """``"running"``, ``"zombie"`` (it had ended, nobody had waited for it: reaped now) or ``"gone"`` for the process
    ``pid`` of this one; ``"not ours"`` when it is not a child of this process (started through a shell, say)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return "not ours"
    return "running" if done == 0 else "zombie"


def _lock_held(lock: Path) -> bool:
    """Whether a live process holds the run folder's lock (the kernel drops it when its holder dies)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return False
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also releases the lock if it was taken here
    return False


def _left_behind(out: Path) -> dict[str, Any]:
    """What is left of the training process that ran in ``out`` (its PID is in the folder's lock file while it
    runs, and after it is killed), and the step of the checkpoint it left."""
    from course_lib.train.rundir import LOCK_FILE

    lock, pid, process = out / LOCK_FILE, None, "gone"
    try:
        pid = int(json.loads(lock.read_text(encoding="utf-8"))["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if pid is not None and pid != os.getpid():
        process = _our_child(pid)
        if process == "not ours":
            process = "running" if _lock_held(lock) else "gone"
    ckpt = out / "ckpt.pt"
    step = torch.load(ckpt, map_location="cpu", weights_only=True)["step"] if ckpt.is_file() else None
    return {"pid": pid, "process": process, "step": step}


def _stop(left: dict[str, Any]) -> None:
    """End a training process the learner's code left running (a child of ours, or the live holder of the lock)."""
    if left["process"] != "running" or left["pid"] is None:
        return
    try:
        os.kill(left["pid"], getattr(signal, "SIGKILL", signal.SIGTERM))
        os.waitpid(left["pid"], 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _interrupted_poll(ns: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """kill_at_halfway with a Ctrl-C at its first read of a checkpoint: how it ended and what it left behind."""
    kill = need(ns, "kill_at_halfway", "define `kill_at_halfway(cfg)` in the exercise cell")
    import course_lib.train as train_package
    from course_lib.train import checkpoint
    from course_lib.train.checkpoint import HANDSHAKE_ENV
    from course_lib.train.config import TrainConfig

    real, fired = checkpoint.read_checkpoint, []

    def interrupted_read(*args: Any, **kwargs: Any) -> Any:
        if not fired:
            fired.append(True)
            raise _Interrupted("Ctrl-C (the grader's) while polling the checkpoint")
        return real(*args, **kwargs)

    # Replaced wherever the learner's code may look it up, for this call only (the run holds at the checkpoint:
    # nothing reads it twice).
    missing = object()
    saved = ns.get("read_checkpoint", missing)
    with tempfile.TemporaryDirectory() as tmp, _one_thread():
        cfg = TrainConfig(**run, out=str(Path(tmp) / "interrupted"))
        out, left = Path(cfg.out), None
        ns["read_checkpoint"] = train_package.read_checkpoint = checkpoint.read_checkpoint = interrupted_read
        os.environ[HANDSHAKE_ENV] = "20"
        try:
            try:
                call(kill, cfg)
            except KeyboardInterrupt:
                if not fired:
                    raise  # a real Ctrl-C
                how = "interrupted"
                # Looked at here, while the exception still holds the function's frame (and its Popen object):
                # nothing but the learner's code can have waited for the process.
                left = _left_behind(out)
            else:
                how = "returned" if fired else "never read a checkpoint through read_checkpoint"
                left = _left_behind(out)
        finally:
            checkpoint.read_checkpoint = train_package.read_checkpoint = real
            if saved is missing:
                ns.pop("read_checkpoint", None)
            else:
                ns["read_checkpoint"] = saved
            os.environ.pop(HANDSHAKE_ENV, None)
            _stop(left if left is not None else _left_behind(out))  # whatever happened, no run outlives the check
    return {"how": how, **left, "first": run["eval_every"]}


@check_for("01", "interrupted while polling: the training process is stopped", parts=("01.3",))
def interrupted_poll(ns: dict[str, Any]) -> None:
    got = observe(ns, _interrupted_poll, _interrupt_run(run_seed(ns)))
    if got["how"] not in ("interrupted", "returned"):
        return  # the poll never went through read_checkpoint: there was nothing to interrupt
    hint = ("whatever ends the poll (Ctrl-C, an error), stop the process before leaving the function: proc.kill() "
            "and proc.wait() in a `finally:`")
    where = "kill_at_halfway was interrupted (a Ctrl-C at its first read of a checkpoint)"
    if got["process"] in ("running", "zombie"):
        # Right after kill() a process may not have died yet: "running" is also what kill() without wait() leaves.
        raise CheckFailed(f"{where}, and its training process was still there after it: running (it would go on "
                          "writing into cfg.out), or killed but never waited for", hint=hint,
                          expected="the process killed and waited for",
                          got="not reaped" if got["process"] == "zombie" else "still running, or not yet reaped")
    if got["step"] is not None and got["step"] > got["first"]:
        raise CheckFailed(f"{where}, and the run went on training: its checkpoint is at step {got['step']}",
                          hint=hint + " (wait() alone lets the run finish)", expected=f"stopped at step {got['first']}",
                          got=f"checkpoint of step {got['step']}")
