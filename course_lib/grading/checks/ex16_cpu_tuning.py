"""Checks for exercise 16: channels_last conversion and the intra-op thread count.

The learner writes ``to_channels_last(model, x)``, ``intra_op_threads(cores, workers=0, busy=0)`` and
``threads_per_rank(cores, ranks, workers_per_rank=0, busy=0)`` (a part the lesson did not show: a torchrun job's
processes sharing one machine). The model's width, the batch and the machines planned for come from the grading run's
seed; the grader rebuilds the same seeded model and batch, and judges layouts, shapes, outputs and thread counts
against :mod:`course_lib.perf.memory_format` and :mod:`course_lib.perf.threads` (part 3: the rule written out below).
"""

from __future__ import annotations

from typing import Any

import torch

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed
from course_lib.models import SmallCNN
from course_lib.perf.memory_format import layout_of
from course_lib.perf.threads import intra_op_threads


# ---------------------------------------------------------------- 16.1: channels_last
def _case(ns: Any) -> dict[str, int]:
    seed = run_seed(ns)
    return {"width": 4 + 4 * (seed % 3), "batch": 2 + seed % 3, "size": 12 + 4 * (seed % 3), "seed": seed % 1009}


def _model_and_batch(case: dict[str, int]) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(case["seed"])
    model = SmallCNN(num_classes=5, width=case["width"]).eval()
    x = torch.randn(case["batch"], 3, case["size"], case["size"], generator=torch.Generator().manual_seed(case["seed"]))
    return model, x


