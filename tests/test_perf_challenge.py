"""The capstone challenge's pieces: its data, the original's bug, the reference's objective, and the speed judgement.

The speed judgement is proven on synthetic timings (no wall-clock threshold here: the machine is shared); the
harness is run once, briefly, for its structure, never for a ratio.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from course_lib.grading import challenge_judge
from course_lib.grading.api import Replay, checks_for, run_check
from course_lib.grading.challenge_judge import judge_speed, losses_match, time_against_original, train_reference
from course_lib.perf.challenge import (
    IGNORE,
    SPEED_THRESHOLD,
    ChallengeConfig,
    challenge_data,
    challenge_model,
    channel_stats,
    train_original,
)

CFG = ChallengeConfig()


def _by_definition(seed: int) -> tuple[list[float], list[torch.Tensor]]:
    """Micro-batches accumulated one by one, each summed loss over the group's labelled samples (lesson 06)."""
    images, labels = challenge_data(seed)
    mean, std = channel_stats(images)
    model = challenge_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=CFG.lr, momentum=CFG.momentum)
    group, losses = CFG.micro_batch * CFG.accum, []
    for start in range(0, len(labels), group):
        labelled = int((labels[start : start + group] != IGNORE).sum())
        total = 0.0
        for s in range(start, min(start + group, len(labels)), CFG.micro_batch):
            x = (images[s : s + CFG.micro_batch].float() - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
            loss = F.cross_entropy(model(x), labels[s : s + CFG.micro_batch], reduction="sum") / labelled
            loss.backward()
            total += float(loss.detach())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses, [p.detach() for p in model.parameters()]


def test_data_is_seeded_and_every_group_has_labelled_samples() -> None:
    a, b = challenge_data(3), challenge_data(3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[0].dtype == torch.uint8 and a[0].shape[1:] == (3, 16, 16)
    for seed in (0, 5, 18, 44, 45):  # 194, 199, 212, 238, 194 samples
        labels = challenge_data(seed)[1]
        assert len(labels) == 194 + seed % 45 and len(labels) % (CFG.micro_batch * CFG.accum)  # a short last group
        assert (labels == IGNORE).any()
        for start in range(0, len(labels), CFG.micro_batch * CFG.accum):
            assert (labels[start : start + CFG.micro_batch * CFG.accum] != IGNORE).any()


@pytest.mark.parametrize("seed", [0, 11])
def test_reference_is_the_accumulation_by_definition(seed: int) -> None:
    losses, weights = _by_definition(seed)
    model = challenge_model(seed)
    got = train_reference(model, *challenge_data(seed), CFG)
    assert losses_match(got, losses, tol=1e-5)
    assert max(float((p.detach() - q).abs().max()) for p, q in zip(model.parameters(), weights)) < 1e-5


def test_the_original_has_the_outdated_normalisation() -> None:
    model, reference = challenge_model(0), challenge_model(0)
    got = train_original(model, *challenge_data(0), CFG)
    expected = train_reference(reference, *challenge_data(0), CFG)
    assert len(got) == len(expected)
    assert not losses_match(got, expected)
    assert max(float((p.detach() - q.detach()).abs().max())
               for p, q in zip(model.parameters(), reference.parameters())) > 1e-3


def test_config_rejects_bad_values_before_any_work() -> None:
    with pytest.raises(ValueError, match="accum=0"):
        ChallengeConfig(accum=0)
    with pytest.raises(ValueError, match="momentum"):
        ChallengeConfig(momentum=1.0)


# ------------------------------------------------------------------ the speed judgement, on synthetic timings
QUIET_ORIGINAL = [0.100, 0.102, 0.099, 0.101, 0.100, 0.103, 0.100]


def _observed(yours: list[float], original: list[float], *, elapsed: float = 10.0,
              intact: bool = True) -> dict[str, Any]:
    return {"attempts": [{"yours": yours, "original": original, "elapsed_s": elapsed,
                          "calls": {"yours": 1, "original": 1}}], "clock_intact": intact}


def test_a_clear_speed_up_passes() -> None:
    outcome, verdict = judge_speed(_observed([t / 6 for t in QUIET_ORIGINAL], QUIET_ORIGINAL))
    assert outcome == "pass" and verdict is not None and verdict.ratio == pytest.approx(6, rel=0.05)


def test_a_real_but_small_speed_up_is_too_slow() -> None:
    outcome, verdict = judge_speed(_observed([t / 1.8 for t in QUIET_ORIGINAL], QUIET_ORIGINAL))
    assert outcome == "slow" and verdict is not None and verdict.outcome == "faster"
    assert judge_speed(_observed(QUIET_ORIGINAL, QUIET_ORIGINAL))[0] == "slow"  # the original itself


def test_a_busy_machine_passes_only_when_three_rounds_in_four_clear_the_threshold() -> None:
    jumpy = [0.1, 0.3, 0.1, 0.32, 0.1, 0.1, 0.29]  # the same work, 3x apart between rounds: "busy"
    clear = [t / 5 for t in jumpy[:4]] + [0.1 / 5, 0.1 / 5, 0.29 / 5]
    outcome, verdict = judge_speed(_observed(clear, jumpy))
    assert verdict is not None and challenge_judge._too_noisy(verdict) and outcome == "pass"
    mixed = [0.02, 0.3, 0.02, 0.32, 0.1, 0.1, 0.29]  # 5x in two rounds, 1x in the rest
    outcome, verdict = judge_speed(_observed(mixed, jumpy))
    assert outcome == "busy" and verdict is not None and challenge_judge._too_noisy(verdict)


def test_a_decided_attempt_after_a_busy_one_is_judged() -> None:
    jumpy = [0.1, 0.3, 0.1, 0.32, 0.1, 0.1, 0.29]
    observed = _observed(jumpy, jumpy)
    observed["attempts"] += _observed([t / 1.5 for t in QUIET_ORIGINAL], QUIET_ORIGINAL)["attempts"]
    assert judge_speed(observed)[0] == "slow"
    observed["attempts"][1] = _observed([t / 4 for t in QUIET_ORIGINAL], QUIET_ORIGINAL)["attempts"][0]
    assert judge_speed(observed)[0] == "pass"


def test_impossible_timings_are_refused() -> None:
    fast = [t / 6 for t in QUIET_ORIGINAL]
    assert judge_speed(_observed(fast, QUIET_ORIGINAL, intact=False))[0] == "impossible"
    assert judge_speed(_observed(fast, QUIET_ORIGINAL, elapsed=0.3))[0] == "impossible"  # rounds add up to 0.82 s


def test_the_threshold_is_a_clear_margin() -> None:
    assert 2 <= SPEED_THRESHOLD <= 3


# ------------------------------------------------------------------ the check, judged in the parent from records
def _speed_check() -> Any:
    (check,) = [c for c in checks_for("17") if "faster" in c.name]
    return check


def _replayed(observed: dict[str, Any], seed: int = 40) -> Any:
    return run_check(_speed_check(), Replay([{"key": "_timed", "value": observed, "seed": seed}], seed=seed))


def _last_call(seed: int, data_seed: int, correct: bool = True) -> dict[str, Any]:
    losses = train_reference(challenge_model(seed), *challenge_data(data_seed), CFG)
    return {"seed": data_seed, "losses": losses if correct else [v + 0.1 for v in losses]}


def test_the_check_passes_fast_and_correct_timed_calls() -> None:
    observed = _observed([t / 6 for t in QUIET_ORIGINAL], QUIET_ORIGINAL)
    observed["last_call"] = _last_call(41, 47)  # the check times with seed run_seed + 1
    assert _replayed(observed).passed


def test_the_check_refuses_fast_timed_calls_that_did_not_do_the_work() -> None:
    observed = _observed([t / 6 for t in QUIET_ORIGINAL], QUIET_ORIGINAL)
    observed["last_call"] = _last_call(41, 47, correct=False)
    result = _replayed(observed)
    assert not result.passed and "does not count" in result.message


def test_the_check_says_re_run_when_it_could_not_measure() -> None:
    jumpy = [0.1, 0.3, 0.1, 0.32, 0.1, 0.1, 0.29]
    observed = _observed([0.02, 0.3, 0.02, 0.32, 0.1, 0.1, 0.29], jumpy)
    observed["last_call"] = _last_call(41, 41)
    result = _replayed(observed)
    assert not result.passed and "could not measure reliably" in result.message and "again" in (result.hint or "")


def test_the_check_names_the_ratio_when_too_slow() -> None:
    observed = _observed([t / 1.5 for t in QUIET_ORIGINAL], QUIET_ORIGINAL)
    observed["last_call"] = _last_call(41, 41)
    result = _replayed(observed)
    assert not result.passed and "1.50x faster" in (result.got or "") and f"{SPEED_THRESHOLD:g}" in result.message


# ------------------------------------------------------------------ the harness, once, for its structure
def test_harness_times_fresh_calls_and_records_the_last_one() -> None:
    observed = time_against_original(train_reference, seed=5, rounds=2, attempts=1)
    (attempt,) = observed["attempts"]
    assert len(attempt["yours"]) == len(attempt["original"]) == 2 and observed["clock_intact"]
    assert sum(attempt["yours"]) + sum(attempt["original"]) <= attempt["elapsed_s"]
    last = observed["last_call"]
    assert last["seed"] > 5  # warm-up, calibration and rounds each drew fresh data
    assert losses_match(last["losses"], train_reference(challenge_model(5), *challenge_data(last["seed"]), CFG))


def test_the_checked_call_never_trains_on_an_earlier_calls_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """The speed check trusts the timings only when the call it checks returned the reference's losses for its
    data. A fast contender is called many times (its rounds are calibrated to a minimum length, and a busy machine
    repeats the measurement), more than the 30 prepared data sets: the checked call once fell on the first call's
    data, so a train_fast that replays its first answer passed that test about one run in 30, under load only. The
    call checked is on data no other call had, whatever the number of calls."""
    first: list[Any] = []
    data_seen: list[int] = []

    def replays(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, cfg: Any) -> Any:
        data_seen.append(int(images.sum()))
        if not first:
            first.append(train_reference(model, images, labels, cfg))
        return first[0]

    class Comparison:  # what time_against_original reads from the protocol's comparison
        def __init__(self, calls: int) -> None:
            self.calls_per_round = {"yours": calls, "original": 1}

        def __getitem__(self, name: str) -> Any:
            return SimpleNamespace(seconds=[0.01] * 7)

        def verdict(self, *names: str) -> Any:
            return SimpleNamespace(worst_spread=1.0)

    for calls in (2, 30, 31, 61):
        first.clear()
        data_seen.clear()

        def compare(contenders: dict[str, Any], calls: int = calls, **kwargs: Any) -> Comparison:
            for _ in range(calls):  # a fast contender's calibration and rounds
                contenders["yours"]()
            return Comparison(calls)

        monkeypatch.setattr(challenge_judge.protocol, "compare", compare)
        last = time_against_original(replays, seed=40, attempts=1)["last_call"]
        assert data_seen.count(data_seen[-1]) == 1, f"{calls} calls: the checked call's data was an earlier call's"
        truth = train_reference(challenge_model(40), *challenge_data(last["seed"]), CFG)
        assert not losses_match(last["losses"], truth), f"{calls} calls: a replayed first answer fits the checked call"
