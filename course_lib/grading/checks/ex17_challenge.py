"""Checks for exercise 17, the capstone challenge: make a slow training epoch fast without changing its objective.

The learner defines ``train_fast(model, images, labels, cfg) -> list[float]`` with the objective of
:func:`course_lib.grading.challenge_judge.train_reference` (one SGD-with-momentum step per group of ``cfg.accum``
micro-batches, the mean loss over the group's labelled samples, one loss per step).

Correctness: the learner's epoch runs on data and initial weights drawn from this grading run's seed (another
dataset size, so another short last group, every run); the grader recomputes the reference on the same inputs and
compares the losses and the final weights. Speed: :func:`~course_lib.grading.challenge_judge.time_against_original`
times the learner's function against the original side by side in the sandboxed process (the course's protocol:
interleaved rounds, median of paired ratios, re-measured while the machine is too busy) and returns the timings as
observations; the grader judges them (:func:`~course_lib.grading.challenge_judge.judge_speed`) and checks that the
last timed call returned the reference's losses for its data, so the timed work is the real work.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, run_seed
from course_lib.grading.challenge_judge import (
    as_losses,
    judge_speed,
    losses_match,
    time_against_original,
    train_reference,
)
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
HOW = "define `train_fast(model, images, labels, cfg)` in the exercise cell"


def _seed(ns: Any) -> int:
    return run_seed(ns) % 10_000


def _trained(ns: dict[str, Any], seed: int) -> dict[str, Any]:
    """The learner's epoch on this run's data: the losses it returned and the weights afterwards."""
    train_fast = need(ns, "train_fast", HOW)
    model = challenge_model(seed)
    images, labels = challenge_data(seed)
    result = call(train_fast, model, images, labels, CFG)
    return {"losses": as_losses(result), "weights": [p.detach() for p in model.parameters()]}


def _reference(seed: int, trainer: Any = train_reference) -> tuple[list[float], list[torch.Tensor]]:
    model = challenge_model(seed)
    losses = trainer(model, *challenge_data(seed), CFG)
    return losses, [p.detach() for p in model.parameters()]


def _counting_all_samples(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                          cfg: ChallengeConfig) -> list[float]:
    """The mistake of dividing the summed loss by every sample of the group, labelled or not."""
    mean, std = channel_stats(images)
    inputs = (images.float() - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    group, losses = cfg.micro_batch * cfg.accum, []
    for start in range(0, len(labels), group):
        x, y = inputs[start : start + group], labels[start : start + group]
        loss = F.cross_entropy(model(x), y, ignore_index=IGNORE, reduction="sum") / len(y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def _max_diff(a: list[Any], b: list[torch.Tensor]) -> float:
    if len(a) != len(b) or any(not isinstance(p, torch.Tensor) or p.shape != q.shape for p, q in zip(a, b)):
        return float("inf")
    return max(float((p.float() - q).abs().max()) for p, q in zip(a, b))


ORIGINAL_HINT = ("this is the original's `loss / accum` normalisation: every micro-batch's mean weighs the same "
                 "whatever its number of labelled samples, and the short last group is divided by cfg.accum too. "
                 "Divide the group's summed loss by the number of labelled samples in the whole group")


def _normalisation_hint(weights: list[Any], seed: int) -> str:
    """Name the mistake when the weights are those of a known wrong normalisation."""
    if _max_diff(weights, _reference(seed, train_original)[1]) < 1e-5:
        return ORIGINAL_HINT
    if _max_diff(weights, _reference(seed, _counting_all_samples)[1]) < 1e-5:
        return (f"you divide by every sample of the group; unlabelled samples (target {IGNORE}) are not samples: "
                f"divide by (y != {IGNORE}).sum() over the group")
    return ("one step per group of cfg.accum micro-batches of cfg.micro_batch consecutive samples, on the summed "
            "loss over the group's labelled samples divided by their number; normalise the images with the whole "
            "dataset's per-channel mean and std (torch.std's default, unbiased)")


@check_for("17", "one loss per step, as the reference", points=1, parts=("17.1",))
def losses(ns: dict[str, Any]) -> None:
    seed = _seed(ns)
    seen = observe(ns, _trained, seed)
    expected, _ = _reference(seed)
    got = seen["losses"]
    if isinstance(got, str):
        raise CheckFailed("train_fast should return the list of per-step losses (floats)", got=got)
    n = len(challenge_data(seed)[1])
    if len(got) != len(expected):
        raise CheckFailed(
            f"{n} samples in micro-batches of {CFG.micro_batch}, {CFG.accum} per step, make {len(expected)} "
            "optimizer steps: return one loss per step",
            hint="the last group is short: it still gets its own step (and its loss); do not skip or merge it",
            expected=f"{len(expected)} losses", got=f"{len(got)} losses")
    if not losses_match(got, expected):
        raise CheckFailed(
            "the per-step losses differ from the reference's on the same data and initial weights",
            hint="each step's loss is the group's mean loss over its labelled samples, taken before its step",
            expected=[round(v, 5) for v in expected], got=[round(v, 5) for v in got])


@check_for("17", "weights after the epoch equal the reference's", points=2, parts=("17.1",))
def weights(ns: dict[str, Any]) -> None:
    seed = _seed(ns)
    seen = observe(ns, _trained, seed)
    _, truth = _reference(seed)
    diff = _max_diff(seen["weights"], truth)
    if not diff <= 1e-4:
        raise CheckFailed("after one epoch the weights differ from the reference's on the same data",
                          hint=_normalisation_hint(seen["weights"], seed),
                          expected="max |weight difference| <= 1e-4", got=f"{diff:.3g}")


# Groups of 64 samples: with 194 the last group is samples 192 and 193, and 192 is unlabelled (every 17th from the
# 6th), so that group's mean is over one labelled sample: a count guarded at 2 (or any divisor but 1) gives another.
ONE_LABELLED_N = 194


def _one_labelled(ns: dict[str, Any], seed: int) -> dict[str, Any]:
    """The learner's epoch on this run's data cut to ONE_LABELLED_N samples: its losses and the weights after."""
    train_fast = need(ns, "train_fast", HOW)
    model = challenge_model(seed)
    result = call(train_fast, model, *challenge_data(seed, n=ONE_LABELLED_N), CFG)
    return {"losses": as_losses(result), "weights": [p.detach() for p in model.parameters()]}


@check_for("17", "a last group of one labelled sample: its loss and step as the reference's", points=1,
           parts=("17.1",))
def one_labelled(ns: dict[str, Any]) -> None:
    seed = _seed(ns)
    seen = observe(ns, _one_labelled, seed)
    images, labels = challenge_data(seed, n=ONE_LABELLED_N)
    group = CFG.micro_batch * CFG.accum
    assert int((labels[-(len(labels) % group):] != IGNORE).sum()) == 1, "the data no longer has its one-label group"
    model = challenge_model(seed)
    expected = train_reference(model, images, labels, CFG)
    got = seen["losses"]
    if isinstance(got, str):
        raise CheckFailed("train_fast should return the list of per-step losses (floats)", got=got)
    diff = _max_diff(seen["weights"], [p.detach() for p in model.parameters()])
    if not losses_match(got, expected) or not diff <= 1e-4:
        raise CheckFailed(
            f"{ONE_LABELLED_N} samples: the last group holds two, one of them unlabelled, and its step differs from "
            "the reference's (the mean over one labelled sample is that sample's loss)",
            hint=f"divide the group's summed loss by its number of labelled samples, however few: (y != {IGNORE})"
                 ".sum(), guarded at 1 at most (a guard only matters for a group without any)",
            expected={"last loss": round(expected[-1], 5)},
            got={"last loss": round(got[-1], 5) if got else None, "max |weight difference|": f"{diff:.3g}"})


def _timed(ns: dict[str, Any], seed: int) -> dict[str, Any]:
    return time_against_original(need(ns, "train_fast", HOW), seed=seed)


def _timed_call_hint(seed: int, data_seed: Any, got: Any) -> str:
    """What the last timed call's losses show: the hint names that, not a guess."""
    if not isinstance(data_seed, int) or not isinstance(got, list):
        return f"return the list of per-step losses (floats) from every call; the timed call returned {got!r:.80}"
    n = len(challenge_data(data_seed)[1])
    expected = train_reference(challenge_model(seed), *challenge_data(data_seed), CFG)
    if len(got) != len(expected):
        return (f"the timed call's data had {n} samples, {len(expected)} steps, but train_fast returned {len(got)} "
                "losses: one loss per step, the short last group included, for whatever data it is given")
    if losses_match(got, train_original(challenge_model(seed), *challenge_data(data_seed), CFG)):
        return ORIGINAL_HINT
    # The timed calls train on data sets seed, seed + 1, ...: losses of another one were kept from an earlier call.
    for other in range(seed, seed + 30):
        data = challenge_data(other)
        if other != data_seed and losses_match(got, train_reference(challenge_model(seed), *data, CFG)):
            return ("these are the losses of an earlier call's data: train_fast kept something from one call to the "
                    "next (a result, a model, statistics). Every call must train the model it is given, on the "
                    "images and labels it is given")
    return (f"on the timed call's data ({n} samples) the losses differ from the reference's: every call must train "
            "the model it is given on the images and labels it is given, with nothing kept from an earlier call, "
            "and each step's loss is the group's mean loss over its labelled samples")


