"""Checks for exercise 22: beyond plain data parallelism -- ZeRO-1 with a reduce-scatter, its bytes, ZeRO's memory
per rank, when data parallelism becomes communication-bound, pipeline parallelism (the bubble, 1F1B's memory, a
two-stage pipeline on two ranks), tensor parallelism of attention (heads split over the ranks) and sequence
parallelism (an all-gather and a reduce-scatter in place of the all-reduce).

``ReduceScatterAdamW`` runs on two real processes (:mod:`course_lib.grading.beyond_dp_driver`: parameters and each
rank's own gradients from the run's seed, every collective recorded); the judges recompute one AdamW stepped with the
averaged gradients here. The other functions are pure: each is called on inputs drawn from the run's seed and
compared with the course's own models (:func:`course_lib.parallel.comm.ring_bytes_sent`,
:func:`course_lib.parallel.zero.zero_bytes_per_rank`, :func:`course_lib.parallel.comm.predicted_allreduce_seconds`,
:func:`course_lib.parallel.comm.comm_bound_world`, :func:`course_lib.parallel.comm.bandwidth_for_compute`,
:mod:`course_lib.parallel.pipeline`).
The crossover cases sit well inside a step of the world size, never on its boundary.
"""

from __future__ import annotations

import math
import operator
import random
from typing import Any

import torch

from course_lib.grading import beyond_dp_driver as driver
from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed
from course_lib.grading.checks.common import gap, hidden_share, rank_records, split_layer_matches
from course_lib.parallel.comm import (
    bandwidth_for_compute,
    comm_bound_world,
    predicted_allreduce_seconds,
    ring_allreduce_bytes,
    ring_bytes_sent,
)
from course_lib.parallel.pipeline import bubble_fraction, peak_in_flight, stage_order
from course_lib.parallel.zero import shard_bounds, zero_bytes_per_rank

ZERO_TOLERANCE = 1e-6  # AdamW is element-wise: a shard steps exactly as the whole does, up to rounding
RELATIVE = 1e-9  # the models are closed formulas: only float rounding may differ
GATHERS = ("all_gather_into_tensor", "all_gather")
SCATTERS = ("reduce_scatter_tensor", "reduce_scatter")


# ------------------------------------------------------------------------------ 22.1-22.2: ZeRO-1, reduce-scatter


HOW = {"zero": ("ReduceScatterAdamW", "define `class ReduceScatterAdamW` with `__init__(self, params, lr, "
                                      "weight_decay)` and `step(self)` in the exercise cell"),
       "pp": ("pipeline_step", "define `pipeline_step(stage, rank, x, y, micro_batches, hidden)` in the exercise cell"),
       "tp": ("tp_attention", "define `tp_attention(x, attn, rank, world)` in the exercise cell"),
       "sp": ("sp_mlp", "define `sp_mlp(x_shard, block, rank, world)` in the exercise cell")}


