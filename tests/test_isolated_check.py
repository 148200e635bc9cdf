"""A check runs alone and leaves the process as it found it; judging a replay starts from a state fixed by the seed."""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from course_lib.grading.api import Check, CheckFailed, Replay, run_check


def _check(func) -> Check:
    return Check("90", "a probe", 1, func, "test")


def test_a_check_that_changes_global_state_leaves_none_of_it_changed() -> None:
    def meddle(ns) -> None:
        torch.manual_seed(1)
        random.seed(1)
        np.random.seed(1)
        torch.set_num_threads(2)
        torch.set_float32_matmul_precision("medium")
        torch.set_grad_enabled(False)
        torch.compile = None  # a spy left behind
        os.environ["COURSE_MODE"] = "full"
        raise CheckFailed("wrong on purpose")

    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    compile_, mode, threads = torch.compile, os.environ.get("COURSE_MODE"), torch.get_num_threads()
    precision = torch.get_float32_matmul_precision()
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    for ns in ({}, Replay([], seed=7, mode="smoke")):
        result = run_check(_check(meddle), ns)
        assert not result.passed and result.message == "wrong on purpose"
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == (expected[0].tolist(), *expected[1:])
    assert torch.compile is compile_ and os.environ.get("COURSE_MODE") == mode
    assert torch.get_num_threads() == threads and torch.get_float32_matmul_precision() == precision
    assert torch.is_grad_enabled()


def test_judging_a_replay_starts_from_the_seed_whatever_ran_before() -> None:
    seen = []

    def look(ns) -> None:
        seen.append((torch.rand(2).tolist(), random.random(), torch.get_num_threads(),
                     torch.get_float32_matmul_precision(), os.environ.get("COURSE_MODE")))

    previous = torch.get_num_threads()
    try:
        for noise in (1, 2):
            torch.manual_seed(noise)
            random.seed(noise)
            torch.set_num_threads(2)
            run_check(_check(look), Replay([], seed=11, mode="full"))
    finally:
        torch.set_num_threads(previous)
    assert seen[0] == seen[1]
    assert seen[0][0] == torch.rand(2, generator=torch.Generator().manual_seed(11)).tolist()
    assert seen[0][2:] == (1, "highest", "full")


def test_checks_in_several_threads_never_overlap() -> None:
    inside, most = 0, 0
    guard = threading.Lock()

    def slow(ns) -> None:
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        time.sleep(0.02)  # long enough for another thread to enter if nothing stopped it
        with guard:
            inside -= 1

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda i: run_check(_check(slow), Replay([], seed=i)), range(12)))
    assert all(r.passed for r in results)
    assert most == 1


def test_no_environment_variable_outlives_a_check(monkeypatch) -> None:
    """Grading sets COURSE_MODE to judge; a check or learner code may set, change or remove anything else."""
    monkeypatch.delenv("COURSE_MODE", raising=False)
    monkeypatch.setenv("COURSE_TEST_KEPT", "as it was")
    monkeypatch.setenv("COURSE_TEST_REMOVED", "still here")
    before = dict(os.environ)

    def meddle(ns) -> None:
        assert os.environ.get("COURSE_MODE") == (ns.mode if isinstance(ns, Replay) else None)
        os.environ["COURSE_TEST_LEAK"] = "1"
        os.environ["COURSE_TEST_KEPT"] = "changed"
        del os.environ["COURSE_TEST_REMOVED"]
        os.environ["COURSE_MODE"] = "full"

    for ns in ({}, Replay([], seed=3, mode="smoke")):
        assert run_check(_check(meddle), ns).passed
        assert dict(os.environ) == before


def test_grading_in_process_leaves_the_environment_as_it_was(monkeypatch) -> None:
    """inprocess.observe_and_judge runs the learner's functions here (observing) and then judges: neither half
    may leave an environment variable behind."""
    from course_lib.grading import inprocess

    monkeypatch.delenv("COURSE_TEST_LEAK", raising=False)
    before = dict(os.environ)

    def lr_at(step, cfg) -> float:
        os.environ["COURSE_TEST_LEAK"] = str(step)
        os.environ["COURSE_MODE"] = "full" if os.environ.get("COURSE_MODE") != "full" else "smoke"
        return 0.0

    results = inprocess.observe_and_judge("05", {"lr_at": lr_at})
    assert results and not all(r.passed for r in results)  # it ran the learner's function (and judged it wrong)
    assert dict(os.environ) == before
