"""Checks for exercise 19: a training step's FLOPs, the roofline, and MFU.

The learner writes ``step_flops(widths, batch, tokens, vocab)`` (by formula, from the shapes alone),
``roofline(flops, bytes_moved, peak_flops, bandwidth)`` and ``mfu(step_flops, step_seconds, peak_flops)``. Every input
comes from the grading run's seed: MLPs of 2 to 4 ``Linear`` layers with and without an embedding, one or several
tokens per row, and a GPT-sized MLP block too big to run here; roofline cases on both sides of the ridge and exactly on
it. The small MLPs are judged against ``FlopCounterMode`` (:func:`course_lib.perf.anatomy.counted_step_flops`), the
big one against the formula (:func:`course_lib.perf.anatomy.step_flops`, proven equal to ``FlopCounterMode`` by
tests/test_perf_anatomy.py), the roofline against :func:`course_lib.perf.ceiling.roofline_point`.
"""

from __future__ import annotations

import math
import operator
import random
from typing import Any

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed
from course_lib.perf.anatomy import MLPSpec, counted_step_flops, step_flops
from course_lib.perf.ceiling import roofline_point


def _number(value: Any) -> Any:
    """An int (numpy and torch integers too), else a float, else the text of what came back."""
    try:
        return operator.index(value)
    except TypeError:
        pass
    try:
        return float(value)
    except (TypeError, ValueError):
        return one_line(value)


# ---------------------------------------------------------------- 19.1: a training step's FLOPs
def _widths(rng: random.Random, layers: int) -> list[int]:
    return [rng.randint(3, 40) for _ in range(layers + 1)]


def _float_specs(seed: int) -> list[dict[str, Any]]:
    """Float inputs, one row per example: 2, 3 and 4 Linear layers."""
    rng = random.Random(seed * 1009 + 191)
    specs = [{"widths": _widths(rng, layers), "batch": rng.randint(2, 9), "tokens": 1, "vocab": None}
             for layers in (2, 3, 4)]
    rng.shuffle(specs)
    return specs


def _token_specs(seed: int) -> list[dict[str, Any]]:
    """Several tokens per row, with and without an embedding; one embedding with a single token."""
    rng = random.Random(seed * 1009 + 192)
    specs = [
        {"widths": _widths(rng, 2), "batch": rng.randint(2, 6), "tokens": rng.randint(2, 7),
         "vocab": rng.randint(20, 90)},
        {"widths": _widths(rng, 3), "batch": rng.randint(2, 6), "tokens": rng.randint(2, 7), "vocab": None},
        {"widths": _widths(rng, 4), "batch": rng.randint(2, 6), "tokens": 1, "vocab": rng.randint(20, 90)},
        {"widths": _widths(rng, 2), "batch": rng.randint(2, 6), "tokens": rng.randint(2, 7),
         "vocab": rng.randint(20, 90)},
    ]
    rng.shuffle(specs)
    return specs


def _big_specs(seed: int) -> list[dict[str, Any]]:
    """A GPT-sized MLP block (width d, hidden 4d) on about 8k tokens: too big to run while grading."""
    rng = random.Random(seed * 1009 + 193)
    d = rng.choice([2048, 3072, 4096])
    return [{"widths": [d, 4 * d, d], "batch": 8 + seed % 9, "tokens": rng.choice([512, 768, 1024]),
             "vocab": rng.choice([None, 50304])}]


def _flops(ns: dict[str, Any], specs: list[dict[str, Any]]) -> list[list[Any]]:
    """``[spec, answer]`` per spec: the inputs are recorded with the answers."""
    fn = need(ns, "step_flops", "define `step_flops(widths, batch, tokens, vocab)`")
    return [[dict(s), _number(call(fn, tuple(s["widths"]), s["batch"], s["tokens"], s["vocab"]))] for s in specs]


def _spec(s: dict[str, Any]) -> MLPSpec:
    return MLPSpec(tuple(s["widths"]), batch=s["batch"], tokens=s["tokens"], vocab=s["vocab"])


def _show(s: dict[str, Any]) -> str:
    return f"step_flops({tuple(s['widths'])}, batch={s['batch']}, tokens={s['tokens']}, vocab={s['vocab']})"


_FLOPS_HINT = ("per Linear(a, b) on N = batch * tokens rows: 2*N*a*b forward (a multiply-add is 2 FLOPs), the same "
               "again for the weight's gradient and again for the input's gradient -- except the first layer fed "
               "raw floats, whose input needs no gradient; an embedding is a lookup (0 FLOPs), and ReLU, dropout "
               "and the loss count 0")


