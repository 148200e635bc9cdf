"""Checks for exercise 20: predicting a training step's memory by category.

The learner writes ``predict_memory(widths, batch, dropout, dtype, optimizer)`` -> ``{"parameters", "gradients",
"optimizer_state", "activations"}`` in bytes, for an MLP of ``Linear`` layers with ``ReLU`` (and ``Dropout`` when
``dropout > 0``) between them, float inputs and ``cross_entropy``. The grading run's seed chooses twelve models
(hidden widths, depths and batches the learner cannot know; every combination of the two dtypes, dropout on and off
and the three optimizers) and each category is judged against the real measurement of that model's training step
(:func:`course_lib.perf.anatomy.measured_memory`, run here), within 1%.
"""

from __future__ import annotations

import functools
import itertools
import operator
import random
from typing import Any

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed
from course_lib.perf.anatomy import CATEGORIES, DTYPES, OPTIMIZERS, MLPSpec, measured_memory

TOLERANCE = 0.01  # the task allows skipping the few-byte scalars (AdamW's step, the loss's total_weight)


def _specs(seed: int) -> list[dict[str, Any]]:
    """One model per (dtype, dropout on/off, optimizer), shuffled. Sizes keep every saved tensor above 1% of its
    category, so leaving one out is caught."""
    rng = random.Random(seed * 4099 + 20)
    specs = []
    for dtype, dropped, optimizer in itertools.product(DTYPES, (False, True), OPTIMIZERS):
        hidden = [rng.randint(16, 48) for _ in range(rng.randint(1, 3))]
        specs.append({"widths": [rng.randint(24, 64), *hidden, rng.randint(10, 32)], "batch": rng.randint(24, 64),
                      "dropout": round(rng.uniform(0.1, 0.5), 2) if dropped else 0.0, "dtype": dtype,
                      "optimizer": optimizer})
    rng.shuffle(specs)
    return specs


def _answer(result: Any) -> Any:
    """The four categories as numbers when ``result`` is a dict holding them, else the text of what came back."""
    if not isinstance(result, dict) or not all(k in result for k in CATEGORIES):
        return one_line(result)
    out: dict[str, Any] = {}
    for key in CATEGORIES:
        try:
            out[key] = operator.index(result[key])  # ints, numpy and torch integers
        except TypeError:
            try:
                out[key] = float(result[key])
            except (TypeError, ValueError):
                return one_line(result)
    return out


def _predictions(ns: dict[str, Any], specs: list[dict[str, Any]]) -> list[list[Any]]:
    """``[spec, answer]`` per spec: the inputs are recorded with the answers."""
    fn = need(ns, "predict_memory", "define `predict_memory(widths, batch, dropout, dtype, optimizer)`")
    return [[dict(s), _answer(call(fn, tuple(s["widths"]), s["batch"], s["dropout"], s["dtype"], s["optimizer"]))]
            for s in specs]


@functools.lru_cache(maxsize=256)
def _measured(widths: tuple[int, ...], batch: int, dropout: float, dtype: str, optimizer: str) -> dict[str, int]:
    return measured_memory(MLPSpec(widths, batch=batch, dropout=dropout, dtype=dtype), optimizer)


def _show(s: dict[str, Any]) -> str:
    return (f"predict_memory({tuple(s['widths'])}, batch={s['batch']}, dropout={s['dropout']}, dtype={s['dtype']!r}, "
            f"optimizer={s['optimizer']!r})")


def _judge(ns: Any, category: str, hint: str) -> None:
    specs = _specs(run_seed(ns))
    seen = observe(ns, _predictions, specs)
    if not isinstance(seen, list) or [row[0] if isinstance(row, list) and row else None for row in seen] != specs:
        raise CheckFailed("the recorded answers are not for this run's models (one answer per call of "
                          "predict_memory)")
    for s, (_, got) in zip(specs, seen):
        if not isinstance(got, dict):
            raise CheckFailed(f"{_show(s)} should return a dict of four byte counts",
                              hint=f"keys {', '.join(CATEGORIES)}", got=got)
        want = _measured(tuple(s["widths"]), s["batch"], s["dropout"], s["dtype"], s["optimizer"])[category]
        if abs(got[category] - want) > TOLERANCE * want:
            raise CheckFailed(f"{category} is off by more than 1% for {_show(s)}", hint=hint,
                              expected=f"{want} bytes (measured)", got=f"{got[category]} bytes")


@check_for("20", "parameters: every weight and bias at the model's dtype", points=1, parts=("20.1",))
def parameters(ns: Any) -> None:
    _judge(ns, "parameters", "each Linear(a, b) holds a*b weights and b biases, each element_size bytes of the "
                             "model's dtype (4 for float32, 2 for bfloat16: the whole model is in that dtype)")


@check_for("20", "gradients: one per parameter, none for the input", points=1, parts=("20.1",))
def gradients(ns: Any) -> None:
    _judge(ns, "gradients", "backward fills .grad for every parameter, same shape and dtype; the input data does "
                            "not require grad, so it gets none")


@check_for("20", "optimizer state: what AdamW and SGD keep per parameter", points=1, parts=("20.1",))
def optimizer_state(ns: Any) -> None:
    _judge(ns, "optimizer_state", "AdamW keeps two tensors per parameter (exp_avg and exp_avg_sq, in the model's "
                                  "dtype) plus a float32 step scalar per parameter tensor; SGD with momentum keeps "
                                  "one momentum_buffer per parameter; plain SGD keeps nothing")


@check_for("20", "activations: what autograd saves for backward, each storage once", points=2, parts=("20.1",))
def activations(ns: Any) -> None:
    _judge(ns, "activations", "the first Linear saves its input x; each ReLU its output; with dropout also the "
                              "mask (activation dtype) and dropout's output; without dropout ReLU's output IS the "
                              "next Linear's input (count it once); the loss saves log_softmax's output "
                              "(batch x classes) and the int64 targets; all at the model's dtype")
