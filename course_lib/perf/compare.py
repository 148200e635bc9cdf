"""The course's measurement protocol: compare two ways of doing the same work, fairly, on a busy laptop.

Every speed comparison in the lessons, exercises and benchmarks goes through :func:`compare`. A learner's laptop
is running a browser and a video call while the lesson measures, so one timing of each contender proves nothing.
The protocol:

1. **Threads, chosen once.** :func:`course_threads` fixes the intra-op thread count for the whole course (lesson 01
   measures why): half the cores, at least one, unless ``COURSE_THREADS`` says otherwise.
2. **Warm-up.** Each contender runs untimed first (lazy initialisation, allocator growth, compilation). The warm-up
   also calibrates how many calls make one timed round, so a round is long enough for the clock to resolve.
3. **Interleaving.** Rounds alternate the order (A B, B A, A B, ...). Slow drifts -- a browser tab waking up,
   the CPU clocking down -- then hit both contenders alike instead of whichever happened to run second.
4. **Three clocks per round.** Each round records the contender's wall-clock time, the CPU time of this process
   and its children (DataLoader workers included), and the CPU time the *rest of the machine* used meanwhile. So
   a verdict knows how many cores its contenders had, and how many other programs took.
5. **One statistic.** A verdict compares the *medians* of the two contenders' rounds (per unit of work), so the
   direction it states is the direction of the medians shown beside it. Each round also gives a *paired* ratio
   (both contenders ran back to back): the difference counts only when the middle half of those ratios lies on one
   side of 1 and the ratio of medians is outside ``band``; otherwise it is ``"too_close"``: too close to call on
   this machine right now, a real result that lessons explain.
6. **The quantity that still means something.** A comparison of one process doing fixed work (``kind="work"``)
   decides on wall-clock time on a quiet machine and on CPU time when other programs took the cores (wall time then
   measures the queue, CPU time still measures the work). A comparison *about* parallelism (``kind="parallel"``:
   workers, threads, ranks) decides on wall time and reports the cores each contender had, so a busy machine
   explains the outcome instead of spoiling it. On a GPU the quantity is wall time (the host only waits).
7. **A time budget.** With ``budget_s`` the rounds stop early (after ``min_rounds``) rather than run long on a slow
   or busy machine.

Texts that explain a number are generated from a :class:`Verdict` (:meth:`Verdict.sentence`,
:meth:`Verdict.pick`, :func:`course_lib.lesson.explain`), never written next to it by hand; with
``COURSE_CLAIM_LOG`` set, every verdict a lesson shows is logged (:mod:`course_lib.perf.claims`).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch

from course_lib import clock, heartbeat
from course_lib.device import apply_course_threads, course_threads, synchronize
from course_lib.perf.busy import spinning_pids

__all__ = [
    "OUTCOMES",
    "KINDS",
    "TIMED_QUANTITIES",
    "Measurement",
    "Verdict",
    "Comparison",
    "OtherPrograms",
    "compare",
    "decide",
    "choose_quantity",
    "verdict_from_times",
    "verdict_from_counts",
    "verdict_table",
    "course_threads",
    "apply_course_threads",
    "format_seconds",
    "format_ratio",
]

OUTCOMES = ("faster", "slower", "too_close")
KINDS = ("work", "parallel")
TIMED_QUANTITIES = {"wall": "wall-clock time", "cpu": "CPU time"}
MIN_TIMED_ROUNDS = 3  # fewer rounds show no noise: a timing verdict needs at least three
# Other programs using this many cores on average (or more) make wall time measure the queue, not the work.
CONTENDED_CORES = 0.5
# Noise figure kept for the record (the grader of exercise 17 retries past it); no verdict refuses because of it.
NOISY_SPREAD = 2.0

# A round reads the course's wall clock (course_lib/clock.py) and these CPU clocks; tests substitute them all.


def _own_cpu() -> float:
    """CPU seconds of this process and of its children: reaped ones from ``os.times``, live worker processes
    (``multiprocessing``, as DataLoader workers are) from psutil. A child that ends within a round moves from the
    live sum to the reaped one, so it is counted once. Cheap: no scan of every process on the machine.
    """
    reaped = os.times()
    total = time.process_time() + reaped.children_user + reaped.children_system
    others = spinning_pids()  # BusyCores' processes stand in for other programs: not this work
    for child in multiprocessing.active_children():
        if child.pid in others:
            continue
        try:
            t = psutil.Process(child.pid).cpu_times()
        except (psutil.Error, ValueError):  # ended between listing and reading: counted once reaped
            continue
        total += t.user + t.system
    return total


def _machine_cpu() -> float:
    """CPU seconds every program on the machine has used (all cores, busy time only)."""
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    return sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


_cpu_clock: Callable[[], float] = _own_cpu
_machine_clock: Callable[[], float] = _machine_cpu


class OtherPrograms:
    """``with OtherPrograms() as others: ...`` then ``others.cores``: how many cores the rest of the machine used, on
    average, while the block ran (its CPU time minus this process's and its workers', over the block's wall time).

    :func:`compare` measures its rounds with it; a lesson that times contenders its own way (lesson 10) uses it to
    build a :class:`Comparison` that chooses its clock like any other.

    Taught in lesson 10 (``notebooks/10_lightning.ipynb``).
    """

    def __init__(self) -> None:
        self.cores: float | None = None

    def __enter__(self) -> OtherPrograms:
        self._machine, self._own, self._start = _machine_clock(), _cpu_clock(), clock.now()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = clock.now() - self._start
        others = (_machine_clock() - self._machine) - (_cpu_clock() - self._own)
        # The OS counts CPU time in ticks: clamp what a short block's rounding can push past the machine's cores.
        self.cores = min(float(_machine_cores()), max(0.0, others / wall)) if wall > 0 else None


def _machine_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


# --------------------------------------------------------------------------------------------------------
# Formatting
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


def format_ratio(value: float) -> str:
    """Ratios as a reader says them: ``1.04``, ``2.3``, ``17``."""
    if value >= 10:
        return f"{value:.0f}"
    return f"{value:.2f}" if value < 1.995 else f"{value:.1f}"




def _format_amount(value: float, quantity: str) -> str:
    return format_seconds(value) if quantity in TIMED_QUANTITIES else f"{_sig3(value)}"


# --------------------------------------------------------------------------------------------------------
# The statistic: one function that every verdict, every table and `claims check` share
# --------------------------------------------------------------------------------------------------------
def _interval(a_times: Sequence[float], b_times: Sequence[float]) -> tuple[float, float]:
    """The middle half of the per-round ratios (quartiles; min and max below four rounds): how much the paired
    rounds agree. Round ``i`` of each contender ran back to back, so their ratio cancels what drifted between rounds.
    """
    paired = sorted(b / a for a, b in zip(a_times, b_times))
    if len(paired) < 4:
        return paired[0], paired[-1]
    q = statistics.quantiles(paired, n=4, method="inclusive")
    return q[0], q[2]


def decide(a_times: Sequence[float], b_times: Sequence[float], *, band: float = 0.05,
           quantity: str = "wall") -> tuple[str, float, float, float]:
    """``(outcome, ratio, low, high)`` for two contenders' rounds of one quantity (per unit of work, less is better).

    ``ratio`` is a's speed over b's: ``median(b_times) / median(a_times)``, above 1 when ``a`` is faster, so it
    points the way the two medians do. ``low``/``high``: the middle half of the per-round ratios. Decided when the
    ratio is outside ``band`` *and* the rounds agree (``low`` above 1, or ``high`` below 1). Timings need
    ``MIN_TIMED_ROUNDS`` rounds to be decided; a count (any other ``quantity``) is exact.

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    a_times, b_times = list(a_times), list(b_times)
    if len(a_times) != len(b_times) or not a_times:
        raise ValueError(f"a has {len(a_times)} rounds and b has {len(b_times)}: a verdict needs the same number "
                         "of paired rounds (at least one) for both.")
    for side, values in (("a", a_times), ("b", b_times)):
        bad = [v for v in values if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)]
        if bad:
            raise ValueError(f"{side}'s rounds contain {bad}: every value must be finite and positive.")
    if not (isinstance(band, (int, float)) and band >= 0):
        raise ValueError(f"band={band!r} must be >= 0.")
    ratio = statistics.median(b_times) / statistics.median(a_times)
    low, high = _interval(a_times, b_times)
    timed = quantity in TIMED_QUANTITIES
    if timed and len(a_times) < MIN_TIMED_ROUNDS:
        outcome = "too_close"
    elif ratio >= 1 + band and low > 1:
        outcome = "faster"
    elif ratio <= 1 / (1 + band) and high < 1:
        outcome = "slower"
    else:
        outcome = "too_close"
    return outcome, ratio, low, high


