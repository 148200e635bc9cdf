"""The DataLoader playground, driven from Python (no browser): controls, Run, the experiment order, table, plot."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from course_lib import widgets


@pytest.fixture
def dataset():
    return TensorDataset(torch.randn(96, 3, 8, 8), torch.arange(96) % 4)


@pytest.fixture
def playground(dataset):
    return widgets.loader_playground(dataset, device="cpu", n_batches=2)


def test_every_part_has_its_css_class(playground):
    found = set()

    def walk(w):
        found.update(w._dom_classes)
        for child in getattr(w, "children", ()):
            walk(child)

    walk(playground)
    assert set(widgets.CSS_CLASSES.values()) <= found


def test_controls_follow_the_rules(playground, dataset):
    assert playground.num_workers.max >= 1 and playground.num_workers.value == 0
    # Without workers, prefetch/persistent are greyed out and the reason is shown.
    assert playground.prefetch_factor.disabled and playground.persistent_workers.disabled
    assert "worker processes" in playground.hints.value
    assert playground.config()["prefetch_factor"] is None
    playground.num_workers.value = 1
    assert not playground.prefetch_factor.disabled and not playground.persistent_workers.disabled
    assert playground.config()["prefetch_factor"] == playground.prefetch_factor.value
    # No CUDA here: pin_memory is greyed out with a tooltip saying why.
    if not torch.cuda.is_available():
        assert playground.pin_memory.disabled and "CUDA" in playground.pin_memory.tooltip
        assert playground.config()["pin_memory"] is False
    # n_batches never asks for more batches than one epoch holds.
    playground.batch_size.value = 64
    assert playground.n_batches.max == len(dataset) // 64


def test_run_adds_a_row_and_redraws_the_plot(playground):
    assert "No runs yet" in playground.table.value
    first_png = playground.plot.outputs[0]["data"]["image/png"]
    row = playground.run_once()
    assert row["samples_per_s"] > 0 and row["batches"] == 2
    assert "No runs yet" not in playground.table.value and "manual run" in playground.table.value
    second_png = playground.plot.outputs[0]["data"]["image/png"]
    assert second_png != first_png
    playground.batch_size.value = 8
    playground.run_once()
    assert len(playground.rows) == 2 and playground.plot.outputs[0]["data"]["image/png"] != second_png
    assert "×1.00" in playground.table.value  # ratios to run 1, never a hard-coded number
    assert not playground.run_button.disabled


def test_experiment_order_fills_the_table_live(playground):
    seen = []
    playground.plot.observe(lambda change: seen.append(len(playground.rows)), names="outputs")
    playground.batch_size.value = 16
    rows = playground.run_experiment_order()
    assert len(rows) >= 3 and len(playground.rows) == len(rows)
    assert seen == list(range(1, len(rows) + 1)), "the plot must be redrawn after every finished row"
    # The × column compares equal work: every configuration (batch 8, 16, 32; one or two epochs) the same samples.
    assert len({r["samples"] for r in rows if not r.get("skipped")}) == 1
    assert {r["batch_size"] for r in rows} == {8, 16, 32}
    assert "done" in playground.status.value


def test_a_failed_run_is_reported_in_the_status_line(playground, monkeypatch):
    import course_lib.perf.loaders as loaders

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(loaders, "measure_loader", broken)
    playground.run_button.click()
    assert "disk on fire" in playground.status.value and not playground.run_button.disabled


def test_table_and_plot_render_skipped_rows():
    rows = [{"num_workers": 0, "batch_size": 8, "samples_per_s": 10.0, "batches": 1},
            {"num_workers": 2, "batch_size": 8, "samples_per_s": None, "skipped": "no CUDA", "step": "pin_memory"}]
    table = widgets.results_table_html(rows)
    assert "skipped" in table and "no CUDA" in table
    assert widgets.samples_per_s_png(rows).startswith(b"\x89PNG")


def test_a_tiny_dataset_is_refused_before_any_work():
    with pytest.raises(ValueError, match="at least"):
        widgets.loader_playground(TensorDataset(torch.zeros(3, 1)), device="cpu")


def _png_size(png: bytes) -> tuple[int, int]:
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def test_many_runs_fit_a_narrow_window():
    rows = [{"num_workers": i % 3, "batch_size": 64, "samples_per_s": 100.0 + i, "step": "workers",
             "label": f"2 epochs, workers={i % 3}, persistent", "host_mb": 200.0, "workers_mb": 50.0,
             "memory_kind": "PSS"} for i in range(14)]
    table = widgets.results_table_html(rows)
    assert "overflow:auto" in table and "max-width:100%" in table  # scrolls in its own box
    assert "250" in table and "PSS" in table  # memory is host + workers, and says which measure
    few, many = widgets.samples_per_s_png(rows[:3]), widgets.samples_per_s_png(rows)
    (w_few, h_few), (w_many, h_many) = _png_size(few), _png_size(many)
    assert w_few == w_many and h_many > h_few  # one bar per line: the plot grows down, labels never collide
    assert widgets._bar_label(3, {"num_workers": 2, "batch_size": 64, "persistent_workers": True, "epochs": 2}) \
        == "#3 w2 b64 persist 2ep"
