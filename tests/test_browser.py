"""The course as a learner sees it: JupyterLab in a real (headless) Chromium, notebooks run through the UI.

What this checks that nbval cannot: the widgets actually render in JupyterLab (the front-end extension is
installed and matches the kernel's ipywidgets), the playground's controls and Run button work end to end, the
plot changes after a run, and tqdm's notebook progress bar renders and completes. In the lessons: no output shows
raw ANSI colour codes, no answer choice is cut off without its full text in a tooltip, Run All leaves every
prediction open with what would answer it held back (no measured figure, no reveal), answering one opens the held
output and the reveal at once, while the kernel is busy, and a saved, executed lesson reopens without "Error
displaying widget".

Needs Debian's ``chromium`` (``apt-get install chromium``) and the ``playwright`` package; Playwright's own
browser download is never used. Without Chromium the tests skip, except under ``CI=true`` where a missing
browser is a failure. Screenshots go to ``artifacts/screenshots/``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browser_helpers import CHROMIUM, CHROMIUM_ARGS, chromium_missing_reason, running_lab
from conftest import REPO
from course_lib.lesson import STALE_NOTE
from course_lib.website import WIDGET_STATE, WIDGET_VIEW

STALE_STEP = "Run All Above Selected Cell"  # the Run-menu item the stale note names

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SCREENSHOTS = REPO / "artifacts" / "screenshots"
RUN_ALL_TIMEOUT_MS = 150_000  # generous: CI machines are shared and noisy
# The lessons run through the UI (Run All): the welcome page (a question answered, reopened) and the DataLoader
# lesson (the playground, reopened). What every lesson prints (no raw ANSI codes, no error) is checked on the outputs
# of the run that executes each lesson once for the site (tests/test_lessons.py), not by running lessons again here.
# Run All in the browser: the welcome lesson and the data-loader lesson (questions, widgets, reopening) in every test
# run; every lesson with COURSE_BROWSER_LESSONS=all (`make lab-check`: each one also closed with Discard, unchanged).
LESSON_PATTERNS = ("*.ipynb",) if os.environ.get("COURSE_BROWSER_LESSONS") == "all" else ("00_*.ipynb", "02_*.ipynb")


def _code(source: str) -> dict[str, Any]:
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}


FIXTURE_NOTEBOOK = {
    "nbformat": 4, "nbformat_minor": 5,
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
    "cells": [
        _code('print("kernel ready")'),
        _code("from course_lib.widgets import loader_playground\n\nloader_playground()"),
        _code('from tqdm.auto import tqdm\n\nfor _ in tqdm(range(20), desc="fixture loop"):\n    pass'),
    ],
}


# A question, then its measurement and reveal (the first answer is final, also after a reload).
QUESTION_NOTEBOOK = {**FIXTURE_NOTEBOOK, "cells": [
    _code('from course_lib import lesson\n\ncolour = lesson.predict("Which colour?", choices=["red", "blue"])'),
    _code('print("measured: red")\ncolour.reveal("red", "Measured here.")'),
]}
# Two questions asked in one cell (as lesson 13 does), a measurement that answers both, then both reveals.
TWO_QUESTIONS_NOTEBOOK = {**FIXTURE_NOTEBOOK, "cells": [
    _code('from course_lib import lesson\n\nshape = lesson.predict("Which shape?", choices=["round", "square"])\n'
          'size = lesson.predict("Which size?", choices=["small", "large"])'),
    _code('print("MEASURED-42")'),
    _code('shape.reveal("round", "SHAPE-WHY")\nsize.reveal("small", "SIZE-WHY")'),
]}

# A question cell that needs the cell above it (as every lesson's questions need its set-up cells).
SET_UP_THEN_QUESTION_NOTEBOOK = {**FIXTURE_NOTEBOOK, "cells": [
    _code("from course_lib import lesson"),
    _code('colour = lesson.predict("Which colour?", choices=["red", "blue"])'),
]}
# A distributed cell that computes silently for a while, as lesson cells do.
TORCHRUN_NOTEBOOK = {**FIXTURE_NOTEBOOK, "cells": [
    _code("%load_ext course_lib.magics"),
    _code("%%torchrun -n 2 --timeout 120\nimport time\ntime.sleep(8)\nprint('cell done', flush=True)"),
]}

# A measurement that prints nothing for a long while (lesson 05's precision cell did, for minutes): the set-up cell's
# watch shows a status line (here after 1 s of silence instead of 10, to keep the test short).
SILENT_NOTEBOOK = {**FIXTURE_NOTEBOOK, "cells": [
    _code("from course_lib import bootstrap, heartbeat\n\nheartbeat.SILENT_S = 1.0\nbootstrap.watch_long_cells()"),
    _code("import time\n\nfrom course_lib.perf.compare import compare\n\n"
          "compare({'a': lambda: time.sleep(0.5), 'b': lambda: time.sleep(0.5)}, rounds=6, warmup=1, "
          "min_round_s=0.0)\nprint('MEASURED')"),
]}


def _lesson_notebooks() -> list[Path]:
    return sorted(p for pattern in LESSON_PATTERNS for p in (REPO / "notebooks").glob(pattern))


# --- fixtures -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served_root(tmp_path_factory) -> Path:
    """A served folder shaped like the repository, so the repository's own files stay clean.

    ``notebooks/`` is *copied* (running cells through the UI changes them), the project's marker files are copied
    (lessons find the project root by ``pyproject.toml``), and the read-only folders lessons look into are
    linked. Anything a lesson writes (runs, checkpoints) lands in this temporary folder.
    """
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)  # only this run's screenshots, nothing stale
    root = tmp_path_factory.mktemp("lab-root")
    (root / "fixture.ipynb").write_text(json.dumps(FIXTURE_NOTEBOOK))
    (root / "question.ipynb").write_text(json.dumps(QUESTION_NOTEBOOK))
    (root / "two_questions.ipynb").write_text(json.dumps(TWO_QUESTIONS_NOTEBOOK))
    (root / "torchrun.ipynb").write_text(json.dumps(TORCHRUN_NOTEBOOK))
    (root / "silent.ipynb").write_text(json.dumps(SILENT_NOTEBOOK))
    (root / "set_up_then_question.ipynb").write_text(json.dumps(SET_UP_THEN_QUESTION_NOTEBOOK))
    if (REPO / "notebooks").is_dir():
        shutil.copytree(REPO / "notebooks", root / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, root / name)
    for name in ("exercises", "solutions", "docs"):
        if (REPO / name).is_dir():
            (root / name).symlink_to(REPO / name, target_is_directory=True)
    return root


@pytest.fixture(scope="module")
def lab_server(served_root, tmp_path_factory):
    _require_browser()
    with running_lab(served_root, tmp_path_factory.mktemp("lab-state"), env={"COURSE_MODE": "smoke"}) as server:
        yield server


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory) -> Iterator[Any]:
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),  # a fresh user-data dir
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1700},  # tall enough for the whole playground
        )
        yield context
        context.close()


@pytest.fixture
def page(browser_context, lab_server):
    page = browser_context.new_page()
    page.set_default_timeout(30_000)
    yield page
    # Stop this notebook's kernel so the next notebook does not compete with it for the CPU.
    try:
        page.evaluate("""async () => {
            const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
            if (panel && panel.sessionContext) { await panel.sessionContext.shutdown(); }
        }""")
    except Exception:  # a crashed page has no kernel to stop; the server stops them all anyway
        pass
    page.close()


def _require_browser() -> None:
    reason = chromium_missing_reason()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but the browser test cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


# --- driving JupyterLab ---------------------------------------------------------------------------------------
def open_notebook(page, server, path: str) -> None:
    """Open ``path`` in JupyterLab and wait until its kernel has really executed something."""
    page.goto(server.url(f"/lab/tree/{path}?reset"))
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=60_000)
    # The idle badge alone can appear before the kernel session is wired up; execute a probe and wait for it.
    page.wait_for_function(
        """() => {
            const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
            const kernel = panel && panel.sessionContext && panel.sessionContext.session
                && panel.sessionContext.session.kernel;
            return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
        }""",
        timeout=60_000,
    )
    probe = page.evaluate(
        """async () => {
            const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
            const future = kernel.requestExecute({code: 'print(6 * 7)', silent: false, store_history: false});
            let text = '';
            future.onIOPub = msg => { if (msg.header.msg_type === 'stream') text += msg.content.text; };
            await future.done;
            return text.trim();
        }"""
    )
    assert probe == "42", f"the kernel did not answer a probe correctly: {probe!r}"


def run_all_cells(page) -> None:
    """Run every cell through the Run menu and wait until each code cell has an execution count."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    try:
        page.wait_for_function(
            """() => {
                const panel = window.jupyterapp.shell.currentWidget;
                const cells = panel.content.widgets.filter(c => c.model.type === 'code');
                const running = cells.some(c => c.node.querySelector('.jp-InputPrompt')?.textContent.includes('*'));
                const allRan = cells.every(c => c.model.executionCount !== null);
                // Run All stops at the first exception: then the remaining cells never get a count.
                const failed = cells.some(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'));
                return !running && (allRan || failed) && panel.sessionContext.session.kernel.status === 'idle';
            }""",
            timeout=RUN_ALL_TIMEOUT_MS,
        )
    except Exception as err:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "run-all-timeout.png"))
        prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
        raise AssertionError(f"Run All Cells did not finish in {RUN_ALL_TIMEOUT_MS / 1000:.0f} s; "
                             f"prompts: {prompts}; screenshot: run-all-timeout.png") from err


