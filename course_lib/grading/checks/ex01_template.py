"""Checks for exercise 01: config overrides from the command line, and a killed run that resumes exactly."""

from __future__ import annotations

import dataclasses
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_lib.grading.api import CheckFailed, check_for, need


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


@check_for("01", "overrides parsed with the fields' types")
def override_types(ns: dict[str, Any]) -> None:
    parse = need(ns, "parse_overrides", "define `parse_overrides(argv, cls=TrainConfig)` in the exercise cell")
    cases = [
        ([], _Probe()),
        (["--depth", "7", "--rate", "0.25"], _Probe(depth=7, rate=0.25)),
        (["--name", "run-2", "--warm-steps", "11"], _Probe(name="run-2", warm_steps=11)),
        (["--fast"], _Probe(fast=True)),
        (["--fast", "--no-fast"], _Probe(fast=False)),
        (["--limit", "40", "--scale", "none"], _Probe(limit=40, scale=None)),
        (["--limit", "none", "--rate", "1e-3"], _Probe(limit=None, rate=1e-3)),
    ]
    for argv, expected in cases:
        got = parse(argv, _Probe)
        if got != expected or any(type(getattr(got, f.name)) is not type(getattr(expected, f.name))
                                  for f in dataclasses.fields(_Probe)):
            hint = "convert each value with the field's type (typing.get_type_hints(cls): with `from __future__ " \
                   "import annotations`, field.type is only a string)"
            if "--warm-steps" in argv and isinstance(got, _Probe) and got.warm_steps != 11:
                hint = "flags use dashes for underscores: --warm-steps sets warm_steps"
            if "--fast" in argv and isinstance(got, _Probe) and got.fast != expected.fast:
                hint = "booleans are switches: --fast sets True, --no-fast sets False"
            raise CheckFailed(f"parse_overrides({argv}) built the wrong config", hint=hint,
                              expected=expected, got=got)


@check_for("01", "unknown or malformed flags are errors")
def override_errors(ns: dict[str, Any]) -> None:
    parse = need(ns, "parse_overrides", "define `parse_overrides(argv, cls=TrainConfig)` in the exercise cell")
    for argv, why in ((["--dpeth", "7"], "a misspelt flag"), (["--depth"], "a flag without its value"),
                      (["--depth", "seven"], "a value of the wrong type"), (["7"], "a value without a flag")):
        try:
            got = parse(argv, _Probe)
        except ValueError as exc:
            if why == "a misspelt flag" and "dpeth" not in str(exc):
                raise CheckFailed("the error for an unknown flag should name it", expected="...dpeth...",
                                  got=str(exc)) from None
            continue
        except SystemExit:
            raise CheckFailed(f"{why} ({argv}) should raise ValueError, not exit the program",
                              hint="argparse exits on errors: raise ValueError yourself") from None
        raise CheckFailed(f"{why} ({argv}) should raise ValueError; silently ignoring it trains the wrong run",
                          expected="ValueError", got=got)


@check_for("01", "config round-trips through the course CLI")
def argv_round_trip(ns: dict[str, Any]) -> None:
    to_argv = need(ns, "to_argv", "define `to_argv(cfg)` in the exercise cell")
    from course_lib.train.cli import build_parser, config_from_args
    from course_lib.train.config import TrainConfig

    for cfg in (TrainConfig(lr=0.02, steps=30, eval_every=15, clip=0.5, out="elsewhere/run", seed=4),
                TrainConfig(steps=9, bs=3, compile=True, model="net", warmup=0)):
        argv = to_argv(cfg)
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise CheckFailed("to_argv should return a list of strings for subprocess", got=argv)
        parsed = config_from_args(build_parser().parse_args(argv))
        if parsed != cfg:
            diff = {k: (v, getattr(parsed, k)) for k, v in cfg.to_dict().items() if getattr(parsed, k) != v}
            raise CheckFailed("`python -m course_lib.train` would not run this config",
                              hint="one --flag per field (dashes), --x/--no-x for booleans",
                              expected="same config", got=f"differs in (want, got): {diff}")


def _comparable(history: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
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


@check_for("01", "killed half-way, resumed: same metrics as an uninterrupted run", points=2)
def kill_and_resume(ns: dict[str, Any]) -> None:
    kill = need(ns, "kill_at_halfway", "define `kill_at_halfway(cfg)` in the exercise cell")
    resume = need(ns, "resume", "define `resume(cfg)` in the exercise cell")
    from course_lib.train.config import TrainConfig
    from course_lib.train import run

    with tempfile.TemporaryDirectory() as tmp:
        tiny = dict(steps=8, eval_every=4, log_every=1, bs=8, device="cpu", seed=3, lr=3e-3)
        cfg = TrainConfig(**tiny, out=str(Path(tmp) / "interrupted"))
        step = kill(cfg)
        if step != 4:
            raise CheckFailed("kill_at_halfway should return the step of the checkpoint it stopped at",
                              hint="wait until read_checkpoint(...)['step'] reaches cfg.steps // 2, then kill",
                              expected=4, got=step)
        resumed = resume(cfg)
        reference = run(TrainConfig(**tiny, out=str(Path(tmp) / "reference")))
        if not isinstance(resumed, list) or not resumed:
            raise CheckFailed("resume(cfg) should return the run's history (a list of metric dicts)", got=resumed)
        want, got = _comparable(reference), _comparable(resumed)
        if not _same(want, got):
            first = next((i for i, (a, b) in enumerate(zip(want, got)) if not _same([a], [b])), min(len(want), len(got)))
            raise CheckFailed("the resumed run does not continue the uninterrupted one exactly",
                              hint="resume from the checkpoint with the same config (course_lib.train.run(cfg, "
                                   "resume=True)); do not start a fresh run or change seeds",
                              expected=want[first] if first < len(want) else "no more records",
                              got=got[first] if first < len(got) else "no more records")
