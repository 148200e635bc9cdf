"""Tests for the lesson presentation helpers (course_lib.lesson)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from conftest import REPO
from course_lib import lesson


def test_predict_smoke_uses_default_and_reveal_compares(capsys: pytest.CaptureFixture[str]) -> None:
    p = lesson.predict("Which is faster?", choices=["A", "B"], default="B")
    assert p.widget is None  # smoke mode / no kernel: no widget
    assert p.answer == "B"
    assert p.matches("B") and not p.matches("A")
    assert p.reveal("B") is None  # displays; a cell ending with it shows no stray True/False
    text = p.reveal_markdown("A", "because of X")
    assert "You predicted:** B" in text and "because of X" in text and "Not what you predicted" in text


def test_nothing_is_preselected_and_an_unanswered_reveal_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    p = lesson.predict("q?", choices=["x", "y"])
    assert p.answer == "" and not p.answered
    text = p.reveal_markdown("y", "why")
    assert "No prediction was made" in text and "You predicted" not in text and "matched" not in text
    monkeypatch.setenv("COURSE_MODE", "full")
    recorded = lesson.predict("How many?", default="3")
    assert recorded.answer == ""  # a recorded answer is for smoke-mode tests only, never a learner's run
    monkeypatch.setenv("COURSE_MODE", "smoke")
    assert recorded.answer == "3" and "You predicted:** 3" in recorded.reveal_markdown("7 measured")


def test_undecided_measurement_and_skipped_prediction() -> None:
    p = lesson.Prediction("q?", choices=("A", "B"), default="A")
    text = p.reveal_markdown(None, "busy")
    assert "could not be decided" in text and "matched" not in text
    skipped = lesson.Prediction("q?", choices=("A", "B"), default=lesson.SKIP_CHOICE)
    assert "chose not to predict" in skipped.reveal_markdown("A")
    with pytest.raises(ValueError, match="added by predict"):
        lesson.predict("q?", choices=["A", lesson.SKIP_CHOICE])


class FakeHandle:
    def __init__(self) -> None:
        self.shown: list[str] = []

    def update(self, obj: object) -> None:
        self.shown.append(getattr(obj, "data", str(obj)))


def _live_question(monkeypatch: pytest.MonkeyPatch, shown: list) -> lesson.Prediction:
    """A multiple-choice question as a live kernel shows it (real widgets, no browser), its displays collected."""
    import IPython.display

    def fake_display(obj: object, display_id: bool = False) -> FakeHandle:
        shown.append(obj)
        return FakeHandle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    monkeypatch.setattr(lesson, "_in_live_kernel", lambda: True)
    monkeypatch.setattr(lesson, "_holding", lesson._Holding())
    return lesson.predict("Which is faster?", choices=["A", "B"])


def _links_to(p: lesson.Prediction, stack: object) -> bool:
    return any(link.source == (p.widget, "index") and link.target == (stack, "selected_index") for link in p._links)


def test_an_unanswered_reveal_is_written_for_every_answer_and_chosen_in_the_browser(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import ipywidgets as widgets

    shown: list = []
    p = _live_question(monkeypatch, shown)
    p.reveal("B", "because")
    hint, stack = shown[-1].children
    assert "still open" in hint.value and "because" not in hint.value and "B" not in hint.value.split("choose")[0]
    assert isinstance(stack, widgets.Stack) and stack.selected_index is None  # nothing shows before an answer
    assert _links_to(p, stack)  # the answer picks the reveal in the browser, not through the kernel
    texts = [out.outputs[0]["data"]["text/markdown"] for out in stack.children]
    assert len(texts) == 3 and all("because" in t for t in texts)
    assert "You predicted:** A" in texts[0] and "Not what you predicted" in texts[0]
    assert "You predicted:** B" in texts[1] and "Your prediction matched" in texts[1]
    assert "chose not to predict" in texts[2]
    question = p._question_handle
    p.widget.value = "A"  # the kernel hears the answer: the question turns into text, the hints go
    assert hint.layout.display == "none"
    assert "Your answer:* A" in question.shown[-1]


def test_cells_after_an_open_question_are_held_until_its_reveal(monkeypatch: pytest.MonkeyPatch) -> None:
    import ipywidgets as widgets

    shown: list = []
    p = _live_question(monkeypatch, shown)

    class Cell:
        def __init__(self, raw_cell: str) -> None:
            self.raw_cell = raw_cell

    class Result:
        def __init__(self, error: BaseException | None = None) -> None:
            self.error_in_exec = error

    lesson._hold_cell_output(Cell("measure()"))
    hint, gate = shown[-1].children
    assert lesson.HELD_TEXT in hint.value and isinstance(gate, widgets.Stack) and gate.selected_index is None
    assert len(gate.children) == 3 and len({id(c) for c in gate.children}) == 1  # any answer opens the same area
    assert lesson._holding.output is gate.children[0] and _links_to(p, gate)
    lesson._release_cell_output(Result())
    assert lesson._holding.output is None and gate.selected_index is None and lesson._holding.questions == [p]

    lesson._hold_cell_output(Cell("broken()"))
    failed = shown[-1].children[1]
    lesson._release_cell_output(Result(ValueError("x")))
    assert failed.selected_index == 0  # an error is never held back

    count = len(shown)
    lesson._hold_cell_output(Cell('again = lesson.predict("q?", choices=["x", "y"])'))
    assert len(shown) == count and lesson._holding.output is None  # a cell asking a question is never held
    lesson._release_cell_output(Result())

    lesson._hold_cell_output(Cell("p.reveal('A')"))
    p.reveal("A")
    lesson._release_cell_output(Result())
    assert lesson._holding.questions == []  # revealed: later cells run as usual
    count = len(shown)
    lesson._hold_cell_output(Cell("print('next')"))
    assert len(shown) == count


def test_an_answered_question_holds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list = []
    p = _live_question(monkeypatch, shown)
    p.widget.value = "B"
    count = len(shown)
    lesson._hold_cell_output(None)
    assert len(shown) == count and lesson._holding.output is None
    p.reveal("B")
    assert "Your prediction matched" in shown[-1].data


def test_a_free_text_reveal_waits_for_the_kernel_then_updates_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    import IPython.display

    class FakeWidget:
        value = None

    shown: list[str] = []
    handles: list[FakeHandle] = []

    def fake_display(obj: object, display_id: bool = False) -> FakeHandle:
        shown.append(getattr(obj, "data", str(obj)))
        handles.append(FakeHandle())
        return handles[-1]

    monkeypatch.setattr(IPython.display, "display", fake_display)
    question = FakeHandle()
    p = lesson.Prediction("How many?", widget=FakeWidget(), _question_handle=question)
    p.reveal("3", "because")
    assert "still open" in shown[-1]
    assert "because" not in shown[-1] and "measured:**" not in shown[-1]  # nothing spoiled before answering
    FakeWidget.value = "4"
    p._on_answer({"new": "4"})
    assert "You predicted:** 4" in handles[-1].shown[-1]
    assert "Your answer:* 4" in question.shown[-1]  # the widget is replaced by text: a saved notebook reopens clean
    assert p._pending == []


def test_predict_answer_reads_the_widget_at_reveal_time() -> None:
    class FakeWidget:
        value = "B"

    p = lesson.Prediction("q?", choices=("A", "B"), widget=FakeWidget())
    assert p.answer == "B"
    FakeWidget.value = "A"
    assert p.answer == "A"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"question": ""},
        {"question": "q", "choices": ["only"]},
        {"question": "q", "choices": ["a", "a"]},
        {"question": "q", "choices": ["a", "b"], "default": "c"},
        {"question": "q", "choices": ["a", "b", "skip: just show me"]},
    ],
)
def test_predict_rejects_bad_input(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        lesson.predict(**kwargs)


def test_reveal_rejects_an_actual_outside_the_choices() -> None:
    p = lesson.predict("q?", choices=["a", "b"])
    with pytest.raises(ValueError, match="not one of the choices"):
        p.reveal("c")


def test_ratio_sentence_directions() -> None:
    rate = lesson.ratio_sentence("workers=0", 100.0, "workers=2", 180.0, "samples/s")
    assert "workers=2 was 1.8x faster than workers=0" in rate
    slower_rate = lesson.ratio_sentence("A", 200.0, "B", 100.0, "samples/s")
    assert "B was 2.0x slower than A" in slower_rate
    time = lesson.ratio_sentence("fp32", 2.0, "bf16", 1.0, "s")
    assert "bf16 was 2.0x faster than fp32" in time
    mem = lesson.ratio_sentence("fp32", 400.0, "bf16", 300.0, "MiB")
    assert "bf16 used 1.3x less memory than fp32" in mem
    other = lesson.ratio_sentence("A", 1.0, "B", 3.0, "widgets")
    assert "3.0x higher" in other
    big = lesson.ratio_sentence("A", 61619.4, "B", 9537.0, "samples/s")
    assert "(9,537 vs 61,619 samples/s)" in big
    same = lesson.ratio_sentence("A", 100.0, "B", 102.0, "samples/s")
    assert "about the same" in same


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_ratio_rejects_non_measurements(bad: float) -> None:
    with pytest.raises(ValueError, match="finite, positive"):
        lesson.ratio_sentence("A", bad, "B", 1.0, "s")
    with pytest.raises(ValueError):
        lesson.ratio(1.0, bad)


def test_outdated_html_escapes_code_and_names_the_fix() -> None:
    box = lesson.outdated_html("scaler = torch.cuda.amp.GradScaler()", "scaler = torch.amp.GradScaler('cuda')", "a < b")
    assert "torch.cuda.amp.GradScaler" in box and "torch.amp.GradScaler(&#x27;cuda&#x27;)" in box
    assert "a &lt; b" in box  # escaped, so code cannot break the HTML
    assert "color: inherit" in box  # readable in dark themes
    with pytest.raises(ValueError, match="new_code"):
        lesson.outdated_html("old", " ", "why")


def test_gpu_note_and_recap_markdown() -> None:
    note = lesson.gpu_note_markdown("line one\n\nline two")
    assert note.startswith("> **What would differ on a GPU**") and "> line two" in note
    text = lesson.recap_markdown(["point a", "point b"], exercise="exercises/02_bottleneck.ipynb")
    assert "- point a" in text and "python -m course_lib check 02" in text
    several = lesson.recap_markdown(["p"], exercise=["exercises/01_template.ipynb", "exercises/09_evaluate_sums.ipynb"])
    assert "check 01" in several and "check 09" in several
    with pytest.raises(ValueError):
        lesson.recap_markdown([], exercise="exercises/02_bottleneck.ipynb")
    assert "Practise" not in lesson.recap_markdown(["p"], exercise=None)
    with pytest.raises(ValueError, match="NN_name"):
        lesson.exercise_id("exercises/bottleneck.ipynb")


def test_display_helpers_run_outside_a_notebook(capsys: pytest.CaptureFixture[str]) -> None:
    lesson.say("**hello**")
    lesson.gpu_note("faster")
    lesson.outdated("a", "b", "c")
    lesson.recap(["x"], exercise="exercises/13_modules.ipynb")
    out = capsys.readouterr().out
    assert out  # each helper displayed something


def test_unattended_runs_write_reveals_out_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lesson, "_in_live_kernel", lesson._in_live_kernel)
    import IPython

    class FakeShell:
        kernel = object()

    monkeypatch.setattr(IPython, "get_ipython", lambda: FakeShell())
    monkeypatch.delenv("COURSE_UNATTENDED", raising=False)
    assert lesson._in_live_kernel()
    monkeypatch.setenv("COURSE_UNATTENDED", "1")
    assert not lesson._in_live_kernel()


def test_code_spans_show_as_code_in_a_question_and_without_backticks_on_a_button() -> None:
    assert lesson._code_spans_html("Does `num_workers=2` beat <0>?") == (
        "Does <code>num_workers=2</code> beat &lt;0&gt;?")
    assert lesson._code_spans_html("an odd ` backtick") == "an odd ` backtick"  # unpaired: shown as written
    buttons = lesson._choice_widget(("`pin_memory` wins", "no difference"))
    assert [label for label, _ in buttons.options] == ["pin_memory wins", "no difference", lesson.SKIP_CHOICE]
    buttons.value = "`pin_memory` wins"  # the answer is the choice as written, compared with the reveal's
    assert buttons.tooltips[0] == "pin_memory wins"


def test_a_reopened_question_says_to_run_its_cell_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The question's box is marked as a live control and carries the rule that, once its kernel is gone, replaces
    the broken-link icon by a sentence; held areas and reveals are marked as readable without a kernel."""
    shown: list = []
    p = _live_question(monkeypatch, shown)
    question_box = shown[0]
    assert lesson.LIVE_CLASS in question_box._dom_classes
    assert lesson.STALE_STYLE in question_box.children[0].value and lesson.STALE_NOTE in lesson.STALE_STYLE
    p.reveal("A")
    assert lesson.HELD_CLASS in shown[-1]._dom_classes


