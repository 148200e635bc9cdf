"""Checks for exercise 18: how the course measures (warm-up, interleaved rounds, a verdict, the quantity).

The learner writes ``interleaved_rounds(a, b, rounds, clock)``, ``verdict(a_times, b_times, band=0.05)`` and
``quantity(kind, others_cores, device="cpu")``. The timings are crafted from the grading run's seed: contenders that
advance a fake clock by a cost that drifts from call to call (the first call pays for lazy initialisation), and
rounds built so that the mean disagrees with the median, the median of the per-round ratios with the ratio of the
medians, and the medians with the rounds. The answers are judged against :mod:`course_lib.perf.compare`.
"""

from __future__ import annotations

import math
import random
from typing import Any

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed
from course_lib.perf.compare import KINDS, MIN_TIMED_ROUNDS, choose_quantity, decide


# ---------------------------------------------------------------- 18.1: warm-up and interleaved rounds
def _costs(seed: int) -> dict[str, Any]:
    """Per-call costs in seconds: a slow first call, then a cost that drifts upward (a machine getting busier)."""
    rng = random.Random(seed)
    rounds = 4 + seed % 3
    out: dict[str, Any] = {"rounds": rounds}
    for name, base in (("a", 0.010 + rng.random() * 0.005), ("b", 0.020 + rng.random() * 0.005)):
        first = base * (8 + rng.random() * 4)
        out[name] = [round(first, 6)] + [round(base * (1 + 0.15 * k) + rng.random() * 1e-3, 6)
                                         for k in range(rounds + 2)]
    return out


class _FakeClock:
    """Seconds that pass only when a contender runs: every call advances it by its cost."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _rounds(ns: dict[str, Any], costs: dict[str, Any]) -> dict[str, Any]:
    fn = need(ns, "interleaved_rounds", "define `interleaved_rounds(a, b, rounds, clock)`")
    clock, order = _FakeClock(), []

    def contender(name: str) -> Any:
        left = list(costs[name])

        def one_call() -> None:
            order.append(name)
            clock.now += left.pop(0) if left else 1.0  # a call past the planned ones costs a full second
        return one_call

    result = call(fn, contender("a"), contender("b"), costs["rounds"], clock)
    times = None
    if isinstance(result, (tuple, list)) and len(result) == 2:
        try:
            times = [[float(t) for t in side] for side in result]
        except (TypeError, ValueError):
            times = None
    return {"order": order, "times": times, "returned": one_line(result)}


def _expected_order(rounds: int) -> list[str]:
    order = ["a", "b"]  # the warm-up: one untimed call each
    for i in range(rounds):
        order += ["a", "b"] if i % 2 == 0 else ["b", "a"]
    return order


@check_for("18", "rounds: one warm-up call each, then rounds in alternating order", points=1, parts=("18.1",))
def rounds_order(ns: Any) -> None:
    costs = _costs(run_seed(ns))
    seen = observe(ns, _rounds, costs)
    want = _expected_order(costs["rounds"])
    if seen["order"] != want:
        raise CheckFailed(
            f"the contenders were called in the wrong order for {costs['rounds']} rounds",
            hint="first one untimed call of a, then of b (warm-up); then round 0 runs a then b, round 1 b then a, "
                 "and so on, one call of each per round",
            expected=" ".join(want), got=" ".join(seen["order"]))


@check_for("18", "rounds: each round's time read from the clock given, warm-up left out", points=1, parts=("18.1",))
def rounds_times(ns: Any) -> None:
    costs = _costs(run_seed(ns))
    seen = observe(ns, _rounds, costs)
    if seen["times"] is None:
        raise CheckFailed("interleaved_rounds should return (a_times, b_times), two lists of seconds",
                          expected="([...], [...])", got=seen["returned"])
    n = costs["rounds"]
    want = [costs["a"][1:n + 1], costs["b"][1:n + 1]]
    a_times, b_times = seen["times"]
    if len(a_times) != n or len(b_times) != n:
        raise CheckFailed(f"there should be one time per round for each contender ({n} rounds)",
                          expected=f"{n} and {n}", got=f"{len(a_times)} and {len(b_times)}")
    if seen["order"] != _expected_order(n):
        raise CheckFailed("the times cannot be judged while the calls are in the wrong order (see the order check)")
    for name, got, expected in (("a", a_times, want[0]), ("b", b_times, want[1])):
        if any(not math.isclose(g, e, rel_tol=1e-6, abs_tol=1e-9) for g, e in zip(got, expected)):
            raise CheckFailed(
                f"{name}'s round times are not what the clock measured around each call",
                hint="read clock() just before and just after each timed call and keep the difference; use the "
                     "clock you are given (not time.perf_counter), and do not time the warm-up call",
                expected=[round(x, 6) for x in expected], got=[round(x, 6) for x in got])


# ---------------------------------------------------------------- 18.2: the verdict
def _case(rng: random.Random, n: int, speed: float, flips: int = 0, hiccup: float = 0.0,
          jitter: float = 0.06) -> tuple[list, list]:
    """``a`` is ``speed`` times faster than ``b`` in most rounds; ``flips`` rounds say the opposite; an optional
    ``hiccup`` makes one of a's rounds that many times slower (the mean moves, the median does not)."""
    a = [round(1.0 + rng.random() * 0.2, 6) for _ in range(n)]
    b = [round(x * speed * (1 + rng.random() * jitter), 6) for x in a]
    for i in rng.sample(range(n), flips):
        b[i] = round(a[i] / (speed * (1 + rng.random() * 0.1)), 6)
    if hiccup:
        a[rng.randrange(n)] *= hiccup
    return a, b