def choose_quantity(kind: str, others_cores: float, device: str = "cpu") -> str:
    """``"cpu"`` or ``"wall"``: what a comparison of ``kind`` decides on, given the cores other programs used.

    CPU time only for fixed work (``kind="work"``) on a CPU while other programs used ``CONTENDED_CORES`` or more:
    then wall time measures the wait for a core, CPU time still the work. A comparison about parallelism is about
    wall time (more workers spend *more* CPU time to finish sooner), and on a GPU the host only waits.

    Written by the learner in exercise 18 (``exercises/18_measuring.ipynb``).

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {KINDS}.")
    return "cpu" if kind == "work" and device == "cpu" and others_cores >= CONTENDED_CORES else "wall"


def _spread(values: Sequence[float]) -> float:
    """max/min of ``values``, ignoring the single largest when there are four or more (one hiccup allowed)."""
    vals = sorted(values)
    if len(vals) >= 4:
        vals = vals[:-1]
    return vals[-1] / vals[0] if vals[0] > 0 else math.inf


# --------------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Measurement:
    """One contender's timed rounds: ``seconds[i]`` is the wall time of one call in round ``i``.

    ``cpu_seconds[i]``: CPU time of this process and its children per call in round ``i`` (empty when not
    measured); ``round_seconds[i]`` and ``others_cpu[i]``: the round's whole wall time and the CPU time other
    programs used during it. ``work``: units of work per call.

    Taught in lesson 10 (``notebooks/10_lightning.ipynb``).
    """

    name: str
    seconds: tuple[float, ...]
    work: float = 1.0
    unit: str = "call"
    cpu_seconds: tuple[float, ...] = ()
    round_seconds: tuple[float, ...] = ()
    others_cpu: tuple[float, ...] = ()

    def per_unit(self, quantity: str = "wall") -> tuple[float, ...]:
        """``quantity`` (``"wall"`` or ``"cpu"``) per unit of work, one value per round."""
        values = {"wall": self.seconds, "cpu": self.cpu_seconds}[quantity]
        return tuple(v / self.work for v in values)

    @property
    def median_s(self) -> float:
        """Median wall seconds per call over the rounds."""
        return statistics.median(self.seconds)

    @property
    def median_cpu_s(self) -> float | None:
        """Median CPU seconds per call over the rounds (None when not measured)."""
        return statistics.median(self.cpu_seconds) if self.cpu_seconds else None

    @property
    def cores_used(self) -> float | None:
        """CPU time over wall time: how many cores this contender kept busy, on average (None when not measured)."""
        if not self.cpu_seconds:
            return None
        return sum(self.cpu_seconds) / sum(self.seconds)

    @property
    def rate(self) -> float:
        """Units of work per second at the median wall time (``work`` units per call)."""
        return self.work / self.median_s

    @property
    def spread(self) -> float:
        """max/min of the wall rounds, ignoring the single slowest when there are four or more.

        The same work, timed again: on a quiet machine this stays close to 1.
        """
        return _spread(self.seconds)


@dataclass(frozen=True)
class Verdict:
    """How contender ``a`` compares with contender ``b`` on this machine, right now, on one ``quantity``.

    ``a_times``/``b_times``: the quantity per unit of work in each round (what the verdict was decided on).
    ``ratio``: a's speed over b's, ``median(b_times) / median(a_times)`` (above 1: ``a`` is faster); ``low`` and
    ``high``: the middle half of the per-round ratios, which usually hold ``ratio`` but need not on a busy machine
    (the medians can come from different rounds; :meth:`sentence` then says so).
    ``outcome``: ``"faster"``/``"slower"`` (``a`` than ``b``) or ``"too_close"``.
    ``quantity``: ``"wall"``, ``"cpu"`` or the name of a count; ``reason``: why that quantity, in one clause
    (empty on a quiet machine). ``cores``: one sentence on the cores each contender had (parallel comparisons).

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``), which rebuilds the verdicts its ranks measured.
    """

    a: str
    b: str
    outcome: str
    ratio: float
    low: float
    high: float
    quantity: str
    a_times: tuple[float, ...]
    b_times: tuple[float, ...]
    band: float = 0.05
    unit: str = "call"
    reason: str = ""
    cores: str = ""
    threads: int | None = None
    worst_spread: float = 1.0
    worst_name: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome={self.outcome!r} must be one of {OUTCOMES}.")

    @property
    def rounds(self) -> int:
        return len(self.a_times)

    @property
    def a_seconds(self) -> float:
        """The median of ``a_times`` (seconds per unit of work for a timed quantity)."""
        return statistics.median(self.a_times)

    @property
    def b_seconds(self) -> float:
        return statistics.median(self.b_times)

    @property
    def factor(self) -> float:
        """The size of the difference as a number >= 1 (``2.0`` for both twice as fast and half as fast)."""
        return self.ratio if self.ratio >= 1 else 1.0 / self.ratio

    @property
    def factor_interval(self) -> tuple[float, float]:
        """``(low, high)`` in the direction of :attr:`factor`."""
        return (self.low, self.high) if self.ratio >= 1 else (1.0 / self.high, 1.0 / self.low)

    @property
    def decided(self) -> bool:
        """True when the measurement says which contender is faster."""
        return self.outcome in ("faster", "slower")

    @property
    def winner(self) -> str | None:
        """The faster contender's name, or ``None`` when too close to call."""
        return {"faster": self.a, "slower": self.b}.get(self.outcome)

    @property
    def quantity_name(self) -> str:
        """``"wall-clock time"``, ``"CPU time"`` or the count's own name."""
        return TIMED_QUANTITIES.get(self.quantity, self.quantity)

    def fields(self) -> dict[str, str]:
        """The values an explanation template may use: ``{a}``, ``{b}``, ``{factor}``, ``{ratio}``, ``{low}``,
        ``{high}``, ``{winner}``, ``{loser}``, ``{a_time}``, ``{b_time}``, ``{rounds}``, ``{band}``, ``{quantity}``,
        ``{threads}``."""
        winner, loser = (self.a, self.b) if self.ratio >= 1 else (self.b, self.a)
        return {
            "a": self.a, "b": self.b, "winner": winner, "loser": loser,
            "factor": format_ratio(self.factor), "ratio": format_ratio(self.ratio),
            "low": format_ratio(self.low), "high": format_ratio(self.high),
            "a_time": _format_amount(self.a_seconds, self.quantity),
            "b_time": _format_amount(self.b_seconds, self.quantity),
            "rounds": str(self.rounds), "band": f"{self.band:.0%}", "quantity": self.quantity_name,
            "threads": "" if self.threads is None else str(self.threads),
            "a_rate": _sig3(1 / self.a_seconds), "b_rate": _sig3(1 / self.b_seconds),
        }

    def headline(self) -> str:
        """The phrase that states the outcome, e.g. ``"A was 2.0x faster than B by wall-clock time"``.

        :mod:`course_lib.perf.claims` looks for exactly this phrase in every logged sentence.
        """
        f = self.fields()
        if self.quantity not in TIMED_QUANTITIES:  # a count: lower is better
            if self.outcome == "too_close":
                return f"Too close to call in {f['quantity']}: {f['a']} was {f['ratio']}x lower than {f['b']}"
            word = "lower" if self.outcome == "faster" else "higher"
            return f"{f['a']} was {f['factor']}x {word} than {f['b']} in {f['quantity']}"
        if self.outcome == "too_close":
            return f"Too close to call by {f['quantity']}: {f['a']} ran at {f['ratio']}x the speed of {f['b']}"
        return f"{f['a']} was {f['factor']}x {self.outcome} than {f['b']} by {f['quantity']}"

    def sentence(self) -> str:
        """One or two sentences stating the verdict with its numbers (what a lesson prints before explaining it).

        A lesson shows it through :func:`course_lib.lesson.explain` or :func:`course_lib.lesson.state`, which also
        write it to the claim log (:mod:`course_lib.perf.claims`).
        """
        f = self.fields()
        outside = ""
        # Said in the direction of the number beside it: the factor's for a verdict, the ratio's for a tie.
        lo, hi = (format_ratio(v) for v in (self.factor_interval if self.decided else (self.low, self.high)))
        per = "per " + ("unit of work" if self.unit == "unit" else self.unit)
        if self.quantity in TIMED_QUANTITIES:
            numbers = f"{f['a_time']} vs {f['b_time']} {per}, medians of {f['rounds']} interleaved rounds"
            if self.threads is not None:
                numbers += f" with {self.threads} intra-op thread{'s' if self.threads != 1 else ''}"
            spread = "the rounds' middle half" if self.rounds >= 4 else "the rounds ranged"
            numbers += f"; {spread} {lo}x to {hi}x"
            said = f["factor"] if self.decided else f["ratio"]
            if not float(lo) <= float(said) <= float(hi):  # possible on a busy machine: say why, not a seeming slip
                outside = (f"The medians' {said}x lies outside that range: the two medians can come from different "
                           "rounds, while each round's ratio compares two runs made back to back.")
        else:
            numbers = f"{f['a_time']} vs {f['b_time']} {per}; counted, so the same on a busy machine"
        if self.outcome == "too_close" and self.quantity not in TIMED_QUANTITIES:
            text = f"{self.headline()} ({numbers}): a difference inside {f['band']}."
        elif self.outcome == "too_close":
            if self.quantity in TIMED_QUANTITIES and self.rounds < MIN_TIMED_ROUNDS:
                why = f"too few rounds to see the noise (at least {MIN_TIMED_ROUNDS} decide)"
            elif 1 / (1 + self.band) < self.ratio < 1 + self.band:
                why = f"a difference smaller than the {f['band']} the course treats as noise"
            else:
                why = "the rounds disagreed on the direction, so neither is called faster"
            text = f"{self.headline()} ({numbers}): {why}."
        else:
            text = f"On this machine {self.headline()} ({numbers})."
        return " ".join(part for part in (text, outside, self.reason, self.cores) if part)

    def pick(self, *, faster: Any, slower: Any, too_close: Any) -> Any:
        """The value for this verdict's outcome; every outcome needs one (so every branch is written)."""
        return {"faster": faster, "slower": slower, "too_close": too_close}[self.outcome]

    def row(self) -> str:
        """A Markdown table row from the same statistic as the sentence (see :func:`verdict_table`)."""
        lo, hi = (format_ratio(v) for v in (self.factor_interval if self.decided else (self.low, self.high)))
        f = self.fields()
        if self.outcome == "too_close":
            said = f"too close ({f['ratio']}x)"
        else:
            said = f"{f['factor']}x {self.outcome}"
        return (f"| {self.a} vs {self.b} | {self.quantity_name} | {f['a_time']} | {f['b_time']} | {said} "
                f"| {lo}x to {hi}x |")

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly record (benchmarks and the claim log store it)."""
        return {
            "a": self.a, "b": self.b, "outcome": self.outcome, "ratio": self.ratio, "low": self.low,
            "high": self.high, "quantity": self.quantity, "a_times": list(self.a_times),
            "b_times": list(self.b_times), "band": self.band, "unit": self.unit, "threads": self.threads,
        }


def verdict_table(verdicts: Sequence[Verdict]) -> str:
    """A Markdown table of verdicts: each row states what its verdict's sentence states."""
    rows = ["| comparison | decided on | a (median) | b (median) | verdict | rounds' middle half |",
            "|---|---|---:|---:|---|---|"]
    return "\n".join(rows + [v.row() for v in verdicts])