def error_outputs(page) -> list[str]:
    """Text of every error output (a raised exception) in the open notebook."""
    return page.evaluate(
        """() => {
            const panel = window.jupyterapp.shell.currentWidget;
            const errors = [];
            for (const cell of panel.content.widgets) {
                if (cell.model.type !== 'code') continue;
                for (const out of cell.model.outputs.toJSON()) {
                    if (out.output_type === 'error') errors.push(out.ename + ': ' + out.evalue);
                }
            }
            for (const node of document.querySelectorAll(
                    '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')) {
                if (node.textContent.includes('Traceback')) errors.push(node.textContent.slice(0, 500));
            }
            return errors;
        }"""
    )


def widget_errors(page) -> list[str]:
    """Widgets that failed to render (JupyterLab shows this text instead of the widget)."""
    texts = page.locator(".jp-OutputArea-output").all_inner_texts()
    return [t for t in texts if "Error displaying widget" in t or "Failed to load model class" in t]


def ansi_outputs(page) -> list[str]:
    """Outputs (streams, text) that carry raw ANSI escape codes, which JupyterLab shows as colours or garbage.

    Tracebacks are left out: they are coloured on purpose, and :func:`error_outputs` already fails on them.
    """
    return page.evaluate(
        """() => {
            const found = [];
            for (const cell of window.jupyterapp.shell.currentWidget.content.widgets) {
                if (cell.model.type !== 'code') continue;
                for (const out of cell.model.outputs.toJSON()) {
                    const texts = [];
                    if (out.output_type === 'stream') texts.push([].concat(out.text).join(''));
                    for (const value of Object.values(out.data || {})) {
                        if (typeof value === 'string' || Array.isArray(value)) texts.push([].concat(value).join(''));
                    }
                    for (const text of texts) {
                        if (text.includes('\u001b[')) found.push(text.slice(0, 200));
                    }
                }
            }
            return found;
        }"""
    )