def test_the_first_answer_is_final(monkeypatch: pytest.MonkeyPatch) -> None:
    """A page that lost the question's text (reloaded, reopened) can still send a second answer: the kernel locks
    the widget at the first (its disabled state is synced, so a reloaded page renders it locked), sets a later value
    back, and the journal records the first answer only."""
    recorded: list[tuple] = []
    monkeypatch.setattr(lesson.journal, "prediction_answered", lambda *args: recorded.append(args))
    shown: list = []
    p = _live_question(monkeypatch, shown)
    p.reveal("B")
    stack = shown[-1].children[1]
    assert not p.widget.disabled
    p.widget.value = "A"
    assert p.widget.disabled and recorded == [("Which is faster?", "A", False)]
    p.widget.value = "B"  # the second click of a reloaded page
    assert p.widget.value == "A" and p.answer == "A" and p.widget.index == 0  # the linked reveal follows back
    assert recorded == [("Which is faster?", "A", False)] and _links_to(p, stack)
    question_box = shown[0]
    assert f".course-q-{p.key}:has(.mod-active) button" in question_box.children[0].value  # locked in the browser


def test_each_question_of_a_cell_releases_its_own_reveal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two questions asked in one cell (lesson 13): a later cell's output waits for both (a measurement may answer
    either), but each reveal is shown outside that held area, linked to its own question only, so one answer
    opens its reveal without waiting for the other."""
    import ipywidgets as widgets

    shown: list = []
    first = _live_question(monkeypatch, shown)
    import IPython.display

    holding_at_display: list = []

    def fake_display(obj: object, display_id: bool = False) -> FakeHandle:
        shown.append(obj)
        holding_at_display.append(lesson._holding.output)
        return FakeHandle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    second = lesson.predict("Which is smaller?", choices=["C", "D"])
    assert lesson._holding.questions == [first, second]

    class Cell:
        raw_cell = "measure()"

    lesson._hold_cell_output(Cell())
    outer = shown[-1].children[1]
    held_first = lesson._holding.output
    inner = outer.children[0]
    assert _links_to(second, outer) and _links_to(first, inner) and inner.children[0] is held_first  # both gate it
    first.reveal("A")
    reveal_box = shown[-2]
    assert holding_at_display[-2] is None, "the reveal was displayed inside the held area"
    assert _links_to(first, reveal_box.children[1]) and not _links_to(second, reveal_box.children[1])
    held_after = shown[-1].children[1]  # the rest of the cell: held again, now for the open question only
    assert _links_to(second, held_after) and isinstance(held_after.children[0], widgets.Output)
    assert lesson._holding.output is held_after.children[0] is not held_first
    second.reveal("C")
    assert holding_at_display[-1] is None and lesson._holding.output is None  # no question left open
    lesson._release_cell_output(None)
    assert lesson._holding.questions == []


def test_the_stale_note_names_a_command_this_jupyterlab_has() -> None:
    """The step the note gives is a Run-menu item of the installed JupyterLab, spelled as the menu spells it."""
    import sys

    static = Path(sys.prefix) / "share" / "jupyter" / "lab" / "static"
    bundles = list(static.glob("*.js"))
    if not bundles:
        pytest.skip(f"no JupyterLab front end installed under {static}")
    command = "Run All Above Selected Cell"
    assert command in lesson.STALE_NOTE and "run this cell again" not in lesson.STALE_NOTE
    assert any(command in bundle.read_text(encoding="utf-8", errors="replace") for bundle in bundles)


@pytest.mark.slow
def test_the_stale_note_step_works_on_a_new_kernel_and_the_old_advice_did_not(tmp_path: Path) -> None:
    """Lesson 12's first question on a new kernel (a lab restarted): its cell alone raises NameError (the old note's
    advice, "run this cell again"); the cells above it, then the cell (the note's step), run."""
    import nbformat
    from nbclient.exceptions import CellExecutionError

    from course_lib.nbrun import NotebookRunner

    nb = nbformat.read(REPO / "notebooks" / "12_techniques.ipynb", as_version=4)
    question = next(i for i, cell in enumerate(nb.cells) if "lesson.predict(" in cell.source)
    resources = {"metadata": {"path": str(REPO / "notebooks")}}

    alone = nbformat.v4.new_notebook(cells=[nb.cells[question]], metadata=nb.metadata)
    with pytest.raises(CellExecutionError, match="NameError"):
        NotebookRunner(alone, timeout=150, kernel_name="python3", resources=resources).execute()

    above_then_cell = nbformat.v4.new_notebook(cells=nb.cells[:question + 1], metadata=nb.metadata)
    NotebookRunner(above_then_cell, timeout=150, kernel_name="python3", resources=resources).execute()
