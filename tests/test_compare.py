"""The measurement protocol (course_lib.perf.compare) and the text generated from its verdicts."""

from __future__ import annotations

import os

import pytest
import torch

from course_lib import clock as course_clock
from course_lib import lesson
from course_lib.perf import compare as cmp
from course_lib.perf.compare import Measurement, verdict_from_times


def m(name: str, *seconds: float, work: float = 1.0) -> Measurement:
    return Measurement(name, tuple(seconds), work)


# Synthetic measurements, one per outcome (a compared with b).
SYNTHETIC = {
    "faster": (m("A", 1.0, 1.1, 0.9, 1.0, 1.05), m("B", 2.0, 2.1, 1.9, 2.2, 2.0)),
    "slower": (m("A", 3.0, 3.2, 3.1, 2.9, 3.0), m("B", 1.0, 1.1, 1.0, 0.95, 1.0)),
    "too_close": (m("A", 1.0, 1.2, 0.9, 1.1, 1.0), m("B", 1.05, 0.95, 1.1, 1.0, 1.02)),
}


@pytest.mark.parametrize("outcome", list(SYNTHETIC))
def test_each_outcome_is_recognised_and_its_sentence_agrees(outcome: str) -> None:
    a, b = SYNTHETIC[outcome]
    v = verdict_from_times(a, b)
    assert v.outcome == outcome
    text = v.sentence()
    assert "wall-clock time" in text  # every sentence names the quantity it rests on
    if outcome == "faster":
        assert v.ratio == pytest.approx(2.0, rel=0.1) and "A was 2.0x faster than B by wall-clock time" in text
        assert v.winner == "A"
    elif outcome == "slower":
        assert v.factor == pytest.approx(3.0, rel=0.1) and "A was 3.0x slower than B by wall-clock time" in text
        assert v.winner == "B"
        lo, hi = v.factor_interval  # the interval is said in the direction of the factor: no "0.3x slower"
        assert 1 < lo <= v.factor <= hi and "half 0." not in text
    else:
        assert "Too close to call" in text and "faster than" not in text and "slower than" not in text
        assert v.winner is None


def test_busy_rounds_still_teach() -> None:
    """Rounds that spread 3x (the old "too busy" refusal) still give a verdict; the spread is only recorded."""
    v = verdict_from_times(m("A", 1.0, 3.5, 1.0, 3.2, 1.1), m("B", 4.0, 4.1, 3.9, 4.2, 4.0))
    assert v.outcome == "faster" and v.worst_spread > 2 and "busy" not in v.sentence()


def test_the_direction_always_agrees_with_the_medians_shown() -> None:
    """The statistic is the ratio of the medians shown beside it, so the two cannot point different ways."""
    import random

    rng = random.Random(1)
    for _ in range(300):
        n = rng.choice([3, 4, 5, 7])
        a = [rng.uniform(0.5, 2.0) for _ in range(n)]
        b = [rng.uniform(0.5, 2.0) for _ in range(n)]
        v = verdict_from_times(m("A", *a), m("B", *b))
        if v.outcome == "faster":
            assert v.a_seconds < v.b_seconds
        elif v.outcome == "slower":
            assert v.a_seconds > v.b_seconds
        row = v.row()
        assert cmp.format_seconds(v.a_seconds) in row and cmp.format_seconds(v.b_seconds) in row


def test_a_consistent_small_difference_inside_the_band_is_too_close() -> None:
    v = verdict_from_times(m("A", 1.0, 1.0, 1.0), m("B", 1.03, 1.03, 1.03))
    assert v.outcome == "too_close" and v.ratio == pytest.approx(1.03)
    assert verdict_from_times(m("A", 1.0, 1.0, 1.0), m("B", 1.03, 1.03, 1.03), band=0.01).outcome == "faster"


def test_rounds_that_disagree_are_too_close_even_with_a_large_median() -> None:
    # Median ratio 1.5, but two of five rounds say the opposite: the interval reaches below 1.
    v = verdict_from_times(m("A", 1.0, 1.0, 1.0, 1.0, 1.0), m("B", 1.5, 1.6, 0.9, 0.95, 1.5))
    assert v.ratio == pytest.approx(1.5) and v.low < 1 and v.outcome == "too_close"


