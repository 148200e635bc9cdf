"""The DataLoader playground: turn the knobs of ``torch.utils.data.DataLoader`` and measure each setting.

In a notebook::

    from course_lib.widgets import loader_playground
    loader_playground()          # the generated JPEG shapes, training split

Each press of **Run** measures one configuration with :func:`course_lib.perf.loaders.measure_loader`, adds a row
to the results table and a bar to the samples/s plot, so you compare runs made side by side on *this* machine.
**Run the experiment order** measures the sequence the course recommends
(:func:`course_lib.perf.loaders.experiment_order`: baseline, worker counts, batch size, pinned memory,
prefetching, persistent workers) with a progress bar, updating the table and plot as each row finishes.

The controls only offer what makes sense, and say why something is greyed out:

* ``pin_memory`` is disabled without CUDA: page-locked buffers only speed up host-to-GPU copies.
* ``prefetch_factor`` and ``persistent_workers`` are disabled with ``num_workers=0``: with no worker processes
  the main process loads each batch when asked, so there is nothing to prefetch and nothing to keep alive.
* ``persistent_workers`` only shows its effect from the second epoch (the first always starts the workers), so
  there is an ``epochs`` control.

Every widget carries a stable CSS class (``course-run-button``, ``course-results-table``, ...; see
:data:`CSS_CLASSES`) so the course's browser test can find it.
"""

from __future__ import annotations

import base64
import html
import io
import traceback
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from torch.utils.data import Dataset

from course_lib.lesson import LIVE_CLASS, STALE_STYLE
from course_lib.mode import by_mode

BATCH_SIZES = (8, 16, 32, 64, 128, 256)

# Stable CSS class of each part of the playground (what a browser test or a custom stylesheet selects).
CSS_CLASSES = {
    "root": "course-playground",
    "num_workers": "course-num-workers",
    "batch_size": "course-batch-size",
    "pin_memory": "course-pin-memory",
    "prefetch_factor": "course-prefetch-factor",
    "persistent_workers": "course-persistent-workers",
    "epochs": "course-epochs",
    "n_batches": "course-n-batches",
    "run": "course-run-button",
    "sweep": "course-sweep-button",
    "status": "course-status",
    "table": "course-results-table",
    "plot": "course-plot",
    "progress": "course-sweep-progress",
}

NO_CUDA_REASON = "pin_memory only speeds up copies from host memory to a CUDA GPU; this machine has no CUDA device."
NO_WORKERS_REASON = (
    "prefetch_factor and persistent_workers need worker processes: with num_workers=0 the main process loads "
    "each batch when the loop asks for it, so there is nothing to prefetch and no worker to keep alive."
)
PERSISTENT_HINT = "persistent_workers only pays off from the 2nd epoch: set epochs to 2 to see it."

_TABLE_COLUMNS = ("#", "what", "workers", "batch", "pin", "prefetch", "persist.", "epochs", "samples/s",
                  "× run 1", "1st batch s", "memory MiB")


def default_dataset() -> Dataset:
    """The course's default: the generated JPEG shapes, training split (generated on first use)."""
    from course_lib.data import load_image_datasets

    return load_image_datasets("shapes").train


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return html.escape(str(value))


def _memory_mb(row: dict[str, Any]) -> float | None:
    """Host + workers memory of a row (PSS on Linux, see ``measure_loader``); RSS for rows made without it."""
    if row.get("host_mb") is not None:
        return row["host_mb"] + row.get("workers_mb", 0.0)
    return row.get("host_rss_mb")


