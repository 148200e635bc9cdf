"""Timing helpers: warm-up excluded, the device synchronised, the context reported."""

from __future__ import annotations

import pytest
import torch

from course_lib import clock as course_clock
from course_lib.perf import timing


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SlowThenFast(torch.nn.Module):
    """Each call advances a fake clock: 100 s for the first `slow` calls, then 1 ms."""

    def __init__(self, clock: FakeClock, slow: int) -> None:
        super().__init__()
        self.clock, self.slow, self.calls = clock, slow, 0
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.clock.now += 100.0 if self.calls <= self.slow else 0.001
        return self.lin(x)


def test_measure_latency_excludes_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(course_clock, "wall", clock)
    model = SlowThenFast(clock, slow=3)
    result = timing.measure_latency(model, torch.randn(1, 4), device="cpu", warmup=3, reps=7)
    assert model.calls == 10
    assert len(result.times_ms) == 7
    assert result.median_ms == pytest.approx(1.0)
    assert result.p90_ms == pytest.approx(1.0)
    assert not model.training  # eval mode
    assert (result.shape, result.batch, result.device, result.precision) == ((1, 4), 1, "cpu", "fp32")
    text = result.summary()
    for part in ("median", "p90", "warm-up 3", "repetitions 7", "(1, 4)", "fp32"):
        assert part in text


def test_measure_latency_runs_under_inference_mode() -> None:
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(torch.is_inference_mode_enabled())
            return x * 2

    timing.measure_latency(Probe(), torch.randn(2, 3), device="cpu", warmup=1, reps=2)
    assert seen == [True, True, True]


def test_timer_synchronises_cuda_at_enter_and_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    clock = FakeClock()
    monkeypatch.setattr(course_clock, "wall", clock)
    with timing.Timer("cuda") as t:
        assert len(calls) == 1
        clock.now += 0.25
    assert len(calls) == 2
    assert t.elapsed == 0.25


def test_cuda_timing_uses_events_and_synchronises(monkeypatch: pytest.MonkeyPatch) -> None:
    syncs, events = [], []

    class FakeEvent:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            events.append(self)

        def record(self) -> None:
            pass

        def elapsed_time(self, other: FakeEvent) -> float:
            return 2.5

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    count = []
    times = timing._time_calls(lambda: count.append(1), torch.device("cuda"), warmup=4, reps=6)
    assert len(count) == 10 and times == [2.5] * 6
    assert len(events) == 12  # a start and an end event per timed call, none for warm-up
    assert len(syncs) >= 6  # at least one synchronise per timed call


def test_throughput_and_end_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(course_clock, "wall", clock)
    model = SlowThenFast(clock, slow=1)  # the warm-up call takes 100 s and must not count
    big = timing.measure_latency(model, torch.randn(32, 4), device="cpu", warmup=1, reps=3)
    assert big.samples_per_s == pytest.approx(32_000)  # 32 samples per 1 ms
    res = timing.end_to_end_latency(lambda x: model(x * 2).argmax(-1), torch.randn(1, 4), warmup=1, reps=3)
    assert res.what == "end-to-end" and res.times_ms == pytest.approx([1.0] * 3)


def test_now_reads_the_substitutable_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    clock.now = 12.5
    monkeypatch.setattr(course_clock, "wall", clock)
    assert timing.now() == 12.5


def test_bad_counts_are_rejected_before_work() -> None:
    model = SlowThenFast(FakeClock(), 0)
    with pytest.raises(ValueError, match="reps"):
        timing.measure_latency(model, torch.randn(1, 4), device="cpu", reps=0)
    assert model.calls == 0
