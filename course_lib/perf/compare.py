"""The course's measurement protocol: compare two ways of doing the same work, fairly, on a busy laptop.

Every speed comparison in the lessons, exercises and benchmarks goes through :func:`compare`. A learner's laptop
is running a browser and a video call while the lesson measures, so one timing of each contender proves nothing.
The protocol:

1. **Threads, chosen once.** :func:`course_threads` fixes the intra-op thread count for the whole course (lesson 01
   measures why): half the cores, at least one, unless ``COURSE_THREADS`` says otherwise. Fewer threads than cores
   leaves room for everything else the machine runs, so a busy machine disturbs the measurement less.
2. **Warm-up.** Each contender runs untimed first (lazy initialisation, allocator growth, compilation). The warm-up
   also calibrates how many calls make one timed round, so a round is long enough for the clock to resolve.
3. **Interleaving.** Rounds alternate the order (A B, B A, A B, ...). Slow drifts -- a browser tab waking up,
   the CPU clocking down -- then hit both contenders alike instead of whichever happened to run second.
4. **Noise from the repeats.** Each round gives a *paired* ratio (B's time / A's time in that round). The verdict
   uses their median, and their spread is the noise: the difference counts only when most rounds agree on it.
5. **A third outcome.** When the rounds disagree, or the difference is inside the band, the verdict is
   ``"too_close"``: too close to call on this machine right now. It is a real result, and lessons say so.
6. **A busy-machine guard.** A contender is measured again in every round, so its own rounds re-measure the same
   work. When identical work differs by more than ``busy_factor`` (2x) between rounds, the machine was too busy to
   teach from: the verdict is ``"busy"`` and the sentence says so instead of explaining a number.
7. **A time budget.** With ``budget_s`` the rounds stop early (after ``min_rounds``) rather than run long on a slow
   or busy machine.

Texts that explain a number are generated from a :class:`Verdict` (:meth:`Verdict.sentence`,
:meth:`Verdict.pick`, :func:`course_lib.lesson.explain`), never written next to it by hand.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from course_lib.device import apply_course_threads, course_threads, synchronize

__all__ = [
    "OUTCOMES",
    "Measurement",
    "Verdict",
    "Comparison",
    "compare",
    "verdict_from_times",
    "course_threads",
    "apply_course_threads",
    "format_seconds",
]

OUTCOMES = ("faster", "slower", "too_close", "busy")

# The clock used for timing. Module-level so tests can substitute a deterministic one.
_clock: Callable[[], float] = time.perf_counter


# Threads: one choice for the whole course, made in course_lib.device (the training CLI needs it too).


# --------------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------------
def format_seconds(seconds: float) -> str:
    """``0.000123`` -> ``"123 µs"``: three significant digits in the unit that suits the size.

    Taught in lesson 04 (``notebooks/04_template.ipynb``).
    """
    if not math.isfinite(seconds):
        return str(seconds)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{_sig3(seconds / scale)} {unit}"
    return f"{_sig3(seconds / 1e-9)} ns"


def _sig3(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _fmt_ratio(value: float) -> str:
    """Ratios as a reader says them: ``1.04``, ``2.3``, ``17``."""
    if value >= 10:
        return f"{value:.0f}"
    return f"{value:.2f}" if value < 1.995 else f"{value:.1f}"


@dataclass(frozen=True)
class Measurement:
    """One contender's timed rounds: ``seconds[i]`` is the time of one call in round ``i``.

    Taught in lesson 10 (``notebooks/10_lightning.ipynb``).
    """

    name: str
    seconds: tuple[float, ...]
    work: float = 1.0
    unit: str = "call"

    @property
    def median_s(self) -> float:
        """Median seconds per call over the rounds."""
        return statistics.median(self.seconds)

    @property
    def rate(self) -> float:
        """Units of work per second at the median time (``work`` units per call)."""
        return self.work / self.median_s

    @property
    def spread(self) -> float:
        """max/min of the rounds, ignoring the single slowest when there are four or more (one hiccup allowed).

        The same work, timed again: on a quiet machine this stays close to 1.
        """
        times = sorted(self.seconds)
        if len(times) >= 4:
            times = times[:-1]
        return times[-1] / times[0] if times[0] > 0 else math.inf


@dataclass(frozen=True)
class Verdict:
    """How contender ``a`` compares with contender ``b`` on this machine, right now.

    ``ratio`` is how many times faster ``a`` was than ``b`` (``b``'s time / ``a``'s time, median of the paired
    rounds): above 1 ``a`` is faster. ``low``/``high`` bound the middle of the per-round ratios (the noise).
    ``outcome`` is one of :data:`OUTCOMES`: ``"faster"``/``"slower"`` (``a`` than ``b``), ``"too_close"``, or
    ``"busy"`` (identical work differed by more than ``busy_factor`` between rounds: nothing to teach from).
    """

    a: str
    b: str
    outcome: str
    ratio: float
    low: float
    high: float
    rounds: int
    band: float
    a_seconds: float
    b_seconds: float
    busy_factor: float = 2.0
    worst_spread: float = 1.0
    worst_name: str = ""
    a_work: float = 1.0
    b_work: float = 1.0
    unit: str = "call"

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome={self.outcome!r} must be one of {OUTCOMES}.")

    @property
    def factor(self) -> float:
        """The size of the difference as a number >= 1 (``2.0`` for both twice as fast and half as fast)."""
        return self.ratio if self.ratio >= 1 else 1.0 / self.ratio

    @property
    def decided(self) -> bool:
        """True when the measurement says which contender is faster."""
        return self.outcome in ("faster", "slower")

    @property
    def winner(self) -> str | None:
        """The faster contender's name, or ``None`` when too close to call or the machine was busy."""
        return {"faster": self.a, "slower": self.b}.get(self.outcome)

    def fields(self) -> dict[str, str]:
        """The values an explanation template may use: ``{a}``, ``{b}``, ``{factor}``, ``{ratio}``, ``{low}``,
        ``{high}``, ``{winner}``, ``{loser}``, ``{a_time}``, ``{b_time}``, ``{rounds}``, ``{band}``, ``{spread}``."""
        winner, loser = (self.a, self.b) if self.ratio >= 1 else (self.b, self.a)
        return {
            "a": self.a, "b": self.b, "winner": winner, "loser": loser,
            "factor": _fmt_ratio(self.factor), "ratio": _fmt_ratio(self.ratio),
            "low": _fmt_ratio(self.low), "high": _fmt_ratio(self.high),
            "a_time": format_seconds(self.a_seconds), "b_time": format_seconds(self.b_seconds),
            "rounds": str(self.rounds), "band": f"{self.band:.0%}", "spread": _fmt_ratio(self.worst_spread),
            "busy_name": self.worst_name,
            "a_rate": _sig3(self.a_work / self.a_seconds), "b_rate": _sig3(self.b_work / self.b_seconds),
        }

    def sentence(self) -> str:
        """One sentence stating the verdict with its numbers (what a lesson prints before explaining it)."""
        f = self.fields()
        if self.a_work != self.b_work:  # different work per call (batch 64 vs batch 1): compare rates
            unit = "item" if self.unit == "call" else self.unit
            per = f"{f['a_rate']} vs {f['b_rate']} {unit}s/s"
        else:
            per = f"{f['a_time']} vs {f['b_time']} per {self.unit}"
        numbers = f"{per}, median of {f['rounds']} interleaved rounds"
        if self.outcome == "busy":
            return (
                f"This machine was too busy to compare {f['a']} with {f['b']}: the same work ({f['busy_name']}) took "
                f"{f['spread']}x longer in one round than in another. Close what else is running (browser tabs, a "
                "video call) and run this cell again; nothing below is taught from these numbers."
            )
        if self.outcome == "too_close":
            return (
                f"Too close to call on this machine right now: {f['a']} ran at {f['ratio']}x the speed of {f['b']} "
                f"({numbers}; the rounds ranged from {f['low']}x to {f['high']}x), inside the noise."
            )
        word = "faster" if self.outcome == "faster" else "slower"
        return (
            f"On this machine {f['a']} was {f['factor']}x {word} than {f['b']} ({numbers}; the rounds ranged from "
            f"{f['low']}x to {f['high']}x)."
        )

    def pick(self, *, faster: Any, slower: Any, too_close: Any, busy: Any = None) -> Any:
        """The value for this verdict's outcome; every outcome needs one (so every branch is written)."""
        return {"faster": faster, "slower": slower, "too_close": too_close, "busy": busy}[self.outcome]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly record (benchmarks store it)."""
        return {
            "a": self.a, "b": self.b, "outcome": self.outcome, "ratio": self.ratio, "low": self.low,
            "high": self.high, "rounds": self.rounds, "band": self.band, "a_seconds": self.a_seconds,
            "b_seconds": self.b_seconds, "worst_spread": self.worst_spread,
        }


def _quartiles(values: Sequence[float]) -> tuple[float, float]:
    """The middle of ``values``: quartiles with four or more values, else min and max."""
    vals = sorted(values)
    if len(vals) < 4:
        return vals[0], vals[-1]
    q = statistics.quantiles(vals, n=4, method="inclusive")
    return q[0], q[2]


def verdict_from_times(
    a: Measurement, b: Measurement, *, band: float = 0.05, busy_factor: float = 2.0
) -> Verdict:
    """Judge ``a`` against ``b`` from their paired rounds (round ``i`` of each ran back to back).

    ``band``: differences smaller than this fraction are too close to call whatever the rounds say.

    Taught in lesson 10 (``notebooks/10_lightning.ipynb``).
    """
    if len(a.seconds) != len(b.seconds) or not a.seconds:
        raise ValueError(
            f"{a.name!r} has {len(a.seconds)} rounds and {b.name!r} has {len(b.seconds)}: a verdict needs the same "
            "number of paired rounds (at least one) for both."
        )
    if band < 0 or busy_factor <= 1:
        raise ValueError(f"band={band!r} must be >= 0 and busy_factor={busy_factor!r} > 1.")
    for m in (a, b):
        bad = [s for s in m.seconds if not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0)]
        if bad:
            raise ValueError(f"{m.name!r} has round times {bad}: times must be finite and positive seconds.")
    # Per unit of work, so contenders doing different amounts per call (batch 1 vs batch 64) compare as rates.
    paired = [(tb / b.work) / (ta / a.work) for ta, tb in zip(a.seconds, b.seconds)]
    ratio = statistics.median(paired)
    low, high = _quartiles(paired)
    worst = max((a, b), key=lambda m: m.spread)
    if worst.spread > busy_factor:
        outcome = "busy"
    elif ratio >= 1 + band and low > 1:
        outcome = "faster"
    elif ratio <= 1 / (1 + band) and high < 1:
        outcome = "slower"
    else:
        outcome = "too_close"
    return Verdict(
        a=a.name, b=b.name, outcome=outcome, ratio=ratio, low=low, high=high, rounds=len(paired), band=band,
        a_seconds=a.median_s, b_seconds=b.median_s, busy_factor=busy_factor, worst_spread=worst.spread,
        worst_name=worst.name, a_work=a.work, b_work=b.work, unit=a.unit if a.unit == b.unit else "unit",
    )


@dataclass
class Comparison:
    """The timed rounds of every contender, measured in one interleaved run."""

    measurements: dict[str, Measurement]
    threads: int
    calls_per_round: dict[str, int] = field(default_factory=dict)
    stopped_by_budget: bool = False

    def __getitem__(self, name: str) -> Measurement:
        if name not in self.measurements:
            raise KeyError(f"{name!r} was not measured; contenders: {list(self.measurements)}")
        return self.measurements[name]

    def verdict(self, a: str, b: str, *, band: float = 0.05, busy_factor: float = 2.0) -> Verdict:
        """How ``a`` compares with ``b`` (see :func:`verdict_from_times`)."""
        return verdict_from_times(self[a], self[b], band=band, busy_factor=busy_factor)

    def fastest(self) -> str:
        """The contender with the best median rate (work per second)."""
        return max(self.measurements.values(), key=lambda m: m.rate).name

    def table(self) -> str:
        """A Markdown table: contender, median time per call, rate, spread between rounds."""
        rows = ["| contender | median per call | rounds | spread (max/min) |", "|---|---:|---:|---:|"]
        for m in self.measurements.values():
            rows.append(f"| {m.name} | {format_seconds(m.median_s)} | {len(m.seconds)} | {_fmt_ratio(m.spread)}x |")
        return "\n".join(rows)


def _time_round(fn: Callable[[], Any], calls: int, device: torch.device) -> float:
    synchronize(device)
    t0 = _clock()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (_clock() - t0) / calls


def compare(
    contenders: Mapping[str, Callable[[], Any]],
    *,
    rounds: int = 5,
    warmup: int = 1,
    work: float | Mapping[str, float] = 1.0,
    min_round_s: float = 0.02,
    budget_s: float | None = None,
    min_rounds: int = 3,
    device: torch.device | str = "cpu",
    threads: int | None = None,
    unit: str = "call",
) -> Comparison:
    """Time every contender in interleaved rounds (see the module docstring) and return a :class:`Comparison`.

    ``contenders``: name -> a function doing one unit of the work (one step, one batch, one forward pass).
    ``work``: units of work per call (e.g. samples), one number or one per contender, for rates; ``unit`` names
    one unit of work (``"sample"``), for the sentences.
    ``min_round_s``: calls are repeated within a round until it lasts about this long (calibrated in warm-up).
    ``budget_s``: stop after the round that would exceed it (never before ``min_rounds``).
    ``threads``: intra-op threads during the measurement (default :func:`course_threads`); restored afterwards.

    Taught in lesson 00 (``notebooks/00_welcome.ipynb``).
    """
    names = list(contenders)
    if len(names) < 2:
        raise ValueError(f"compare() needs at least two contenders, got {names}.")
    if not isinstance(rounds, int) or rounds < 1 or not isinstance(min_rounds, int) or min_rounds < 1:
        raise ValueError(f"rounds={rounds!r} and min_rounds={min_rounds!r} must be whole numbers >= 1.")
    if not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"warmup={warmup!r} must be >= 1: the first call pays for lazy initialisation.")
    if budget_s is not None and budget_s <= 0:
        raise ValueError(f"budget_s={budget_s!r} must be positive seconds (or None for no budget).")
    works = {n: float(work[n] if isinstance(work, Mapping) else work) for n in names}
    for n, w in works.items():
        if not (math.isfinite(w) and w > 0):
            raise ValueError(f"work for {n!r} is {w!r}: it must be a positive amount per call.")
    device = torch.device(device)
    previous_threads = torch.get_num_threads()
    n_threads = course_threads() if threads is None else int(threads)
    torch.set_num_threads(n_threads)
    try:
        started = _clock()
        calls: dict[str, int] = {}
        for n in names:  # warm-up, which also calibrates the calls per round
            one = _time_round(contenders[n], warmup, device)
            calls[n] = max(1, math.ceil(min_round_s / one)) if one > 0 else 1
            if calls[n] > 1:  # the first calls paid for lazy initialisation: calibrate again on a full round
                one = _time_round(contenders[n], calls[n], device)
                calls[n] = max(1, math.ceil(min_round_s / one)) if one > 0 else 1
        times: dict[str, list[float]] = {n: [] for n in names}
        stopped = False
        for i in range(rounds):
            order = names if i % 2 == 0 else names[::-1]
            round_start = _clock()
            for n in order:
                times[n].append(_time_round(contenders[n], calls[n], device))
            elapsed, last = _clock() - started, _clock() - round_start
            if budget_s is not None and i + 1 >= min_rounds and i + 1 < rounds and elapsed + last > budget_s:
                stopped = True
                break
    finally:
        torch.set_num_threads(previous_threads)
    measurements = {n: Measurement(n, tuple(times[n]), works[n], unit) for n in names}
    return Comparison(measurements, n_threads, calls, stopped)