def _make_verdict(a_name: str, b_name: str, a_times: Sequence[float], b_times: Sequence[float], *,
                  quantity: str, band: float, unit: str, reason: str = "", cores: str = "",
                  threads: int | None = None, spreads: Sequence[tuple[str, float]] = ()) -> Verdict:
    outcome, ratio, low, high = decide(a_times, b_times, band=band, quantity=quantity)
    worst_name, worst = max(spreads, key=lambda s: s[1]) if spreads else ("", 1.0)
    return Verdict(a=a_name, b=b_name, outcome=outcome, ratio=ratio, low=low, high=high, quantity=quantity,
                   a_times=tuple(a_times), b_times=tuple(b_times), band=band, unit=unit, reason=reason,
                   cores=cores, threads=threads, worst_spread=worst, worst_name=worst_name)


def verdict_from_times(a: Measurement, b: Measurement, *, band: float = 0.05, quantity: str = "wall",
                       threads: int | None = None) -> Verdict:
    """Judge ``a`` against ``b`` on ``quantity`` from their paired rounds (round ``i`` of each ran back to back).

    ``band``: differences smaller than this fraction are too close to call whatever the rounds say.

    Taught in lesson 10 (``notebooks/10_lightning.ipynb``).
    """
    if quantity not in TIMED_QUANTITIES:
        raise ValueError(f"quantity={quantity!r} must be one of {sorted(TIMED_QUANTITIES)}.")
    for m in (a, b):
        if quantity == "cpu" and len(m.cpu_seconds) != len(m.seconds):
            raise ValueError(f"{m.name!r} has no CPU time for every round: decide on quantity='wall'.")
    try:
        return _make_verdict(a.name, b.name, a.per_unit(quantity), b.per_unit(quantity), quantity=quantity,
                             band=band, unit=_unit(a, b),
                             threads=threads, spreads=[(a.name, a.spread), (b.name, b.spread)])
    except ValueError as exc:
        raise ValueError(f"comparing {a.name!r} with {b.name!r}: {exc}") from None


