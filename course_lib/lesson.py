"""Presentation helpers for the lesson notebooks: predict, measure, explain.

Every lesson follows the same rhythm:

1. **predict** -- the learner commits to a guess *before* anything is measured
   (:func:`predict` shows a small widget in a live notebook);
2. **measure** -- the library measures on this machine (``course_lib.perf`` and friends);
3. **explain** -- the text is written from the measured numbers (:func:`ratio_sentence`,
   :meth:`Prediction.reveal`), never from numbers typed in advance.

The other helpers draw the recurring boxes: :func:`outdated` (an old snippet next to its modern fix),
:func:`gpu_note` (what would differ on a GPU) and :func:`recap` (the summary and the exercise to do next).

Every box has a pure ``*_html`` / ``*_markdown`` builder (tested) and a thin function that displays it.
Colours are translucent and text colour is inherited, so the boxes read well in JupyterLab's light and
dark themes alike.
"""

from __future__ import annotations

import html
import math
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_lib import journal, mode

__all__ = [
    "Prediction",
    "predict",
    "explain",
    "use_course_threads",
    "SKIP_CHOICE",
    "say",
    "show_source",
    "ratio",
    "ratio_sentence",
    "outdated",
    "outdated_html",
    "gpu_note",
    "gpu_note_markdown",
    "recap",
    "recap_markdown",
    "exercise_id",
]


# --------------------------------------------------------------------------------------------------------
# Displaying things
# --------------------------------------------------------------------------------------------------------
def _display(obj: Any) -> None:
    """``IPython.display.display`` when IPython is importable, else print the plain-text form."""
    try:
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython ships with the course's environment
        print(getattr(obj, "data", obj))
        return
    display(obj)


def _in_live_kernel() -> bool:
    """True inside a Jupyter kernel a person is looking at (where widgets can render and be answered).

    False in a plain interpreter or script, and when ``COURSE_UNATTENDED=1``: a notebook executed by nbval, nbclient
    or the site builder has a kernel but nobody to answer, so its reveals are written out in full at once.
    """
    if mode.is_unattended():
        return False
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def say(markdown: str) -> None:
    """Display ``markdown`` as rendered Markdown (use it for text built from measured numbers)."""
    from IPython.display import Markdown

    _display(Markdown(markdown))


def show_source(obj: Any) -> None:
    """Display the source of a ``course_lib`` function or class, highlighted, under the file it comes from.

    The lesson shows the code that runs, read from the library itself, never a copy that could drift from it.
    """
    import inspect

    obj = inspect.unwrap(obj)  # a decorated function (``@torch.no_grad()``): its own source, not the decorator's
    path = Path(inspect.getsourcefile(obj) or "").resolve()
    root = Path(__file__).resolve().parent.parent  # the folder holding course_lib/
    where = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    say(f"`{where}` · `{obj.__qualname__}`\n\n```python\n{inspect.getsource(obj).rstrip()}\n```")


# A widget saved with the notebook outlives its kernel: reopened, it shows its saved controls, which do nothing, and
# ipywidgets marks each view `jupyter-widgets-disconnected` (a red broken-link icon). The course's controls
# (class LIVE_CLASS) say in words what to do instead; its held areas and reveals (HELD_CLASS) need no kernel to be
# read, so they show no icon. The rule travels in an HTML widget's saved value, so it works on a reopened notebook.
LIVE_CLASS, HELD_CLASS = "course-live", "course-held"
# A new kernel has none of the lesson's names (``lesson``, the measured values) until the cells above run again:
# "run this cell again" alone ends in a NameError, so the note names the step that works.
STALE_NOTE = ("These controls belong to a kernel that has stopped. To use them, select this cell, choose "
              "Run All Above Selected Cell in the Run menu, then run this cell.")
STALE_STYLE = (
    "<style>"
    f'.{LIVE_CLASS}.jupyter-widgets-disconnected::before {{content: "{STALE_NOTE}"; font: italic 13px '
    "var(--jp-ui-font-family, sans-serif); color: inherit; padding: 2px 0 6px}"
    f".{LIVE_CLASS} .jupyter-widgets-disconnected::before, .{HELD_CLASS}.jupyter-widgets-disconnected::before, "
    f".{HELD_CLASS} .jupyter-widgets-disconnected::before {{content: none}}"
    f".{LIVE_CLASS}.jupyter-widgets-disconnected :is(button, input) {{pointer-events: none; opacity: 0.55}}"
    "</style>"
)