_BIAS_HINT = ("your count is the right one plus the biases' work: FlopCounterMode counts only the matrix multiplies, "
              "so the bias add (N*b per Linear(a, b)), its gradient (a sum over the N rows) and a weight widened to "
              "(a + 1) x b all count 0 -- count 2*N*a*b per matmul and leave the bias out")


def _bias_multiples(s: dict[str, Any]) -> set[int]:
    """What counting the biases adds to the right answer: c bias-sized terms (N*b per layer) per layer, c in 1..6,
    the first layer's input gradient included or not (a weight widened to (a + 1) x b adds 2, 4 or 6 of them)."""
    rows, widths = s["batch"] * s["tokens"], s["widths"]
    per_layer = [rows * b for b in widths[1:]]
    first_input_grad = 0 if s["vocab"] is not None else per_layer[0]
    return {c * sum(per_layer) - k * first_input_grad for c in range(1, 7) for k in (0, 2) if c > k}


def _judge_flops(ns: Any, specs: list[dict[str, Any]], reference: Any) -> None:
    seen = observe(ns, _flops, specs)
    if not isinstance(seen, list) or [row[0] if isinstance(row, list) and row else None for row in seen] != specs:
        raise CheckFailed("the recorded answers are not for this run's models (one answer per call of step_flops)")
    for s, (_, got) in zip(specs, seen):
        want = reference(_spec(s))
        if isinstance(got, str) or got != want:
            counted_bias = not isinstance(got, str) and got - want in _bias_multiples(s)
            raise CheckFailed(f"{_show(s)} is wrong" + (": it counts the biases" if counted_bias else ""),
                              hint=_BIAS_HINT if counted_bias else _FLOPS_HINT, expected=want, got=got)


@check_for("19", "step FLOPs: an MLP on float inputs (forward and backward, no gradient for the data)", points=2,
           parts=("19.1",))
def flops_float_inputs(ns: Any) -> None:
    _judge_flops(ns, _float_specs(run_seed(ns)), counted_step_flops)


@check_for("19", "step FLOPs: an embedding and several tokens per row", points=1, parts=("19.1",))
def flops_embedding_tokens(ns: Any) -> None:
    _judge_flops(ns, _token_specs(run_seed(ns)), counted_step_flops)


@check_for("19", "step FLOPs: a GPT-sized MLP block, from the shapes alone", points=1, parts=("19.1",))
def flops_gpt_sized(ns: Any) -> None:
    _judge_flops(ns, _big_specs(run_seed(ns)), step_flops)  # the formula: equal to FlopCounterMode (tested)


# ---------------------------------------------------------------- 19.2: the roofline
def _roofline_cases(seed: int) -> list[list[float]]:
    """``[flops, bytes_moved, peak_flops, bandwidth]``: below the ridge, above it, and exactly on it."""
    rng = random.Random(seed * 7907 + 192)
    cases = []
    for _ in range(3):
        bandwidth = float(rng.randint(20, 900)) * 1e9
        ridge = rng.randint(8, 400) / 4  # a multiple of 1/4: exact in binary, so "on the ridge" is exact
        peak = ridge * bandwidth
        for factor in (rng.uniform(0.02, 0.6), rng.uniform(1.7, 30.0), 1.0):
            moved = 4 * rng.randint(250_000, 250_000_000)
            flops = ridge * moved if factor == 1.0 else round(ridge * factor * moved)
            cases.append([float(flops), float(moved), peak, bandwidth])
    rng.shuffle(cases)
    return cases


def _rooflines(ns: dict[str, Any], cases: list[list[float]]) -> list[list[Any]]:
    """``[inputs, answer]`` per case; the answer as ``[intensity, attainable, bound]`` when it has that form."""
    fn = need(ns, "roofline", "define `roofline(flops, bytes_moved, peak_flops, bandwidth)`")
    out = []
    for case in cases:
        result = call(fn, *case)
        answer: Any = one_line(result)
        if isinstance(result, (tuple, list)) and len(result) == 3:
            answer = [_number(result[0]), _number(result[1]), str(result[2])]
        out.append([list(case), answer])
    return out