def truncated_choices(page) -> list[str]:
    """Answer buttons whose label does not fit and whose full text is not in a tooltip either."""
    return page.evaluate(
        """() => [...document.querySelectorAll('.widget-toggle-buttons button')]
            .filter(b => b.offsetParent !== null && b.scrollWidth > b.clientWidth + 1
                         && (b.getAttribute('title') || '').trim() !== b.textContent.trim())
            .map(b => b.textContent.trim())"""
    )


def page_text(page) -> str:
    return page.locator(".jp-NotebookPanel .jp-Notebook").inner_text()


HELD = "Held until you answer the question above"


def outputs_text(page) -> str:
    """What the cells' outputs show (visible text only: a held area the answer has not opened has no text)."""
    return "\n".join(page.locator(".jp-Cell-outputWrapper").all_inner_texts())


def keep_kernel_busy(page, seconds: int) -> None:
    """Give the kernel a silent cell of ``seconds`` (as Run All keeps it busy) and wait until it is busy."""
    page.evaluate("""s => { window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.requestExecute(
                             {code: `import time; time.sleep(${s})`, silent: true}); }""", seconds)
    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'busy'")


def check_answer_opens_what_was_held(page, name: str, measured_marker: str) -> None:
    """After Run All nothing measured shows under the open question; a click shows the held output and the reveal
    at once, while the kernel is still busy with something else (so the browser, not the kernel, opened it)."""
    text = outputs_text(page)
    assert HELD in text, "Run All should hold the measurement under the open question"
    assert "This machine measured" not in text and "You predicted" not in text, "a reveal showed before an answer"
    assert measured_marker not in text, f"{measured_marker!r} (a measured figure) showed before an answer"
    page.locator(".widget-toggle-buttons").first.scroll_into_view_if_needed()
    shot(page.locator(".jp-NotebookPanel"), f"{name}-before-answer")
    keep_kernel_busy(page, 30)
    first_choice = page.locator(".widget-toggle-buttons button").first
    first_choice.scroll_into_view_if_needed()
    choice_text = first_choice.inner_text().strip()
    first_choice.click()
    page.wait_for_function("marker => [...document.querySelectorAll('.jp-Cell-outputWrapper')]"
                           ".some(n => n.innerText.includes(marker))", arg="This machine measured", timeout=30_000)
    status = page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status")
    assert status == "busy", "the reveal should not wait for the kernel"
    text = outputs_text(page)
    assert measured_marker in text and f"You predicted: {choice_text}" in text, text[-2000:]
    assert HELD not in text, "the held notes should go once the question is answered"
    shot(page.locator(".jp-NotebookPanel"), f"{name}-after-answer")
    page.evaluate("async () => { await window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                  ".interrupt(); }")
    page.wait_for_function("() => document.querySelector('.jp-Notebook').innerText.includes('Your answer:')",
                           timeout=60_000)  # the kernel, once free, turns the question into text