# --------------------------------------------------------------------------------------------------------
# Predict -> measure -> explain
# --------------------------------------------------------------------------------------------------------
SKIP_CHOICE = "skip: just show me"


@dataclass
class Prediction:
    """A question asked before a measurement; :meth:`reveal` compares the learner's answer with what was measured.

    Nothing is pre-selected. In a live notebook an open multiple-choice question holds back what would answer it:
    the output of every cell run after it, up to and including the cell of its reveal, goes into a held area that
    the answer opens (see :func:`_hold_cell_output`), and the reveal is written for every possible answer, the
    answer choosing which one shows. Both are linked in the browser, so a click takes effect at once, also while
    Run All keeps the kernel busy. Once the kernel hears the answer, the question is replaced by plain text (so a
    saved notebook reopens without dead controls).
    Without a live kernel (nbval, a rendered site) nobody can answer: the reveal says so plainly. ``default`` is an
    answer recorded for smoke-mode runs only, for tests that exercise the comparison branch; lessons never pass one
    (a default in the lesson's code would read as the expected answer).
    """

    question: str
    choices: tuple[str, ...] | None = None
    default: str = ""
    widget: Any = field(default=None, repr=False)
    key: str = field(default_factory=lambda: uuid.uuid4().hex[:10], repr=False)  # names this question's CSS classes
    _measured: tuple[str | None] | None = field(default=None, repr=False)  # (actual,) once revealed
    _question_handle: Any = field(default=None, repr=False)
    _pending: list[Any] = field(default_factory=list, repr=False)
    _hints: list[Any] = field(default_factory=list, repr=False)
    _links: list[Any] = field(default_factory=list, repr=False)
    _first_answer: str = field(default="", repr=False)  # the answer the kernel heard first: final

    @property
    def answer(self) -> str:
        """The learner's answer ("" when none was given; :data:`SKIP_CHOICE` when they chose not to predict).

        The first answer the kernel hears is final (see :meth:`_on_answer`)."""
        if self._first_answer:
            return self._first_answer
        if self.widget is not None:
            value = self.widget.value
            return "" if value is None else str(value)
        return self.default if mode.is_smoke() else ""

    @property
    def answered(self) -> bool:
        """True once the learner (or a smoke-mode recording) has committed to an answer."""
        return bool(self.answer.strip())

    def matches(self, actual: str | None) -> bool:
        """Whether the answer equals ``actual`` (case and surrounding spaces ignored)."""
        return actual is not None and self.answer.strip().lower() == str(actual).strip().lower()

    @property
    def revealed(self) -> bool:
        """True once :meth:`reveal` has run (its cell ends the stretch of held cells)."""
        return self._measured is not None

    @property
    def values(self) -> tuple[str, ...]:
        """Every answer a choice widget can give, in the order of its buttons."""
        return () if self.choices is None else (*self.choices, SKIP_CHOICE)

    def reveal_markdown(self, actual: str | None, why: str = "", answer: str | None = None) -> str:
        """The Markdown of the reveal for ``answer`` (default: the current answer); pure, for tests.

        ``actual=None`` means the measurement could not decide (e.g. a busy machine): no choice is "right".
        """
        measured = actual if actual is not None else "could not be decided on this machine right now"
        answer = (self.answer if answer is None else answer).strip()
        if not answer:
            lines = ["**No prediction was made** (nobody answered the question above).  ",
                     f"**This machine measured:** {measured}"]
        elif answer == SKIP_CHOICE:
            lines = ["**You chose not to predict.**  ", f"**This machine measured:** {measured}"]
        else:
            lines = [f"**You predicted:** {answer}  ", f"**This machine measured:** {measured}"]
            if self.choices is not None and actual is not None:
                verdict = ("Your prediction matched." if answer.lower() == str(actual).strip().lower()
                           else "Not what you predicted: worth a second look.")
                lines[-1] += "  "
                lines.append(f"*{verdict}*")
        if why:
            lines += ["", why]
        return "\n".join(lines)

    def _waiting_text(self) -> str:
        return (f"Your prediction is still open. Answer the question above (or choose {SKIP_CHOICE}): what this "
                "machine measured appears here as soon as you do.")

    def _waiting_markdown(self) -> str:
        return f"**{self._waiting_text()}**"

    def _freeze_question(self) -> None:
        """Replace the question widget by plain text showing the committed answer."""
        if self._question_handle is None:
            return
        from IPython.display import Markdown

        self._question_handle.update(Markdown(f"**Predict:** {self.question}  \n*Your answer:* {self.answer}"))
        self._question_handle = None

    def _journal(self, actual: str | None) -> None:
        """Note the learner's answer, and whether it matched, in the progress journal."""
        compared = self.choices is not None and actual is not None and self.answer != SKIP_CHOICE
        journal.prediction_answered(self.question, self.answer, self.matches(actual) if compared else None)

    def hint(self, text: str) -> Any:
        """A line shown until this question is answered (see :func:`_hint`)."""
        return _hint(text, [self])

    def linked_stack(self, children: Sequence[Any]) -> Any:
        """A stack showing ``children[i]`` once the learner picks choice ``i`` and nothing before: the choice's
        index is linked to the stack in the browser, never through the (possibly busy) kernel."""
        import ipywidgets as widgets

        stack = widgets.Stack(children=list(children), selected_index=None)
        self._links.append(widgets.jsdlink((self.widget, "index"), (stack, "selected_index")))
        return stack

    def _on_answer(self, change: dict[str, Any]) -> None:
        """The kernel heard an answer. The first one is final: the widget is disabled (its state lives in the
        kernel, so a reloaded or reopened page renders it locked too), and a later value, which a page that lost
        the question's text can still send, is set back to the first answer; the journal records the first only."""
        new = change.get("new")
        if self._first_answer:
            if new != self._first_answer:
                self.widget.value = self._first_answer  # the reveal linked in the browser follows back
            return
        if not new:
            return
        self._first_answer = str(new)
        self.widget.disabled = True
        from IPython.display import Markdown

        for hint, questions in self._hints:  # before the question turns into text, which the CSS rule looks for
            if all(q.answered for q in questions):
                hint.layout.display = "none"
        if self._measured is not None:
            self._journal(*self._measured)
        for handle, actual, why in self._pending:
            handle.update(Markdown(self.reveal_markdown(actual, why)))
        self._pending.clear()
        self._freeze_question()

    def reveal(self, actual: str | None, why: str = "") -> None:
        """Show the answer next to the measured ``actual`` and the explanation ``why``.

        For multiple-choice questions ``actual`` is one of the choices, computed from the measurement (use
        :meth:`course_lib.perf.compare.Verdict.pick`), or ``None`` when the measurement could not decide.
        Returns nothing (so a cell ending with it shows only the Markdown).
        """
        if self.choices is not None and actual is not None and actual not in self.choices:
            raise ValueError(
                f"actual={actual!r} is not one of the choices {self.choices}; compute it from the measurement "
                "as one of those strings (or None when the measurement could not decide)."
            )
        self._measured = (actual,)
        if self.widget is None or self.answered:
            self._freeze_question()
            say(self.reveal_markdown(actual, why))
            if self.widget is not None:
                self._journal(actual)
            return
        from IPython.display import Markdown, display

        if self.choices is None:  # free text: the kernel writes the reveal when it hears the answer
            handle = display(Markdown(self._waiting_markdown()), display_id=True)
            self._pending[:] = [(handle, actual, why)]  # a re-run cell replaces the earlier placeholder
            return
        import ipywidgets as widgets

        reveals = []
        for answer in self.values:
            out = widgets.Output()
            out.append_display_data(Markdown(self.reveal_markdown(actual, why, answer=answer)))
            reveals.append(out)
        # The reveal opens on this question's own answer: outside the cell's held area, which may wait for other
        # questions too (two questions asked in one cell, revealed in one cell); the rest of the cell is held again.
        holding = _holding.output is not None
        if holding:
            _stop_holding()
        display(widgets.VBox([self.hint(self._waiting_text()), self.linked_stack(reveals)]).add_class(HELD_CLASS))
        if holding:
            _start_holding()