def _judged_rooflines(ns: Any) -> list[tuple[list[float], list[Any], Any]]:
    cases = _roofline_cases(run_seed(ns))
    seen = observe(ns, _rooflines, cases)
    if not isinstance(seen, list) or [row[0] if isinstance(row, list) and row else None for row in seen] != cases:
        raise CheckFailed("the recorded answers are not for this run's operations (one answer per call of roofline)")
    out = []
    for case, (_, got) in zip(cases, seen):
        if not isinstance(got, list) or any(isinstance(v, str) for v in got[:2]):
            raise CheckFailed("roofline should return (intensity, attainable, bound): two numbers and a string",
                              expected="(12.5, 1.25e12, 'compute')", got=got)
        out.append((case, got, roofline_point(*case)))
    return out


def _show_case(case: list[float]) -> str:
    flops, moved, peak, bandwidth = case
    return f"roofline({flops:.6g}, {moved:.6g}, {peak:.6g}, {bandwidth:.6g})"


@check_for("19", "roofline: arithmetic intensity is FLOPs per byte moved", points=1, parts=("19.2",))
def roofline_intensity(ns: Any) -> None:
    for case, got, want in _judged_rooflines(ns):
        if not math.isclose(got[0], want.intensity, rel_tol=1e-9):
            raise CheckFailed(f"the intensity of {_show_case(case)} is wrong",
                              hint="intensity = flops / bytes_moved: how many FLOPs each byte brought in pays for",
                              expected=want.intensity, got=got[0])


@check_for("19", "roofline: the attainable FLOP/s is the lower of the two roofs", points=1, parts=("19.2",))
def roofline_attainable(ns: Any) -> None:
    for case, got, want in _judged_rooflines(ns):
        if not math.isclose(got[1], want.attainable, rel_tol=1e-9):
            raise CheckFailed(
                f"the attainable FLOP/s of {_show_case(case)} is wrong",
                hint="min(peak_flops, intensity * bandwidth): memory feeds at most intensity * bandwidth FLOP/s, "
                     "the cores do at most peak_flops; the slower of the two limits the operation",
                expected=want.attainable, got=got[1])


@check_for("19", "roofline: compute-bound at or above the ridge, the ridge itself included", points=1,
           parts=("19.2",))
def roofline_bound(ns: Any) -> None:
    for case, got, want in _judged_rooflines(ns):
        if got[2] != want.bound:
            ridge = case[2] / case[3]
            raise CheckFailed(
                f"{_show_case(case)} is bound by the wrong thing (intensity {want.intensity:.6g}, ridge {ridge:.6g})",
                hint="the ridge intensity is peak_flops / bandwidth: 'compute' when the intensity is at or above it "
                     "(exactly on the ridge both roofs are equal and more bandwidth would not help), else 'memory'",
                expected=want.bound, got=got[2])


# ---------------------------------------------------------------- 19.3: MFU
def _mfu_cases(seed: int) -> list[list[float]]:
    """``[step_flops, step_seconds, peak_flops]`` with a utilisation between 2% and 90%."""
    rng = random.Random(seed * 6271 + 193)
    cases = []
    for _ in range(5):
        flops = float(rng.randint(10**9, 10**15))
        seconds = round(rng.uniform(0.005, 4.0), 6)
        cases.append([flops, seconds, flops / seconds / rng.uniform(0.02, 0.9)])
    return cases


def _mfus(ns: dict[str, Any], cases: list[list[float]]) -> list[list[Any]]:
    fn = need(ns, "mfu", "define `mfu(step_flops, step_seconds, peak_flops)`")
    return [[list(case), _number(call(fn, *case))] for case in cases]


@check_for("19", "mfu: the step's FLOPs per second as a fraction of the peak", points=1, parts=("19.3",))
def mfu_fraction(ns: Any) -> None:
    cases = _mfu_cases(run_seed(ns))
    seen = observe(ns, _mfus, cases)
    if not isinstance(seen, list) or [row[0] if isinstance(row, list) and row else None for row in seen] != cases:
        raise CheckFailed("the recorded answers are not for this run's steps (one answer per call of mfu)")
    for (flops, seconds, peak), (_, got) in zip(cases, seen):
        want = flops / seconds / peak
        if isinstance(got, str) or not math.isclose(got, want, rel_tol=1e-9):
            raise CheckFailed(
                f"mfu({flops:.6g}, {seconds}, {peak:.6g}) is wrong",
                hint="the FLOP/s the step achieved is step_flops / step_seconds; divide it by the peak FLOP/s",
                expected=want, got=got)