def _scaled(case: tuple[list, list], factor: float) -> tuple[list, list]:
    return [round(x * factor, 9) for x in case[0]], [round(x * factor, 9) for x in case[1]]


def _equal_rounds(rng: random.Random, speed: float) -> tuple[list, list]:
    """Five rounds, two of them a tie: the middle half of the per-round ratios has 1.0 exactly at one end."""
    a = [round(1.0 + rng.random() * 0.2, 6) for _ in range(5)]
    b = [x if i < 2 else round(x * speed, 6) for i, x in enumerate(a)]
    return a, b


def _verdict_cases(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed * 7919 + 1)
    fast = 1.6 + rng.random()
    cases = [
        _case(rng, 5, fast),                     # a clearly faster
        _case(rng, 6, 1 / fast),                 # a clearly slower
        _case(rng, 7, fast, flips=1),            # one round disagrees: still decided
        _case(rng, 5, 1.5, flips=2),             # two of five disagree: the rounds do not agree
        _case(rng, 5, 1.02, jitter=0.02),        # consistent but inside the 5% band
        _case(rng, 7, 1.3, hiccup=6.0),          # a hiccup: the mean says slower, the medians faster
        _case(rng, 2, 3.0),                      # two rounds: too few to decide
        _case(rng, 4, 0.5, flips=1),             # four rounds, one disagrees
        # Near misses, each separating the rule from a rule one step away:
        _case(rng, 3, fast),                     # three rounds are enough to decide
        _case(rng, 3, fast, flips=1),            # three rounds: the interval is min..max, and they disagree
        _case(rng, 3, 1 / fast, flips=1),
        _case(rng, 5, 0.98, jitter=0.02),        # consistent but inside the band, below 1
        _case(rng, 5, 1 / 1.5, flips=2),         # slower in the medians, but the rounds do not agree
        _scaled(_case(rng, 5, fast), 0.01),      # milliseconds: b's times are below 1, the ratios b/a above
        _equal_rounds(rng, 1.5),                 # the middle half of the ratios starts exactly at 1: not decided
        _equal_rounds(rng, 1 / 1.5),             # ... ends exactly at 1
        ([2.0, 1.9, 2.05, 2.0, 2.1], [2.1, 1.995, 2.15, 2.1, 2.2]),  # ratio exactly 1 + band: faster
        ([2.1, 2.0, 2.2, 2.1, 2.3], [2.0, 1.9, 2.09, 2.0, 2.19]),   # ratio exactly 1 / (1 + band): slower
    ]
    rng.shuffle(cases)
    return [{"a": a, "b": b, "band": 0.05} for a, b in cases] + [
        {"a": a, "b": b, "band": 0.01} for a, b in [_case(rng, 5, 1.03, jitter=0.01)]]  # the band is an argument


def _verdicts(ns: dict[str, Any], cases: list[dict[str, Any]]) -> list[Any]:
    """``[inputs, answer]`` per case: the inputs are recorded with the answers, so a judge can tell that the
    answers are for this run's rounds."""
    fn = need(ns, "verdict", "define `verdict(a_times, b_times, band=0.05)`")
    out = []
    for case in cases:
        result = call(fn, list(case["a"]), list(case["b"]), band=case["band"])
        answer: Any = one_line(result)
        if isinstance(result, (tuple, list)) and len(result) == 2:
            try:
                answer = [str(result[0]), float(result[1])]
            except (TypeError, ValueError):
                pass
        out.append([dict(case), answer])
    return out