def _unit(a: Measurement, b: Measurement) -> str:
    """What one of the verdict's times is per: the contenders' unit of work; ``"item"`` when calls did several
    unnamed units of work (batch 64 against batch 1); ``"unit of work"`` when their units differ."""
    if a.unit != b.unit:
        return "unit"
    if a.unit == "call" and (a.work != 1 or b.work != 1):
        return "item"
    return a.unit


def verdict_from_counts(a: str, a_count: float, b: str, b_count: float, *, count: str, unit: str = "step",
                        band: float = 0.05) -> Verdict:
    """A verdict on a count that does not depend on load (operators launched, bytes copied, recompilations...).

    Lower is better (outcome ``"faster"``, said "Nx lower"): ``a`` needs ``b_count / a_count`` times less of
    ``count``. Counts are exact, so any difference outside ``band`` is decided.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    if not count or count in TIMED_QUANTITIES:
        raise ValueError(f"count={count!r} must name what was counted (e.g. 'operators launched').")
    return _make_verdict(a, b, (float(a_count),), (float(b_count),), quantity=count, band=band, unit=unit)


@dataclass
class Comparison:
    """The rounds of every contender, measured in one interleaved run (by :func:`compare`, or by a lesson's own
    timing together with :class:`OtherPrograms`); :meth:`verdict` chooses the clock and judges.

    Taught in lesson 10 (``notebooks/10_lightning.ipynb``).
    """

    measurements: dict[str, Measurement]
    threads: int
    calls_per_round: dict[str, int] = field(default_factory=dict)
    stopped_by_budget: bool = False
    kind: str = "work"
    device: str = "cpu"
    machine_cores: int = field(default_factory=_machine_cores)
    measured_others_cores: float | None = None  # read once around all the rounds (the OS counts CPU time in ticks)

    def __getitem__(self, name: str) -> Measurement:
        if name not in self.measurements:
            raise KeyError(f"{name!r} was not measured; contenders: {list(self.measurements)}")
        return self.measurements[name]

    @property
    def others_cores(self) -> float | None:
        """Cores other programs used on average during the rounds (None when not measured)."""
        if self.measured_others_cores is not None:
            return self.measured_others_cores
        ms = [m for m in self.measurements.values() if m.others_cpu and m.round_seconds]
        wall = sum(sum(m.round_seconds) for m in ms)
        if not ms or wall <= 0:
            return None
        return min(float(self.machine_cores), max(0.0, sum(sum(m.others_cpu) for m in ms) / wall))

    def quantity(self) -> tuple[str, str]:
        """``(quantity, reason)``: what this comparison's verdicts decide on (:func:`choose_quantity`), and why."""
        others = self.others_cores
        has_cpu = all(len(m.cpu_seconds) == len(m.seconds) and m.seconds for m in self.measurements.values())
        if not has_cpu or others is None:
            return "wall", ""
        if choose_quantity(self.kind, others, self.device) == "cpu":
            return "cpu", (f"Decided on CPU time: other programs used {others:.1f} of the {self.machine_cores} "
                           "cores during the rounds, which stretches wall-clock time but not the CPU time the "
                           "work itself needs.")
        return "wall", ""

    def cores_sentence(self, a: str, b: str) -> str:
        """How many cores each contender kept busy and how many other programs used (parallel comparisons)."""
        ma, mb, others = self[a], self[b], self.others_cores
        if ma.cores_used is None or mb.cores_used is None or others is None:
            return ""
        return (f"During the rounds {a} kept {ma.cores_used:.1f} cores busy and {b} {mb.cores_used:.1f}, while "
                f"other programs used {others:.1f} of the machine's {self.machine_cores}.")

    def verdict(self, a: str, b: str, *, band: float = 0.05) -> Verdict:
        """How ``a`` compares with ``b`` (see :func:`decide`), on the quantity :meth:`quantity` chooses."""
        quantity, reason = self.quantity()
        # A parallel comparison's contenders set their own threads or workers (their names say so).
        threads = self.threads if self.kind == "work" else None
        v = verdict_from_times(self[a], self[b], band=band, quantity=quantity, threads=threads)
        cores = self.cores_sentence(a, b) if self.kind == "parallel" else ""
        return Verdict(**{**v.__dict__, "reason": reason, "cores": cores})

    def fastest(self) -> str:
        """The contender with the lowest median per unit of work, on the quantity :meth:`quantity` chooses."""
        quantity, _ = self.quantity()
        return min(self.measurements.values(), key=lambda m: statistics.median(m.per_unit(quantity))).name

    def table(self) -> str:
        """A Markdown table: contender, median wall and CPU time per call, cores it kept busy, spread of rounds."""
        quantity, _ = self.quantity()
        mark = {q: " (decides)" if q == quantity else "" for q in TIMED_QUANTITIES}
        rows = [f"| contender | wall per call{mark['wall']} | CPU per call{mark['cpu']} | cores busy | rounds "
                "| spread (max/min) |", "|---|---:|---:|---:|---:|---:|"]
        for m in self.measurements.values():
            cpu = "" if m.median_cpu_s is None else format_seconds(m.median_cpu_s)
            cores = "" if m.cores_used is None else f"{m.cores_used:.1f}"
            rows.append(f"| {m.name} | {format_seconds(m.median_s)} | {cpu} | {cores} | {len(m.seconds)} "
                        f"| {format_ratio(m.spread)}x |")
        rows.append("\n*Per call: each round's time over its calls, the median over the rounds. Cores busy: CPU time "
                    "over wall time (this process and its workers).*")
        return "\n".join(rows)


