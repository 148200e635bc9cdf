"""The instructor notes (docs/instructor/) name exercise parts by the numbers the exercises and their checks use,
and list every lesson's note."""

import re
from pathlib import Path

import pytest

from course_lib.grading.api import checks_for

ROOT = Path(__file__).resolve().parents[1]
NOTES = ROOT / "docs" / "instructor"
# "02.6", or a range "02.6–02.10" (en dash or hyphen); the minor number is 1-99.
PART_OR_RANGE = re.compile(r"(?<![\d.])(\d\d)\.([1-9]\d?)(?:\s*[–-]\s*(?:\1\.)?([1-9]\d?))?\b")


def parts_named_in(text: str) -> tuple[dict[str, set[int]], set[str]]:
    """Every exercise part the text names, ranges expanded ({"02": {1, 2, 3, 4, 5}}), and the exercises it names a
    range of parts of: those are the exercises whose parts the notes set out to list."""
    named: dict[str, set[int]] = {}
    listed: set[str] = set()
    for match in PART_OR_RANGE.finditer(text):
        exercise, first, last = match.group(1), int(match.group(2)), match.group(3)
        named.setdefault(exercise, set()).update(range(first, int(last or first) + 1))
        if last:
            listed.add(exercise)
    return named, listed


def parts_of_exercise(exercise: str) -> set[int]:
    """The parts the exercise's checks grade, which are also the numbers its stubs raise ("Exercise 02.10: ...")."""
    return {int(part.split(".")[1]) for check in checks_for(exercise) for part in check.parts}


def test_the_part_pattern_reads_single_parts_and_ranges() -> None:
    assert parts_named_in("parts 02.1–02.5, then 02.8 and 07.3-4, 10.2") == (
        {"02": {1, 2, 3, 4, 5, 8}, "07": {3, 4}, "10": {2}}, {"02", "07"})
    assert parts_named_in("version 2.14.1 and 1.06x") == ({}, set())


def test_every_exercise_part_the_notes_name_exists_and_together_they_cover_the_exercise() -> None:
    # Exercise 02 grew from eight parts to ten; the notes kept saying "02.6–02.8", so two parts went unmentioned and
    # two names pointed at the wrong code. Both drifts fail here.
    named: dict[str, set[int]] = {}
    listed: set[str] = set()
    for note in sorted(NOTES.glob("*.md")):
        in_note, ranges = parts_named_in(note.read_text(encoding="utf-8"))
        for exercise, parts in in_note.items():
            named.setdefault(exercise, set()).update(parts)
        listed |= ranges
    assert "02" in listed, "the notes no longer list exercise 02's parts; this test would check nothing"
    for exercise, parts in sorted(named.items()):
        real = parts_of_exercise(exercise)
        if not real:
            continue  # an exercise whose checks give no part numbers
        assert parts <= real, f"the notes name parts {sorted(parts - real)} of {exercise}; it has {sorted(real)}"
        if exercise in listed:
            assert real <= parts, f"the notes list exercise {exercise}'s parts but never name {sorted(real - parts)}"


def test_exercise_02s_stubs_use_the_checks_part_numbers() -> None:
    stubs = (ROOT / "exercises" / "02_bottleneck.ipynb").read_text(encoding="utf-8")
    raised = {int(minor) for minor in re.findall(r"Exercise 02\.(\d+):", stubs)}
    assert raised == parts_of_exercise("02")


@pytest.mark.parametrize("note", sorted(p.name for p in NOTES.glob("[0-9][0-9]_*.md")))
def test_the_index_lists_every_lesson_note(note: str) -> None:
    index = (NOTES / "README.md").read_text(encoding="utf-8")
    files_section = index.split("## Files", 1)[1]
    assert f"]({note})" in files_section, f"docs/instructor/README.md's file list does not link {note}"
