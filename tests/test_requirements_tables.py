"""docs/grading.md's requirements tables (issue #42): one per graded exercise, each row naming checks that exist.

Every exercise notebook in solutions/ has a ``**Exercise NN**`` table in the section "## Requirements: ...". Each
row's check column names one or more checks of that exercise, separated by ``"; "``. A name is a check's title as
the grader shows it, or its beginning cut at a word boundary ("step FLOPs: an MLP on float inputs" for the title
that goes on "(forward and backward, ...)"). Two abbreviations the tables use: a piece ``...`` stands for the rest of
a title that itself contains "; ", and a trailing ``(both)`` or ``(all)`` says the name begins several titles.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from course_lib.grading.api import checks_for

REPO = Path(__file__).resolve().parents[1]
GRADING_MD = REPO / "docs" / "grading.md"
SECTION = "## Requirements"
HEADER = ("the task says", "check", "wrong answer that fails it", "data that separates them")
SEVERAL = re.compile(r"\s+\((both|all)\)$")


def exercises() -> list[str]:
    return sorted(path.name[:2] for path in (REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))


def _cells(line: str) -> list[str]:
    """A markdown table row's cells; a ``|`` inside backticks is text, not a column border."""
    cells, current, in_code = [], "", False
    for char in line.strip().strip("|"):
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            cells.append(current.strip())
            current = ""
        else:
            current += char
    return [*cells, current.strip()]


def requirement_tables(text: str) -> dict[str, list[list[str]]]:
    """``{"NN": [row cells, ...]}`` for every ``**Exercise NN**`` table of the Requirements section."""
    start = text.find("\n" + SECTION)
    assert start >= 0, f"{GRADING_MD.name} has no section starting {SECTION!r}"
    end = text.find("\n## ", start + 1)
    section = text[start : end if end >= 0 else len(text)]
    tables: dict[str, list[list[str]]] = {}
    for block in re.split(r"\n(?=\*\*Exercise \d\d\*\*)", section)[1:]:
        number = block[len("**Exercise ") :][:2]
        assert number not in tables, f"exercise {number} has two requirements tables"
        rows = [_cells(line) for line in block.splitlines() if line.startswith("|")]
        assert rows and tuple(rows[0]) == HEADER, f"exercise {number}: the table's header is not {HEADER}"
        assert len(rows) > 2, f"exercise {number}: the table has no rows"
        tables[number] = rows[2:]  # after the header and the |---| line
    return tables


def names_a_title(name: str, titles: list[str]) -> list[str]:
    """The titles ``name`` names: itself, or titles it begins, cut at a word boundary."""
    return [t for t in titles if t == name or (t.startswith(name) and not t[len(name)].isalnum())]


def unknown_checks(cell: str, titles: list[str]) -> list[str]:
    """The names in a check cell that name no title (a misspelling, a renamed check).

    Titles may contain "; " themselves ("tiny fit; load_best restores ..."), so the cell is cut at each "; " where
    the pieces on both sides name titles, the longest name first.
    """
    several = SEVERAL.search(cell)
    pieces = SEVERAL.sub("", cell).split("; ")
    names, wrong = [], []
    while pieces:
        for length in range(len(pieces), 0, -1):
            name = "; ".join(pieces[:length])
            if name == "..." or names_a_title(name, titles):
                break
        else:
            name, length = pieces[0], 1
            wrong.append(name)
        names.append(name)
        pieces = pieces[length:]
    if several and not wrong and len(names_a_title(names[0], titles)) < 2:
        wrong.append(f"{names[0]} ({several.group(1)})")
    return wrong if any(name != "..." for name in names) else [cell]


def test_every_exercise_has_a_table() -> None:
    tables = requirement_tables(GRADING_MD.read_text(encoding="utf-8"))
    missing = [n for n in exercises() if n not in tables]
    assert not missing, f"{GRADING_MD.name} has no requirements table for exercise(s) {', '.join(missing)}"


@pytest.mark.parametrize("number", exercises())
def test_every_row_names_checks_that_exist(number: str) -> None:
    rows = requirement_tables(GRADING_MD.read_text(encoding="utf-8")).get(number)
    if rows is None:
        pytest.skip(f"no table for exercise {number} (test_every_exercise_has_a_table reports it)")
    titles = [check.name for check in checks_for(number)]
    bad = []
    for row in rows:
        assert len(row) == len(HEADER), f"exercise {number}: a row with {len(row)} cells, not 4: {row}"
        assert row[0] and row[2], f"exercise {number}: a row without a sentence or a wrong answer: {row}"
        bad += [f"{row[0]!r}: {name!r}" for name in unknown_checks(row[1], titles)]
    assert not bad, f"exercise {number}: rows name checks that do not exist: {bad}; the checks are {titles}"
