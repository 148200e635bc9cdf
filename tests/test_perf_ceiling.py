"""course_lib.perf.ceiling: the roofline's arithmetic, the measured ceiling, and its cache."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pytest
import torch

from course_lib import clock
from course_lib.perf import ceiling as ceilings
from course_lib.perf.ceiling import (
    Ceiling,
    CeilingConfig,
    best_call_seconds,
    cached_ceiling,
    matmul_flops,
    measure_ceiling,
    ridge_intensity,
    roofline_point,
    training_step_bytes,
)

matplotlib.use("Agg")

TINY = CeilingConfig(sizes=(16, 32), shapes=((48, 16, 8),), stream_mib=1, seconds_per_shape=0.0)


def test_below_the_ridge_memory_limits_and_above_it_compute_does() -> None:
    # peak 100 FLOP/s, 10 B/s: the ridge is at 10 FLOP/byte.
    low = roofline_point(flops=50, bytes_moved=10, peak_flops=100, bandwidth=10)
    assert (low.intensity, low.attainable, low.bound) == (5.0, 50.0, "memory")
    high = roofline_point(flops=400, bytes_moved=10, peak_flops=100, bandwidth=10)
    assert (high.intensity, high.attainable, high.bound) == (40.0, 100.0, "compute")
    at = roofline_point(flops=100, bytes_moved=10, peak_flops=100, bandwidth=10)
    assert (at.attainable, at.bound) == (100.0, "compute")
    assert ridge_intensity(100, 10) == 10.0


@pytest.mark.parametrize("name, kwargs", [
    ("flops", dict(flops=0, bytes_moved=1, peak_flops=1, bandwidth=1)),
    ("bytes_moved", dict(flops=1, bytes_moved=-2, peak_flops=1, bandwidth=1)),
    ("peak_flops", dict(flops=1, bytes_moved=1, peak_flops=True, bandwidth=1)),
    ("bandwidth", dict(flops=1, bytes_moved=1, peak_flops=1, bandwidth="fast")),
])
def test_a_value_that_is_not_positive_is_named(name: str, kwargs: dict) -> None:
    with pytest.raises(ValueError, match=f"^{name}="):
        roofline_point(**kwargs)


def test_the_best_call_counts_and_the_warm_up_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    costs = iter([5.0, 3.0, 1.0, 2.0, 4.0, 9.0, 9.0])  # the first (warm-up) call is the slowest
    now = [0.0]
    monkeypatch.setattr(clock, "wall", lambda: now[0])

    def call() -> None:
        now[0] += next(costs)

    assert best_call_seconds(call, torch.device("cpu"), seconds=0.0, min_calls=4) == 1.0


def test_a_step_moves_at_least_its_state_and_activations_twice() -> None:
    assert training_step_bytes(100, 30, "adamw") == 10 * 100 + 60
    assert training_step_bytes(100, 30, "sgd") == 6 * 100 + 60
    with pytest.raises(ValueError, match="optimizer="):
        training_step_bytes(1, 1, "lion")


def test_a_tiny_sweep_measures_every_shape_and_keeps_the_best(monkeypatch: pytest.MonkeyPatch) -> None:
    result = measure_ceiling("cpu", TINY, progress=False)
    shapes = {(r["m"], r["n"], r["k"]) for r in result.sweep if r["dtype"] == "float32"}
    assert shapes == {(16, 16, 16), (32, 32, 32), (48, 16, 8)}
    best = max((r for r in result.sweep if r["dtype"] == "float32"), key=lambda r: r["flops_per_s"])
    assert result.matmul["float32"] == best["flops_per_s"] > 0
    assert result.best_shape["float32"] == (best["m"], best["n"], best["k"])
    assert result.copy_bandwidth > 0 and result.triad_bandwidth > 0
    assert result.bandwidth == max(result.copy_bandwidth, result.triad_bandwidth)
    assert result.threads >= 1 and result.datasheet is None  # no datasheet figure applies to a CPU
    assert "GFLOP/s" in result.summary() and "GB/s" in result.summary()


def _fake(others: float | None, flops: float = 1e9) -> Ceiling:
    return Ceiling(device="cpu", name="test cpu", threads=1, torch_version="x", matmul={"float32": flops},
                   best_shape={"float32": (8, 8, 8)}, sweep=[], copy_bandwidth=2e9, triad_bandwidth=3e9,
                   others_cores=others)


def test_the_ceiling_is_measured_once_then_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    made = []
    monkeypatch.setattr(ceilings, "measure_ceiling", lambda *a, **k: made.append(1) or _fake(0.1, 1e9 + len(made)))
    first = cached_ceiling("cpu", progress=False)
    again = cached_ceiling("cpu", progress=False)
    assert len(made) == 1 and again == first and again.best_shape["float32"] == (8, 8, 8)
    cached_ceiling("cpu", refresh=True, progress=False)
    assert len(made) == 2


def test_a_ceiling_measured_on_a_busy_machine_is_reused_and_says_so(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    busy = _fake(1.5, 1e9)
    busy.seconds, busy.measured_epoch = 8.0, 1000.0
    results = iter([busy, _fake(0.0, 4e9)])
    monkeypatch.setattr(ceilings, "measure_ceiling", lambda *a, **k: next(results))
    measured = cached_ceiling("cpu", progress=False)
    assert not measured.from_cache and measured.provenance().startswith("Measured now in 8.0 s")
    again = cached_ceiling("cpu", progress=False)
    assert again.peak() == 1e9 and again.from_cache  # reused: measuring again is the learner's call
    said = again.provenance(now=1000.0 + 2 * 3600 + 5)
    assert "measured 2 hours ago in 8.0 s" in said and "1.5 core(s)" in said and "may be low" in said
    assert "refresh=True" in said
    assert cached_ceiling("cpu", refresh=True, progress=False).peak() == 4e9


def _rated(rates: dict[str, float]):
    """A stand-in for one sweep row: ``rates[dtype]`` FLOP/s at every shape; records the shapes measured."""
    measured: list[tuple[str, int]] = []

    def row(dtype: str, m: int, n: int, k: int, device: object, seconds: float) -> dict:
        measured.append((dtype, m))
        return {"dtype": dtype, "m": m, "n": n, "k": k, "flops_per_s": rates[dtype]}
    return row, measured


def test_a_dtype_slower_than_fp32_is_not_swept_past_two_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ceilings, "fast_dtypes", lambda device: ["float32", "bfloat16"])
    row, measured = _rated({"float32": 1e12, "bfloat16": 1e10})
    monkeypatch.setattr(ceilings, "_matmul_row", row)
    config = CeilingConfig(sizes=(16, 32, 64, 128), shapes=(), stream_mib=1, seconds_per_shape=0.0)
    result = measure_ceiling("cpu", config, progress=False)
    assert [m for dtype, m in measured if dtype == "bfloat16"] == [16, 32]
    assert [m for dtype, m in measured if dtype == "float32"] == [16, 32, 64, 128]
    assert result.slow_path("bfloat16") and not result.slow_path("float32")
    assert result.stopped["bfloat16"]["shape"] == [32, 32, 32] and result.stopped["bfloat16"]["ratio"] == 0.01
    assert result.largest_swept("bfloat16") == matmul_flops(32, 32, 32)
    assert "no fast bfloat16 path here" in result.summary()


def test_a_shape_whose_call_would_run_past_the_cap_is_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ceilings, "fast_dtypes", lambda device: ["float32"])
    row, measured = _rated({"float32": 1e6})  # 1 MFLOP/s: a 64-wide multiply (0.5 MFLOP) takes 0.5 s
    monkeypatch.setattr(ceilings, "_matmul_row", row)
    config = CeilingConfig(sizes=(16, 32, 64), shapes=(), stream_mib=1, seconds_per_shape=0.0, max_call_s=0.1)
    result = measure_ceiling("cpu", config, progress=False)
    assert [m for _, m in measured] == [16, 32]
    assert result.stopped["float32"]["reason"] == ceilings.CALL_TOO_LONG and not result.slow_path("float32")
    assert result.seconds > 0 and result.measured_epoch > 0


@pytest.mark.parametrize("content", ["{not json", json.dumps({"version": 0}), json.dumps({"version": 1})])
def test_an_unreadable_or_old_cache_is_measured_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      content: str) -> None:
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    path = ceilings.cache_path("cpu")
    path.parent.mkdir(parents=True)
    path.write_text(content, encoding="utf-8")
    monkeypatch.setattr(ceilings, "measure_ceiling", lambda *a, **k: _fake(0.0, 7e9))
    assert cached_ceiling("cpu", progress=False).peak() == 7e9
    assert Ceiling.from_json(json.loads(path.read_text(encoding="utf-8"))).peak() == 7e9


def test_the_roofline_plot_shows_every_point_and_roof() -> None:
    import matplotlib.pyplot as plt

    points = [{"name": f"op {i}", "intensity": 0.1 * (i + 1), "achieved": 1e8 * (i + 1)} for i in range(12)]
    ax = ceilings.plot_roofline(_fake(0.0), points, moves=[("op 0", "op 1")])
    labels = [line.get_label() for line in ax.get_lines()]
    assert [f"op {i}" for i in range(12)] == [label for label in labels if label.startswith("op ")]
    assert any(label.startswith("roof: float32") for label in labels)
    markers = {line.get_marker() for line in ax.get_lines() if line.get_label().startswith("op ")}
    assert len(markers) == 2  # twelve points: colours repeat after ten, the marker tells them apart
    plt.close(ax.figure)


def test_the_gpu_table_gives_mfu_against_the_datasheet_and_the_measured_peak() -> None:
    from course_lib.perf.mfu import format_rows

    rows = [{"contender": "bf16 + compile", "precision": "bf16", "batch": 64, "tokens_per_s": 1000.0, "mfu": 0.40,
             "peak_flops": 989e12, "mfu_measured": 0.55, "vs_first": 1.0},
            {"contender": "fp32 eager", "precision": "fp32", "tokens_per_s": 100.0, "mfu": None, "peak_flops": None,
             "vs_first": 0.1}]
    table = format_rows({"rows": rows}).splitlines()
    assert "MFU (datasheet)" in table[0] and "MFU (measured peak)" in table[0]
    assert "| 40.0% | 989 TFLOP/s | 55.0% |" in table[2]
    assert "| - | unknown | - |" in table[3]  # neither figure known: said, not invented
    assert "| bf16 | 64 |" in table[2] and "| fp32 | - |" in table[3]  # a row's own batch; none known: a dash
