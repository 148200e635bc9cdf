"""Pipeline parallelism's two costs, counted: the bubble, and the activations a stage keeps in flight.

The model is cut into ``p`` stages, one per rank; the batch into ``m`` micro-batches that flow through the stages.

**The bubble (GPipe).** Every stage runs all ``m`` forwards, then all ``m`` backwards. With every forward and every
backward taking one time unit per stage, a step lasts ``m + p - 1`` units in each direction and each stage is busy
for ``m`` of them: the idle share is ``(p - 1) / (m + p - 1)``. More micro-batches shrink it: 4 stages idle 43% of the
time with 4 micro-batches, 16% with 16.

**The memory (1F1B).** GPipe's stages keep the activations of all ``m`` micro-batches until their backward comes.
1F1B (PipeDream-Flush, what Megatron-LM and picotron run) starts the backwards as early as possible: stage ``s``
(0 = the first) runs ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one backward, then
finishes the remaining backwards. The bubble is the same, but stage ``s`` never holds more than ``min(p - s, m)``
micro-batches' activations: at most ``p``, whatever ``m``, so ``m`` can grow to shrink the bubble without the memory
growing with it.

Taught in lesson 13 (``notebooks/13_parallel.ipynb``: two ranks run GPipe steps in :func:`stage_order`'s order and
measure the bubble against :func:`bubble_fraction`); practised in exercise 22 (``exercises/22_beyond_dp.ipynb``).
"""

from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b")


def _check(stages: int, micro_batches: int, stage: int = 0) -> None:
    if stages < 1 or micro_batches < 1 or not 0 <= stage < stages:
        raise ValueError(f"need stages >= 1, micro_batches >= 1 and 0 <= stage < stages; got stages={stages!r}, "
                         f"micro_batches={micro_batches!r}, stage={stage!r}.")


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """GPipe's idle share of a step, ``(p - 1) / (m + p - 1)`` (1F1B's is the same).

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``); practised in exercise 22 (``exercises/22_beyond_dp.ipynb``).
    """
    _check(stages, micro_batches)
    return (stages - 1) / (micro_batches + stages - 1)


def stage_order(schedule: str, stages: int, micro_batches: int, stage: int) -> list[tuple[str, int]]:
    """The order in which stage ``stage`` runs its work: ``("F", i)`` the forward of micro-batch ``i``, ``("B", i)``
    its backward. ``"gpipe"``: every forward, then every backward; ``"1f1b"``: warm-up forwards, one forward one
    backward, then the remaining backwards.

    Taught in lesson 13 (``notebooks/13_parallel.ipynb``); practised in exercise 22 (``exercises/22_beyond_dp.ipynb``).
    """
    _check(stages, micro_batches, stage)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: use one of {SCHEDULES}.")
    warmup = micro_batches if schedule == "gpipe" else min(stages - stage - 1, micro_batches)
    order = [("F", i) for i in range(warmup)]
    backward = 0
    for forward in range(warmup, micro_batches):  # steady state: one forward, then the oldest backward
        order += [("F", forward), ("B", backward)]
        backward += 1
    return order + [("B", i) for i in range(backward, micro_batches)]


def peak_in_flight(order: list[tuple[str, int]]) -> int:
    """The most micro-batches whose forward has run and whose backward has not, over ``order``: how many
    micro-batches' activations the stage holds at its peak.

    Practised in exercise 22 (``exercises/22_beyond_dp.ipynb``).
    """
    held = peak = 0
    for kind, _ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak
