"""Checks for exercise 04: the learner's tests pass on a correct implementation and catch broken ones.

A broken implementation counts as *caught* when at least one test fails on it while the same
test passes on the correct one (a test that always fails catches nothing).
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable
from typing import Any

from course_lib.grading import suite_targets as targets
from course_lib.grading.api import CheckFailed, check_for, need, observe, run_seed


def _suite(ns: dict[str, Any]) -> dict[str, Callable[..., None]]:
    tests = {}
    for name in targets.TEST_NAMES:
        fn = need(ns, name, f"define `{name}(impl{', tmp_path' if 'checkpoint' in name else ''})` in the exercise cell")
        if not callable(fn):
            raise CheckFailed(f"`{name}` should be a test function", got=type(fn).__name__)
        tests[name] = fn
    return tests


# Outcomes per (suite, implementation), so the checks (one per broken implementation, and one more) run the correct
# implementation once.
_RUNS: dict[tuple[Any, ...], dict[str, str]] = {}


def _outcome(ns: dict[str, Any], implementation: str) -> dict[str, str]:
    """``{test name: "" or the error}`` of the learner's suite on ``suite_targets.<implementation>``."""
    tests = _suite(ns)
    key = (*(id(fn) for fn in tests.values()), implementation)
    if key not in _RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            _RUNS[key] = targets.run_suite(tests, getattr(targets, implementation)(), tmp)
    return _RUNS[key]


def _order(ns: dict[str, Any]) -> list[str]:
    """The implementations to test, the correct one several times, shuffled differently in every grading run.

    The observations are the outcomes in this order, so answers prepared in advance cannot tell which outcomes
    must be the correct implementation's (suites run once per implementation: repeats cost nothing).
    """
    order = ["Reference"] * 9 + [broken.__name__ for broken in targets.BROKEN]
    random.Random(run_seed(ns)).shuffle(order)
    return order


def _outcomes(ns: dict[str, Any], order: list[str]) -> list[dict[str, str]]:
    return [_outcome(ns, implementation) for implementation in order]


def _observed(ns: dict[str, Any]) -> tuple[list[dict[str, str]], dict[str, dict[str, str]]]:
    """The outcomes on the correct implementation (one per repeat) and the outcome on each broken one."""
    order = _order(ns)
    outcomes = observe(ns, _outcomes, order)
    if not isinstance(outcomes, list) or len(outcomes) != len(order) or not all(
            isinstance(o, dict) for o in outcomes):
        raise CheckFailed("the test suite's outcomes could not be read", got=type(outcomes).__name__)
    good = [o for name, o in zip(order, outcomes) if name == "Reference"]
    others = {name: o for name, o in zip(order, outcomes) if name != "Reference"}
    if any(o != good[0] for o in good):  # the suite runs once per implementation: its repeats are one outcome
        raise CheckFailed("the outcomes on the correct implementation differ between its repeats in this run's order "
                          "(observations from another run?)", got=good)
    return good, others


# The part of the exercise each test is (04.1 is test_shapes, ...), and the test meant to catch each broken one.
PART = {name: f"04.{i}" for i, name in enumerate(targets.TEST_NAMES, 1)}
CATCHER: dict[type[targets.Reference], str] = {
    targets.WrongShape: "test_shapes",
    targets.DetachedLoss: "test_overfit_one_batch",
    targets.IgnoresSeed: "test_determinism",
    targets.PrunedUnseeded: "test_determinism",
    targets.UnusedLayer: "test_gradient_flow",
    targets.ZeroGradient: "test_gradient_flow",
    targets.PlainList: "test_checkpoint_roundtrip",
    targets.DropsOptimizer: "test_checkpoint_roundtrip",
    targets.DropsBuffers: "test_checkpoint_roundtrip",
}


@check_for("04", "all tests pass on the correct implementation", points=2, parts=tuple(PART.values()))
def passes_on_correct(ns: dict[str, Any]) -> None:
    good, _ = _observed(ns)
    blank = [error for error in good[0].values() if error.startswith(targets.NOT_ATTEMPTED)]
    if blank:
        more = f" (and {len(blank) - 1} more test(s) not attempted)" if len(blank) > 1 else ""
        raise CheckFailed(blank[0] + more)
    failing = {name: error for o in good for name, error in o.items() if error}
    if failing or any(sorted(o) != sorted(targets.TEST_NAMES) for o in good):
        name, error = next(iter(failing.items())) if failing else ("?", "missing tests")
        raise CheckFailed(f"{name} fails on a correct implementation, so it would flag good code",
                          hint="loosen tolerances only where floats legitimately differ; use eval mode to compare "
                               "outputs; give the overfit test enough steps",
                          expected="all pass", got=f"{len(failing)} failing, first: {name}: {error}")


def _make_caught_check(broken: type[targets.Reference]) -> None:
    def caught(ns: dict[str, Any]) -> None:
        goods, others = _observed(ns)
        bad = others[broken.__name__]
        if not any(bad.get(name) and not any(good.get(name) for good in goods) for name in targets.TEST_NAMES):
            meant = goods[0].get(CATCHER[broken], "")
            if meant.startswith(targets.NOT_ATTEMPTED):  # the test meant to catch it is still blank: say that
                raise CheckFailed(meant)
            raise CheckFailed(f"no test catches an implementation with this bug: {broken.name}",
                              hint=_HINTS[broken], expected="at least one test fails", got="all tests pass")

    caught.__name__ = caught.__qualname__ = f"catches_{broken.__name__}"
    check_for("04", f"catches: {broken.name}", parts=(PART[CATCHER[broken]],))(caught)
    globals()[caught.__name__] = caught


_HINTS: dict[type[targets.Reference], str] = {
    targets.WrongShape: "check the logits' shape for several batch sizes, including 1",
    targets.DetachedLoss: "train a few dozen steps on one fixed batch: the loss should drop close to zero",
    targets.IgnoresSeed: "build and train twice with the same seed: losses and weights must match exactly",
    targets.PrunedUnseeded: "compare every weight tensor of the two seeded runs (all of them), not only the losses: "
                            "weights the loss never sees can still differ",
    targets.UnusedLayer: "after one backward, every parameter should have a non-zero .grad",
    targets.ZeroGradient: "after one backward, every parameter's .grad should exist and not be all zeros: a gradient "
                          "of zeros never moves the weight",
    targets.PlainList: "after load, the restored model (eval mode) should give the same outputs as the saved one",
    targets.DropsOptimizer: "after load, one more train_step on both copies should give the same loss and weights",
    targets.DropsBuffers: "compare outputs in eval mode after training a few steps: running statistics matter there",
}

for _broken in targets.BROKEN:
    _make_caught_check(_broken)
