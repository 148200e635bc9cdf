"""Exercise 17's grader: the reference objective, the side-by-side timing harness and the speed judge.

:func:`train_reference` computes what a correct, fast version of :func:`course_lib.perf.challenge.train_original`
computes: one SGD-with-momentum step per group of ``accum`` micro-batches, each step on the mean loss over the
*labelled* samples of its group, and one loss per step. :func:`time_against_original` measures a candidate against
the original side by side with the course's protocol (:func:`course_lib.perf.compare.compare`), each call on fresh
data, and returns plain data; :func:`judge_speed` judges that data in the grader. docs/grading.md explains the rules.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from course_lib import clock
from course_lib.perf import compare as protocol
from course_lib.perf.challenge import (
    IGNORE,
    SPEED_THRESHOLD,
    ChallengeConfig,
    challenge_data,
    challenge_model,
    channel_stats,
    train_original,
)
from course_lib.train.loss import cross_entropy_sum


def train_reference(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, cfg: ChallengeConfig) -> list[float]:
    """The objective, computed fast: one step per group on the mean loss over the group's labelled samples.

    A group of micro-batches is one batch of ``micro_batch * accum`` consecutive samples, so its gradient is
    that of one big batch. The images are normalised once, with the statistics of the whole dataset.
    """
    mean, std = channel_stats(images)
    inputs = (images.float() - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    model.train()
    group = cfg.micro_batch * cfg.accum
    losses = []
    for start in range(0, len(labels), group):
        x, y = inputs[start : start + group], labels[start : start + group]
        labelled = (y != IGNORE).sum().clamp(min=1)
        loss = cross_entropy_sum(model(x), y) / labelled  # the course's loss primitive: -100 targets add nothing
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return torch.stack(losses).tolist() if losses else []


Trainer = Callable[[nn.Module, torch.Tensor, torch.Tensor, ChallengeConfig], Any]
# Taken when this module is imported (before any submission runs in a grading process): the course's wall clock
# (course_lib/clock.py) is set back to it for the measurement, and a second clock checks the first.
_TRUSTED_CLOCK: Callable[[], float] = time.perf_counter
_CHECK_CLOCK_NS: Callable[[], int] = time.monotonic_ns


def as_losses(value: Any) -> list[float] | str:
    """A returned list of losses as floats, or a description of what came back instead."""
    try:
        return [float(v) for v in value]
    except (TypeError, ValueError):
        return f"{type(value).__name__}: not a list of numbers"


def time_against_original(candidate: Trainer, *, seed: int, cfg: ChallengeConfig | None = None, rounds: int = 7,
                          attempts: int = 3) -> dict[str, Any]:
    """Measure ``candidate`` against :func:`train_original` side by side; plain data for a judge.

    Every call trains a fresh :func:`challenge_model` on fresh data (call ``k`` of a contender uses
    ``challenge_data(seed + k)``, ``k`` below 30, in turn). While the rounds are too noisy to grade
    (:func:`_too_noisy`), the measurement is repeated, up to ``attempts`` times.
    Returns ``{"attempts": [{"yours": [s, ...], "original": [s, ...], "elapsed_s": wall time of the attempt,
    "calls": timed calls per round}, ...], "clock_intact": bool, "last_call": {"seed": k, "losses": ...}}``:
    ``last_call`` is what the candidate returned for one more call after the timed ones, on a data set no timed call
    had (``seed + 30``), so a judge can check that the timed work was the real work. (A fast candidate is called
    more than 30 times -- each round is calibrated to a minimum length, a busy machine repeats the attempt -- so the
    last *timed* call could fall on the first call's data, and a candidate replaying its first answer passed that
    test one time in 30, under load only.)
    """
    cfg = cfg or ChallengeConfig()
    # 30 data sets per contender, used in turn (a fast contender is called more often: they repeat).
    pools = {name: [challenge_data(seed + k) for k in range(30)] for name in ("yours", "original")}
    used = {"yours": 0, "original": 0}

    def contender(name: str, fn: Trainer) -> Callable[[], None]:
        def one_epoch() -> None:
            k = used[name] % len(pools[name])
            used[name] += 1
            images, labels = pools[name][k]
            fn(challenge_model(seed), images, labels, cfg)
        return one_epoch

    contenders = {"yours": contender("yours", candidate), "original": contender("original", train_original)}
    measured, intact = [], True
    try:
        for _ in range(attempts):
            clock.wall = _TRUSTED_CLOCK
            started = _CHECK_CLOCK_NS()
            comparison = protocol.compare(contenders, rounds=rounds, warmup=1, min_round_s=0.005)
            elapsed = (_CHECK_CLOCK_NS() - started) / 1e9
            intact = intact and clock.wall is _TRUSTED_CLOCK
            measured.append({"yours": list(comparison["yours"].seconds),
                             "original": list(comparison["original"].seconds),
                             "elapsed_s": elapsed, "calls": dict(comparison.calls_per_round)})
            if not _too_noisy(comparison.verdict("yours", "original")):
                break
    finally:
        clock.wall = _TRUSTED_CLOCK
    fresh = seed + len(pools["yours"])  # checked on data no timed call had, whatever their number
    losses = candidate(challenge_model(seed), *challenge_data(fresh), cfg)
    return {"attempts": measured, "clock_intact": intact, "last_call": {"seed": fresh, "losses": as_losses(losses)}}


def _too_noisy(verdict: protocol.Verdict) -> bool:
    """The same work differed by more than ``NOISY_SPREAD`` between rounds: a grade waits for a quieter attempt."""
    return verdict.worst_spread > protocol.NOISY_SPREAD


def judge_speed(observed: dict[str, Any], threshold: float = SPEED_THRESHOLD) -> tuple[str, protocol.Verdict | None]:
    """Judge :func:`time_against_original`'s data: ``("pass" | "slow" | "busy" | "impossible", verdict)``.

    Grading judges on wall time (what the learner's timings record) and is stricter than a lesson: an attempt whose
    rounds of the same work spread more than ``NOISY_SPREAD`` apart is "noisy".
    ``pass``: an attempt that was not noisy found the candidate ``threshold`` times faster
    (the ratio of the medians), or a noisy attempt found it that much faster in three rounds out of four (its lower
    quartile), which noise does not fake. ``slow``: the last decidable attempt found it slower than that.
    ``busy``: every attempt was too noisy and none showed the threshold: could not measure reliably, measure again.
    ``impossible``: the timings cannot be real (the clock was replaced, or the timed calls add up to more than the
    attempt's wall time).
    """
    if not observed.get("clock_intact"):
        return "impossible", None
    decided: protocol.Verdict | None = None
    busiest: protocol.Verdict | None = None
    for attempt in observed.get("attempts") or []:
        yours, original = attempt["yours"], attempt["original"]
        calls = attempt.get("calls") or {}
        timed = sum(yours) * calls.get("yours", 1) + sum(original) * calls.get("original", 1)
        if timed > attempt["elapsed_s"] * 1.01 + 1e-3:
            return "impossible", None
        verdict = protocol.verdict_from_times(protocol.Measurement("yours", tuple(yours)),
                                              protocol.Measurement("original", tuple(original)))
        if not _too_noisy(verdict):
            if verdict.outcome == "faster" and verdict.ratio >= threshold:
                return "pass", verdict
            decided = verdict
        elif verdict.low >= threshold:
            return "pass", verdict
        else:
            busiest = verdict
    if decided is not None:
        return "slow", decided
    return "busy", busiest


def losses_match(got: Sequence[float], expected: Sequence[float], tol: float = 1e-4) -> bool:
    """Same number of steps and every loss within ``tol`` (relative to its size, at least absolute ``tol``)."""
    return len(got) == len(expected) and all(
        math.isfinite(a) and abs(a - b) <= tol * max(1.0, abs(b)) for a, b in zip(got, expected))