def test_two_rounds_of_a_timing_are_never_decided_but_a_count_is_exact() -> None:
    assert verdict_from_times(m("A", 1.0, 1.0), m("B", 5.0, 5.0)).outcome == "too_close"
    v = cmp.verdict_from_counts("fused", 3, "eager", 12, count="kernels launched")
    assert v.outcome == "faster" and v.ratio == 4
    assert "fused was 4.0x lower than eager in kernels launched" in v.sentence()
    assert "the same on a busy machine" in v.sentence()
    more = cmp.verdict_from_counts("plain", 8e6, "checkpointed", 2e6, count="bytes saved for backward")
    assert more.outcome == "slower"
    assert "plain was 4.0x higher than checkpointed in bytes saved for backward" in more.sentence()
    assert cmp.verdict_from_counts("a", 10, "b", 10, count="graph breaks").outcome == "too_close"
    with pytest.raises(ValueError, match="name what was counted"):
        cmp.verdict_from_counts("a", 1, "b", 2, count="wall")


def test_work_per_call_turns_times_into_per_item_times() -> None:
    # batch 64 in 10 s per call is 156 ms per sample; batch 1 in 1 s is 1 s per sample: batch 64 is 6.4x faster.
    v = verdict_from_times(m("batch 64", 10.0, 10.0, 10.0, work=64), m("batch 1", 1.0, 1.0, 1.0, work=1))
    assert v.outcome == "faster" and v.ratio == pytest.approx(6.4)
    assert "(156 ms vs 1 s per item," in v.sentence()
    samples = Measurement("b64", (10.0,) * 3, 64, "sample"), Measurement("b1", (1.0,) * 3, 1, "sample")
    assert "per sample" in verdict_from_times(*samples).sentence()


def test_one_hiccup_is_allowed_in_the_spread() -> None:
    assert m("A", 1.0, 1.0, 5.0, 1.0).spread == pytest.approx(1.0)
    assert m("A", 1.0, 2.5, 5.0, 1.0).spread == pytest.approx(2.5)
    assert verdict_from_times(m("A", 1.0, 1.0, 5.0, 1.0), m("B", 2.0, 2.0, 2.0, 2.0)).outcome == "faster"


def _with_cpu(name: str, walls: tuple[float, ...], cpus: tuple[float, ...], others: float) -> Measurement:
    return Measurement(name, walls, cpu_seconds=cpus, round_seconds=walls, others_cpu=tuple(w * others for w in walls))


def test_a_busy_machine_moves_fixed_work_to_cpu_time_and_says_why() -> None:
    # Wall times are stretched by other programs and disagree; the CPU times still show A doing half the work.
    a = _with_cpu("A", (2.0, 1.0, 3.0, 1.5, 2.5), (1.0, 1.0, 1.0, 1.0, 1.0), others=1.9)
    b = _with_cpu("B", (2.5, 3.0, 1.8, 2.2, 2.9), (2.0, 2.1, 1.9, 2.0, 2.0), others=1.9)
    busy = cmp.Comparison({"A": a, "B": b}, threads=1, machine_cores=2)
    v = busy.verdict("A", "B")
    assert busy.quantity()[0] == "cpu" and v.quantity == "cpu" and v.outcome == "faster"
    assert "by CPU time" in v.sentence() and "other programs used 1.9 of the 2 cores" in v.sentence()
    assert "(decides)" in busy.table().splitlines()[0].split("|")[3]  # the CPU column is the one that decides
    quiet = cmp.Comparison({"A": _with_cpu("A", a.cpu_seconds, a.cpu_seconds, 0.05),
                            "B": _with_cpu("B", b.cpu_seconds, b.cpu_seconds, 0.05)}, threads=1, machine_cores=2)
    assert quiet.verdict("A", "B").quantity == "wall" and "Decided on" not in quiet.verdict("A", "B").sentence()
    # About parallelism: wall time decides whatever the load, and the cores each side had explain it.
    par = cmp.Comparison({"A": a, "B": b}, threads=1, kind="parallel", machine_cores=2)
    pv = par.verdict("A", "B")
    assert pv.quantity == "wall" and "other programs used 1.9 of the machine's 2" in pv.sentence()
    # On a GPU the host only waits: wall time.
    assert cmp.Comparison({"A": a, "B": b}, threads=1, device="cuda", machine_cores=2).quantity()[0] == "wall"


