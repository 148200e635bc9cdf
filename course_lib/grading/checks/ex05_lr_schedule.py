"""Checks for exercise 05: a learning rate computed from the step number alone.

The learner defines ``lr_at(step, cfg)``: linear warm-up from 0 to ``cfg.lr`` over ``cfg.warmup`` steps, then a
cosine down to 10% of the peak at ``cfg.steps``, and 10% after that. Every value is compared with the reference
:func:`course_lib.train.lr_at` on configurations the notebook does not show.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import Any

from course_lib.grading.api import CheckFailed, check_for, need
from course_lib.train.schedule import lr_at as reference_lr_at

TOL = 1e-9


def _cfg(lr: float, warmup: int, steps: int) -> SimpleNamespace:
    # A plain object with the three fields the schedule reads (TrainConfig has them too).
    return SimpleNamespace(lr=lr, warmup=warmup, steps=steps)


def _lr_at(ns: dict[str, Any]) -> Any:
    return need(ns, "lr_at", "define `lr_at(step, cfg)` returning a float")


def _first_mismatch(fn: Any, cfg: SimpleNamespace, steps: list[int]) -> tuple[int, float, float] | None:
    for step in steps:
        got, expected = fn(step, cfg), reference_lr_at(step, cfg)
        if not isinstance(got, (int, float)) or not math.isclose(float(got), expected, rel_tol=1e-7, abs_tol=TOL):
            return step, expected, got
    return None


def _hint(step: int, cfg: SimpleNamespace) -> str:
    if step < cfg.warmup:
        return f"during warm-up the rate grows linearly: lr * step / warmup (0 at step 0, lr at step {cfg.warmup})"
    if step >= cfg.steps:
        return "after the last step the rate stays at 10% of the peak: clamp the progress to at most 1"
    return (
        "after warm-up: progress t = (step - warmup) / (steps - warmup), "
        "lr * (0.1 + 0.9 * 0.5 * (1 + cos(pi * t)))"
    )


@check_for("05", "warm-up then cosine to 10%", points=2)
def values(ns: dict[str, Any]) -> None:
    fn = _lr_at(ns)
    for cfg in (_cfg(3e-3, 7, 61), _cfg(0.5, 20, 45)):
        bad = _first_mismatch(fn, cfg, list(range(cfg.steps + 1)))
        if bad:
            step, expected, got = bad
            raise CheckFailed(
                f"lr_at({step}, cfg) is wrong for lr={cfg.lr}, warmup={cfg.warmup}, steps={cfg.steps}",
                hint=_hint(step, cfg),
                expected=expected,
                got=got,
            )


@check_for("05", "warmup=0 starts at the peak", points=1)
def no_warmup(ns: dict[str, Any]) -> None:
    fn = _lr_at(ns)
    cfg = _cfg(0.02, 0, 30)
    bad = _first_mismatch(fn, cfg, [0, 1, 15, 29, 30])
    if bad:
        step, expected, got = bad
        raise CheckFailed(
            f"with warmup=0 the schedule should start at the peak and follow the cosine (step {step} is wrong)",
            hint="test `step < cfg.warmup` first (false for every step when warmup is 0), so there is no division by "
            "zero; guard steps - warmup with max(1, ...)",
            expected=expected,
            got=got,
        )


@check_for("05", "past the end stays at 10%", points=1)
def past_end(ns: dict[str, Any]) -> None:
    fn = _lr_at(ns)
    cfg = _cfg(1e-3, 4, 40)
    bad = _first_mismatch(fn, cfg, [40, 41, 55, 80, 400])
    if bad:
        step, expected, got = bad
        raise CheckFailed(
            f"a run that continues past cfg.steps should keep 10% of the peak (step {step} of {cfg.steps})",
            hint="without clamping, cos(pi * t) for t > 1 climbs back up: use t = min(1.0, ...)",
            expected=expected,
            got=got,
        )


@check_for("05", "pure function of the step (exact resume)", points=1)
def pure(ns: dict[str, Any]) -> None:
    fn = _lr_at(ns)
    cfg = _cfg(2e-3, 5, 50)
    in_order = [fn(s, cfg) for s in range(51)]
    # A resumed run asks for step 30 first, without having seen steps 0..29: the answer must not change.
    steps = list(range(51))
    random.Random(7).shuffle(steps)
    shuffled = {s: fn(s, cfg) for s in steps}
    changed = [s for s in range(51) if shuffled[s] != in_order[s]]
    if changed or vars(cfg) != {"lr": 2e-3, "warmup": 5, "steps": 50}:
        raise CheckFailed(
            "lr_at gave different answers for the same step depending on what was asked before (or changed cfg): "
            "a resumed run would not continue the same schedule",
            hint="compute the rate from `step` and `cfg` only: no counters, no stored state, no changes to cfg",
            expected="the same value for the same step, in any order",
            got=f"steps that changed: {changed[:5]}" if changed else vars(cfg),
        )
