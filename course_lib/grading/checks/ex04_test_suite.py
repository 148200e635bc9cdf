"""Checks for exercise 04: the learner's tests pass on a correct implementation and catch broken ones.

A broken implementation counts as *caught* when at least one test fails on it while the same
test passes on the correct one (a test that always fails catches nothing).
"""

from __future__ import annotations

import tempfile
from typing import Any, Callable

from course_lib.grading import suite_targets as targets
from course_lib.grading.api import CheckFailed, check_for, need


def _suite(ns: dict[str, Any]) -> dict[str, Callable[..., None]]:
    tests = {}
    for name in targets.TEST_NAMES:
        fn = need(ns, name, f"define `{name}(impl{', tmp_path' if 'checkpoint' in name else ''})` in the exercise cell")
        if not callable(fn):
            raise CheckFailed(f"`{name}` should be a test function", got=type(fn).__name__)
        tests[name] = fn
    return tests


# The correct implementation's outcome per suite, so the eight checks run it once (keyed by the test functions).
_REFERENCE_RUNS: dict[tuple[int, ...], dict[str, str]] = {}


def _run(tests: dict[str, Callable[..., None]], impl: targets.Reference) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        return targets.run_suite(tests, impl, tmp)


def _reference_outcome(tests: dict[str, Callable[..., None]]) -> dict[str, str]:
    key = tuple(id(fn) for fn in tests.values())
    if key not in _REFERENCE_RUNS:
        _REFERENCE_RUNS[key] = _run(tests, targets.Reference())
    return _REFERENCE_RUNS[key]


@check_for("04", "all tests pass on the correct implementation", points=2)
def passes_on_correct(ns: dict[str, Any]) -> None:
    outcome = _reference_outcome(_suite(ns))
    failing = {name: error for name, error in outcome.items() if error}
    if failing:
        name, error = next(iter(failing.items()))
        raise CheckFailed(f"{name} fails on a correct implementation, so it would flag good code",
                          hint="loosen tolerances only where floats legitimately differ; use eval mode to compare "
                               "outputs; give the overfit test enough steps",
                          expected="all pass", got=f"{len(failing)} failing, first: {name}: {error}")


def _make_caught_check(broken: type[targets.Reference]) -> None:
    def caught(ns: dict[str, Any]) -> None:
        tests = _suite(ns)
        good = _reference_outcome(tests)
        bad = _run(tests, broken())
        if not any(bad[name] and not good[name] for name in tests):
            raise CheckFailed(f"no test catches an implementation with this bug: {broken.name}",
                              hint=_HINTS[broken], expected="at least one test fails", got="all tests pass")

    caught.__name__ = caught.__qualname__ = f"catches_{broken.__name__}"
    check_for("04", f"catches: {broken.name}")(caught)
    globals()[caught.__name__] = caught


_HINTS: dict[type[targets.Reference], str] = {
    targets.WrongShape: "check the logits' shape for several batch sizes, including 1",
    targets.DetachedLoss: "train a few dozen steps on one fixed batch: the loss should drop close to zero",
    targets.IgnoresSeed: "build and train twice with the same seed: losses and weights must match exactly",
    targets.UnusedLayer: "after one backward, every parameter should have a non-zero .grad",
    targets.PlainList: "after load, the restored model (eval mode) should give the same outputs as the saved one",
    targets.DropsOptimizer: "after load, one more train_step on both copies should give the same loss and weights",
    targets.DropsBuffers: "compare outputs in eval mode after training a few steps: running statistics matter there",
}

for _broken in targets.BROKEN:
    _make_caught_check(_broken)
