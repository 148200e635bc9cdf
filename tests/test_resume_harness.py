"""The kill-and-resume test bed of exercise 14: the reference resumes bit for bit, and each missing piece shows."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from course_lib.grading import resume_harness as harness
from course_lib.grading.checks.ex14_checkpoint import _forgetting

CFG = harness.HarnessConfig(seed=5, steps=10, samples=20)


def _losses(segment: harness.Segment) -> list[float]:
    return [segment.losses[s] for s in sorted(segment.losses)]


@pytest.fixture(scope="module")
def truth() -> harness.Segment:
    return harness.uninterrupted(CFG)


def test_reference_resumes_bit_for_bit(tmp_path: Path, truth: harness.Segment) -> None:
    result = harness.interrupted_run(CFG, tmp_path / "c.pt", harness.reference_save, harness.reference_load, 5)
    assert sorted(result.before) == [1, 2, 3, 4, 5]
    assert all(result.before[s] == truth.losses[s] for s in result.before)
    assert result.resumed.start == 4 == CFG.last_save_before(5)
    assert _losses(result.resumed) == [truth.losses[s] for s in range(5, CFG.steps + 1)]
    assert all(torch.equal(a, b) for a, b in zip(result.resumed.params, truth.params))
    assert result.resumed.scale == truth.scale


def test_a_real_sigkill_then_resume(tmp_path: Path, truth: harness.Segment) -> None:
    result = harness.killed_run(CFG, tmp_path / "c.pt", harness.reference_save, harness.reference_load, 7)
    assert result.how == ("SIGKILL" if sys.platform.startswith("linux") else "exception")
    assert max(result.before) == 7 and result.resumed.start == 6
    assert _losses(result.resumed) == [truth.losses[s] for s in range(7, CFG.steps + 1)]


def test_a_process_whose_forks_cannot_run_autograd_resumes_in_process(tmp_path: Path, truth: harness.Segment,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A notebook's functions are run in a forked child; once the process has compiled something, torch refuses
    autograd in such a child, and the harness falls back to the in-process interrupt instead of failing the run.
    The patched probe stands in for that process state (the forked child inherits it)."""
    monkeypatch.setattr(harness, "_autograd_works_here", lambda: False)
    notebook_save = lambda path, **parts: harness.reference_save(path, **parts)  # noqa: E731 - not importable
    result = harness.killed_run(CFG, tmp_path / "c.pt", notebook_save, harness.reference_load, 7)
    assert result.how == "exception"
    assert max(result.before) == 7 and result.resumed.start == 6
    assert _losses(result.resumed) == [truth.losses[s] for s in range(7, CFG.steps + 1)]


@pytest.mark.parametrize("what", ["optimizer state", "random number generators", "data position"])
def test_each_missing_piece_changes_the_resumed_losses(tmp_path: Path, truth: harness.Segment, what: str) -> None:
    result = harness.interrupted_run(CFG, tmp_path / "c.pt", harness.reference_save, _forgetting(what), 5)
    assert _losses(result.resumed) != [truth.losses[s] for s in range(5, CFG.steps + 1)]


def test_losses_do_not_depend_on_the_scale_but_the_scale_grows() -> None:
    a = harness.uninterrupted(CFG)
    b = harness.uninterrupted(harness.HarnessConfig(seed=5, steps=10, samples=20, init_scale=2.0**3))
    assert _losses(a) == _losses(b)
    assert a.scale == CFG.init_scale * 2 ** (CFG.steps // CFG.growth_interval)


def test_the_callers_rng_and_threads_are_left_alone() -> None:
    threads = torch.get_num_threads()
    harness.seed_everything(1)
    expected = random.random(), np.random.random(), torch.rand(1)
    harness.seed_everything(1)
    harness.uninterrupted(harness.HarnessConfig(steps=2))
    assert (random.random(), np.random.random()) == expected[:2] and torch.equal(torch.rand(1), expected[2])
    assert torch.get_num_threads() == threads


def test_bad_configs_and_stops_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="multiple of batch"):
        harness.HarnessConfig(samples=10, batch=4)
    with pytest.raises(ValueError, match="before the end"):
        harness.interrupted_run(harness.HarnessConfig(steps=3), tmp_path / "c.pt", harness.reference_save,
                                harness.reference_load, 3)
    with pytest.raises(TypeError, match="an int"):
        harness.run(harness.HarnessConfig(steps=2), tmp_path / "c.pt", harness.reference_save,
                    lambda path, **objects: None, resume=True)


def test_a_blank_save_is_not_attempted_not_a_harness_error(tmp_path: Path) -> None:
    """A blank exercise's save (NotImplementedError("Exercise 14.1: ...")) reads as not attempted, as the learner's
    own function would, however the harness ran it (a killed child process reports it through a pipe)."""
    def blank_save(path, **parts):
        raise NotImplementedError("Exercise 14.1: collect every state_dict")

    for run in (harness.killed_run, harness.interrupted_run):
        with pytest.raises(NotImplementedError, match=r"^Exercise 14\.1: collect every state_dict$"):
            run(CFG, tmp_path / "c.pt", blank_save, harness.reference_load, 7)