def _hint(text: str, questions: Sequence[Prediction]) -> Any:
    """A line shown until every one of ``questions`` is answered.

    The browser hides it the moment each has an active choice (a CSS rule, so also while Run All keeps the kernel
    busy); the kernel hides it as well once it has heard every answer (for front ends without CSS ``:has``).
    """
    import ipywidgets as widgets

    key = "-".join(q.key for q in questions)
    answered = "".join(f":has(.course-q-{q.key} .mod-active)" for q in questions)
    rule = f"body{answered} .course-hint-{key} {{display: none}}"
    line = f'<div class="course-hint-{key}"><i>{html.escape(text)}</i></div>'
    hint = widgets.HTML(f"<style>{rule}</style>{STALE_STYLE}{line}")
    for question in questions:
        question._hints.append((hint, tuple(questions)))
    return hint


def _code_spans_html(text: str) -> str:
    """``text`` as HTML, its Markdown code spans (```x```) as ``<code>x</code>`` instead of literal backticks."""
    parts = html.escape(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: show the text as it is
        return html.escape(text)
    return "".join(f"<code>{part}</code>" if i % 2 else part for i, part in enumerate(parts))


def _choice_widget(options: tuple[str, ...]) -> Any:
    """Toggle buttons as wide as their text, wrapping on narrow windows, full text in the tooltip.

    A button cannot show code formatting, so its label drops the backticks of a code span; its value (what the
    learner's answer is compared with) is the choice as written."""
    import ipywidgets as widgets

    values = list(options) + [SKIP_CHOICE]
    labels = [value.replace("`", "") for value in values]
    return widgets.ToggleButtons(
        options=list(zip(labels, values)),
        value=None,
        tooltips=labels,
        style={"button_width": "auto"},
        layout=widgets.Layout(display="flex", flex_flow="row wrap", width="100%"),
    )


def predict(question: str, choices: Sequence[str] | None = None, default: str | None = None) -> Prediction:
    """Ask the learner to commit to a guess before measuring; return a :class:`Prediction`.

    ``choices``: a multiple-choice question (toggle buttons, none selected); ``None``: a free-text answer.
    ``default``: the answer recorded in smoke mode (tests), never pre-selected for a learner.
    """
    if not question or not question.strip():
        raise ValueError("predict() needs a non-empty question.")
    options: tuple[str, ...] | None = None
    if choices is not None:
        options = tuple(str(c) for c in choices)
        if len(options) < 2:
            raise ValueError(f"choices={list(options)!r}: a multiple-choice question needs at least two choices.")
        if len(set(options)) != len(options):
            raise ValueError(f"choices={list(options)!r} contains duplicates; each choice must be distinct.")
        if SKIP_CHOICE in options:
            raise ValueError(f"{SKIP_CHOICE!r} is added by predict() itself; leave it out of choices.")
        if default is not None and default not in options:
            raise ValueError(f"default={default!r} is not one of the choices {list(options)!r}.")
    prediction = Prediction(question=question, choices=options, default="" if default is None else str(default))
    if not _in_live_kernel():
        listed = "" if options is None else "  \n" + "  \n".join(f"- {c}" for c in options)
        say(f"**Predict:** {question}{listed}")
        return prediction

    import ipywidgets as widgets
    from IPython.display import display

    if options is not None:
        prediction.widget = _choice_widget(options)
    else:
        prediction.widget = widgets.Text(
            value="", placeholder="type your guess and press Enter", continuous_update=False,
            layout=widgets.Layout(width="100%"),
        )
    prediction.widget.observe(prediction._on_answer, names="value")
    # The first click is final in the browser too, while Run All keeps the kernel from hearing it: once a choice
    # is active no button takes a click (the kernel then disables them, see Prediction._on_answer).
    lock = f"<style>.course-q-{prediction.key}:has(.mod-active) button {{pointer-events: none}}</style>"
    label = widgets.HTML(f"{STALE_STYLE}{lock}<b>Predict:</b> {_code_spans_html(question)}")
    box = widgets.VBox([label, prediction.widget])
    box.add_class(f"course-q-{prediction.key}").add_class(LIVE_CLASS)
    prediction._question_handle = display(box, display_id=True)
    if options is not None:
        _hold_after(prediction)
    return prediction


# --------------------------------------------------------------------------------------------------------
# Holding back what would answer an open question
# --------------------------------------------------------------------------------------------------------
HELD_TEXT = "Held until you answer the question above (or choose skip): the output below could answer it."


@dataclass
class _Holding:
    """The questions whose answers are awaited (in the order asked), and the held area of the cell running now."""

    questions: list[Prediction] = field(default_factory=list)
    output: Any = None
    gate: Any = None

    def open_questions(self) -> list[Prediction]:
        """The questions not yet revealed whose answer the kernel has not heard: what a cell's output must wait
        for (a measurement may answer any of them)."""
        return [q for q in self.questions if not q.revealed and not q.answered]


_holding = _Holding()


def _hold_after(prediction: Prediction) -> None:
    """Hold the output of the cells run after ``prediction``'s cell until it is answered (IPython cell hooks)."""
    from IPython import get_ipython

    shell = get_ipython()
    _holding.questions = [q for q in _holding.questions if q.key != prediction.key and not q.revealed] + [prediction]
    if shell is not None and not getattr(shell, "_course_holds_outputs", False):
        shell.events.register("pre_run_cell", _hold_cell_output)
        shell.events.register("post_run_cell", _release_cell_output)
        shell._course_holds_outputs = True


def _hold_cell_output(info: Any = None) -> None:
    """Before a cell runs: if questions are open (the kernel has not heard their answers), show a held area that
    opens once every one of them is answered, and send the cell's output into it. A cell that asks a question is
    never held."""
    if "predict(" in str(getattr(info, "raw_cell", "")):
        return
    _start_holding()


def _start_holding() -> None:
    """Send what the running cell shows from now on into a new held area gated by every open question."""
    questions = _holding.open_questions()
    if not questions:
        return
    import ipywidgets as widgets
    from IPython.display import display

    held = gate = widgets.Output()
    for question in questions:  # nested stacks: each level opens on one question's answer (any answer)
        gate = question.linked_stack([gate] * len(question.values))
    display(widgets.VBox([_hint(HELD_TEXT, questions), gate]).add_class(HELD_CLASS))
    held.__enter__()  # the browser routes this cell's outputs into ``held``
    _holding.output, _holding.gate = held, gate


def _stop_holding(error: bool = False) -> None:
    """Stop sending the running cell's output into its held area (an error opens it: never held back)."""
    held, gate = _holding.output, _holding.gate
    _holding.output = _holding.gate = None
    if held is None:
        return
    held.__exit__(None, None, None)
    if error:
        while gate is not held:  # open every level of the nested gate
            gate.selected_index = 0
            gate = gate.children[0]


def _release_cell_output(result: Any = None) -> None:
    """After a cell: stop holding its output (an error is never held back), and forget revealed questions."""
    _stop_holding(error=getattr(result, "error_in_exec", None) is not None)
    _holding.questions = [q for q in _holding.questions if not q.revealed]


def use_course_threads() -> int:
    """Apply the course's intra-op thread count (see :func:`course_lib.perf.compare.course_threads`) and say so."""
    from course_lib.perf.compare import apply_course_threads

    n = apply_course_threads()
    print(f"Measuring with {n} intra-op thread{'s' if n != 1 else ''} (the course setting; lesson 01 explains why).")
    return n


def explain(verdict: Any, *, faster: str, slower: str, too_close: str, **values: Any) -> str:
    """The explanation of a measured comparison: the verdict's sentence, then the branch for its outcome.

    Every outcome needs its own text (``faster``/``slower`` say what ``a`` being faster/slower than ``b`` means,
    ``too_close`` what a tie means), so no lesson can explain a direction the machine did not measure. Texts are
    templates filled from the verdict (``{a}``, ``{b}``, ``{factor}``, ``{winner}``, ``{quantity}``, ... see
    :meth:`~course_lib.perf.compare.Verdict.fields`) and from ``values`` (facts that are not measurements).
    The whole text goes to the claim log when one is set (:mod:`course_lib.perf.claims`).
    """
    if "busy" in values:
        raise ValueError("explain() got busy=: a busy machine is no longer an outcome (the verdict decides on CPU time "
                         "or explains the cores instead); remove the busy= text.")
    branches = {"faster": faster, "slower": slower, "too_close": too_close}
    for name in ("faster", "slower", "too_close"):
        if not isinstance(branches[name], str) or not branches[name].strip():
            raise ValueError(f"explain() needs a non-empty {name}= text: every outcome gets its own explanation.")
    fields = {**{k: str(v) for k, v in values.items()}, **verdict.fields()}
    template = branches[verdict.outcome]
    try:
        text = template.format_map(fields)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"the {verdict.outcome}= text uses {exc} which is neither a verdict field {sorted(verdict.fields())} "
            "nor a keyword passed to explain()."
        ) from None
    shown = f"{verdict.sentence()} {text}".strip()
    from course_lib.perf import claims

    claims.record(verdict, shown)
    return shown