def _time_round(fn: Callable[[], Any], calls: int, device: torch.device) -> tuple[float, float, float]:
    """``(wall, own CPU, machine CPU)`` seconds for ``calls`` calls; the CPU probes stay outside the wall time.

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    synchronize(device)
    machine0, cpu0 = _machine_clock(), _cpu_clock()
    t0 = clock.now()
    for _ in range(calls):
        fn()
    synchronize(device)
    wall = clock.now() - t0
    cpu, machine = _cpu_clock() - cpu0, _machine_clock() - machine0
    return wall, cpu, machine


def _checked_work(names: list[str], work: float | Mapping[str, float], *, rounds: int, min_rounds: int,
                  warmup: int, budget_s: float | None, kind: str) -> dict[str, float]:
    """Refuse a comparison that cannot be made (one clear error each); returns each contender's work per call."""
    if len(names) < 2:
        raise ValueError(f"compare() needs at least two contenders, got {names}.")
    if not isinstance(rounds, int) or rounds < 1 or not isinstance(min_rounds, int) or min_rounds < 1:
        raise ValueError(f"rounds={rounds!r} and min_rounds={min_rounds!r} must be whole numbers >= 1.")
    if not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"warmup={warmup!r} must be >= 1: the first call pays for lazy initialisation.")
    if budget_s is not None and budget_s <= 0:
        raise ValueError(f"budget_s={budget_s!r} must be positive seconds (or None for no budget).")
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {KINDS}: 'parallel' when the comparison is about workers, "
                         "threads or processes, else 'work'.")
    works = {n: float(work[n] if isinstance(work, Mapping) else work) for n in names}
    for n, w in works.items():
        if not (math.isfinite(w) and w > 0):
            raise ValueError(f"work for {n!r} is {w!r}: it must be a positive amount per call.")
    return works