def results_table_html(rows: list[dict[str, Any]]) -> str:
    """The results as an HTML table; ``× run 1`` is samples/s relative to the first measured row.

    The table scrolls inside its own box (it never pushes the notebook wider) and its headers and "what" column
    wrap, so it fits a narrow window; memory is host + workers as PSS (shared pages counted once).
    """
    cell = "padding:2px 5px;border-bottom:1px solid rgba(127,127,127,0.35);text-align:right;white-space:nowrap"
    left = ";text-align:left;white-space:normal;min-width:110px;max-width:200px"  # the "what" column wraps
    head = "".join(f'<th style="{cell}{left if j == 1 else ""};white-space:normal;font-weight:600">{c}</th>'
                   for j, c in enumerate(_TABLE_COLUMNS))
    notes: list[str] = []  # why a row was skipped, listed under the table
    kinds = sorted({r["memory_kind"] for r in rows if r.get("memory_kind")})
    if not rows:
        body = f'<tr><td colspan="{len(_TABLE_COLUMNS)}" style="{cell};text-align:left;opacity:0.7">' \
               "No runs yet: choose a configuration and press Run.</td></tr>"
    else:
        base = next((r["samples_per_s"] for r in rows if r.get("samples_per_s")), None)
        lines = []
        for i, r in enumerate(rows, start=1):
            sps = r.get("samples_per_s")
            ratio = f"×{sps / base:.2f}" if sps and base else "–"
            what = r.get("label") or "manual run"
            if r.get("skipped"):
                what += " (skipped, see below)"
                notes.append(f"#{i}: {r['skipped']}")
            values = [str(i), what, _fmt(r.get("num_workers")), _fmt(r.get("batch_size")), _fmt(r.get("pin_memory")),
                      _fmt(r.get("prefetch_factor")), _fmt(r.get("persistent_workers")), _fmt(r.get("epochs", 1)),
                      _fmt(sps, 1), ratio, _fmt(r.get("first_batch_s"), 3), _fmt(_memory_mb(r), 0)]
            tds = "".join(
                f'<td style="{cell}{left if j == 1 else ""}">{html.escape(v) if j == 1 else v}</td>'
                for j, v in enumerate(values)
            )
            lines.append(f"<tr>{tds}</tr>")
        body = "".join(lines)
    if kinds:
        notes.append(f"memory: this process + its workers, as {'/'.join(kinds)} "
                     "(proportional set size: pages the workers share with this process are counted once)")
    foot = "".join(f'<div style="opacity:0.75;font-size:12px">{html.escape(n)}</div>' for n in notes)
    return (f'<div style="overflow:auto;max-width:100%;max-height:420px">'
            f'<table style="border-collapse:collapse;font-size:12px;line-height:1.3">'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>{foot}")


def _bar_label(i: int, row: dict[str, Any]) -> str:
    """A short label for run ``i``: ``#3 w2 b64`` plus what else differs from the defaults."""
    parts = [f"#{i}", f"w{row.get('num_workers', 0)}", f"b{row.get('batch_size', '?')}"]
    if row.get("pin_memory"):
        parts.append("pin")
    if row.get("prefetch_factor") not in (None, 2):
        parts.append(f"pf{row['prefetch_factor']}")
    if row.get("persistent_workers"):
        parts.append("persist")
    if row.get("epochs", 1) > 1:
        parts.append(f"{row['epochs']}ep")
    return " ".join(parts)


def samples_per_s_png(rows: list[dict[str, Any]]) -> bytes:
    """A horizontal bar chart of samples/s per run (PNG bytes), with the first run as a dashed reference line.

    One bar per line, so labels never overlap however many runs there are: the figure grows in height instead.
    Drawn on a bare :class:`matplotlib.figure.Figure` (no pyplot): no global figure state, no backend needed, and
    nothing left open after a hundred runs.
    """
    shown = [(i, r) for i, r in enumerate(rows, start=1) if r.get("samples_per_s") or r.get("skipped")]
    fig = Figure(figsize=(7.5, max(2.4, 1.1 + 0.28 * len(shown))), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    measured = [(i, r) for i, r in shown if r.get("samples_per_s")]
    if measured:
        ys = list(range(len(shown)))
        by_run = {i: y for y, (i, _) in enumerate(shown)}
        rates = [r["samples_per_s"] for _, r in measured]
        colours = ["#4c72b0" if not r.get("step") else "#dd8452" for _, r in measured]
        ax.barh([by_run[i] for i, _ in measured], rates, color=colours, height=0.7)
        ax.axvline(rates[0], color="#555", linestyle="--", linewidth=1)
        for (i, _), rate in zip(measured, rates):
            ax.annotate(f"×{rate / rates[0]:.2f}", (rate, by_run[i]), ha="left", va="center", fontsize=8,
                        xytext=(3, 0), textcoords="offset points")
        for i, r in shown:  # say why a bar is missing instead of leaving a silent gap
            if r.get("skipped"):
                ax.text(max(rates) * 0.02, by_run[i], "skipped (see the table)", ha="left", va="center",
                        fontsize=8, color="#777")
        ax.set_yticks(ys, [_bar_label(i, r) for i, r in shown], fontsize=8)
        ax.set_ylim(len(shown) - 0.5, -0.5)  # run 1 at the top
        ax.set_xlim(0, max(rates) * 1.2)  # room for the ×ratio labels
        kinds = {"#4c72b0": "Run button", "#dd8452": "experiment order"}
        handles = [Patch(color=c, label=label) for c, label in kinds.items() if c in colours]
        handles.append(Line2D([], [], color="#555", linestyle="--", linewidth=1, label="run 1"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    else:
        ax.text(0.5, 0.5, "no runs yet: press Run", ha="center", va="center", transform=ax.transAxes,
                color="#777")
        ax.set_xticks([])
        ax.set_yticks([])
    ax.set_xlabel("samples/s (higher is better)")
    ax.set_title("Samples per second, per run", fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


class LoaderPlayground(widgets.VBox):
    """The playground widget (a ``VBox``); :func:`loader_playground` is the usual way to make one.

    ``rows`` holds every measurement so far (dicts from ``measure_loader`` / ``loader_sweep``). ``run_once()`` and
    ``run_experiment_order()`` are what the two buttons call, usable from code too.
    """

    def __init__(self, dataset: Dataset | None = None, *, device: str | torch.device | None = None,
                 n_batches: int | None = None, max_n_batches: int | None = None) -> None:
        from course_lib.device import pick_device

        self.dataset = default_dataset() if dataset is None else dataset
        self.n_samples = len(self.dataset)  # type: ignore[arg-type]
        if self.n_samples < BATCH_SIZES[0]:
            raise ValueError(f"loader_playground: the dataset has {self.n_samples} samples; it needs at least "
                             f"{BATCH_SIZES[0]} (the smallest batch size offered).")
        self.device = torch.device(device) if device is not None else pick_device("auto")
        self.rows: list[dict[str, Any]] = []
        self.plot_version = 0  # bumped on every redraw (tests and curious learners can watch it)
        self._last_traceback = ""
        self._max_n_batches = max_n_batches or by_mode(smoke=10, full=200)
        self._build_controls(n_batches or by_mode(smoke=3, full=40))
        self._build_outputs()
        self._tag_for_css()
        self._wire_events()
        self._update_enabled()
        self._draw_plot()
        title = widgets.HTML(f"{STALE_STYLE}<b>DataLoader playground</b>: change one setting at a time, press Run, "
                             "compare samples/s.")
        controls = widgets.VBox([
            self.num_workers, self.batch_size, self.pin_memory, self.prefetch_factor, self.persistent_workers,
            self.epochs, self.n_batches, self.hints,
            widgets.HBox([self.run_button, self.sweep_button]), self.status,
        ])
        super().__init__([title, controls, self.progress, self.table, self.plot])
        self.add_class(CSS_CLASSES["root"]).add_class(LIVE_CLASS)  # reopened without its kernel: says so

    # --- building -------------------------------------------------------------------------------------
    def _build_controls(self, n_batches: int) -> None:
        """The sliders, boxes and buttons, limited to what this machine and dataset allow."""
        from course_lib.perf.loaders import usable_cores

        cuda = self.device.type == "cuda"
        cores = usable_cores()  # the cores this process may use (container/affinity limits), not the machine's
        sizes = [b for b in BATCH_SIZES if b <= self.n_samples]
        batch = by_mode(smoke=16, full=64)
        batch = batch if batch in sizes else sizes[-1]
        wide = {"description_width": "130px"}
        layout = widgets.Layout(width="420px")
        self.num_workers = widgets.IntSlider(value=0, min=0, max=cores, description="num_workers", style=wide,
                                             layout=layout, tooltip="worker processes that load batches in parallel "
                                             f"(0 = the main process; {cores} cores are usable here)")
        self.batch_size = widgets.Dropdown(options=sizes, value=batch, description="batch_size", style=wide,
                                           layout=widgets.Layout(width="260px"))
        self.pin_memory = widgets.Checkbox(value=False, description="pin_memory", disabled=not cuda, style=wide,
                                           tooltip="page-locked host memory for faster, asynchronous copies to the "
                                           "GPU" if cuda else NO_CUDA_REASON)
        self.prefetch_factor = widgets.IntSlider(value=2, min=1, max=8, description="prefetch_factor", style=wide,
                                                 layout=layout, tooltip="batches each worker prepares ahead")
        self.persistent_workers = widgets.Checkbox(value=False, description="persistent_workers", style=wide,
                                                   tooltip="keep worker processes alive between epochs")
        self.epochs = widgets.IntSlider(value=1, min=1, max=3, description="epochs", style=wide, layout=layout,
                                        tooltip=PERSISTENT_HINT)
        self.n_batches = widgets.IntSlider(value=min(n_batches, self._max_n_batches),
                                           min=1, max=self._max_n_batches, description="n_batches", style=wide,
                                           layout=layout, tooltip="batches measured per epoch")
        self.hints = widgets.HTML()
        self.run_button = widgets.Button(description="Run", button_style="primary", icon="play",
                                         tooltip="measure this configuration and add a row")
        self.sweep_button = widgets.Button(description="Run the experiment order", icon="list-ol",
                                           layout=widgets.Layout(width="auto"),
                                           tooltip="baseline → workers → batch size → pinning → prefetch → "
                                                   "persistent workers")

    def _build_outputs(self) -> None:
        """The status line, the results table, the plot and the progress area."""
        self.status = widgets.HTML()
        self._say(f"Dataset: {self.n_samples} samples; batches go to <b>{self.device}</b>.")
        # Both stay inside the output area: the table scrolls in its own box, the plot scales down.
        self.table = widgets.HTML(value=results_table_html(self.rows),
                                  layout=widgets.Layout(width="100%", max_width="100%", overflow="auto"))
        self.plot = widgets.Output(layout=widgets.Layout(width="100%", max_width="100%", overflow="auto"))
        self.progress = widgets.Output()

    def _tag_for_css(self) -> None:
        """Give every part its CSS class (the stylesheet and the browser tests find them by it)."""
        for name, widget in [("num_workers", self.num_workers), ("batch_size", self.batch_size),
                             ("pin_memory", self.pin_memory), ("prefetch_factor", self.prefetch_factor),
                             ("persistent_workers", self.persistent_workers), ("epochs", self.epochs),
                             ("n_batches", self.n_batches), ("run", self.run_button),
                             ("sweep", self.sweep_button), ("status", self.status), ("table", self.table),
                             ("plot", self.plot), ("progress", self.progress)]:
            widget.add_class(CSS_CLASSES[name])

    def _wire_events(self) -> None:
        """Re-check the controls when one changes; run a measurement when a button is pressed."""
        for control in (self.num_workers, self.batch_size, self.persistent_workers, self.epochs):
            control.observe(self._update_enabled, names="value")
        self.run_button.on_click(lambda _: self._guarded(self.run_once))
        self.sweep_button.on_click(lambda _: self._guarded(self.run_experiment_order))

    # --- keeping the controls honest ------------------------------------------------------------------
    def _batches_available(self, batch_size: int) -> int:
        return self.n_samples // batch_size

    def _update_enabled(self, _change: Any = None) -> None:
        """Grey out what does not apply, say why, and keep ``n_batches`` within what one epoch can give."""
        no_workers = self.num_workers.value == 0
        self.prefetch_factor.disabled = no_workers
        self.persistent_workers.disabled = no_workers
        hints: list[tuple[str, str]] = []  # (what, why)
        if self.pin_memory.disabled:
            hints.append(("pin_memory is greyed out", NO_CUDA_REASON))
        if no_workers:
            hints.append(("prefetch_factor and persistent_workers are greyed out", NO_WORKERS_REASON))
        elif self.persistent_workers.value and self.epochs.value == 1:
            hints.append(("Tip", PERSISTENT_HINT))
        self.hints.value = "".join(
            f'<div style="color:#555;font-size:12px;line-height:1.4;margin-left:8px">'
            f"<b>{html.escape(what)}:</b> {html.escape(why)}</div>" for what, why in hints)
        limit = max(1, min(self._max_n_batches, self._batches_available(self.batch_size.value)))
        if self.n_batches.value > limit:
            self.n_batches.value = limit
        self.n_batches.max = limit

    def config(self) -> dict[str, Any]:
        """The configuration the controls describe, as ``measure_loader`` keyword arguments."""
        workers = self.num_workers.value
        return {
            "num_workers": workers,
            "batch_size": self.batch_size.value,
            "pin_memory": bool(self.pin_memory.value and not self.pin_memory.disabled),
            "prefetch_factor": self.prefetch_factor.value if workers > 0 else None,
            "persistent_workers": bool(self.persistent_workers.value) if workers > 0 else False,
            "epochs": self.epochs.value,
            "n_batches": self.n_batches.value,
        }

    # --- actions --------------------------------------------------------------------------------------
    def _say(self, text_html: str) -> None:
        """Show a message in the status line (HTML; callers escape what they did not write)."""
        self.status.value = f'<div style="font-size:13px;line-height:1.4;margin:4px 0">{text_html}</div>'

    def _guarded(self, action: Callable[[], None]) -> None:
        """Run a button's action with the buttons disabled; show a failure in the status line, not a lost log."""
        self.run_button.disabled = self.sweep_button.disabled = True
        try:
            action()
        except Exception as err:  # a button callback's exception would vanish into the browser console
            self._say(f'<span style="color:#b00020">Failed: {html.escape(type(err).__name__)}: '
                      f"{html.escape(str(err))}</span>")
            self._last_traceback = traceback.format_exc()
        finally:
            self.run_button.disabled = self.sweep_button.disabled = False

    def run_once(self) -> dict[str, Any]:
        """Measure the current configuration, append the row, redraw; returns the row."""
        from course_lib.perf.loaders import measure_loader

        cfg = self.config()
        self._say(f"Measuring {self._describe(cfg)} …")
        row = measure_loader(self.dataset, device=self.device, **cfg)
        row.setdefault("label", "manual run")
        self._add_row(row)
        self._say(f"Run {len(self.rows)} → <b>{row['samples_per_s']:,.1f} samples/s</b> "
                  f"({self._describe(cfg)}).")
        return row

    def run_experiment_order(self) -> list[dict[str, Any]]:
        """Measure :func:`~course_lib.perf.loaders.experiment_order` at the current batch size, live."""
        from course_lib.perf.loaders import experiment_order, loader_sweep, samples_unit

        batch = self.batch_size.value
        configs = experiment_order(batch_size=batch, max_workers=self.num_workers.max)
        # Every configuration delivers the same samples (a bigger batch fewer batches, two epochs half as many
        # each), so the × column compares equal work: a multiple of every batch size x epochs, near what the
        # n_batches slider asks for at this batch size, and no more than every configuration can deliver.
        unit = samples_unit(configs)
        most = min(self._batches_available(c["batch_size"]) * c["batch_size"] * c.get("epochs", 1) for c in configs)
        n_samples = max(unit, min(self.n_batches.value * batch, most) // unit * unit)
        note = f" ({n_samples} samples each)"
        self._say(f"Running the experiment order: {len(configs)} configurations{note} …")
        self.progress.clear_output()
        with self.progress:  # tqdm.auto draws its progress bar widget here
            rows = loader_sweep(self.dataset, configs, n_samples=n_samples, device=self.device, progress=True,
                                on_row=self._add_row)
        self._say(f"Experiment order done: {len(rows)} rows{note}. Compare the × column, not raw numbers.")
        return rows

    def _add_row(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.table.value = results_table_html(self.rows)
        self._draw_plot()

    def _draw_plot(self) -> None:
        """Replace the plot's output with a fresh PNG.

        Setting the Output widget's ``outputs`` directly (rather than ``with self.plot: display(...)``) works the
        same from a cell, a button callback or a plain script, and swaps the image in one step (no flicker).
        """
        png = base64.b64encode(samples_per_s_png(self.rows)).decode("ascii")
        self.plot_version += 1
        self.plot.outputs = ({
            "output_type": "display_data",
            "data": {"image/png": png, "text/plain": f"<samples/s plot, {len(self.rows)} runs>"},
            "metadata": {},
        },)

    @staticmethod
    def _describe(cfg: dict[str, Any]) -> str:
        return ", ".join(f"{k}={v}" for k, v in cfg.items() if v is not None)


def loader_playground(dataset: Dataset | None = None, **kwargs: Any) -> LoaderPlayground:
    """Make the DataLoader playground (a widget: the last line of a cell shows it).

    ``dataset`` defaults to the generated shapes' training split. Keyword arguments go to
    :class:`LoaderPlayground` (``device``, ``n_batches``, ``max_n_batches``).

    Taught in lesson 02 (``notebooks/02_dataloader.ipynb``).
    """
    return LoaderPlayground(dataset, **kwargs)


__all__ = ["loader_playground", "LoaderPlayground", "results_table_html", "samples_per_s_png", "CSS_CLASSES"]
