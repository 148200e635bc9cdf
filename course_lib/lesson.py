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
from dataclasses import dataclass, field
from typing import Any, Sequence

from torch.utils.data import Dataset

from course_lib import mode

__all__ = [
    "Prediction",
    "predict",
    "say",
    "ratio",
    "ratio_sentence",
    "outdated",
    "outdated_html",
    "gpu_note",
    "gpu_note_markdown",
    "recap",
    "recap_markdown",
    "exercise_id",
    "CountingDataset",
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
    """True inside a Jupyter kernel (where widgets can render), False in a plain interpreter or a script."""
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


# --------------------------------------------------------------------------------------------------------
# Predict -> measure -> explain
# --------------------------------------------------------------------------------------------------------
@dataclass
class Prediction:
    """A guess recorded before a measurement; :meth:`reveal` compares it with what was measured.

    ``answer`` reads the widget at the moment you ask, so a learner can change their mind until the
    measurement cell runs. In smoke mode (and outside a live kernel) there is no widget and the answer
    is ``default``.
    """

    question: str
    choices: tuple[str, ...] | None = None
    default: str = ""
    widget: Any = field(default=None, repr=False)

    @property
    def answer(self) -> str:
        """The learner's current answer (the widget's value, or the default without a widget)."""
        if self.widget is not None:
            value = self.widget.value
            return "" if value is None else str(value)
        return self.default

    def matches(self, actual: str) -> bool:
        """Whether the answer equals ``actual`` (case and surrounding spaces ignored)."""
        return self.answer.strip().lower() == str(actual).strip().lower()

    def reveal_markdown(self, actual: str, why: str = "") -> str:
        """The Markdown that :meth:`reveal` displays (pure, for tests)."""
        answer = self.answer.strip() or "(no answer)"
        lines = [f"**You predicted:** {answer}  ", f"**This machine measured:** {actual}"]
        if self.choices is not None:
            verdict = "Your prediction matched." if self.matches(actual) else "Not what you predicted: worth a second look."
            lines[-1] += "  "
            lines.append(f"*{verdict}*")
        if why:
            lines += ["", why]
        return "\n".join(lines)

    def reveal(self, actual: str, why: str = "") -> None:
        """Show the guess next to the measured ``actual`` (and the explanation ``why``).

        For multiple-choice questions ``actual`` should be one of the choices, computed from the measurement.
        Returns nothing (so a notebook cell ending with it shows only the Markdown); use :meth:`matches` for
        the comparison itself.
        """
        if self.choices is not None and actual not in self.choices:
            raise ValueError(
                f"actual={actual!r} is not one of the choices {self.choices}; compute it from the measurement "
                "as one of those strings."
            )
        say(self.reveal_markdown(actual, why))


def predict(question: str, choices: Sequence[str] | None = None, default: str | None = None) -> Prediction:
    """Ask the learner to commit to a guess before measuring; return a :class:`Prediction`.

    ``choices``: a multiple-choice question (toggle buttons); ``None``: a free-text answer.
    ``default``: the answer used in smoke mode and outside a live kernel (first choice if not given).
    In a live notebook in full mode a widget is displayed; its value is read when you call ``reveal``.
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
        if default is None:
            default = options[0]
        elif default not in options:
            raise ValueError(f"default={default!r} is not one of the choices {list(options)!r}.")
    default = "" if default is None else str(default)

    prediction = Prediction(question=question, choices=options, default=default)
    if mode.is_smoke() or not _in_live_kernel():
        say(f"**Predict:** {question}  \n*(recorded answer: {default or '(none)'})*")
        return prediction

    import ipywidgets as widgets

    if options is not None:
        prediction.widget = widgets.ToggleButtons(options=list(options), value=default or None)
    else:
        prediction.widget = widgets.Text(value=default, placeholder="type your guess, then run the next cell")
    label = widgets.HTML(f"<b>Predict:</b> {html.escape(question)}")
    _display(widgets.VBox([label, prediction.widget]))
    return prediction


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


# --------------------------------------------------------------------------------------------------------
# Demonstration objects (module scope, so DataLoader workers can unpickle them under ``spawn``)
# --------------------------------------------------------------------------------------------------------
class CountingDataset(Dataset):
    """Wrap ``dataset`` and count ``__getitem__`` calls in ``self.calls``: the worker-local state demonstration.

    With ``num_workers=0`` the count grows in the notebook's process. With worker processes each worker
    increments *its own copy* of the object (it was pickled or forked into the worker), so ``self.calls`` in the
    notebook stays 0: per-worker counters, logs and caches are never aggregated back for you.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.calls = 0
        # Keep the wrapped dataset's (index, aug_seed) protocol visible to make_loader.
        self.accepts_aug_seed = bool(getattr(dataset, "accepts_aug_seed", False))

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: Any) -> Any:
        self.calls += 1
        return self.dataset[key]
