"""Every explanation in every lesson is generated from a verdict, with a branch for each outcome.

Lessons explain a timing comparison only through ``lesson.explain(verdict, faster=..., slower=..., too_close=...)``.
This test finds each such call in each notebook and renders it for synthetic verdicts of every outcome (faster,
slower, too close): the text must lead with the verdict's own sentence, take the branch of that
outcome, and never contradict it. It also forbids the older ways of writing a number's meaning next to it.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from course_lib import lesson
from course_lib.perf.compare import Measurement, verdict_from_times

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))

SYNTHETIC = {
    "faster": ((1.0, 1.1, 0.9, 1.0, 1.05), (2.0, 2.1, 1.9, 2.2, 2.0)),
    "slower": ((3.0, 3.2, 3.1, 2.9, 3.0), (1.0, 1.1, 1.0, 0.95, 1.0)),
    "too_close": ((1.0, 1.2, 0.9, 1.1, 1.0), (1.05, 0.95, 1.1, 1.0, 1.02)),
}
# Words that state a direction; a branch must not state the opposite of its outcome.
CONTRADICTS = {
    "faster": re.compile(r"\btoo close\b|\bwithin (the )?noise\b", re.I),
    "slower": re.compile(r"\btoo close\b|\bwithin (the )?noise\b", re.I),
    "too_close": re.compile(r"\bclearly (faster|slower)\b|\bwon\b|\bwins\b", re.I),
}
# A number with a ratio or percent sign written into a template is a performance claim typed in advance.
HARD_CODED = re.compile(r"\d+(\.\d+)?\s*(x|×|%)(?![a-z])")
TIMING_UNITS = re.compile(r"^(ns|us|µs|ms|s|min|h|.*/s|per .*)$")


def code_cells(path: Path) -> list[tuple[int, str]]:
    nb = json.loads(path.read_text())
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def parse(source: str) -> ast.Module | None:
    # IPython magics and shell lines are not Python; blank them out (cell magics make the whole cell foreign).
    if source.lstrip().startswith("%%"):
        return None
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    return ast.parse("\n".join(lines))


def calls(tree: ast.AST, attr: str) -> list[ast.Call]:
    return [
        node for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr
    ]


def explain_calls() -> list[tuple[str, ast.Call]]:
    found = []
    for path in NOTEBOOKS:
        for index, source in code_cells(path):
            tree = parse(source)
            if tree is not None:
                found += [(f"{path.parent.name}/{path.name} cell {index}", c) for c in calls(tree, "explain")]
    return found


EXPLAIN_CALLS = explain_calls()


def test_timing_is_never_explained_by_ratio_sentence() -> None:
    offenders = []
    for path in NOTEBOOKS:
        for index, source in code_cells(path):
            tree = parse(source)
            if tree is None:
                continue
            for call in calls(tree, "ratio_sentence"):
                unit = call.args[4] if len(call.args) > 4 else None
                if not (isinstance(unit, ast.Constant) and not TIMING_UNITS.match(str(unit.value))):
                    offenders.append(f"{path.name} cell {index}")
    assert not offenders, (
        f"timing compared with ratio_sentence in {offenders}: time it with course_lib.perf.compare.compare() and "
        "explain the verdict with lesson.explain(...)"
    )


def test_the_lessons_explain_their_comparisons_through_verdicts() -> None:
    assert len(EXPLAIN_CALLS) >= 8, "the lessons' timing comparisons should be explained with lesson.explain"


@pytest.mark.parametrize("where,call", EXPLAIN_CALLS, ids=[w for w, _ in EXPLAIN_CALLS])
def test_every_branch_of_every_explanation_agrees_with_its_verdict(where: str, call: ast.Call) -> None:
    keywords = {k.arg: k.value for k in call.keywords if k.arg is not None}
    branches = {}
    assert "busy" not in keywords, f"{where}: a busy machine is no longer an outcome; remove busy="
    for name in ("faster", "slower", "too_close"):
        node = keywords.get(name)
        assert node is not None, f"{where}: explain() has no {name}= branch"
        assert isinstance(node, ast.Constant) and isinstance(node.value, str), (
            f"{where}: the {name}= text must be a plain string template (fill numbers from the verdict's fields)"
        )
        assert not HARD_CODED.search(node.value), f"{where}: {name}= text hard-codes a ratio: {node.value!r}"
        branches[name] = node.value
    values = {k: f"<{k}>" for k in keywords if k not in ("faster", "slower", "too_close")}
    for outcome, (a_times, b_times) in SYNTHETIC.items():
        verdict = verdict_from_times(Measurement("A", a_times), Measurement("B", b_times))
        assert verdict.outcome == outcome
        text = lesson.explain(verdict, **branches, **values)
        assert text.startswith(verdict.sentence()), where
        rest = text[len(verdict.sentence()):]
        for other, branch in branches.items():
            body = branch.split("{")[0].strip()
            if other != outcome and body and len(body) > 12 and body != branches.get(outcome, "").split("{")[0].strip():
                assert body not in rest, f"{where}: the {other} text appeared for a {outcome} verdict"
        if outcome in CONTRADICTS:
            assert not CONTRADICTS[outcome].search(rest), f"{where}: the {outcome} text contradicts it: {rest!r}"