def save_and_reopen(page, server, path: str) -> None:
    """Save the open notebook (outputs and widget state), then open it again as a learner would the next day."""
    # A kernel still handling widget messages (an answer's handler closing and creating widgets) may close a model
    # between the save of the widget state and that of the outputs: wait until it is idle, as a learner's save is.
    page.wait_for_function("""() => {
        const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel;
        return !kernel || kernel.status === 'idle';
    }""", timeout=60_000)
    # The widget manager saves the models it holds live; a model the kernel has opened but the page has not yet
    # built (or one already closed) would be left out of the state while its output stays: wait until every widget
    # output's model is live, and say which are not if that never happens.
    page.evaluate(FIND_WIDGET_MANAGER)
    try:
        page.wait_for_function(f"() => ({UNSAVED_WIDGET_OUTPUTS})().length === 0", timeout=60_000)
    except Exception as err:
        raise AssertionError(f"widget outputs whose model is not live before saving {path}: "
                             f"{page.evaluate(UNSAVED_WIDGET_OUTPUTS)}") from err
    page.evaluate("async () => { await window.jupyterapp.commands.execute('docmanager:save'); }")
    page.wait_for_function(
        "() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
    page.evaluate("""async () => {
        const panel = window.jupyterapp.shell.currentWidget;
        if (panel && panel.sessionContext) { await panel.sessionContext.shutdown(); }
    }""")
    wait_for_saved_outputs(page, server, path)


# The notebook's widget manager, found through a widget output's renderer (JupyterLab exposes it nowhere else).
FIND_WIDGET_MANAGER = """async () => {
    const panel = window.jupyterapp.shell.currentWidget;
    window.courseWidgetManager = null;
    for (const cell of panel.content.widgets) {
        for (const child of (cell.outputArea ? cell.outputArea.widgets : [])) {
            for (const part of (child.widgets || [])) {
                if (part._manager) { window.courseWidgetManager = await part._manager.promise; return; }
            }
        }
    }
}"""
# Every widget output whose model the manager does not hold live, as "cell N: model_id (why)".
UNSAVED_WIDGET_OUTPUTS = """() => {
    const manager = window.courseWidgetManager;
    const panel = window.jupyterapp.shell.currentWidget;
    const missing = [];
    panel.content.widgets.forEach((cell, index) => {
        if (cell.model.type !== 'code') return;
        for (const out of cell.model.outputs.toJSON()) {
            const view = out.data && out.data['application/vnd.jupyter.widget-view+json'];
            if (!view) continue;
            const model = manager && manager._modelsSync.get(view.model_id);  // a closed model leaves this map
            if (!model || !model.comm_live) {
                const why = !manager ? 'no widget manager' : !model ? 'not built yet, or closed' : 'comm not live';
                missing.push(`cell ${index}: ${view.model_id} (${why})`);
            }
        }
    });
    return missing;
}"""


def saved_widget_outputs_without_state(saved: Path) -> list[str]:
    """The widget outputs of a saved notebook whose model is missing from its saved widget state."""
    nb = json.loads(saved.read_text(encoding="utf-8"))
    models = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    return [f"cell {index}: {view['model_id']}" for index, cell in enumerate(nb["cells"])
            for out in cell.get("outputs", [])
            if (view := out.get("data", {}).get(WIDGET_VIEW)) and view["model_id"] not in models]


def wait_for_saved_outputs(page, server, path: str) -> None:
    """Open ``path`` as saved (without running it) and wait until its saved widgets have rendered or failed."""
    page.goto(server.url(f"/lab/tree/{path}?reset"))
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell .jp-OutputArea-output", timeout=60_000)
    # Widget views render (or fail) asynchronously once the widget manager has read the saved state: wait until
    # every saved widget output shows either a widget or an error.
    page.wait_for_function(
        """() => {
            const panel = window.jupyterapp.shell.currentWidget;
            if (!panel || !panel.content) return false;
            let expected = 0;
            for (const cell of panel.content.widgets) {
                if (cell.model.type !== 'code') continue;
                for (const out of cell.model.outputs.toJSON()) {
                    if (out.data && out.data['application/vnd.jupyter.widget-view+json']) expected += 1;
                }
            }
            const settled = [...document.querySelectorAll('.jp-OutputArea-output')].filter(
                n => n.querySelector('.jupyter-widgets') || n.innerText.includes('Error displaying widget')
                     || n.innerText.includes('model not found'));
            return settled.length >= expected;
        }""",
        timeout=60_000,
    )


def stale_controls(page) -> dict[str, list[str]]:
    """On a reopened lesson: what each course control's stale note says, and the broken-link icons still drawn."""
    return page.evaluate(
        """() => {
            const notes = [...document.querySelectorAll('.course-live')].map(
                el => getComputedStyle(el, '::before').content);
            const icons = [...document.querySelectorAll('.jupyter-widgets-disconnected')].filter(
                el => !el.classList.contains('course-live') && getComputedStyle(el, '::before').content !== 'none')
                .map(el => el.className);
            return {notes, icons};
        }""")


def check_dark_theme(page, name: str) -> None:
    """In JupyterLab's dark theme the lesson's outputs (tables, reveals, notes) are light text on the dark page."""
    page.evaluate("async () => { await window.jupyterapp.commands.execute('apputils:change-theme', "
                  "{theme: 'JupyterLab Dark'}); }")
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
    dark_text = page.evaluate(
        """() => {
            const luminance = color => {
                const [r, g, b] = color.match(/[\\d.]+/g).slice(0, 3).map(Number);
                return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255;
            };
            return [...document.querySelectorAll('.jp-Cell-outputWrapper .jp-RenderedMarkdown, '
                                                 + '.jp-Cell-outputWrapper .widget-html-content')]
                .filter(el => el.innerText.trim() && luminance(getComputedStyle(el).color) < 0.5)
                .map(el => el.innerText.trim().slice(0, 60));
        }""")
    shot(page.locator(".jp-NotebookPanel"), f"{name}-dark")
    page.evaluate("async () => { await window.jupyterapp.commands.execute('apputils:change-theme', "
                  "{theme: 'JupyterLab Light'}); }")
    assert dark_text == [], f"dark text on the dark theme: {dark_text[:5]}"


def cell_of(page, selector: str):
    """The notebook cell containing ``selector`` (for screenshots)."""
    return page.locator(".jp-Cell", has=page.locator(selector)).first


def shot(locator, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    locator.screenshot(path=str(path))
    return path


def check_playground(page, name: str) -> None:
    """The playground renders; a slider change plus Run adds a table row and redraws the plot."""
    root = page.locator(".course-playground").first
    root.wait_for(state="visible")
    for css in ("course-num-workers", "course-batch-size", "course-pin-memory", "course-prefetch-factor",
                "course-persistent-workers", "course-n-batches", "course-run-button", "course-sweep-button",
                "course-results-table", "course-plot"):
        assert root.locator(f".{css}").count() == 1, f"playground part .{css} did not render"
    root.scroll_into_view_if_needed()
    shot(cell_of(page, ".course-playground"), f"{name}-playground-before")

    rows_before = root.locator(".course-results-table tbody tr td:first-child").all_inner_texts()
    rows_before = [r for r in rows_before if r.strip().isdigit()]
    img = root.locator(".course-plot img")
    src_before = img.get_attribute("src")
    assert src_before, "the plot shows no image before the first run"

    # Change a slider with the keyboard, as a learner could: num_workers 0 -> 1 enables prefetch_factor.
    workers = root.locator(".course-num-workers")
    before = workers.locator(".widget-readout").inner_text()
    workers.locator(".noUi-handle").focus()
    workers.locator(".noUi-handle").press("ArrowRight")
    page.wait_for_function("([el, before]) => el.innerText.trim() !== before",
                           arg=[workers.locator(".widget-readout").element_handle(), before])
    assert workers.locator(".widget-readout").inner_text().strip() == str(int(before) + 1)
    # The readout changes in the browser at once; enabling prefetch_factor is the kernel's answer to the change (a
    # round trip that a busy machine delays): wait for it, a hang guard being the only limit.
    page.wait_for_function("el => el.querySelector('.noUi-target[disabled]') === null",
                           arg=root.locator(".course-prefetch-factor").element_handle(), timeout=60_000)
    assert root.locator(".course-prefetch-factor .noUi-target[disabled]").count() == 0, \
        "prefetch_factor should be enabled once num_workers > 0"

    root.locator(".course-run-button button, button.course-run-button").first.click()
    page.wait_for_function(
        """([table, n]) => [...table.querySelectorAll('tbody tr td:first-child')]
                .filter(td => /^\\d+$/.test(td.innerText.trim())).length === n + 1""",
        arg=[root.locator(".course-results-table").element_handle(), len(rows_before)],
        timeout=60_000,
    )
    page.wait_for_function(
        """([root, src]) => { const img = root.querySelector('.course-plot img');
                               return img && img.getAttribute('src') !== src; }""",
        arg=[root.element_handle(), src_before], timeout=30_000,
    )
    status = root.locator(".course-status").inner_text()
    assert "Failed" not in status, status
    last_row = root.locator(".course-results-table tbody tr").last.inner_text()
    assert "manual run" in last_row
    root.scroll_into_view_if_needed()
    shot(cell_of(page, ".course-playground"), f"{name}-playground-after-run")


def check_experiment_order(page, name: str) -> None:
    """The sweep button shows a tqdm bar inside the playground, which completes, and adds rows live."""
    root = page.locator(".course-playground").first
    rows = root.locator(".course-results-table tbody tr")
    n_before = rows.count()
    root.locator(".course-sweep-button").click()
    root.locator(".course-sweep-progress .widget-hprogress").wait_for(state="visible", timeout=60_000)
    page.wait_for_function(
        "(root) => root.querySelector('.course-status').innerText.includes('done') || "
        "root.querySelector('.course-status').innerText.includes('Failed')",
        arg=root.element_handle(), timeout=120_000,
    )
    status = root.locator(".course-status").inner_text()
    assert "done" in status, status
    assert rows.count() > n_before + 2, "the experiment order should add one row per configuration"
    text = root.locator(".course-sweep-progress .widget-hbox").first.inner_text()
    assert "100%" in text, f"the sweep's progress bar did not complete: {text!r}"
    root.scroll_into_view_if_needed()
    shot(root, f"{name}-playground-after-sweep")


def check_tqdm_bars(page, name: str) -> int:
    """Every tqdm notebook bar on the page reached 100% and was closed as a success; returns how many."""
    # tqdm.notebook draws an HBox: [HTML "desc: 100%", FloatProgress, HTML "n/total [time, rate]"].
    boxes = page.locator(".jp-OutputArea-output .widget-hbox:has(> .widget-hprogress)")
    count = boxes.count()
    for i in range(count):
        box = boxes.nth(i)
        text = box.inner_text()
        assert "100%" in text, f"a tqdm bar did not complete: {text!r}"
        done, total = re.search(r"(\d+)/(\d+)", text).groups()
        assert done == total, f"a tqdm bar stopped at {done}/{total}"
        assert box.locator(".progress-bar-success").count() == 1, "a completed tqdm bar is shown as success"
    if count:
        shot(cell_of(page, ".widget-hprogress"), f"{name}-tqdm")
    return count


# --- tests ------------------------------------------------------------------------------------------------
def test_the_class_report_opens_in_chromium(browser_context, tmp_path):
    from course_lib import cli
    from test_room import _room

    assert cli.main(["class", "report", str(_room(tmp_path / "room")), "--out", str(tmp_path / "report")]) == 0
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto((tmp_path / "report" / "class-report.png").as_uri())
    width = page.evaluate("() => document.images[0] && document.images[0].naturalWidth")
    page.close()
    assert width and width > 300 and errors == []


def test_fixture_notebook_widgets_work_in_jupyterlab(page, lab_server):
    open_notebook(page, lab_server, "fixture.ipynb")
    run_all_cells(page)
    assert error_outputs(page) == []
    assert widget_errors(page) == []
    assert "kernel ready" in cell_of(page, ".jp-OutputArea-output").inner_text()
    check_playground(page, "fixture")
    assert check_tqdm_bars(page, "fixture") >= 1, "the tqdm.auto loop did not render a notebook progress bar"
    check_experiment_order(page, "fixture")
    page.screenshot(path=str(SCREENSHOTS / "fixture-page.png"))


def test_opening_and_saving_an_untouched_lesson_changes_nothing(page, lab_server, served_root):
    """The kernel's metadata (Python's version, the kernelspec's name, an empty widget state) arrives on opening;
    saving writes the lesson back byte for byte (the course lab's save hook), so `git pull` never meets a change."""
    rel = "notebooks/03_modules.ipynb"
    open_notebook(page, lab_server, rel)
    page.evaluate("async () => { await window.jupyterapp.commands.execute('docmanager:save'); }")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
    assert (served_root / rel).read_bytes() == (REPO / rel).read_bytes(), f"saving an untouched {rel} changed it"


@pytest.mark.parametrize("notebook", _lesson_notebooks() or [None],
                         ids=[p.name for p in _lesson_notebooks()] or ["no-lesson-notebooks"])
def test_lesson_notebook_runs_in_jupyterlab(page, lab_server, served_root, notebook):
    if notebook is None:
        pytest.skip(f"no notebooks/{' or '.join(LESSON_PATTERNS)} yet")
    rel = f"notebooks/{notebook.name}"
    stored = (served_root / rel).read_bytes()
    open_notebook(page, lab_server, rel)
    run_all_cells(page)
    assert (served_root / rel).read_bytes() == stored, f"running {rel} wrote it to disk (autosave) before any save"
    page.screenshot(path=str(SCREENSHOTS / f"{notebook.stem}-page.png"), full_page=False)
    assert error_outputs(page) == [], f"{rel} shows an error output"
    assert widget_errors(page) == []
    assert ansi_outputs(page) == [], f"{rel} shows raw ANSI colour codes"
    assert truncated_choices(page) == [], f"{rel} cuts off answer choices without a tooltip"
    if page.locator(".course-playground").count():
        check_playground(page, notebook.stem)
    check_tqdm_bars(page, notebook.stem)
    if notebook.name.startswith("00_"):  # the predict/reveal round trip, on the shortest lesson
        check_answer_opens_what_was_held(page, notebook.stem, measured_marker="the Python loop")
        progress = page.locator(".jp-Cell-outputWrapper table", has_text="predictions answered").first
        assert "(smoke mode)" in progress.locator("tr", has_text="00_welcome").inner_text(), \
            "the progress view in lesson 00 should show this very run"
    if notebook.name.startswith(("00_", "02_")):  # reopen: an answered question (00), open ones and widgets (02)
        save_and_reopen(page, lab_server, rel)
        assert widget_errors(page) == [], (
            f"{rel} shows a widget error when reopened after saving; outputs saved without their model's state: "
            f"{saved_widget_outputs_without_state(served_root / rel)}")
        assert (("Your answer:" in page_text(page) and "This machine measured" in outputs_text(page))
                if notebook.name.startswith("00_")
                else page.locator(".widget-toggle-buttons").count() >= 1), "the questions did not come back"
        stale = stale_controls(page)
        if notebook.name.startswith("02_"):  # open questions and the playground: each says to run its cell again
            assert stale["notes"] and all("Run All Above Selected Cell" in note for note in stale["notes"]), stale
        assert stale["icons"] == [], "a reopened course widget still shows the broken-link icon"
        page.locator(".course-live").last.scroll_into_view_if_needed() if stale["notes"] else None
        shot(page.locator(".jp-NotebookPanel"), f"{notebook.stem}-reopened")
        check_dark_theme(page, notebook.stem)
    else:  # Run All, then close without saving, as a learner who only ran the lesson: the file stays as stored
        assert close_current_tab(page), f"closing {rel} after Run All should offer to save it"
        page.locator(".jp-Dialog button", has_text=re.compile("^Discard$")).click()
        page.wait_for_selector(".jp-Dialog", state="detached", timeout=10_000)
        page.wait_for_timeout(1_000)
        assert (served_root / rel).read_bytes() == stored, f"running {rel} and discarding changed it on disk"



def choice(page, text: str):
    return page.locator(".widget-toggle-buttons button", has_text=re.compile(f"^{text}$")).first


SHOWN_IN_OUTPUTS = ("text => [...document.querySelectorAll('.jp-Cell-outputWrapper')]"
                    ".some(n => n.innerText.includes(text))")


def test_a_first_answer_stays_final_after_a_reload(page, lab_server):
    """Seen: after a reload the question's buttons came back live (the kernel's "turn it into text" update cannot
    reach a reloaded page), and a second click changed the reveal and the progress. Now the kernel locks the
    question at the first answer, and the reloaded page renders the lock."""
    open_notebook(page, lab_server, "question.ipynb")
    run_all_cells(page)
    page.evaluate("async () => { await window.jupyterapp.commands.execute('docmanager:save'); }")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
    page.reload()
    choice(page, "red").wait_for(state="visible", timeout=60_000)  # the kernel's widget state, on the new page
    choice(page, "red").click()
    page.wait_for_function("() => document.querySelector('.jp-Notebook').innerText.includes('You predicted: red')",
                           timeout=30_000)
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status"
                           " === 'idle'", timeout=30_000)
    page.wait_for_timeout(2_000)  # the kernel has heard the answer (an idle kernel handles it at once)
    choice(page, "blue").click(force=True)  # as a learner would: the second click must change nothing
    page.wait_for_timeout(3_000)
    text = outputs_text(page)
    shot(page.locator(".jp-NotebookPanel"), "question-second-click")
    assert "You predicted: red" in text and "You predicted: blue" not in text, text[-1000:]
    assert choice(page, "blue").is_disabled(), "the kernel did not lock the question at its first answer"


def test_each_question_of_a_cell_opens_its_own_reveal(page, lab_server):
    """Two questions in one cell: answering one opens its reveal without waiting for the other; the measurement,
    which could answer either, opens once both are answered."""
    open_notebook(page, lab_server, "two_questions.ipynb")
    run_all_cells(page)
    assert not {"SHAPE-WHY", "SIZE-WHY", "MEASURED-42"} & set(outputs_text(page).split()), "shown before an answer"
    keep_kernel_busy(page, 30)  # the browser opens what the answers release, not the kernel
    choice(page, "square").click()
    page.wait_for_function(SHOWN_IN_OUTPUTS, arg="SHAPE-WHY", timeout=30_000)
    text = outputs_text(page)
    assert "You predicted: square" in text and "SIZE-WHY" not in text and "MEASURED-42" not in text, text
    choice(page, "large").click()
    page.wait_for_function(SHOWN_IN_OUTPUTS, arg="SIZE-WHY", timeout=30_000)
    text = outputs_text(page)
    assert "MEASURED-42" in text and "You predicted: large" in text and HELD not in text, text
    shot(page.locator(".jp-NotebookPanel"), "two-questions-answered")


def close_current_tab(page) -> bool:
    """Close the current tab as a learner would; True when JupyterLab asked something first (a dialog)."""
    page.evaluate("() => { window.jupyterapp.commands.execute('application:close'); }")
    try:
        page.wait_for_selector(".jp-Dialog", timeout=3_000)
        return True
    except Exception:  # no dialog: the tab closed straight away
        return False


def test_a_lesson_opens_unmodified_and_running_it_writes_nothing(page, lab_server, served_root):
    """Seen: every lesson showed the unsaved-changes dot as soon as it opened ("Save your work?" on closing it), and
    autosave wrote lessons nobody saved. Now: open + close asks nothing; Run All then close with Discard leaves the
    file as stored (autosave is off through the course's settings overrides)."""
    rel = "notebooks/03_modules.ipynb"
    before = (served_root / rel).read_bytes()
    open_notebook(page, lab_server, rel)
    plugin = page.evaluate("""async () => await window.jupyterapp.serviceManager.settings.fetch(
        '@jupyterlab/docmanager-extension:plugin')""")
    assert plugin["schema"]["properties"]["autosave"]["default"] is False and \
        "autosave" not in plugin.get("settings", {}), f"the course's settings should turn autosave off: {plugin}"
    page.wait_for_timeout(2_000)  # the kernel's metadata has arrived (open_notebook ran a probe on it)
    dirty = page.evaluate("() => window.jupyterapp.shell.currentWidget.context.model.dirty")
    asked = close_current_tab(page)
    assert not dirty and not asked, "opening a lesson marked it modified"

    open_notebook(page, lab_server, rel)
    run_all_cells(page)
    assert close_current_tab(page), "closing a lesson that ran should offer to save it"
    page.locator(".jp-Dialog button", has_text=re.compile("^Discard$")).click()
    page.wait_for_selector(".jp-Dialog", state="detached", timeout=10_000)
    page.wait_for_timeout(1_000)
    assert (served_root / rel).read_bytes() == before, f"running {rel} and discarding changed it on disk"


def test_a_torchrun_cell_shows_a_line_while_it_starts(page, lab_server):
    """Seen: distributed cells showed nothing for 19-27 s. The cell's first line shows while the job is still
    starting (no rank has printed yet, the kernel is busy), then each rank's line, then the cell's own output."""
    open_notebook(page, lab_server, "torchrun.ipynb")
    started = page.evaluate("() => performance.now()")
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    page.wait_for_function(SHOWN_IN_OUTPUTS, arg="torchrun: starting 2 processes", timeout=30_000)
    first_line_s = (page.evaluate("() => performance.now()") - started) / 1000
    text = outputs_text(page)
    status = page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status")
    assert status == "busy" and "cell done" not in text, "the first line should show while the job runs"
    page.wait_for_function(SHOWN_IN_OUTPUTS, arg="[rank1]: cell done", timeout=120_000)
    text = outputs_text(page)
    assert text.index("[rank0]: started: running the cell") < text.index("[rank0]: cell done"), text
    print(f"time to the torchrun cell's first line in the browser: {first_line_s:.1f} s")


def test_a_long_silent_measurement_shows_how_far_it_got(page, lab_server):
    """Seen: lesson 05's bf16 cell showed an empty output for about 114 s. A silent cell now shows one line, kept
    current: its time so far and the measurement's rounds done, then how long it took."""
    open_notebook(page, lab_server, "silent.ipynb")
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    page.wait_for_function(SHOWN_IN_OUTPUTS, arg="rounds done, about", timeout=60_000)
    text = outputs_text(page)
    assert "Still running" in text and "timing a vs b" in text and "MEASURED" not in text, text
    shot(page.locator(".jp-NotebookPanel"), "silent-cell-status")
    page.wait_for_function(SHOWN_IN_OUTPUTS, arg="MEASURED", timeout=120_000)
    page.wait_for_function(SHOWN_IN_OUTPUTS, arg="This cell ran for", timeout=30_000)
    assert "Still running" not in outputs_text(page), "the line should say how long the cell took once it ended"


def test_the_stale_note_step_brings_a_question_back_on_a_new_kernel(page, lab_server):
    """Seen: after a lab restart the note said "run this cell again", which raised NameError. On a new kernel the
    cell alone still fails so; the note's step (Run All Above Selected Cell from the Run menu, then the cell) brings
    the question back."""
    assert STALE_STEP in STALE_NOTE
    open_notebook(page, lab_server, "set_up_then_question.ipynb")
    run_all_cells(page)
    page.evaluate("async () => { await window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                  ".restart(); }")
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status"
                           " === 'idle'", timeout=60_000)
    page.evaluate("""async () => { const panel = window.jupyterapp.shell.currentWidget;
        panel.content.activeCellIndex = 1;
        await window.jupyterapp.commands.execute('notebook:run-cell'); }""")
    page.wait_for_function(SHOWN_IN_OUTPUTS, arg="NameError", timeout=60_000)  # the old advice, on a new kernel
    page.evaluate("() => { window.jupyterapp.shell.currentWidget.content.activeCellIndex = 1; }")
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{STALE_STEP}$")).click()
    page.evaluate("""async () => { const panel = window.jupyterapp.shell.currentWidget;
        panel.content.activeCellIndex = 1;
        await window.jupyterapp.commands.execute('notebook:run-cell'); }""")
    choice(page, "red").wait_for(state="visible", timeout=60_000)
    assert error_outputs(page) == [], "the note's step should bring the question back without an error"