def state(verdict: Any) -> str:
    """A verdict's own sentence, as shown (and written to the claim log): for a verdict that needs no explanation
    beyond its numbers; :func:`explain` adds the branch that explains its outcome."""
    from course_lib.perf import claims

    shown = verdict.sentence()
    claims.record(verdict, shown)
    return shown


# --------------------------------------------------------------------------------------------------------
# Sentences from measured numbers
# --------------------------------------------------------------------------------------------------------
_TIME_UNITS = {"ns", "us", "µs", "ms", "s", "min", "h"}
_MEMORY_UNITS = {"b", "bytes", "kb", "kib", "mb", "mib", "gb", "gib"}


def _unit_kind(unit: str) -> str:
    """``"rate"`` (more is better: samples/s), ``"time"``, ``"memory"`` (less is better) or ``"other"``."""
    u = unit.strip().lower()
    if u.endswith("/s") or u.endswith("/ s") or u.startswith("per "):
        return "rate"
    if u in _TIME_UNITS:
        return "time"
    if u in _MEMORY_UNITS:
        return "memory"
    return "other"


def _fmt(value: float) -> str:
    """Three significant digits, without scientific notation for large values (``61,619`` not ``6.16e+04``)."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def ratio(value_a: float, value_b: float) -> float:
    """``value_b / value_a``, checking that both are finite and positive (measurements, not placeholders)."""
    for name, value in (("value_a", value_a), ("value_b", value_b)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name}={value!r}: a ratio needs two finite, positive measured values.")
    return float(value_b) / float(value_a)


def ratio_sentence(
    name_a: str, value_a: float, name_b: str, value_b: float, unit: str, *, tolerance: float = 0.05
) -> str:
    """Describe two measurements as a ratio, e.g. ``"On this machine, B was 1.8x faster than A (...)."``

    The unit decides the direction: rates (``"samples/s"``) are better when higher, times (``"s"``, ``"ms"``)
    and memory (``"MiB"``) when lower; any other unit is described as higher/lower. Differences within
    ``tolerance`` (5 %) are reported as "about the same": on a shared machine that is noise.
    """
    r = ratio(value_a, value_b)
    kind = _unit_kind(unit)
    numbers = f"({_fmt(value_b)} vs {_fmt(value_a)} {unit})"
    if abs(r - 1.0) <= tolerance:
        what = {"rate": "speed", "time": "time", "memory": "memory"}.get(kind, "value")
        return f"On this machine, {name_b} and {name_a} were about the same {what} {numbers}: within noise."
    if kind == "rate":
        word, factor = ("faster", r) if r > 1 else ("slower", 1 / r)
    elif kind == "time":
        word, factor = ("faster", 1 / r) if r < 1 else ("slower", r)
    elif kind == "memory":
        word, factor = ("less memory", 1 / r) if r < 1 else ("more memory", r)
        return f"On this machine, {name_b} used {factor:.1f}x {word} than {name_a} {numbers}."
    else:
        word, factor = ("higher", r) if r > 1 else ("lower", 1 / r)
    return f"On this machine, {name_b} was {factor:.1f}x {word} than {name_a} {numbers}."


# --------------------------------------------------------------------------------------------------------
# Boxes: outdated snippet, GPU note, recap
# --------------------------------------------------------------------------------------------------------
_BOX = (
    "border-left: 4px solid {accent}; background: {tint}; padding: 0.5em 0.9em; margin: 0.6em 0; "
    "border-radius: 4px; color: inherit;"
)
_PRE = (
    "background: rgba(127,127,127,0.12); color: inherit; padding: 0.4em 0.6em; margin: 0.2em 0 0.6em 0; "
    "border-radius: 3px; white-space: pre-wrap; font-family: var(--jp-code-font-family, monospace);"
)


def outdated_html(old_code: str, new_code: str, why: str) -> str:
    """The HTML of the "outdated snippet" box: the old code, why it is wrong or stale, the modern code."""
    for name, value in (("old_code", old_code), ("new_code", new_code), ("why", why)):
        if not value or not value.strip():
            raise ValueError(f"outdated() needs a non-empty {name}.")
    return (
        f'<div style="{_BOX.format(accent="#d9822b", tint="rgba(217,130,43,0.10)")}">'
        "<b>&#9888; Outdated snippet</b> &mdash; you will still find this in tutorials and old code:"
        f'<pre style="{_PRE}"><code>{html.escape(old_code.strip())}</code></pre>'
        f"<b>Why it is wrong today:</b> {html.escape(why.strip())}"
        f'<br><b>Write instead:</b><pre style="{_PRE}"><code>{html.escape(new_code.strip())}</code></pre>'
        "</div>"
    )


def outdated(old_code: str, new_code: str, why: str) -> None:
    """Display the "outdated snippet" box (see :func:`outdated_html`)."""
    from IPython.display import HTML

    _display(HTML(outdated_html(old_code, new_code, why)))


def gpu_note_markdown(text: str) -> str:
    """Markdown for a "what would differ on a GPU" note (a quoted block)."""
    if not text or not text.strip():
        raise ValueError("gpu_note() needs a non-empty text.")
    body = "\n".join(f"> {line}" if line.strip() else ">" for line in text.strip().splitlines())
    return f"> **What would differ on a GPU**\n>\n{body}"


def gpu_note(text: str) -> None:
    """Display what would differ on a GPU (see :func:`gpu_note_markdown`)."""
    say(gpu_note_markdown(text))


def exercise_id(exercise: str) -> str:
    """``"exercises/05_lr_schedule.ipynb"`` -> ``"05"``: the id that ``python -m course_lib check`` takes."""
    match = re.match(r"(\d+)_", exercise.replace("\\", "/").rsplit("/", 1)[-1])
    if match is None:
        raise ValueError(
            f"exercise={exercise!r} does not look like 'exercises/NN_name.ipynb' (two digits, underscore, name)."
        )
    return match.group(1)


def recap_markdown(
    points: Sequence[str], exercise: str | Sequence[str] | None = "exercises/05_lr_schedule.ipynb"
) -> str:
    """Markdown for the end-of-lesson recap: the points, then the exercise(s) and how to check them.

    ``exercise=None`` (a lesson without an exercise) leaves the "Practise it" part out.
    """
    points = [p for p in points if p and p.strip()]
    if not points:
        raise ValueError("recap() needs at least one non-empty point.")
    lines = ["### Recap", ""] + [f"- {p.strip()}" for p in points]
    if exercise is None:
        return "\n".join(lines)
    exercises = [exercise] if isinstance(exercise, str) else list(exercise)
    if not exercises:
        raise ValueError("recap() needs at least one exercise path (or exercise=None for none).")
    lines += ["", "**Practise it:**", ""]
    for ex in exercises:
        lines.append(f"- open `{ex}`, then check it with `python -m course_lib check {exercise_id(ex)}`")
    return "\n".join(lines)


def recap(
    points: Sequence[str], exercise: str | Sequence[str] | None = "exercises/05_lr_schedule.ipynb"
) -> None:
    """Display the recap and the pointer to the exercise(s) (see :func:`recap_markdown`)."""
    say(recap_markdown(points, exercise))
