"""Each check names the parts of its exercise it checks, and those names are true (course_lib.grading.parts)."""

from __future__ import annotations

import re

import pytest

from conftest import REPO
from course_lib.grading import parts
from course_lib.grading.api import checks_for, known_exercises

EXERCISES = known_exercises()


def _stub_parts(number: str) -> set[str]:
    path = next((REPO / "exercises").glob(f"{number}_*.ipynb"))
    return set(re.findall(rf"Exercise ({number}\.\d+):", path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("number", EXERCISES)
def test_every_check_names_existing_parts_and_every_part_is_checked(number: str) -> None:
    checks = checks_for(number)
    stubs = _stub_parts(number)
    assert all(check.parts for check in checks), [c.name for c in checks if not c.parts]
    named = {part for check in checks for part in check.parts}
    assert named <= stubs, f"parts with no stub in exercises/{number}: {sorted(named - stubs)}"
    assert stubs <= named, f"parts no check looks at: {sorted(stubs - named)}"


@pytest.mark.slow
@pytest.mark.parametrize("number", ["04", "07"])  # the suite-judging exercise, and a two-part one (seconds each)
def test_declared_parts_are_the_parts_whose_blank_fails_the_check(number: str) -> None:
    assert parts.differences(number) == []


def test_a_part_is_blanked_alone() -> None:
    from course_lib.grading import notebook

    nb = notebook.read(next((REPO / "solutions").glob("07_*.ipynb")))
    assert parts.count_parts(nb) == 2
    second = parts.blank_only(nb, "07", 2)
    text = "".join(notebook.source(c) for c in second["cells"])
    assert text.count("raise NotImplementedError(\"Exercise") == 1 and "### BEGIN SOLUTION" not in text