def _judged(ns: Any) -> list[tuple[dict[str, Any], Any, tuple[str, float]]]:
    cases = _verdict_cases(run_seed(ns))
    seen = observe(ns, _verdicts, cases)
    if not isinstance(seen, list) or [row[0] if isinstance(row, list) and row else None for row in seen] != cases:
        raise CheckFailed("the recorded answers are not for this run's rounds (one answer per call of verdict)")
    out = []
    for case, (_, got) in zip(cases, seen):
        if not isinstance(got, list):
            raise CheckFailed("verdict should return (outcome, ratio): a string and a number",
                              expected="('faster', 1.87)", got=got)
        outcome, ratio, _, _ = decide(case["a"], case["b"], band=case["band"])
        out.append((case, got, (outcome, ratio)))
    return out


def _show(case: dict[str, Any]) -> str:
    return f"a_times={case['a']}, b_times={case['b']}, band={case['band']}"


@check_for("18", "verdict: the ratio of the medians, above 1 when a is faster", points=1, parts=("18.2",))
def verdict_ratio(ns: Any) -> None:
    for case, (_, got_ratio), (_, want) in _judged(ns):
        if not math.isclose(got_ratio, want, rel_tol=1e-6):
            raise CheckFailed(
                f"the ratio is wrong for {_show(case)}",
                hint="a's speed over b's: median(b_times) / median(a_times). Medians, not means (one hiccup must "
                     "not decide), and of each contender's rounds, not of the per-round ratios (so the direction "
                     "always agrees with the two medians shown)",
                expected=round(want, 6), got=round(got_ratio, 6))


@check_for("18", "verdict: decided only when the rounds agree, outside the band", points=2, parts=("18.2",))
def verdict_outcome(ns: Any) -> None:
    for case, (got, _), (want, _) in _judged(ns):
        if len(case["a"]) < MIN_TIMED_ROUNDS:
            continue  # the next check
        if got != want:
            raise CheckFailed(
                f"the outcome is wrong for {_show(case)}",
                hint="'faster' needs the ratio >= 1 + band AND the middle half of the per-round ratios b/a above 1 "
                     "(statistics.quantiles(ratios, n=4, method='inclusive')); 'slower' the mirror image; "
                     "anything else is 'too_close'",
                expected=want, got=got)


@check_for("18", f"verdict: fewer than {MIN_TIMED_ROUNDS} rounds decide nothing", points=1, parts=("18.2",))
def verdict_few_rounds(ns: Any) -> None:
    for case, (got, _), (want, _) in _judged(ns):
        if len(case["a"]) < MIN_TIMED_ROUNDS and got != want:
            raise CheckFailed(
                f"{len(case['a'])} rounds cannot show the noise, yet the verdict was decided: {_show(case)}",
                hint=f"with fewer than {MIN_TIMED_ROUNDS} rounds the outcome is 'too_close', whatever the ratio",
                expected=want, got=got)


# ---------------------------------------------------------------- 18.3: which quantity decides
def _quantity_cases(seed: int) -> list[tuple[str, float, str]]:
    rng = random.Random(seed + 18)
    cases = [(kind, round(others, 2), device) for kind in KINDS for device in ("cpu", "cuda")
             for others in (0.0, 0.2 + rng.random() * 0.2, 0.6 + rng.random(), 1.5 + rng.random() * 3)]
    cases.append(("work", 0.5, "cpu"))  # exactly at the threshold: contended
    rng.shuffle(cases)
    return cases


def _quantities(ns: dict[str, Any], cases: list[tuple[str, float, str]]) -> list[list[Any]]:
    """``[kind, others_cores, device, answer]`` per case (inputs recorded with the answers)."""
    fn = need(ns, "quantity", "define `quantity(kind, others_cores, device='cpu')`")
    return [[kind, others, device, one_line(call(fn, kind, others, device))] for kind, others, device in cases]


@check_for("18", "quantity: CPU time only for fixed work on a contended CPU", points=1, parts=("18.3",))
def quantity_choice(ns: Any) -> None:
    cases = _quantity_cases(run_seed(ns))
    seen = observe(ns, _quantities, cases)
    asked = [tuple(row[:3]) for row in seen] if isinstance(seen, list) else None
    if asked != cases:
        raise CheckFailed("the recorded answers are not for this run's comparisons", expected=cases[:3], got=asked)
    for (kind, others, device), got in zip(cases, (row[3] for row in seen)):
        want = repr(choose_quantity(kind, others, device))
        if got != want:
            raise CheckFailed(
                f"quantity({kind!r}, {others}, {device!r}) is wrong",
                hint="'cpu' only when the comparison is about fixed work (kind 'work'), on the CPU, and other "
                     "programs used at least 0.5 cores; a comparison about parallelism is about wall time, and on "
                     "a GPU the host only waits",
                expected=want, got=got)