@check_for("17", f"at least {SPEED_THRESHOLD:g}x faster than the original, side by side", points=2, parts=("17.1",))
def speed(ns: dict[str, Any]) -> None:
    seed = _seed(ns) + 1
    seen = observe(ns, _timed, seed)
    outcome, verdict = judge_speed(seen)
    if outcome == "impossible":
        raise CheckFailed("the timings cannot be real: the measurement's clock was replaced, or the timed calls "
                          "took longer than the whole measurement",
                          hint="leave the course's timing code alone; make train_fast itself faster")
    last = seen.get("last_call") or {}
    data_seed = last.get("seed")
    if not isinstance(data_seed, int) or isinstance(last.get("losses"), str) or not losses_match(
            last["losses"], train_reference(challenge_model(seed), *challenge_data(data_seed), CFG)):
        raise CheckFailed("the timed calls of train_fast did not return the reference's losses for their data, "
                          "so their speed does not count",
                          hint=_timed_call_hint(seed, data_seed, last.get("losses")))
    if outcome == "busy":
        assert verdict is not None
        raise CheckFailed(
            "could not measure reliably: the machine was too busy (the same work took "
            f"{verdict.worst_spread:.1f}x longer in one round than in another, in every attempt)",
            hint="close other programs and run the check again; this says nothing about your code yet",
            got=verdict.sentence())
    assert verdict is not None
    if outcome == "slow":
        raise CheckFailed(
            f"train_fast must be at least {SPEED_THRESHOLD:g}x faster than the original, measured side by side",
            hint="find the waste in the original: work per sample in Python, work repeated for every micro-batch "
                 "that never changes, a host sync per micro-batch; the profiler (lesson 07) shows where time goes",
            expected=f">= {SPEED_THRESHOLD:g}x", got=verdict.sentence())