def _calibrated_calls(fn: Callable[[], Any], warmup: int, min_round_s: float, device: torch.device) -> int:
    """Warm ``fn`` up, then the calls per round that make a round last about ``min_round_s``."""
    one = _time_round(fn, warmup, device)[0] / warmup
    calls = max(1, math.ceil(min_round_s / one)) if one > 0 else 1
    if calls > 1:  # the first calls paid for lazy initialisation: calibrate again on a full round
        one = _time_round(fn, calls, device)[0] / calls
        calls = max(1, math.ceil(min_round_s / one)) if one > 0 else 1
    return calls


def _measurement(name: str, rows: list[tuple[float, float, float]], calls: int, work: float,
                 unit: str) -> Measurement:
    """One contender's rounds ``(wall, own CPU, machine CPU)`` as per-call times, with what others took."""
    walls = tuple(max(w, 1e-12) / calls for w, _, _ in rows)
    cpus = tuple(max(cpu, 1e-12) / calls for _, cpu, _ in rows)
    others = tuple(max(0.0, machine - cpu) for _, cpu, machine in rows)
    return Measurement(name, walls, work, unit, cpu_seconds=cpus, round_seconds=tuple(w for w, _, _ in rows),
                       others_cpu=others)


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
    kind: str = "work",
) -> Comparison:
    """Time every contender in interleaved rounds (see the module docstring) and return a :class:`Comparison`.

    ``contenders``: name -> a function doing one unit of the work (one step, one batch, one forward pass).
    ``work``: units of work per call (e.g. samples), one number or one per contender, for rates; ``unit`` names
    one unit of work (``"sample"``), for the sentences.
    ``min_round_s``: calls are repeated within a round until it lasts about this long (calibrated in warm-up).
    ``budget_s``: stop after the round that would exceed it (never before ``min_rounds``).
    ``threads``: intra-op threads during the measurement (default :func:`course_threads`); restored afterwards.
    ``kind``: ``"work"`` (one process, fixed work: CPU time decides when other programs take the cores) or
    ``"parallel"`` (the comparison is about workers, threads or processes: wall time decides, cores reported).

    Taught in lesson 00 (``notebooks/00_welcome.ipynb``).
    """
    names = list(contenders)
    works = _checked_work(names, work, rounds=rounds, min_rounds=min_rounds, warmup=warmup, budget_s=budget_s,
                          kind=kind)
    device = torch.device(device)
    previous_threads = torch.get_num_threads()
    n_threads = course_threads() if threads is None else int(threads)
    torch.set_num_threads(n_threads)
    try:
        started = clock.now()
        # A long measurement says how far it got (a cell silent for seconds gets a status line: heartbeat.py).
        with heartbeat.working_on(f"timing {' vs '.join(names)}", total=rounds, unit="round") as activity:
            calls = {n: _calibrated_calls(contenders[n], warmup, min_round_s, device) for n in names}  # warm-up too
            rows: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
            stopped = False
            with OtherPrograms() as load:  # what the rest of the machine did meanwhile
                for i in range(rounds):
                    order = names if i % 2 == 0 else names[::-1]
                    round_start = clock.now()
                    for n in order:
                        rows[n].append(_time_round(contenders[n], calls[n], device))
                    activity.advance()
                    elapsed, last = clock.now() - started, clock.now() - round_start
                    if budget_s is not None and i + 1 >= min_rounds and i + 1 < rounds and elapsed + last > budget_s:
                        stopped = True
                        break
    finally:
        torch.set_num_threads(previous_threads)
    measurements = {n: _measurement(n, rows[n], calls[n], works[n], unit) for n in names}
    return Comparison(measurements, n_threads, calls, stopped, kind=kind, device=device.type,
                      measured_others_cores=load.cores)
