"""The benchmark: exact figures from fixed times and a fake clock, and ``bench --tiny`` writing both files."""

from __future__ import annotations

import json
import math

import pytest
import torch

from course_lib import clock
from course_lib.perf import bench
from course_lib.perf.bench import (
    LoopCase,
    TimedBatches,
    gpt_flops_per_token,
    interleaved_step_times,
    main,
    median_and_quartiles,
    peak_flops,
    python_calls_per_step,
    step_overhead,
    summarise_loops,
    summarise_overhead,
    to_markdown,
)

CASE = LoopCase("tiny model", d=16, n_blocks=1, batch=8, steps=10)


def test_timed_batches_step_time_is_the_median_gap_after_the_first_step(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter([0.0, 5.0, 6.0, 8.0, 9.0, 10.0])  # the gap after the first request (5 s, warm-up) is skipped
    monkeypatch.setattr(clock, "wall", lambda: next(ticks))
    timed = TimedBatches([(torch.zeros(1), torch.zeros(1))], limit=6)
    assert len(list(timed)) == 6
    assert timed.step_s() == 1.0  # gaps 1, 2, 1, 1


def test_median_and_quartiles() -> None:
    assert median_and_quartiles([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    assert median_and_quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (3.0, 2.0, 4.0)


def test_summarise_loops_pairs_repetitions_and_reports_overhead_in_ms() -> None:
    times = {"course_train": [0.0101, 0.0202, 0.0101, 0.0101, 0.0101],
             "minimal_loop": [0.0100, 0.0200, 0.0100, 0.0100, 0.0100],
             "lightning": [0.0104, 0.0208, 0.0104, 0.0104, 0.0104]}
    s = summarise_loops(CASE, times)
    assert s["ratio_train_vs_minimal"] == pytest.approx(1.01)  # paired: the slow repetition does not move it
    assert s["ratio_train_vs_minimal_quartiles"] == pytest.approx([1.01, 1.01])
    assert s["overhead_ms"]["course_train"]["median"] == pytest.approx(0.1)
    assert s["overhead_ms"]["lightning"] == pytest.approx({"median": 0.4, "low": 0.4, "high": 0.4})
    assert s["overhead_train_vs_lightning"] == pytest.approx(0.25)
    assert s["met_train_vs_minimal"] and s["met_overhead_vs_lightning"]
    assert s["step_ms"]["minimal_loop"] == pytest.approx(10.0) and s["reps"] == 5
    slower = summarise_loops(CASE, {**times, "course_train": [t * 1.03 for t in times["minimal_loop"]]})
    assert slower["ratio_train_vs_minimal"] == pytest.approx(1.03) and not slower["met_train_vs_minimal"]
    assert slower["verdict_train_vs_minimal"] == "faster"  # the minimal loop is the faster one, beyond the 2 % band


def test_interleaving_reverses_the_order_every_other_repetition() -> None:
    calls: list[str] = []

    def contender(name: str):
        def run(model, batches, val, case) -> float:
            calls.append(name)
            return float(len(calls))
        return run

    times = interleaved_step_times(CASE, 3, lambda _: None, {k: contender(k) for k in ("a", "b", "c")})
    assert calls == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert times == {"a": [1.0, 6.0, 7.0], "b": [2.0, 5.0, 8.0], "c": [3.0, 4.0, 9.0]}


def fake_runs(monkeypatch: pytest.MonkeyPatch, costs: dict[str, tuple[float, float, float]],
              calls: list[tuple[str, int]], now: list[float] | None = None) -> dict:
    """Contenders that only advance a fake wall clock and a fake CPU clock (``now[0]``): a run of ``n`` steps takes
    ``setup + n * step + (log lines) * line`` seconds, for ``(setup, step, line)`` in ``costs``."""
    now = [0.0] if now is None else now
    monkeypatch.setattr(clock, "wall", lambda: now[0])
    monkeypatch.setattr(bench.time, "process_time", lambda: now[0] / 2)  # half the wall time: another core's load

    def contender(name: str):
        setup, step, line = costs[name]

        def run(model, batches, val, case) -> float:
            calls.append((name, case.steps))
            now[0] += setup + case.steps * step + (case.steps // case.log_every) * line
            return math.nan
        return run
    return {name: contender(name) for name in costs}


def test_step_overhead_cancels_start_up_and_counts_the_log_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """(time of 2N steps - time of N steps) / N: each run's set-up cancels, exactly; what a loop does once per log
    line stays, spread over the steps (a median gap between batch requests would not see it)."""
    calls: list[tuple[str, int]] = []
    costs = {"a": (0.5, 1e-3, 0.0), "b": (0.05, 1e-3, 5e-3), "c": (3.0, 2e-3, 0.0)}
    case = LoopCase("tiny model", d=16, n_blocks=1, batch=8, steps=100, log_every=50)
    comparison = step_overhead(case, 3, contenders=fake_runs(monkeypatch, costs, calls))
    assert calls == [(n, k) for order in ("abc", "cba", "abc") for n in order for k in (100, 200)]
    assert comparison["a"].seconds == pytest.approx((1e-3,) * 3)
    assert comparison["b"].seconds == pytest.approx((1e-3 + 5e-3 / 50,) * 3)  # a log line every 50 steps
    assert comparison["c"].seconds == pytest.approx((2e-3,) * 3)
    assert comparison["c"].cpu_seconds == pytest.approx((1e-3,) * 3) and comparison["a"].unit == "step"


def test_step_overhead_runs_a_pair_again_when_the_longer_run_was_not_longer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []
    now = [0.0]
    runs = fake_runs(monkeypatch, {"a": (0.0, 1e-3, 0.0)}, calls, now)
    stalls = iter([1.0])

    def stalling(model, batches, val, case) -> float:  # the first N-step run stalls for longer than N more steps
        runs["a"](model, batches, val, case)
        if case.steps == 10:
            now[0] += next(stalls, 0.0)
        return math.nan

    case = LoopCase("tiny model", d=16, n_blocks=1, batch=8, steps=10, log_every=50)
    comparison = step_overhead(case, 1, contenders={"a": stalling})
    assert [k for _, k in calls] == [10, 20, 10, 20]
    assert comparison["a"].seconds == pytest.approx((1e-3,))
    with pytest.raises(RuntimeError, match="never took longer"):
        step_overhead(case, 1, contenders={"a": lambda *args: math.nan})  # no time passes at all


def test_summarise_overhead_pairs_rounds_and_judges_both_goals() -> None:
    case = LoopCase("tiny model", d=16, n_blocks=1, batch=8, steps=100, log_every=50)
    minimal = [1.0e-3, 2.0e-3, 1.0e-3, 1.0e-3, 1.0e-3]  # one slow round: paired figures do not move
    s = summarise_overhead(case, {"minimal_loop": minimal, "course_train": [t * 1.01 for t in minimal],
                                  "lightning": [t + 0.4e-3 for t in minimal]}, "wall")
    assert s["overhead_ms"]["course_train"] == pytest.approx({"median": 0.01, "low": 0.01, "high": 0.01})
    assert s["overhead_ms"]["lightning"]["median"] == pytest.approx(0.4)
    assert s["ratio_train_vs_minimal"] == pytest.approx(1.01) and s["step_ms"]["minimal_loop"] == pytest.approx(1.0)
    assert s["allowed_overhead_ms"] == pytest.approx(0.1)  # a quarter of Lightning's beats 2 % of the step
    assert s["met_overhead"] and s["met_ratio"]
    slower = summarise_overhead(case, {"minimal_loop": minimal, "course_train": [t * 1.03 for t in minimal],
                                       "lightning": [t + 0.04e-3 for t in minimal]}, "wall")
    assert slower["allowed_overhead_ms"] == pytest.approx(0.02)  # 2 % of the step beats a quarter of Lightning's
    assert not slower["met_overhead"] and not slower["met_ratio"]


def test_python_calls_per_step_counts_what_each_step_calls() -> None:
    def helper() -> None:
        pass

    def run(model, batches, val, case) -> float:
        for _ in range(5):  # once per run: cancels
            helper()
        for _ in range(case.steps):
            helper()  # a Python call per step
            len(batches)  # and a C function called from Python
        return math.nan

    assert python_calls_per_step(run, CASE) == 2.0


@pytest.mark.slow
def test_bench_tiny_writes_both_files(tmp_path) -> None:
    threads = torch.get_num_threads()
    code = main(["--tiny", "--threads", "1", "--clock", "cpu", "--out", str(tmp_path),
                 "--only", "loops", "overhead", "loaders", "in_memory",
                 "compile", "precision", "gpu"])
    report = json.loads((tmp_path / "latest.json").read_text())
    assert code == 0, report["errors"]
    assert report["machine"]["torch_threads"] == 1 and torch.get_num_threads() == threads
    res = report["results"]
    assert set(res["training_loops"]["cases"]) == {"bench model", "tiny model"}
    for case in res["training_loops"]["cases"].values():
        assert case["reps"] == 2 and len(case["all_step_ms"]["lightning"]) == 2 and case["clock"] == "cpu"
        assert all(math.isfinite(case["overhead_ms"][k]["median"]) for k in ("course_train", "lightning"))
        assert case["ratio_ops_train_vs_minimal"] >= 1.0  # train() never does less work than the minimal loop
    assert set(res["step_overhead"]["cases"]) == {"bench model", "tiny model"}
    for case in res["step_overhead"]["cases"].values():
        assert case["rounds"] == 2 and case["quantity"] == "cpu" and case["log_every"] == 50
        assert all(v > 0 for v in case["step_ms"].values()), case["step_ms"]
        assert case["python_calls_per_step"]["lightning"] > case["python_calls_per_step"]["course_train"]
    assert math.isfinite(res["loaders"]["ratio_tuned_vs_workers0"])
    assert math.isfinite(res["in_memory"]["ratio_devicebatcher_vs_dataloader"])
    assert math.isfinite(res["compile"]["ratio_compiled_vs_eager_step_time"])
    assert math.isfinite(res["precision"]["ratio_bf16_vs_fp32_step_time"])
    assert report["machine"]["cores"] >= 1 and report["machine"]["torch"] and len(report["load_average_end"]) == 3
    md = (tmp_path / "latest.md").read_text()
    assert md == to_markdown(report)
    assert "| (a) tiny model: `train()` step time / minimal loop (quartiles " in md and "Machine:" in md
    assert "| (a) tiny model, per-step overhead above the minimal loop's " in md


def test_cpu_clock_needs_one_thread() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--tiny", "--clock", "cpu", "--threads", "2", "--only", "loops"])
    assert exc.value.code == 2


def test_flops_and_peak_table() -> None:
    assert gpt_flops_per_token(1000, 2, 64, 128) == 6000 + 12 * 2 * 64 * 128
    assert peak_flops("NVIDIA H100 80GB HBM3") and peak_flops("Mystery GPU") is None
    assert peak_flops("Mystery GPU", 100.0) == 100e12
