"""A failing check's hint names the mistake the learner's answer shows, chosen from what was observed.

Each test judges one wrong answer through the grader's own observe -> save -> load -> replay path and reads the
hint (or message) of the check it fails: the hint must point at the real cause, not at another mistake that the
same check also catches.
"""

from __future__ import annotations

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
