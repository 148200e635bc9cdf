"""The lessons' comparisons stay fair: equal work for every contender, quality judged on held-out data.

The library's own guarantees are tested where they live (tests/test_perf_loaders.py: every contender of
``compare_loaders`` delivers the same samples; tests/test_perf_precision.py: ``compare_precisions`` judges quality on
the batches it is given). These checks read the lessons' code and make sure every call keeps using them.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _calls(name: str) -> list[tuple[str, ast.Call]]:
    """Every call of a function (or method) called ``name`` in the lessons' code cells, with where it is."""
    found = []
    for path in LESSONS:
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            source = "".join(cell["source"])
            if cell["cell_type"] != "code" or source.lstrip().startswith("%%"):
                continue
            lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
            for node in ast.walk(ast.parse("\n".join(lines))):
                if isinstance(node, ast.Call):
                    func = node.func
                    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                    if called == name:
                        found.append((f"{path.name} cell {index}", node))
    return found


def _keywords(call: ast.Call) -> set[str]:
    return {k.arg for k in call.keywords if k.arg is not None}


def test_the_checks_find_the_calls_they_guard() -> None:
    assert _calls("compare_loaders") and _calls("compare_precisions") and _calls("Comparison")


@pytest.mark.parametrize("where,call", _calls("compare_loaders"), ids=lambda v: v if isinstance(v, str) else "")
def test_loader_comparisons_give_every_configuration_the_same_samples(where: str, call: ast.Call) -> None:
    # n_samples: every configuration delivers exactly that many samples, whatever its batch size and epochs
    # (n_batches per epoch would give a bigger batch more samples to spread its start-up over).
    assert "n_samples" in _keywords(call) and "n_batches" not in _keywords(call), where


@pytest.mark.parametrize("where,call", _calls("compare_precisions"), ids=lambda v: v if isinstance(v, str) else "")
def test_precision_quality_is_judged_on_held_out_data(where: str, call: ast.Call) -> None:
    # Without val_batches the quality columns are computed on the batches each copy trained on.
    assert "val_batches" in _keywords(call), where


HAND_MADE = _calls("verdict_from_times") + _calls("Comparison")


@pytest.mark.parametrize("where,call", HAND_MADE, ids=lambda v: v if isinstance(v, str) else "")
def test_hand_made_verdicts_say_their_thread_count_and_the_machine_load(where: str, call: ast.Call) -> None:
    # compare() gives its verdicts the thread count it measured with and the cores other programs used; a verdict
    # built from hand-timed rounds must be told both, or its sentence leaves out a condition its result depends on
    # (and it could not move to CPU time on a busy machine).
    assert "threads" in _keywords(call), where
    if getattr(call.func, "id", getattr(call.func, "attr", None)) == "Comparison":
        assert "measured_others_cores" in _keywords(call), where
