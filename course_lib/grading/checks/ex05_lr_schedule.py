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

from course_lib.grading.api import CheckFailed, LearnerRaised, call, check_for, need, observe, run_seed
from course_lib.train.schedule import lr_at as reference_lr_at

TOL = 1e-9


def _cfg(lr: float, warmup: int, steps: int) -> SimpleNamespace:
    # A plain object with the three fields the schedule reads (TrainConfig has them too).
    return SimpleNamespace(lr=lr, warmup=warmup, steps=steps)


def _values(ns: dict[str, Any], lr: float, warmup: int, total: int, steps: list[int] | None = None,
            order_seed: int | None = None) -> dict[str, Any]:
    """The learner's ``lr_at`` at ``steps`` (default: every step 0..total) for ``_cfg(lr, warmup, total)``,
    asked in order or shuffled, and the config's fields afterwards."""
    fn = need(ns, "lr_at", "define `lr_at(step, cfg)` returning a float")
    cfg = _cfg(lr, warmup, total)
    wanted = list(range(total + 1)) if steps is None else list(steps)
    asked = list(wanted)
    if order_seed is not None:
        random.Random(order_seed).shuffle(asked)
    got = {step: call(fn, step, cfg) for step in asked}
    values = [got[step] if isinstance(got[step], (int, float)) else repr(got[step]) for step in wanted]
    return {"values": values, "cfg_after": [cfg.lr, cfg.warmup, cfg.steps]}


def _first_mismatch(got: list[Any], cfg: SimpleNamespace, steps: list[int]) -> tuple[int, float, Any] | None:
    for step, value in zip(steps, got):
        expected = reference_lr_at(step, cfg)
        if not isinstance(value, (int, float)) or not math.isclose(float(value), expected, rel_tol=1e-7, abs_tol=TOL):
            return step, expected, value
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


def _peak(ns: dict[str, Any], base: float) -> float:
    """A peak rate that differs per grading run (answers computed in advance for fixed inputs do not fit)."""
    return round(base * (1 + (run_seed(ns) % 97) / 100), 12)


@check_for("05", "warm-up then cosine to 10%", points=2, parts=("05.1",))
def values(ns: dict[str, Any]) -> None:
    # The last run has one step after warm-up: a guard of steps - warmup at 2 instead of 1 (or a cosine that is
    # off by one step) gives a different rate only there.
    for cfg in (_cfg(_peak(ns, 3e-3), 7, 61), _cfg(_peak(ns, 0.5), 20, 45), _cfg(_peak(ns, 0.05), 9, 10)):
        got = observe(ns, _values, cfg.lr, cfg.warmup, cfg.steps)["values"]
        bad = _first_mismatch(got, cfg, list(range(cfg.steps + 1)))
        if bad:
            step, expected, value = bad
            raise CheckFailed(
                f"lr_at({step}, cfg) is wrong for lr={cfg.lr}, warmup={cfg.warmup}, steps={cfg.steps}",
                hint=_hint(step, cfg),
                expected=expected,
                got=value,
            )


@check_for("05", "warmup=0 starts at the peak", points=1, parts=("05.1",))
def no_warmup(ns: dict[str, Any]) -> None:
    cfg = _cfg(_peak(ns, 0.02), 0, 30)
    steps = [0, 1, 15, 29, 30]
    bad = _first_mismatch(observe(ns, _values, cfg.lr, cfg.warmup, cfg.steps, steps)["values"], cfg, steps)
    if bad:
        step, expected, got = bad
        raise CheckFailed(
            f"with warmup=0 the schedule should start at the peak and follow the cosine (step {step} is wrong)",
            hint="test `step < cfg.warmup` first (false for every step when warmup is 0), so there is no division by "
            "zero; guard steps - warmup with max(1, ...)",
            expected=expected,
            got=got,
        )


@check_for("05", "warmup == steps (all warm-up) is allowed", points=1, parts=("05.1",))
def all_warmup(ns: dict[str, Any]) -> None:
    cfg = _cfg(_peak(ns, 0.3), 12, 12)  # TrainConfig allows it: the whole run is warm-up, then the floor
    try:
        got = observe(ns, _values, cfg.lr, cfg.warmup, cfg.steps)["values"]
    except LearnerRaised as raised:
        raise CheckFailed(
            f"with warmup == steps == {cfg.steps} (a run that is all warm-up) lr_at crashed: {raised.message}",
            hint="guard the cosine's denominator: t = (step - warmup) / max(1, steps - warmup)",
        ) from None
    bad = _first_mismatch(got, cfg, list(range(cfg.steps + 1)))
    if bad:
        step, expected, value = bad
        raise CheckFailed(f"with warmup == steps == {cfg.steps}, lr_at({step}, cfg) is wrong", hint=_hint(step, cfg),
                          expected=expected, got=value)


@check_for("05", "past the end stays at 10%", points=1, parts=("05.1",))
def past_end(ns: dict[str, Any]) -> None:
    cfg = _cfg(_peak(ns, 1e-3), 4, 40)
    steps = [40, 41, 55, 80, 400]
    bad = _first_mismatch(observe(ns, _values, cfg.lr, cfg.warmup, cfg.steps, steps)["values"], cfg, steps)
    if bad:
        step, expected, got = bad
        raise CheckFailed(
            f"a run that continues past cfg.steps should keep 10% of the peak (step {step} of {cfg.steps})",
            hint="without clamping, cos(pi * t) for t > 1 climbs back up: use t = min(1.0, ...)",
            expected=expected,
            got=got,
        )


@check_for("05", "pure function of the step (exact resume)", points=1, parts=("05.1",))
def pure(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    lr, warmup, total = _peak(ns, 2e-3), 3 + seed % 5, 40 + seed % 23
    in_order = observe(ns, _values, lr, warmup, total)
    # A resumed run asks for step 30 first, without having seen steps 0..29: the answer must not change.
    shuffled = observe(ns, _values, lr, warmup, total, order_seed=seed)
    changed = [s for s in range(total + 1) if shuffled["values"][s:s + 1] != in_order["values"][s:s + 1]]
    if changed or shuffled["cfg_after"] != [lr, warmup, total] or in_order["cfg_after"] != [lr, warmup, total]:
        raise CheckFailed(
            "lr_at gave different answers for the same step depending on what was asked before (or changed cfg): "
            "a resumed run would not continue the same schedule",
            hint="compute the rate from `step` and `cfg` only: no counters, no stored state, no changes to cfg",
            expected="the same value for the same step, in any order",
            got=f"steps that changed: {changed[:5]}" if changed else f"cfg after: {shuffled['cfg_after']}",
        )