@pytest.mark.parametrize(
    "a,b,match",
    [
        (m("A", 1.0, 1.0), m("B", 1.0), "paired rounds"),
        (m("A", 1.0), m("B", 0.0), "finite and positive"),
        (m("A", float("nan")), m("B", 1.0), "finite and positive"),
    ],
)
def test_verdict_rejects_bad_measurements(a: Measurement, b: Measurement, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        verdict_from_times(a, b)


class FakeClock:
    """Each contender call advances time by its own fixed cost; the clock reads the running total."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_compare_interleaves_calibrates_and_measures_exact_fake_times(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(course_clock, "wall", clock)
    monkeypatch.setattr(cmp, "_cpu_clock", clock)  # all of the time is this process's work
    monkeypatch.setattr(cmp, "_machine_clock", clock)  # and nothing else ran
    order: list[str] = []

    def contender(name: str, cost: float):
        def call() -> None:
            order.append(name)
            clock.now += cost
        return call

    result = cmp.compare(
        {"fast": contender("fast", 0.001), "slow": contender("slow", 0.004)}, rounds=4, min_round_s=0.01, threads=1
    )
    assert result.calls_per_round == {"fast": 10, "slow": 3}
    assert result["fast"].seconds == pytest.approx((0.001,) * 4)
    assert result["slow"].seconds == pytest.approx((0.004,) * 4)
    v = result.verdict("fast", "slow")
    assert v.outcome == "faster" and v.ratio == pytest.approx(4.0)
    # Warm-up: one call each, then one round's worth to re-check the calibration. Then the rounds alternate the
    # order: fast slow, slow fast, fast slow, slow fast.
    assert order[:15] == ["fast"] * 11 + ["slow"] * 4
    rounds = [["fast"] * 10 + ["slow"] * 3, ["slow"] * 3 + ["fast"] * 10] * 2
    assert order[15:] == [name for r in rounds for name in r]
    assert result.fastest() == "fast" and "| fast | 1 ms | 1 ms | 1.0 | 4 |" in result.table()
    assert result.others_cores == 0 and v.quantity == "wall"


def test_a_slow_first_call_does_not_shorten_the_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(course_clock, "wall", clock)
    calls = {"n": 0}

    def lazy() -> None:  # the first call pays 5 ms of lazy initialisation, then each call costs 0.1 ms
        calls["n"] += 1
        clock.now += 0.005 if calls["n"] == 1 else 0.0001

    result = cmp.compare({"lazy": lazy, "other": lazy}, rounds=2, min_round_s=0.01, threads=1)
    # Calibrated on the first call alone, a round would be 2 calls (0.2 ms): far too short for a clock to resolve.
    assert result.calls_per_round["lazy"] == 100


def test_compare_stops_at_the_budget_after_min_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(course_clock, "wall", clock)

    def call() -> None:
        clock.now += 1.0

    result = cmp.compare({"a": call, "b": call}, rounds=50, min_round_s=0.0, budget_s=7.0, min_rounds=3, threads=1)
    # warm-up 2 s, each round 2 s: rounds end at 4, 6, 8 s; the third would pass 7 s only after min_rounds.
    assert len(result["a"].seconds) == 3 and result.stopped_by_budget


def test_compare_restores_threads_and_rejects_bad_input() -> None:
    before = torch.get_num_threads()
    cmp.compare({"a": lambda: None, "b": lambda: None}, rounds=1, min_round_s=0.0, threads=1)
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="at least two"):
        cmp.compare({"a": lambda: None})
    with pytest.raises(ValueError, match="warmup"):
        cmp.compare({"a": lambda: None, "b": lambda: None}, warmup=0)
    with pytest.raises(ValueError, match="work"):
        cmp.compare({"a": lambda: None, "b": lambda: None}, work={"a": 1, "b": 0})


def test_course_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COURSE_THREADS", "3")
    assert cmp.course_threads() == 3
    monkeypatch.setenv("COURSE_THREADS", "zero")
    with pytest.raises(ValueError, match="COURSE_THREADS"):
        cmp.course_threads()
    monkeypatch.delenv("COURSE_THREADS")
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert cmp.course_threads() == 4
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert cmp.course_threads() == 1


def test_format_seconds() -> None:
    assert cmp.format_seconds(0.000123) == "123 µs"
    assert cmp.format_seconds(0.0039181459997053025) == "3.92 ms"
    assert cmp.format_seconds(2.5) == "2.5 s"
    assert cmp.format_seconds(4e-8) == "40 ns"


BRANCHES = dict(
    faster="{a} wins because the work runs in one call.",
    slower="{a} lost: the per-call overhead dominated at this size.",
    too_close="Here the difference is smaller than the noise.",
)


@pytest.mark.parametrize("outcome", list(SYNTHETIC))
def test_explain_leads_with_the_verdict_and_takes_the_branch_of_its_outcome(outcome: str) -> None:
    v = verdict_from_times(*SYNTHETIC[outcome])
    text = lesson.explain(v, **BRANCHES)
    assert text.startswith(v.sentence())
    expected_branch = {"faster": "A wins", "slower": "A lost", "too_close": "smaller than the noise"}
    for branch, marker in expected_branch.items():
        assert (marker in text) == (branch == outcome)


def test_explain_requires_every_branch_and_known_fields() -> None:
    v = verdict_from_times(*SYNTHETIC["faster"])
    with pytest.raises(ValueError, match="too_close"):
        lesson.explain(v, faster="x", slower="y", too_close=" ")
    with pytest.raises(ValueError, match="unknown_field"):
        lesson.explain(v, faster="{unknown_field}", slower="y", too_close="z")
    assert "3 layers" in lesson.explain(v, faster="{n} layers", slower="y", too_close="z", n=3)


def test_pick_needs_a_value_per_outcome() -> None:
    with pytest.raises(TypeError):
        verdict_from_times(*SYNTHETIC["faster"]).pick(faster="f", slower="s")  # type: ignore[call-arg]
    assert verdict_from_times(*SYNTHETIC["slower"]).pick(faster="f", slower="s", too_close="t") == "s"


def test_busy_cores_count_as_other_programs_not_as_the_work() -> None:
    """BusyCores' spinning processes are children of this process, yet their CPU time is not the work's."""
    from course_lib.perf.busy import BusyCores

    def work() -> None:
        torch.randn(64, 64) @ torch.randn(64, 64)

    with BusyCores(2, max_s=30):
        result = cmp.compare({"a": work, "b": work}, rounds=3, min_round_s=0.05, threads=1)
    for m in result.measurements.values():
        # one thread of work: its CPU time cannot exceed its wall time by the two spinners' worth
        assert m.cores_used is not None and m.cores_used < 1.5, m
    assert result.others_cores is not None and result.others_cores > 1.0


def test_a_ratio_of_medians_outside_the_rounds_middle_half_is_explained_not_left_as_a_contradiction() -> None:
    """On a busy machine the medians can come from different rounds: the ratio of the medians (the headline) then
    lies outside the middle half of the per-round ratios, and the sentence says why instead of reading as a slip."""
    a = m("A", 1.0, 1.0, 1.0, 1.0, 4.0, 4.0, 4.0)
    b = m("B", 3.0, 3.0, 3.0, 3.2, 5.0, 5.0, 5.0)  # per round: 3, 3, 3, 3.2, 1.25, 1.25, 1.25
    v = verdict_from_times(b, a)
    assert v.outcome == "slower" and v.factor == pytest.approx(3.2) and v.factor_interval[1] < 3.2
    assert "The medians' 3.2x lies outside that range" in v.sentence()
    inside = verdict_from_times(*SYNTHETIC["faster"])
    assert inside.factor_interval[0] <= inside.factor <= inside.factor_interval[1]
    assert "lies outside" not in inside.sentence()
