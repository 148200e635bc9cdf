"""Run All of every lesson with questions, in Chromium, then answer each question: a walkthrough, not part of
`make test` (it runs every lesson through the browser, minutes of CPU). `make walkthrough` runs it.

For each lesson: after Run All nothing measured shows under an unanswered question (every output between a
question and its reveal is held: only the held line is visible), and each answer, given while the kernel is kept
busy (as it is during Run All), opens its held outputs and reveal within 5 s of the click. The time from click to
reveal is printed per question; screenshots of each lesson's first question before and after its answer go to
``artifacts/screenshots/walkthrough-*.png``.
"""

from __future__ import annotations

import time

import pytest

from conftest import REPO
from course_lib.lesson import HELD_TEXT
from test_browser import keep_kernel_busy, open_notebook, run_all_cells, shot

pytest_plugins = ("test_browser",)  # its fixtures: the lab server, the browser, a page
pytestmark = [pytest.mark.browser, pytest.mark.slow]

LESSONS = sorted(p for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb") if "predict(" in p.read_text())
REVEAL_LIMIT_S = 5.0


def _held_cells(page) -> list[dict]:
    """Per question (in order): the visible text of each cell it holds, and whether each cell is held."""
    return page.evaluate(
        """() => {
            const cells = window.jupyterapp.shell.currentWidget.content.widgets;
            const found = [];
            let current = null;
            for (const cell of cells) {
                if (cell.model.type !== 'code') continue;
                const question = cell.node.querySelector('[class*="course-q-"]');
                if (question) { current = {cells: []}; found.push(current); continue; }
                const gate = cell.node.querySelector('.course-held');
                if (current && gate) current.cells.push(cell.node.querySelector('.jp-Cell-outputWrapper').innerText);
                else current = null;  // the first cell not held ends the question's stretch
            }
            return found;
        }""")


@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_run_all_then_answer_every_question(page, lab_server, lesson):
    rel = f"notebooks/{lesson.name}"
    open_notebook(page, lab_server, rel)
    run_all_cells(page)
    questions = _held_cells(page)
    assert questions and all(q["cells"] for q in questions), f"a question of {rel} holds nothing: {questions}"
    for q in questions:
        for text in q["cells"]:
            assert text.strip() == HELD_TEXT, f"{rel}: shown under an open question: {text}"
    page.locator(".widget-toggle-buttons").first.scroll_into_view_if_needed()
    shot(page.locator(".jp-NotebookPanel"), f"walkthrough-{lesson.stem}-before")
    keep_kernel_busy(page, 600)
    buttons = page.locator(".widget-toggle-buttons")
    for i in range(buttons.count()):
        choice = buttons.nth(i).locator("button").last  # "skip: just show me"
        choice.scroll_into_view_if_needed()
        started = time.perf_counter()
        choice.click()
        page.wait_for_function(
            "n => [...document.querySelectorAll('.jp-Cell-outputWrapper')].filter("
            "w => w.innerText.includes('You chose not to predict')).length > n", arg=i, timeout=30_000)
        took = time.perf_counter() - started
        print(f"{rel} question {i + 1}: reveal shown {took * 1000:.0f} ms after the click (kernel busy)")
        assert took < REVEAL_LIMIT_S, f"{rel} question {i + 1}: the reveal took {took:.1f} s"
        if i == 0:
            shot(page.locator(".jp-NotebookPanel"), f"walkthrough-{lesson.stem}-after")
    status = page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status")
    assert status == "busy", "the reveals should not have needed the kernel"
    page.evaluate("async () => { await window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                  ".interrupt(); }")
