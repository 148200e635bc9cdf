"""A failing check's hint names the mistake the learner's answer shows, chosen from what was observed.

Each test judges one wrong answer through the grader's own observe -> save -> load -> replay path and reads the
hint (or message) of the check it fails: the hint must point at the real cause, not at another mistake that the
same check also catches.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import course_lib.grading.checks
from course_lib.grading.api import checks_for, known_exercises
from test_grading_variants import judge_row
from variant_tables import ex15


def _failed(number: str, code: str, check: str) -> tuple[str, str]:
    results = judge_row(number, code, only=check)
    (failed,) = [r for name, r in results.items() if check in name and not r.passed]
    return failed.message, failed.hint or ""


def test_ex15_a_counter_that_keeps_state_is_told_so_not_about_numel() -> None:
    _, hint = _failed("15", ex15.SHARED_DICT, "count_saved_bytes")
    assert "numel" not in hint
    assert "called again" in hint and "every call" in hint


def test_ex15_a_counter_of_view_bytes_is_told_about_storages() -> None:
    (code,) = [code for mistake, code, _ in ex15.WRONG if "views" in mistake]
    message, hint = _failed("15", code, "count_saved_bytes")
    assert "slice" in message and "view" in hint and "untyped_storage().nbytes()" in hint


def test_ex02_a_clock_started_late_is_told_about_the_clock_not_the_sample_count() -> None:
    from test_grading_variants import SAMPLES_CLOCK_LATE

    _, hint = _failed("02", SAMPLES_CLOCK_LATE, "samples/s")
    assert "clock" in hint and "first batch" in hint
    assert "len(x)" not in hint and "batch sizes" not in hint


def test_ex02_a_tuning_failure_never_shows_expected_equal_to_got() -> None:
    from test_grading_variants import TUNING_EXTRA_MEASUREMENT

    results = judge_row("02", TUNING_EXTRA_MEASUREMENT, only="tuning")
    failed = [r for r in results.values() if not r.passed]
    assert failed
    for r in failed:
        assert r.expected is None or r.expected != r.got, (r.name, r.message, r.expected)


def test_ex17_the_speed_hint_names_what_the_timed_call_returned() -> None:
    """A train_fast that replays its first answer passes the correctness checks: the speed check's hint must say
    that the losses belong to an earlier call's data, not send the learner back to checks that pass."""
    from variant_tables import ex17

    (code,) = [code for mistake, code, _ in ex17.WRONG if "replays its first answer" in mistake]
    _, hint = _failed("17", code, ex17.SPEED)
    assert "earlier call" in hint and "checks" not in hint


def test_ex10_a_tied_weight_counted_twice_is_named() -> None:
    from test_grading_variants import WRONG

    (code,) = [code for number, mistake, code, _ in WRONG if number == "10" and "state_dict()" in mistake]
    _, hint = _failed("10", code, "stored bytes")
    assert "shared by two modules" in hint


# A reference to grading checks in a learner-facing text: "make the first two checks pass", "the check above fails".
_CHECKS_PHRASE = re.compile(r"\bchecks?\b[^.;:]{0,30}\b(pass|passes|passed|fail|fails|failed)\b", re.IGNORECASE)


def _texts(path: Path) -> list[tuple[int, str]]:
    """The string constants of a check module that can end up in a message or hint (docstrings and the names given
    to ``check_for`` left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value,
                                                                                           ast.Constant):
            skip.add(id(body[0].value))  # a docstring
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "check_for":
            skip.update(id(n) for arg in node.args[1:2] for n in ast.walk(arg))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip]


def test_no_message_or_hint_sends_the_learner_to_another_check() -> None:
    """A check's feedback is about what that check observed: it never names another check, nor says which checks
    pass (exercise 17's speed check said "make the first two checks pass" while they passed)."""
    names = {c.name for number in known_exercises() for c in checks_for(number) if " " in c.name}
    found = []
    for path in sorted(Path(course_lib.grading.checks.__file__).parent.glob("ex*.py")):
        for line, text in _texts(path):
            named = [n for n in names if n.lower() in text.lower()]
            if named or _CHECKS_PHRASE.search(text):
                found.append(f"{path.name}:{line}: {text[:100]!r} {named or ''}")
    assert not found, "\n".join(found)


def test_ex07_titles_and_task_text_say_what_the_checks_compare() -> None:
    """The group check's inputs change with the seed, so its title quotes no sizes; the task text defines each
    returned value as the checks compute it (group_sizes counts targets that are not -100)."""
    from course_lib.grading import notebook

    assert not any(ch.isdigit() for c in checks_for("07") for ch in c.name), [c.name for c in checks_for("07")]
    nb = notebook.read(Path(__file__).resolve().parents[1] / "solutions" / "07_accumulation.ipynb")
    (task,) = ["".join(c["source"]) for c in nb["cells"] if "## Your task" in "".join(c["source"])]
    for key in ("loss", "steps", "group_sizes"):
        assert f'`"{key}"`:' in task, key
    assert "not `-100`" in task.split('`"group_sizes"`')[1].split("\n")[0]
