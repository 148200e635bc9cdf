"""Checks for exercise 10: what a model stores, and a forward latency worth reporting.

The learner defines ``count_trainable(model)``, ``stored_bytes(model)`` and
``measure_latency(model, example, device, *, warmup, reps, timer)``. Memory answers are compared with the
reference in :mod:`course_lib.perf.memory` on a model with buffers, frozen layers, mixed dtypes and a tied weight.

Latency is checked without ever reading a real clock (machines are shared and noisy): the check passes a
*fake* clock that only the model advances, and a model whose first calls are slow. A correct measurement
then reports an exactly known median; one that times the warm-up, averages, or forgets to synchronise
gives a different answer or an out-of-order event log.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

import torch
from torch import nn

import course_lib.device
from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed
from course_lib.perf.memory import count_parameters
from course_lib.perf.memory import stored_bytes as reference_stored_bytes

REPORT_KEYS = ("median_ms", "batch", "shape", "device", "precision", "warmup", "reps")


class _MemoryModel(nn.Module):
    """A body of layers plus an embedding tied to an output layer (one weight, two modules); never run."""

    def __init__(self, body: nn.Module, vocab: int, hidden: int) -> None:
        super().__init__()
        self.body = body
        self.embed = nn.Embedding(vocab, hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: state_dict() lists it twice, parameters() once


def _memory_model(seed: int) -> nn.Module:
    """Trainable and frozen layers, BatchNorm buffers (one of them int64), a half-precision buffer and a weight
    shared by two modules."""
    hidden = 8 + seed % 9  # sizes differ in every grading run
    body = nn.Sequential(nn.Linear(6, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, 3))
    body[0].requires_grad_(False)  # a frozen feature layer: stored, not trained
    model = _MemoryModel(body, 5 + seed % 6, hidden)
    model.register_buffer("lookup", torch.zeros(5 + seed % 7, dtype=torch.float16))
    model.scale = nn.Parameter(torch.ones(3 + seed % 5, dtype=torch.float64))
    return model


_TIED_HINT = ("a weight shared by two modules (here an embedding tied to the output layer) is one tensor: count it "
              "once (model.parameters() and model.buffers() list each tensor once; state_dict() and "
              "named_parameters(remove_duplicate=False) list it under both names)")


def _with_duplicates(model: nn.Module, trainable_only: bool) -> int:
    """The count with the tied weight counted under each of its names."""
    return sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False)
               if p.requires_grad or not trainable_only)


def _counted(ns: dict[str, Any], name: str, seed: int) -> Any:
    fn = need(ns, name, f"define `{name}(model) -> int`")
    torch.manual_seed(0)
    got = call(fn, _memory_model(seed))
    return int(got) if isinstance(got, int) else one_line(got)


@check_for("10", "trainable parameter count", points=1, parts=("10.1",))
def trainable(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    model = _memory_model(seed)
    expected, got = count_parameters(model, trainable_only=True), observe(ns, _counted, "count_trainable", seed)
    if got != expected:
        total = count_parameters(model, trainable_only=False)
        if got in (total, _with_duplicates(model, False)):
            hint = "frozen parameters (requires_grad=False) are not trained: leave them out"
        elif got == _with_duplicates(model, True):
            hint = _TIED_HINT
        else:
            hint = "count elements (p.numel()) of the parameters whose requires_grad is True, each tensor once"
        raise CheckFailed("count_trainable counted the wrong parameters", hint=hint, expected=expected, got=got)


@check_for("10", "stored bytes of parameters + buffers", points=1, parts=("10.2",))
def stored(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    model = _memory_model(seed)
    expected, got = reference_stored_bytes(model), observe(ns, _counted, "stored_bytes", seed)
    if got != expected:
        params_only = sum(p.numel() * p.element_size() for p in model.parameters())
        by_name = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        if got == by_name or got == expected + model.embed.weight.numel() * model.embed.weight.element_size():
            hint = _TIED_HINT
        elif got == params_only:
            hint = ("buffers (BatchNorm running statistics, registered lookup tables) are stored too: add "
                    "model.buffers()")
        elif got == 4 * sum(t.numel() for t in list(model.parameters()) + list(model.buffers())):
            hint = "not every tensor is 4 bytes per element: use t.element_size() (fp16 is 2, int64 and float64 are 8)"
        else:
            hint = "sum t.numel() * t.element_size() over parameters (frozen included) and buffers, each tensor once"
        raise CheckFailed("stored_bytes does not match the bytes this model holds", hint=hint, expected=expected,
                          got=got)


class _FakeClock:
    """A clock that moves only when the model runs, and logs every read."""

    def __init__(self, log: list[str]) -> None:
        self.now = 0.0
        self.log = log

    def __call__(self) -> float:
        self.log.append("timer")
        return self.now


class _SlowStart(nn.Module):
    """Slow for its first ``slow_calls`` calls (lazy set-up), then a known cost per call (in seconds)."""

    def __init__(self, clock: _FakeClock, slow_calls: int, costs_ms: list[float]) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.drop = nn.Dropout(0.5)
        self.clock, self.slow_calls, self.costs_ms = clock, slow_calls, costs_ms
        self.calls: list[tuple[bool, bool]] = []  # (autograd off: inference_mode or no_grad, training flag) per call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append((not torch.is_grad_enabled(), self.training))
        n = len(self.calls)
        cost = 500.0 if n <= self.slow_calls else self.costs_ms[(n - self.slow_calls - 1) % len(self.costs_ms)]
        self.clock.now += cost / 1000.0
        self.clock.log.append("model")
        return self.drop(self.lin(x))


def _run_latency(ns: dict[str, Any], warmup: int, costs_ms: list[float], batch: int = 3) -> dict[str, Any]:
    """The learner's report, the model's calls and the event log (timer reads, model calls, syncs)."""
    measure = need(
        ns, "measure_latency",
        "define `measure_latency(model, example, device, *, warmup, reps, timer)` returning a dict",
    )
    log: list[str] = []
    clock = _FakeClock(log)
    torch.manual_seed(0)
    model = _SlowStart(clock, slow_calls=warmup, costs_ms=costs_ms)
    model.train()  # the learner's function must switch to eval itself

    def logged_sync(device: Any = None) -> None:
        log.append("sync")

    # Replace synchronize wherever the learner's code may look it up, for the duration of the call only.
    saved_ns, saved_mod = ns.get("synchronize"), course_lib.device.synchronize
    ns["synchronize"] = logged_sync
    course_lib.device.synchronize = logged_sync  # type: ignore[assignment]
    try:
        report = call(measure, model, torch.randn(batch, 4), torch.device("cpu"), warmup=warmup, reps=len(costs_ms),
                      timer=clock)
    finally:
        course_lib.device.synchronize = saved_mod  # type: ignore[assignment]
        if saved_ns is None:
            ns.pop("synchronize", None)
        else:
            ns["synchronize"] = saved_ns
    if isinstance(report, dict):
        shown: Any = {str(k): _plain(v) for k, v in report.items()}
    else:
        shown = one_line(report)
    return {"report": shown, "calls": [list(c) for c in model.calls], "log": log}


def _plain(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (tuple, list, torch.Size)) and all(isinstance(v, int) for v in value):
        return list(value)
    return str(value)


def _report(seen: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(seen["report"], dict):
        raise CheckFailed("measure_latency should return a dict (the report)", expected=REPORT_KEYS, got=seen["report"])
    return seen["report"]


@check_for("10", "warm-up excluded, median of repetitions", points=2, parts=("10.3",))
def latency_median(ns: dict[str, Any]) -> None:
    # ms per timed call, different in every grading run: four distinct short ones and a 40 ms outlier (so the
    # median differs from the mean and from the median of every call, warm-up included)
    draw = random.Random(run_seed(ns))
    costs = [float(c) for c in draw.sample(range(1, 10), 4)] + [40.0]
    draw.shuffle(costs)
    warmup = 2 + run_seed(ns) % 3
    seen = observe(ns, _run_latency, warmup, costs)
    report = _report(seen)
    if len(seen["calls"]) != warmup + len(costs):
        raise CheckFailed(
            "the model should run warmup + reps times in total",
            hint="run `warmup` untimed calls, then time `reps` calls one by one",
            expected=warmup + len(costs),
            got=len(seen["calls"]),
        )
    got = report.get("median_ms")
    expected = statistics.median(costs)
    if not isinstance(got, (int, float)) or abs(got - expected) > 1e-6:
        if isinstance(got, (int, float)) and got > 100:
            hint = "the slow first calls were timed: run the warm-up calls before starting any clock"
        elif isinstance(got, (int, float)) and abs(got - statistics.fmean(costs)) < 1e-6:
            hint = "that is the mean; time each repetition separately and report statistics.median of them"
        else:
            hint = "time each repetition with `timer()` before and after, in milliseconds, and take the median"
        raise CheckFailed(
            "median_ms is not the median of the timed repetitions (this model is slow only on its first calls)",
            hint=hint,
            expected=expected,
            got=got,
        )


@check_for("10", "eval mode, inference_mode, synchronised", points=1, parts=("10.3",))
def latency_conditions(ns: dict[str, Any]) -> None:
    warmup, reps = 1 + run_seed(ns) % 4, 2 + run_seed(ns) // 4 % 3  # different in every grading run
    seen = observe(ns, _run_latency, warmup, [float(c) for c in range(1, reps + 1)])
    _report(seen)
    calls, log = seen["calls"], seen["log"]
    if log.count("model") != warmup + reps:
        raise CheckFailed("the model should run warmup + reps times in total", expected=warmup + reps,
                          got=log.count("model"))
    if not calls or not all(no_grad for no_grad, _ in calls):
        raise CheckFailed(
            "every forward call should run under torch.inference_mode() (no autograd bookkeeping)",
            hint="wrap the warm-up and the timed loop in `with torch.inference_mode():`",
        )
    if any(training for _, training in calls):
        raise CheckFailed(
            "the model was timed in training mode (dropout active, BatchNorm updating)",
            hint="call model.eval() before measuring",
        )
    pending, bad = False, 0
    for event in log:
        if event == "model":
            pending = True
        elif event == "sync":
            pending = False
        elif event == "timer" and pending:
            bad += 1
    if bad:
        raise CheckFailed(
            "the clock was read while device work could still be queued: on a GPU that times the launch, not the work",
            hint="call synchronize(device) after the warm-up and before each stop of the clock",
            expected="synchronize(device) between every model call and the next timer() read",
            got=f"{bad} timer read(s) without it",
        )


@check_for("10", "the report says what was measured", points=1, parts=("10.3",))
def latency_report(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    warmup, reps, batch = 1 + seed % 3, 2 + seed % 2, 2 + seed % 5  # different in every grading run
    report = _report(observe(ns, _run_latency, warmup, [1.0] * reps, batch))
    missing = [k for k in REPORT_KEYS if k not in report]
    if missing:
        raise CheckFailed(
            "a latency number is meaningless without its conditions: the report misses some fields",
            hint="return shape, batch, device, precision, warm-up and repetitions next to median_ms",
            expected=list(REPORT_KEYS),
            got=sorted(report),
        )
    wrong = {
        k: report[k]
        for k, want in (("batch", batch), ("warmup", warmup), ("reps", reps), ("shape", (batch, 4)))
        if (tuple(report[k]) if k == "shape" and isinstance(report[k], list) else report[k]) != want
    }
    if "cpu" not in str(report["device"]):
        wrong["device"] = report["device"]
    if wrong:
        raise CheckFailed(
            f"some report fields do not describe this measurement (input [{batch}, 4] on the CPU, warmup={warmup}, "
            f"reps={reps})",
            expected={"batch": batch, "shape": (batch, 4), "device": "cpu", "warmup": warmup, "reps": reps},
            got=wrong,
        )