def _converted(ns: dict[str, Any], case: dict[str, int]) -> dict[str, Any]:
    convert = need(ns, "to_channels_last", "define `to_channels_last(model, x)` returning `(model, x)`")
    model, x = _model_and_batch(case)
    result = call(convert, model, x)
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)
            and isinstance(result[1], torch.Tensor)):
        return {"returned": one_line(result)}
    new_model, new_x = result
    seen: dict[str, Any] = {
        "returned": "ok", "case": dict(case),
        "x_shape": list(new_x.shape), "x_layout": layout_of(new_x), "x": new_x,
        "weights": {name: layout_of(p) for name, p in new_model.named_parameters() if p.dim() == 4},
    }
    try:
        with torch.no_grad():
            seen["out"] = new_model.eval()(new_x)
    except Exception as exc:  # a permuted batch makes the convolution refuse it: report, do not crash the check
        seen["out"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return seen


def _returned(seen: Any, case: dict[str, int]) -> dict[str, Any]:
    if not isinstance(seen, dict) or seen.get("returned") != "ok":
        raise CheckFailed("to_channels_last should return a tuple (model, x)",
                          expected="(model, x)", got=seen.get("returned") if isinstance(seen, dict) else seen)
    if seen.get("case") != case:
        raise CheckFailed("the recorded conversion is not of this run's model and batch", expected=case,
                          got=seen.get("case"))
    return seen


@check_for("16", "channels_last: the batch converted, same shape and values", points=1, parts=("16.1",))
def batch_converted(ns: Any) -> None:
    case = _case(ns)
    seen = _returned(observe(ns, _converted, case), case)
    _, x = _model_and_batch(case)
    if seen["x_shape"] != list(x.shape):
        raise CheckFailed("the batch changed shape: channels_last changes the strides, not the shape",
                          hint="x.contiguous(memory_format=torch.channels_last), not x.permute(0, 2, 3, 1)",
                          expected=list(x.shape), got=seen["x_shape"])
    if seen["x_layout"] != "channels_last":
        raise CheckFailed("the returned batch is not in channels_last",
                          hint="convert the inputs too: x.contiguous(memory_format=torch.channels_last)",
                          expected="channels_last", got=seen["x_layout"])
    if not torch.equal(seen["x"], x):
        raise CheckFailed("the returned batch holds other values than the input", hint="only the layout changes")


@check_for("16", "channels_last: the model's convolution weights converted", points=1, parts=("16.1",))
def weights_converted(ns: Any) -> None:
    case = _case(ns)
    seen = _returned(observe(ns, _converted, case), case)
    left = sorted(name for name, layout in seen["weights"].items() if layout != "channels_last")
    if not seen["weights"] or left:
        raise CheckFailed(f"{len(left)} convolution weights are not in channels_last",
                          hint="model.to(memory_format=torch.channels_last) converts every 4-D parameter",
                          expected="every 4-D parameter channels_last", got=left or "no 4-D parameters")


@check_for("16", "channels_last: the outputs unchanged", points=1, parts=("16.1",))
def outputs_unchanged(ns: Any) -> None:
    case = _case(ns)
    seen = _returned(observe(ns, _converted, case), case)
    model, x = _model_and_batch(case)
    with torch.no_grad():
        want = model(x)
    got = seen["out"]
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or not torch.allclose(got, want, atol=1e-4):
        raise CheckFailed("the converted model on the converted batch does not give the original outputs",
                          hint="keep the shape [N, C, H, W]; convert the layout only",
                          expected=want[0].tolist(), got=got[0].tolist() if isinstance(got, torch.Tensor) else got)


# ---------------------------------------------------------------- 16.2: threads
def _machines(seed: int) -> list[tuple[int, int, int]]:
    """Machines to plan for: roomy ones, full ones and oversubscribed ones."""
    cores = [2, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    out = []
    for i in range(8):
        c = cores[(seed + 3 * i) % len(cores)]
        w = (seed // 7 + i) % (c // 2 + 1)
        b = (seed // 5 + 2 * i) % 3
        out.append((c, w, b))
    full = cores[(seed // 3) % len(cores)]
    out += [(2, 2, 0), (4, 3, 2), (1, 0, 0), (cores[seed % len(cores)], 0, 0),
            (full, full - 1 - seed % 2, 1 + seed % 2)]  # a seeded machine with no core left
    return out


def _learner_threads(ns: dict[str, Any], machines: list[tuple[int, int, int]]) -> list[Any]:
    """``[cores, workers, busy, answer]`` per machine: the inputs are recorded with the answers."""
    plan = need(ns, "intra_op_threads", "define `intra_op_threads(cores, workers=0, busy=0)`")
    return [[c, w, b, call(plan, c, w, b)] for c, w, b in machines]


def _answers(recorded: Any, machines: list[tuple[int, int, int]]) -> list[Any]:
    """The answers, once the recorded inputs are checked to be this run's machines."""
    asked = [tuple(row[:3]) for row in recorded] if isinstance(recorded, list) else None
    if asked != machines:
        raise CheckFailed("the recorded answers are not for this run's machines", expected=machines, got=asked)
    return [row[3] for row in recorded]


@check_for("16", "threads: the cores the workers and busy processes leave", points=1, parts=("16.2",))
def threads_left(ns: Any) -> None:
    machines = [m for m in _machines(run_seed(ns)) if m[0] - m[1] - m[2] >= 1]
    got = _answers(observe(ns, _learner_threads, machines), machines)
    for (c, w, b), value in zip(machines, got):
        want = intra_op_threads(c, w, b)
        if value != want:
            raise CheckFailed(f"intra_op_threads({c}, workers={w}, busy={b}) is wrong",
                              hint="each worker and each busy process takes one core; use the arguments, not "
                                   "this machine's os.cpu_count()",
                              expected=want, got=value)


@check_for("16", "threads: never fewer than one", points=1, parts=("16.2",))
def at_least_one(ns: Any) -> None:
    machines = [m for m in _machines(run_seed(ns)) if m[0] - m[1] - m[2] < 1]
    got = _answers(observe(ns, _learner_threads, machines), machines)
    for (c, w, b), value in zip(machines, got):
        if value != 1:
            raise CheckFailed(f"intra_op_threads({c}, workers={w}, busy={b}): with no core left the process still "
                              "needs one thread", hint="max(1, ...)", expected=1, got=value)


# ---------------------------------------------------------------- 16.3: threads per rank of a torchrun job
def _jobs(seed: int) -> list[tuple[int, int, int, int]]:
    """``(cores, ranks, workers_per_rank, busy)``: jobs whose share divides evenly, jobs where it does not (rounding
    decides), and jobs with no core left per rank."""
    out = []
    for i in range(10):
        ranks = (2, 3, 4, 6, 8)[(seed + i) % 5]
        workers = (seed // 5 + i) % 4
        busy = (seed // 3 + 2 * i) % 3
        spare = (seed // 7 + 3 * i) % (ranks * 3)  # cores left before sharing: a multiple of ranks or not
        out.append((ranks * (workers + 1) + busy + spare, ranks, workers, busy))
    ranks = (2, 4, 8)[seed % 3]
    out += [(ranks * 2 + 1, ranks, 2, 0), (ranks * 3, ranks, 2, 1 + seed % 3)]  # fewer cores left than ranks
    return out


def _share(cores: int, ranks: int, workers: int, busy: int) -> int:
    return max(1, (cores - ranks * workers - busy) // ranks)


def _learner_shares(ns: dict[str, Any], jobs: list[tuple[int, int, int, int]]) -> list[Any]:
    """``[cores, ranks, workers_per_rank, busy, answer]`` per job: the inputs are recorded with the answers."""
    plan = need(ns, "threads_per_rank", "define `threads_per_rank(cores, ranks, workers_per_rank=0, busy=0)`")
    return [[c, r, w, b, call(plan, c, r, w, b)] for c, r, w, b in jobs]


def _shares(ns: Any, keep: Any) -> list[tuple[tuple[int, int, int, int], Any]]:
    jobs = [j for j in _jobs(run_seed(ns)) if keep(*j)]
    recorded = observe(ns, _learner_shares, jobs)
    asked = [tuple(row[:4]) for row in recorded] if isinstance(recorded, list) else None
    if asked != jobs:
        raise CheckFailed("the recorded answers are not for this run's jobs", expected=jobs, got=asked)
    return [(job, row[4]) for job, row in zip(jobs, recorded)]


def _share_hint(job: tuple[int, int, int, int], got: Any) -> str:
    cores, ranks, workers, busy = job
    left = cores - ranks * workers - busy
    if got == max(1, cores - workers - busy) or got == max(1, left):
        return "the cores left are shared by all the ranks: divide by `ranks`"
    if got == max(1, (cores - workers - busy) // ranks):
        return "every rank has its own workers: `ranks * workers_per_rank` cores go to workers"
    if isinstance(got, (int, float)) and not isinstance(got, bool) and got == max(1, -(-left // ranks)):
        return "round down: rounding up gives the ranks together more threads than there are free cores"
    if isinstance(got, float):
        return "a thread count is a whole number: use // (rounding down)"
    return "cores - ranks * workers_per_rank - busy cores are left; each rank gets that // ranks, and at least 1"


@check_for("16", "threads per rank: an equal share of the cores left, rounded down", points=1, parts=("16.3",))
def threads_per_rank_share(ns: Any) -> None:
    for job, got in _shares(ns, lambda c, r, w, b: c - r * w - b >= r):
        want = _share(*job)
        if got != want or type(got) is not int:
            cores, ranks, workers, busy = job
            raise CheckFailed(f"threads_per_rank({cores}, ranks={ranks}, workers_per_rank={workers}, busy={busy}) "
                              "is wrong", hint=_share_hint(job, got), expected=want, got=got)


@check_for("16", "threads per rank: at least one when fewer cores than ranks are left", points=1, parts=("16.3",))
def threads_per_rank_at_least_one(ns: Any) -> None:
    for (cores, ranks, workers, busy), got in _shares(ns, lambda c, r, w, b: c - r * w - b < r):
        if got != 1:
            raise CheckFailed(f"threads_per_rank({cores}, ranks={ranks}, workers_per_rank={workers}, busy={busy}): "
                              "with less than a core per rank left, every rank still needs one thread",
                              hint="max(1, ...)", expected=1, got=got)
