"""A long, silent cell shows what it is doing and about how long is left (course_lib/heartbeat.py).

Seen: lesson 05's precision cell showed an empty output for about 114 s on a busy laptop. The kernel test waits for
the watcher's line itself (no sleep of a guessed length), so it does not depend on how fast the machine is.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from course_lib import heartbeat
from course_lib.nbrun import NotebookRunner
from course_lib.perf.compare import compare

REPO = Path(__file__).resolve().parents[1]


def test_an_activity_says_how_far_it_got_and_about_how_long_is_left() -> None:
    activity = heartbeat.Activity("timing fp32 vs bf16", total=7, unit="round", started=100.0)
    assert activity.describe(now=101.0) == "timing fp32 vs bf16, round 1 of 7 under way"
    activity.advance(3)
    assert activity.describe(now=112.0) == "timing fp32 vs bf16, 3 of 7 rounds done, about 16 s left"
    assert heartbeat.status_line(130.0, [activity], now=112.0) == (
        "Still running, 2 min 10 s so far: timing fp32 vs bf16, 3 of 7 rounds done, about 16 s left.")
    assert heartbeat.status_line(12.0, []) == "Still running, 12 s so far (this cell prints when it finishes)."


def test_the_status_line_names_the_innermost_activity_that_counts_its_work() -> None:
    outer = heartbeat.Activity("lesson 14's ceiling", total=3, unit="part", started=0.0)
    inner = heartbeat.Activity("waiting for a worker")  # counts nothing: the outer one says more
    assert "lesson 14's ceiling" in heartbeat.status_line(20.0, [outer, inner], now=1.0)
    counted = heartbeat.Activity("timing a vs b", total=5, unit="round", started=0.0)
    assert "timing a vs b" in heartbeat.status_line(20.0, [outer, counted], now=1.0)


def test_compare_reports_its_rounds_while_it_measures() -> None:
    seen: list[str] = []

    def a() -> None:
        seen.append(heartbeat.current()[-1].describe())

    compare({"a": a, "b": lambda: None}, rounds=4, warmup=1, min_round_s=0.0)
    assert heartbeat.current() == [], "the activity must end with the comparison"
    assert seen[0] == "timing a vs b, round 1 of 4 under way"  # the warm-up, then the first round
    assert any(s.startswith("timing a vs b, 3 of 4 rounds done") for s in seen), seen


WAIT_FOR_THE_LINE = """
import time
watch = get_ipython()._course_watches[0]
deadline = time.monotonic() + 120
while watch.handle is None and time.monotonic() < deadline:
    time.sleep(0.05)   # silent: the watcher sees no output
assert watch.handle is not None, "no status line within 120 s"
"""

SELF_REPORTING = """
import time
from course_lib import heartbeat
with heartbeat.working_on("torchrun", reports_itself=True):
    time.sleep(3 * heartbeat.SILENT_S)
"""


@pytest.mark.timeout(300)
def test_a_silent_cell_in_a_kernel_gets_a_status_line_and_a_self_reporting_one_does_not() -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("from course_lib import bootstrap, heartbeat\n"
                                  "heartbeat.SILENT_S = 0.5\n"
                                  "assert bootstrap.watch_long_cells()"),
        nbformat.v4.new_code_cell(WAIT_FOR_THE_LINE),
        nbformat.v4.new_code_cell(SELF_REPORTING),
        nbformat.v4.new_code_cell("print('quick')"),
    ]
    NotebookRunner(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()

    def shown(cell: nbformat.NotebookNode) -> str:
        return "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell.outputs)

    _, silent, self_reporting, quick = nb.cells
    assert shown(silent).startswith("This cell ran for"), silent.outputs  # the line, brought up to date at the end
    assert [o.output_type for o in silent.outputs] == ["display_data"], silent.outputs
    assert "Still running" not in shown(self_reporting) and "ran for" not in shown(self_reporting)
    assert shown(quick) == "quick\n"
