"""Checks for exercise 01: config overrides from the command line, and a killed run that resumes exactly."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import tempfile
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
            (["--rate", "1e-3", "--depth"], "a flag without its value, last after others")]  # not at position 0


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


# Two runs the notebook does not show: checkpoints every 4 steps of 8 (half-way = 4), every 3 of 10 (the first
# checkpoint at or past half-way is step 6, not 10 // 2).
def _runs(seed: int) -> tuple[dict[str, Any], ...]:
    """The two runs; their training seed and learning rate (so every metric) differ in every grading run."""
    return (dict(steps=8, eval_every=4, log_every=1, bs=8, device="cpu", seed=3 + seed % 1000, lr=3e-3),
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


def _kill_and_resume(ns: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    kill = need(ns, "kill_at_halfway", "define `kill_at_halfway(cfg)` in the exercise cell")
    resume = need(ns, "resume", "define `resume(cfg)` in the exercise cell")
    from course_lib.train.checkpoint import HANDSHAKE_ENV, atomic_torch_save, read_checkpoint
    from course_lib.train.config import TrainConfig

    with tempfile.TemporaryDirectory() as tmp, _one_thread():
        cfg = TrainConfig(**run, out=str(Path(tmp) / "interrupted"))
        # The run holds at each checkpoint until read_checkpoint has read it twice: a poller that kills on its
        # first read of the half-way checkpoint always sees it, however busy the machine (checkpoint.py).
        os.environ[HANDSHAKE_ENV] = "20"  # seconds: a reader that never calls read_checkpoint is only slowed
        try:
            step = call(kill, cfg)
        finally:
            os.environ.pop(HANDSHAKE_ENV, None)
        ckpt = Path(cfg.out) / "ckpt.pt"
        on_disk = read_checkpoint(ckpt)["step"] if ckpt.exists() else None
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

    for run in _runs(run_seed(ns)):
        got = observe(ns, _kill_and_resume, run)
        shown = f"steps={run['steps']}, a checkpoint every {run['eval_every']}"
        if got["step"] != _halfway(run) or got["on_disk"] != got["step"]:
            raise CheckFailed(
                f"kill_at_halfway should return the step of the checkpoint it stopped at ({shown})",
                hint="poll read_checkpoint(...)['step'] until it reaches cfg.steps // 2, kill, and return the step "
                     "read from the checkpoint (not a number you compute)",
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
