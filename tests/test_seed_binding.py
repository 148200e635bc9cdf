"""Every observation is bound to the whole seed of the grading run it answers.

Checks draw their inputs from the run's seed, but many inputs are job sizes taken from a few of its bits
(``3 + seed % 2`` rows...): an answer recorded for seed ``s`` fitted seed ``s + 4`` as well, so a notebook that wrote
observations for a guessed seed scored about one time in four on such a check.
:meth:`course_lib.grading.api.Replay.take` now refuses a record made for any other seed, whatever bits they share.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from course_lib.grading import api, notebook
from course_lib.grading.api import Replay, checks_for, run_check
from course_lib.grading.worker import load_namespace

REPO = Path(__file__).resolve().parents[1]
SEED = 150
# A multiple of every number up to 16: seed and seed + SAME_LOW_BITS agree modulo each of them (and modulo 9000,
# which the distributed jobs use).
SAME_LOW_BITS = 720720 * 25
# The exercises (quick to judge) whose checks accepted, before the binding, an answer recorded for SEED judged with
# SEED + SAME_LOW_BITS: some inputs depended on the seed modulo 2, 3, 4, 9000 only.
EXERCISES = ("02", "08", "09", "10", "13", "15", "16", "18")


def _recorded(number: str) -> list[tuple[api.Check, bytes]]:
    """Every check of ``number`` run on the solution with seed SEED: ``(check, its records saved as bytes)``."""
    (path,) = sorted((REPO / "solutions").glob(f"{number}_*.ipynb"))
    ns = load_namespace(notebook.read(path))
    out = []
    api.set_run_seed(SEED)
    try:
        for check in checks_for(number):
            records = api.start_recording()
            try:
                check.func(ns)
            except Exception:  # judged from the records, as the grader does
                pass
            finally:
                api.stop_recording()
            data = io.BytesIO()
            torch.save(records, data)
            out.append((check, data.getvalue()))
    finally:
        api.set_run_seed(0)
    return out


@pytest.mark.parametrize("number", EXERCISES)
def test_an_answer_for_a_seed_with_the_same_low_bits_is_refused(number: str) -> None:
    accepted, refused = [], []
    for check, data in _recorded(number):
        for seed, wrong in ((SEED + SAME_LOW_BITS, accepted), (SEED, refused)):
            result = run_check(check, Replay(torch.load(io.BytesIO(data), weights_only=True), seed=seed))
            if result.passed == (wrong is accepted):
                wrong.append(check.name)
    assert not refused, f"the solution fails its own run's checks: {refused}"
    assert not accepted, f"answers recorded for seed {SEED} pass with seed {SEED + SAME_LOW_BITS}: {accepted}"


def test_a_record_without_the_seed_it_answers_is_refused() -> None:
    """A hand-written record (no seed, or a seed of another type) is not judged, even when its value is right."""
    (check, data), *_ = _recorded("16")
    records = torch.load(io.BytesIO(data), weights_only=True)
    assert run_check(check, Replay(records, seed=SEED)).passed
    for seed in (None, float(SEED), str(SEED)):
        forged = [{k: v for k, v in r.items() if k != "seed"} | ({} if seed is None else {"seed": seed})
                  for r in records]
        result = run_check(check, Replay(forged, seed=SEED))
        assert not result.passed and "another grading run" in result.message, (seed, result)