def _section(ns: dict[str, Any], cfg: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Every rank's record of one section (the run itself is shared by all checks); raise what the ranks raised."""
    need(ns, *HOW[name])
    return rank_records(driver.run_exercise, ns, cfg, name)


def _ranks(ns: dict[str, Any], name: str = "zero") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    cfg = driver.exercise_config(run_seed(ns))
    return cfg, observe(ns, _section, cfg, name)


def _averaged_adamw(cfg: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: one AdamW over every parameter, stepped with the gradients averaged over the ranks; its
    parameters and its first moments, each flattened."""
    params = driver.zero_params(cfg)
    optimizer = torch.optim.AdamW(params, lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    for step in range(cfg["steps"]):
        per_rank = [driver.local_grads(cfg, step, rank) for rank in range(driver.WORLD)]
        for i, p in enumerate(params):
            p.grad = sum(grads[i] for grads in per_rank) / driver.WORLD
        optimizer.step()
    return driver.flat(params), driver.first_moments(optimizer)


@check_for("22", "ReduceScatterAdamW matches AdamW on the averaged gradients", points=2, parts=("22.1", "22.2"))
def zero_matches_averaged(ns: dict[str, Any]) -> None:
    cfg, ranks = _ranks(ns)
    want, want_moments = _averaged_adamw(cfg)
    bounds = shard_bounds(want.numel(), driver.WORLD)
    for rank, record in enumerate(ranks):
        got = record["params"]
        if got.shape != want.shape or not torch.allclose(got, want, rtol=0, atol=ZERO_TOLERANCE):
            raise CheckFailed(
                f"rank {rank}'s parameters after {cfg['steps']} steps differ from one AdamW over all {want.numel()} of "
                "them stepped with the gradients averaged over the ranks",
                hint="each rank's .grad is its own (not averaged): reduce-scatter (SUM) the padded flat gradient, "
                     "divide your shard by the world size, step, then all-gather the updated shards into every "
                     "parameter",
                expected=f"within {ZERO_TOLERANCE:g} of AdamW on the averaged gradients", got=gap(got, want))
        # AdamW's update m / sqrt(v) cancels a gradient's scale, so the parameters alone cannot tell the average
        # from the ranks' sum; the first moments can.
        start, end = bounds[rank]
        got_moments, shard_moments = record["exp_avg"][: end - start], want_moments[start:end]
        if got_moments.shape != shard_moments.shape or not torch.allclose(got_moments, shard_moments, rtol=1e-4,
                                                                         atol=1e-6):
            scale = (got_moments.norm() / shard_moments.norm()).item() if got_moments.shape == shard_moments.shape \
                else float("nan")
            raise CheckFailed(
                f"rank {rank}'s AdamW moments (exp_avg) are not those of the averaged gradients"
                + (f": they are {scale:.2f}x them" if math.isfinite(scale) else ""),
                hint="the reduce-scatter SUMs the ranks' gradients: divide your shard by the world size before the "
                     "step (AdamW's step hides a gradient's scale; its moments do not, nor would SGD or clipping)",
                expected=f"exp_avg of elements [{start}, {end}) as AdamW's on the averaged gradients",
                got=gap(got_moments, shard_moments) if got_moments.shape == shard_moments.shape
                else f"{got_moments.numel()} moments for {end - start} elements")


@check_for("22", "optimizer state: each rank keeps its shard's moments only", points=1, parts=("22.1", "22.2"))
def zero_state(ns: dict[str, Any]) -> None:
    cfg, ranks = _ranks(ns)
    numel = driver.flat(driver.zero_params(cfg)).numel()
    for rank, ((start, end), record) in enumerate(zip(shard_bounds(numel, driver.WORLD), ranks)):
        want = 2 * 4 * (end - start)  # AdamW's exp_avg and exp_avg_sq, float32, per element of the shard
        if record["state_bytes"] != want:
            raise CheckFailed(
                f"rank {rank}'s `optimizer` keeps moments for {record['state_bytes'] // 8} elements; its shard "
                f"[{start}, {end}) of the {numel} has {end - start}",
                hint="self.optimizer = torch.optim.AdamW([shard], ...) over this rank's slice only (not the padding)",
                expected=f"{want} bytes", got=f"{record['state_bytes']} bytes")


@check_for("22", "traffic: one reduce-scatter and one all-gather per step, data parallelism's bytes", points=1,
           parts=("22.1", "22.2"))
def zero_traffic(ns: dict[str, Any]) -> None:
    cfg, ranks = _ranks(ns)
    numel = driver.flat(driver.zero_params(cfg)).numel()
    padded = 4 * math.ceil(numel / driver.WORLD) * driver.WORLD  # float32, every shard padded to the first's size
    want = ring_allreduce_bytes(padded, driver.WORLD)  # what plain data parallelism's all-reduce sends
    for rank, record in enumerate(ranks):
        for step, events in enumerate(record["steps"]):
            ops = [op for op, _ in events]
            sent = sum(ring_bytes_sent(op, n, driver.WORLD) if op in SCATTERS + GATHERS + ("all_reduce",) else n
                       for op, n in events)
            shape_ok = len(ops) == 2 and ops[0] in SCATTERS and ops[1] in GATHERS
            if shape_ok and math.isclose(sent, want, rel_tol=RELATIVE):
                continue
            ratio = f" ({sent / want:.2f}x data parallelism's)" if want else ""
            raise CheckFailed(
                f"rank {rank}, step {step}: the step sent {one_line(events)} ([op, bytes passed in]): "
                f"{sent:g} ring bytes{ratio}",
                hint="one reduce-scatter of the padded flat gradient (each rank receives the sum of its shard only), "
                     "then one all-gather of the updated shards; an all-reduce of the gradients followed by an "
                     "all-gather sends 1.5x what data parallelism sends",
                expected=f"[reduce-scatter of {padded} bytes, all-gather of {padded // driver.WORLD}]: {want:g} ring "
                         "bytes, as one all-reduce", got=ops)


# ------------------------------------------------------------------------------ 22.3: bytes on the ring


def _ring_cases(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed * 7919 + 22)
    ops = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor")
    cases = []
    for world in rng.sample(range(2, 65), 6):
        records = [[rng.choice(ops), 4 * rng.randint(1, 10**6)] for _ in range(rng.randint(2, 5))]
        records.append([ops[len(cases) % 3], 4 * rng.randint(1, 10**6)])  # every op, in every run
        cases.append({"records": records, "world": world})
    return cases


def _ring_answers(ns: dict[str, Any], cases: list[dict[str, Any]]) -> list[list[Any]]:
    fn = need(ns, "ring_bytes", "define `ring_bytes(records, world)` in the exercise cell")
    return [[c, _number(call(fn, [tuple(r) for r in c["records"]], c["world"]))] for c in cases]


def _number(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return one_line(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return one_line(value)


def _answers(ns: Any, fn: Any, cases: list[dict[str, Any]]) -> list[list[Any]]:
    """Observe ``fn``'s answers and make sure they are for this run's cases."""
    seen = observe(ns, fn, cases)
    if not isinstance(seen, list) or [row[0] if isinstance(row, list) and row else None for row in seen] != cases:
        raise CheckFailed("the recorded answers are not for this run's inputs (one answer per call)")
    return seen


def _close(got: Any, want: float) -> bool:
    if isinstance(want, float) and math.isinf(want):
        return isinstance(got, float) and math.isinf(got) and got > 0
    return isinstance(got, float) and math.isclose(got, want, rel_tol=RELATIVE)


@check_for("22", "ring bytes: what each rank sends per collective", points=1, parts=("22.3",))
def ring_bytes(ns: Any) -> None:
    for case, got in _answers(ns, _ring_answers, _ring_cases(run_seed(ns))):
        want = sum(ring_bytes_sent(op, n, case["world"]) for op, n in case["records"])
        if not _close(got, want):
            raise CheckFailed(
                f"ring_bytes({case['records']}, world={case['world']}) is not what each rank sends",
                hint="bytes passed in, as count_collectives records them: an all-reduce sends 2 (world-1)/world of "
                     "them, a reduce-scatter (its input is the whole vector) (world-1)/world, an all-gather (its "
                     "input is one shard) world-1 times its input",
                expected=want, got=got)


# ------------------------------------------------------------------------------ 22.4: ZeRO's memory per rank


def _memory_cases(seed: int, stages: tuple[int, ...]) -> list[dict[str, Any]]:
    rng = random.Random(seed * 6151 + 224 + 31 * stages[-1])
    cases = []
    for stage in stages:
        for mixed in (False, True):
            for _ in range(3):
                world = rng.choice([3, 5, 6, 7, 12, 24, 48, 96])
                numel = rng.randint(10**5, 10**9) * world + rng.randint(1, world - 1)  # never divisible
                cases.append({"numel": numel, "world": world, "stage": stage, "mixed_precision": mixed})
    rng.shuffle(cases)
    return cases


def _memory_answers(ns: dict[str, Any], cases: list[dict[str, Any]]) -> list[list[Any]]:
    fn = need(ns, "zero_bytes", "define `zero_bytes(numel, world, stage, mixed_precision)` in the exercise cell")
    return [[c, _number(call(fn, c["numel"], c["world"], c["stage"], c["mixed_precision"]))] for c in cases]


def _judge_memory(ns: Any, stages: tuple[int, ...], hint: str) -> None:
    for case, got in _answers(ns, _memory_answers, _memory_cases(run_seed(ns), stages)):
        want = zero_bytes_per_rank(case["numel"], case["world"], case["stage"],
                                   "mixed" if case["mixed_precision"] else "fp32")
        if got != want:
            raise CheckFailed(
                f"zero_bytes({case['numel']}, world={case['world']}, stage={case['stage']}, "
                f"mixed_precision={case['mixed_precision']}) is not what one rank keeps", hint=hint,
                expected=f"{want} bytes", got=got)


@check_for("22", "ZeRO memory, stages 0 and 1: 4+4+8 (fp32) and 2+2+12 (mixed) bytes a parameter", points=1,
           parts=("22.4",))
def memory_stage_1(ns: Any) -> None:
    _judge_memory(ns, (0, 1), "fp32: 4 weight + 4 gradient + 8 AdamW state; mixed precision: 2 + 2 + 12 (fp32 "
                              "master weights and both moments); stage 1 keeps the state of ceil(numel / world) "
                              "parameters only, the rest whole")


@check_for("22", "ZeRO memory, stage 2: the gradients sharded too", points=1, parts=("22.4",))
def memory_stage_2(ns: Any) -> None:
    _judge_memory(ns, (2,), "stage 2 shards the gradients as well as the state (ceil(numel / world) elements of "
                            "each); the weights stay whole")


@check_for("22", "ZeRO memory, stage 3: everything sharded", points=1, parts=("22.4",))
def memory_stage_3(ns: Any) -> None:
    _judge_memory(ns, (3,), "stage 3 shards weights, gradients and state: ceil(numel / world) elements of each")


# ------------------------------------------------------------------------------ 22.5-22.7: communication-bound?


def _link(rng: random.Random) -> tuple[float, float, float]:
    """A link and a model: latency alpha (s), beta (s per byte), gradient bytes."""
    return rng.uniform(5e-6, 2e-4), 1 / rng.uniform(1e8, 5e10), 4.0 * rng.randint(10**5, 10**9)


def _seconds_cases(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed * 5281 + 225)
    cases = []
    for _ in range(8):
        alpha, beta, nbytes = _link(rng)
        cases.append({"nbytes": nbytes, "world": rng.randint(2, 512), "alpha": alpha, "beta": beta})
    return cases


def _seconds_answers(ns: dict[str, Any], cases: list[dict[str, Any]]) -> list[list[Any]]:
    fn = need(ns, "allreduce_seconds", "define `allreduce_seconds(nbytes, world, alpha, beta)`")
    return [[c, _number(call(fn, c["nbytes"], c["world"], c["alpha"], c["beta"]))] for c in cases]


def _model_seconds(nbytes: float, world: int, alpha: float, beta: float) -> float:
    return predicted_allreduce_seconds(nbytes, world, 1 / beta, alpha)


@check_for("22", "ring all-reduce time: 2(n-1) alpha + 2(n-1)/n bytes beta", points=1, parts=("22.5",))
def allreduce_seconds(ns: Any) -> None:
    for case, got in _answers(ns, _seconds_answers, _seconds_cases(run_seed(ns))):
        want = _model_seconds(case["nbytes"], case["world"], case["alpha"], case["beta"])
        if not _close(got, want):
            raise CheckFailed(
                f"allreduce_seconds({case['nbytes']:g}, world={case['world']}, alpha={case['alpha']:.3g}, "
                f"beta={case['beta']:.3g}) is not the ring's alpha-beta time",
                hint="2 (world-1) messages each way round the ring cost alpha each; each rank sends 2 (world-1)/world "
                     "of the bytes, at beta seconds per byte (beta is a time per byte, not a bandwidth)",
                expected=f"{want:.6g} s", got=got)


MAX_WORLD = 1024


def _crossover_cases(seed: int) -> list[dict[str, Any]]:
    """Compute times strictly between the all-reduce times at two neighbouring world sizes (answer ``k``), below the
    2-rank time (answer 2) and above the ``MAX_WORLD``-rank time (answer ``None``); the edges a near miss gets
    wrong: the crossover at ``max_world`` itself and one rank past it (``None``), and a compute time *equal* to an
    all-reduce time (answer that world: "at least"), on a link of powers of two, where every order of the sums is
    exact."""
    rng = random.Random(seed * 4447 + 226)
    cases = []
    for kind in ("inside",) * 5 + ("two", "never", "last", "past", "tie"):
        alpha, beta, nbytes = _link(rng)
        max_world = MAX_WORLD
        if kind == "tie":
            alpha, beta, nbytes = 2.0 ** -rng.randint(14, 20), 2.0 ** -rng.randint(27, 35), 4.0 * 2 ** rng.randint(
                17, 28)

        def t(world: int, nbytes: float = nbytes, alpha: float = alpha, beta: float = beta) -> float:
            return _model_seconds(nbytes, world, alpha, beta)

        if kind == "inside":
            k = rng.randint(3, 400)
            compute = t(k - 1) + rng.uniform(0.1, 0.9) * (t(k) - t(k - 1))
        elif kind == "two":
            compute = t(2) * rng.uniform(0.2, 0.9)
        elif kind == "never":
            compute = t(MAX_WORLD) * rng.uniform(1.1, 3.0)
        elif kind in ("last", "past"):
            max_world = rng.randint(3, 60)
            k = max_world if kind == "last" else max_world + 1  # past: the crossover lies just beyond max_world
            compute = t(k - 1) + rng.uniform(0.1, 0.9) * (t(k) - t(k - 1))
        else:
            compute = t(rng.choice((2, 4, 8)))
        cases.append({"compute_s": compute, "grad_bytes": nbytes, "alpha": alpha, "beta": beta,
                      "max_world": max_world})
    rng.shuffle(cases)
    return cases


def _crossover_answers(ns: dict[str, Any], cases: list[dict[str, Any]]) -> list[list[Any]]:
    fn = need(ns, "comm_bound_ranks", "define `comm_bound_ranks(compute_s, grad_bytes, alpha, beta, max_world)`")
    return [[c, _world(call(fn, c["compute_s"], c["grad_bytes"], c["alpha"], c["beta"], c["max_world"]))]
            for c in cases]


def _world(value: Any) -> Any:
    """A world size as an int (Python, numpy or torch integers), ``None`` as is, anything else as its text."""
    if value is None:
        return None
    try:
        return operator.index(value)
    except TypeError:
        return one_line(value)


@check_for("22", "crossover in ranks: the first world whose all-reduce outlasts the compute", points=1,
           parts=("22.5", "22.6"))
def crossover_ranks(ns: Any) -> None:
    for case, got in _answers(ns, _crossover_answers, _crossover_cases(run_seed(ns))):
        want = comm_bound_world(case["compute_s"], case["grad_bytes"], case["alpha"], 1 / case["beta"],
                                case["max_world"])
        if got != want or isinstance(got, bool):
            raise CheckFailed(
                f"comm_bound_ranks(compute_s={case['compute_s']:.4g}, grad_bytes={case['grad_bytes']:g}, "
                f"alpha={case['alpha']:.3g}, beta={case['beta']:.3g}, max_world={case['max_world']}) is not the "
                "first world size whose all-reduce takes at least the compute time",
                hint="try world = 2, 3, ..., max_world and return the first whose allreduce_seconds >= compute_s; "
                     "None when even max_world ranks stay below it",
                expected=want, got=got)


def _bandwidth_cases(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed * 3571 + 227)
    cases = []
    for kind in ("bandwidth",) * 5 + ("latency", "latency", "exactly latency"):
        alpha, _, nbytes = _link(rng)
        world = rng.randint(2, 512)
        if kind == "exactly latency":  # a power of two: the latency term equals compute_s exactly, in any order
            alpha = 2.0 ** -rng.randint(14, 20)
        floor = 2 * (world - 1) * alpha  # the latency term: no bandwidth makes the all-reduce faster than this
        compute = floor * {"bandwidth": rng.uniform(1.5, 50.0), "latency": rng.uniform(0.3, 0.95),
                           "exactly latency": 1.0}[kind]
        cases.append({"compute_s": compute, "grad_bytes": nbytes, "world": world, "alpha": alpha})
    rng.shuffle(cases)
    return cases


def _bandwidth_answers(ns: dict[str, Any], cases: list[dict[str, Any]]) -> list[list[Any]]:
    fn = need(ns, "bandwidth_needed", "define `bandwidth_needed(compute_s, grad_bytes, world, alpha)`")
    return [[c, _number(call(fn, c["compute_s"], c["grad_bytes"], c["world"], c["alpha"]))] for c in cases]


@check_for("22", "crossover in bandwidth: the link at which the all-reduce takes the compute time", points=1,
           parts=("22.7",))
def crossover_bandwidth(ns: Any) -> None:
    for case, got in _answers(ns, _bandwidth_answers, _bandwidth_cases(run_seed(ns))):
        want = bandwidth_for_compute(case["compute_s"], case["grad_bytes"], case["world"], case["alpha"])
        if not _close(got, want):
            raise CheckFailed(
                f"bandwidth_needed(compute_s={case['compute_s']:.4g}, grad_bytes={case['grad_bytes']:g}, "
                f"world={case['world']}, alpha={case['alpha']:.3g}) is not the bandwidth at which the all-reduce "
                "takes exactly compute_s",
                hint="solve 2 (world-1) alpha + 2 (world-1)/world grad_bytes / bandwidth = compute_s for bandwidth "
                     "(bytes per second); when the latency term alone reaches compute_s no bandwidth is enough: "
                     "math.inf",
                expected=f"{want:.6g} bytes/s", got=got)


# ------------------------------------------------------------------------------ 22.8-22.9: pipeline parallelism


def _pipeline_cases(seed: int) -> list[dict[str, int]]:
    """Stages and micro-batches; a third of the cases with so few micro-batches that 1F1B's warm-up is capped by
    them (``micro_batches < stages - stage - 1``)."""
    rng = random.Random(seed * 2663 + 228)
    cases = []
    for i in range(9):
        if i % 3 == 0:
            stages = rng.randint(3, 12)
            micro_batches = rng.randint(1, stages - 2)
            stage = rng.randrange(stages - micro_batches - 1)
        else:
            stages = rng.randint(2, 12)
            micro_batches, stage = rng.randint(stages, 4 * stages), rng.randrange(stages)
        cases.append({"stages": stages, "micro_batches": micro_batches, "stage": stage})
    return cases


def _bubble_answers(ns: dict[str, Any], cases: list[dict[str, int]]) -> list[list[Any]]:
    fn = need(ns, "bubble_fraction", "define `bubble_fraction(stages, micro_batches)` in the exercise cell")
    return [[c, _number(call(fn, c["stages"], c["micro_batches"]))] for c in cases]


@check_for("22", "pipeline bubble: (p-1)/(m+p-1) of the step idle", points=1, parts=("22.8",))
def pipeline_bubble(ns: Any) -> None:
    for case, got in _answers(ns, _bubble_answers, _pipeline_cases(run_seed(ns))):
        want = bubble_fraction(case["stages"], case["micro_batches"])
        if not _close(got, want):
            raise CheckFailed(
                f"bubble_fraction(stages={case['stages']}, micro_batches={case['micro_batches']}) is not the idle "
                "share of a GPipe step",
                hint="a step lasts m + p - 1 time units per direction and each stage works m of them",
                expected=want, got=got)


def _order(value: Any) -> Any:
    """A schedule as ``[["F", i], ["B", j], ...]`` (any pairs of a letter and an integer), else its text."""
    try:
        return [[str(kind), operator.index(i)] for kind, i in value]
    except (TypeError, ValueError):
        return one_line(value)


def _order_answers(ns: dict[str, Any], cases: list[dict[str, int]]) -> list[list[Any]]:
    fn = need(ns, "one_f_one_b", "define `one_f_one_b(stages, micro_batches, stage)` in the exercise cell")
    return [[c, _order(call(fn, c["stages"], c["micro_batches"], c["stage"]))] for c in cases]


def _call_text(case: dict[str, int]) -> str:
    return f"one_f_one_b(stages={case['stages']}, micro_batches={case['micro_batches']}, stage={case['stage']})"


@check_for("22", "1F1B order: warm-up forwards, then one forward and one backward", points=1, parts=("22.9",))
def pipeline_order(ns: Any) -> None:
    for case, got in _answers(ns, _order_answers, _pipeline_cases(run_seed(ns))):
        want = [list(op) for op in stage_order("1f1b", case["stages"], case["micro_batches"], case["stage"])]
        if got != want:
            raise CheckFailed(
                f"{_call_text(case)} is not 1F1B's order for that stage",
                hint="min(stages - stage - 1, micro_batches) warm-up forwards; then for each remaining micro-batch "
                     "its forward and the oldest backward still due; then the backwards left, in order",
                expected=want, got=got)


@check_for("22", "1F1B memory: at most min(p - stage, m) micro-batches in flight, not GPipe's m", points=1,
           parts=("22.9",))
def pipeline_memory(ns: Any) -> None:
    for case, got in _answers(ns, _order_answers, _pipeline_cases(run_seed(ns))):
        m = case["micro_batches"]
        complete = isinstance(got, list) and sorted(map(tuple, got)) == sorted(
            [("B", i) for i in range(m)] + [("F", i) for i in range(m)])
        forwards_first = complete and all(got.index(["F", i]) < got.index(["B", i]) for i in range(m))
        if not forwards_first:
            raise CheckFailed(f"{_call_text(case)} does not run each micro-batch's forward, then its backward, once",
                              hint="one ('F', i) and one ('B', i) for every micro-batch i, the forward first",
                              got=got)
        want = min(case["stages"] - case["stage"], m)
        if peak_in_flight([tuple(op) for op in got]) > want:
            raise CheckFailed(
                f"{_call_text(case)} holds the activations of {peak_in_flight([tuple(op) for op in got])} "
                f"micro-batches at once",
                hint="start each backward as soon as the stage may: a stage s of p needs only p - s forwards in "
                     "flight before the first backward comes back (GPipe keeps all m)",
                expected=f"at most {want}", got=peak_in_flight([tuple(op) for op in got]))


# ------------------------------------------------------------------------------ 22.10: a two-stage pipeline


def _unsplit(cfg: dict[str, Any]) -> dict[str, Any]:
    """The reference: the whole model, one process, the whole batch (cross-entropy's mean)."""
    model = driver.pp_model(cfg)
    x, y = driver.pp_batch(cfg)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return {"loss": loss.detach().reshape(-1),
            "grads": [{n: p.grad for n, p in model[rank].named_parameters()} for rank in range(driver.WORLD)]}


@check_for("22", "pipeline: the loss and both stages' gradients match the unsplit model", points=2, parts=("22.10",))
def pipeline_matches_unsplit(ns: Any) -> None:
    cfg, ranks = _ranks(ns, "pp")
    want = _unsplit(cfg)
    m = cfg["pp"]["micro_batches"]
    hint = (f"rank 1 adds cross_entropy(out, y_mb) / {m} over the micro-batches (the mean of equal micro-batches' "
            "means is the batch's mean); it sends back the gradient of each received activation (require grad on "
            "it), and rank 0 calls activation.backward(that gradient) for each of its micro-batches")
    got_loss = ranks[1]["loss"]
    if got_loss is None or got_loss.shape != want["loss"].shape or not torch.allclose(got_loss, want["loss"], rtol=0,
                                                                                         atol=1e-6):
        raise CheckFailed("the loss rank 1 returned is not the unsplit model's mean loss on the whole batch",
                          hint=hint, expected=f"{want['loss'].item():.6f}", got=one_line(got_loss))
    for rank, record in enumerate(ranks):
        for name, expected in want["grads"][rank].items():
            got = record["grads"].get(name)
            if got is None or got.shape != expected.shape or not torch.allclose(got, expected, rtol=0, atol=1e-6):
                raise CheckFailed(
                    f"stage {rank}'s {name} gradient differs from the unsplit model's",
                    hint=hint, expected=f"{tuple(expected.shape)} within 1e-6",
                    got="no gradient" if got is None else gap(got, expected))


@check_for("22", "pipeline traffic: per micro-batch one activation forward and one gradient back", points=1,
           parts=("22.10",))
def pipeline_messages(ns: Any) -> None:
    cfg, ranks = _ranks(ns, "pp")
    pp = cfg["pp"]
    one = 4 * pp["batch"] // pp["micro_batches"] * pp["hidden"]  # one micro-batch's activation, float32
    for rank, record in enumerate(ranks):
        got = record["messages"]
        sends = [n for op, n in got if op in ("send", "isend")]
        recvs = [n for op, n in got if op in ("recv", "irecv")]
        others = [op for op, _ in got if op not in ("send", "isend", "recv", "irecv")]
        if sends != [one] * pp["micro_batches"] or recvs != [one] * pp["micro_batches"] or others:
            raise CheckFailed(
                f"rank {rank} did not send and receive one activation-sized message per micro-batch",
                hint="rank 0 sends each micro-batch's activation (micro_batch x hidden) to rank 1 and receives its "
                     "gradient back; rank 1 the mirror image; no collectives: a pipeline talks to its neighbour only",
                expected=f"{pp['micro_batches']} sends and {pp['micro_batches']} receives of {one} bytes",
                got=got)


# ------------------------------------------------------------------------------ 22.11: tensor-parallel attention

TP_TOLERANCE = 1e-5


def _unsplit_attention(cfg: dict[str, Any]) -> dict[str, Any]:
    layer = driver.tp_attention_layer(cfg)
    x, weights = driver.tp_input(cfg)
    x.requires_grad_()
    out = layer(x)
    (out * weights).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad, "grads": {n: p.grad for n, p in layer.named_parameters()}}


def _heads_share(name: str, grad: torch.Tensor, rank: int) -> torch.Tensor:
    """The part of the unsplit layer's gradient that reaches rank ``rank``'s heads (zeros elsewhere): its rows of
    q, k and v in ``qkv``, its columns of ``proj.weight``; ``proj.bias`` whole."""
    if name == "proj.bias":
        return grad
    out = torch.zeros_like(grad)
    if name == "proj.weight":
        width = grad.shape[1] // driver.WORLD
        mine = slice(rank * width, (rank + 1) * width)
        out[:, mine] = grad[:, mine]
        return out
    embd = grad.shape[0] // 3  # qkv: rows of q, then k, then v
    width = embd // driver.WORLD
    for part in range(3):
        mine = slice(part * embd + rank * width, part * embd + (rank + 1) * width)
        out[mine] = grad[mine]
    return out


@check_for("22", "tensor-parallel attention: output and gradients match the unsplit layer", points=2,
           parts=("22.11",))
def tp_attention_matches(ns: Any) -> None:
    cfg, ranks = _ranks(ns, "tp")
    want = _unsplit_attention(cfg)
    hint = ("rank r's heads are columns [r*C/world, (r+1)*C/world) of q, of k and of v: rows of qkv.weight at offsets "
            "0, C and 2C; attention on those heads alone; their columns of proj.weight give a partial output, "
            "summed over the ranks (SumInForward), then proj.bias once; SumInBackward on the input")
    split_layer_matches(ranks, want, _heads_share, layer="attention layer", param=lambda name: f"attn.{name}",
                        hint=hint, tolerance=TP_TOLERANCE)


@check_for("22", "tensor-parallel attention: one activation-sized all-reduce in forward, one in backward", points=1,
           parts=("22.11",))
def tp_attention_messages(ns: Any) -> None:
    cfg, ranks = _ranks(ns, "tp")
    tp = cfg["tp"]
    nbytes = 4 * tp["batch"] * tp["tokens"] * tp["n_head"] * tp["head_dim"]
    for rank, record in enumerate(ranks):
        for direction in ("forward", "backward"):
            if record[direction] != [["all_reduce", nbytes]]:
                raise CheckFailed(
                    f"rank {rank}: the layer's {direction} should send exactly one all-reduce of the activations",
                    hint="the heads need nothing from each other: only the projection's partial outputs are summed "
                         "(forward) and the input's partial gradients (backward)",
                    expected=f"[['all_reduce', {nbytes}]]", got=record[direction])


# ------------------------------------------------------------------------------ 22.12-22.14: sequence parallelism

SP_PARTS = ("22.12", "22.13", "22.14")


def _unsplit_sp(cfg: dict[str, Any], tokens: slice | None = None) -> dict[str, Any]:
    """The unsplit block on the whole sequence; the loss over every token, or over ``tokens`` only."""
    block = driver.sp_block(cfg)
    x, weights = driver.sp_input(cfg)
    x.requires_grad_()
    out = block(x)
    keep = slice(None) if tokens is None else tokens
    (out[:, keep] * weights[:, keep]).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad, "grads": {n: p.grad for n, p in block.named_parameters()}}


@check_for("22", "sequence parallelism: this rank's tokens and gradients match the unsplit block", points=2,
           parts=SP_PARTS)
def sp_matches(ns: Any) -> None:
    cfg, ranks = _ranks(ns, "sp")
    whole = _unsplit_sp(cfg)  # every rank's loss together: what the shared weights and each input slice receive
    hint = ("GatherTokens all-gathers the token slices (dim 1) into the whole sequence and reduce-scatters the "
            "gradient back; ScatterTokens reduce-scatters (SUM) the partial outputs into this rank's tokens and "
            "all-gathers the gradient; between them exercise 21's column- then row-parallel split; the second "
            "Linear's bias once, after the reduce-scatter")
    for rank, record in enumerate(ranks):
        mine = driver.token_slice(cfg, rank)
        own = _unsplit_sp(cfg, mine)  # the bias is added after the reduce-scatter: only this rank's tokens reach it
        expected_grads = {name: own["grads"][name] if name == "2.bias" else hidden_share(name, grad, rank, driver.WORLD)
                          for name, grad in whole["grads"].items()}
        for what, got, expected in (("output", record["out"], whole["out"][:, mine]),
                                    ("input gradient", record["x_grad"], whole["x_grad"][:, mine])):
            if got is None or got.shape != expected.shape or not torch.allclose(got, expected, rtol=0,
                                                                                 atol=TP_TOLERANCE):
                raise CheckFailed(f"rank {rank}: the {what} of its tokens differs from the unsplit block's",
                                  hint=hint, expected=f"{tuple(expected.shape)} within {TP_TOLERANCE:g}",
                                  got="no gradient" if got is None else gap(got, expected))
        for name, expected in expected_grads.items():
            got = record["grads"].get(name)
            if got is None or got.shape != expected.shape or not torch.allclose(got, expected, rtol=0,
                                                                                 atol=TP_TOLERANCE):
                raise CheckFailed(
                    f"rank {rank}: block[{name.replace('.', '].')}'s gradient is not the part of the unsplit "
                    "block's that reaches this rank", hint=hint,
                    expected=f"{tuple(expected.shape)} within {TP_TOLERANCE:g}",
                    got="no gradient" if got is None else gap(got, expected))


@check_for("22", "sequence parallelism: an all-gather and a reduce-scatter each way, one all-reduce's bytes",
           points=1, parts=SP_PARTS)
def sp_messages(ns: Any) -> None:
    cfg, ranks = _ranks(ns, "sp")
    sp = cfg["sp"]
    full = driver.SP_DTYPE.itemsize * sp["batch"] * sp["tokens"] * sp["d"]
    want = ring_allreduce_bytes(full, driver.WORLD)  # what tensor parallelism's all-reduce sends
    for rank, record in enumerate(ranks):
        for direction in ("forward", "backward"):
            events = record[direction]
            ops = sorted("gather" if op in GATHERS else "scatter" if op in SCATTERS else op for op, _ in events)
            priced = all(op in GATHERS + SCATTERS for op, _ in events)
            sent = sum(ring_bytes_sent(op, n, driver.WORLD) for op, n in events) if priced else None
            if ops != ["gather", "scatter"] or sent is None or not math.isclose(sent, want, rel_tol=RELATIVE):
                raise CheckFailed(
                    f"rank {rank}: the block's {direction} sent {events} ([op, bytes passed in])",
                    hint="forward: one all-gather of the token slices and one reduce-scatter of the partial outputs; "
                         "backward: the same two, the other way round; no all-reduce",
                    expected=f"one all-gather of {full // driver.WORLD} bytes and one reduce-scatter of {full}: "
                             f"{want:g} ring bytes, as one all-reduce of the activations", got=events)
