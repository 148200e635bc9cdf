"""The benchmark table: ``python -m course_lib bench [--quick] [--out benchmarks/results]``.

Every figure is measured in one run, on this machine, with the contenders **interleaved** (A, B, C, A, B, C, ...)
so that background load hits them equally, repeated, and summarised by the median. Results are reported as
**ratios** of runs made side by side -- absolute times on a shared laptop mean little; ratios travel.

Sections:

(a) ``course_lib.train.train()`` vs a minimal hand-written loop doing the same work (same model and initial
    weights, AdamW parameter groups, per-step learning rate, gradient clipping, same batches) vs PyTorch Lightning
    doing the same work, made fair (no logger, checkpointing, progress bar or model summary). Step time is the
    steady-state period between consecutive batch requests, so set-up and the final evaluation are excluded for
    all three alike. Goals: train()'s step <= 1.02x the minimal loop's; its overhead <= 0.25x Lightning's.
    The per-step overhead row (``--only overhead``) times the same three differently: whole runs of N and 2N steps
    with a log line every 50, their difference over N, so what a run does once cancels and what it does per step
    or per log line (reading the loss, bookkeeping) counts. Goals: ``train()``'s ms per step above the minimal loop
    <= max(0.25x Lightning's, 2 % of the step), and its paired ratio to the minimal loop <= 1.02.
(b) A tuned DataLoader (worker processes) vs ``num_workers=0`` on the generated JPEG "shapes" data (goal >= 1.7x
    on 2 cores); and in-memory batching on the device (``DeviceBatcher``) vs ``DataLoader(TensorDataset)``.
(c) Eager vs ``torch.compile`` steady-state training step (and the cold compile in seconds); fp32 vs bf16 autocast.
(d) On a CUDA GPU only: a GPT-2-small-sized model's tokens/s and model FLOPs utilisation (MFU), bf16 + compile vs
    eager vs fp32 side by side (``course_lib.perf.mfu``).

Writes ``latest.json`` (everything, machine description included) and ``latest.md`` (the table) under ``--out``.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from course_lib import atomic, clock
from course_lib.argparsing import CommandParser
from course_lib.device import pick_device, synchronize
from course_lib.perf.compare import Comparison, Measurement, OtherPrograms, verdict_from_times
from course_lib.perf.mfu import gpt_flops_per_token, peak_flops  # noqa: F401 - section (d); re-exported
from course_lib.train.loss import mean_cross_entropy


@dataclass
class Sizes:
    """How much work each section does (the --tiny/--quick/full presets)."""

    steps: int  # training steps per contender per repetition
    reps: int  # interleaved repetitions (sections b, c)
    loop_reps: int  # interleaved repetitions of section (a), whose ratios are compared with 1.02
    overhead_steps: int  # per-step overhead row: N of its N- and 2N-step runs (bench model; the tiny model 5 N)
    overhead_rounds: int  # its interleaved rounds
    d: int  # width of the MLP used in (a) and (c)
    batch: int
    loader_batches: int
    compile_steps: int
    compile_backend: str
    gpt_steps: int  # (d): timed steps per contender
    gpt_model: str = "gpt2-small"  # (d): "gpt2-small" (124 M parameters) or "tiny" (a wiring check)


PRESETS = {
    "tiny": Sizes(steps=8, reps=1, loop_reps=2, overhead_steps=4, overhead_rounds=2, d=64, batch=16, loader_batches=3,
                  compile_steps=3, compile_backend="eager", gpt_steps=5, gpt_model="tiny"),
    "quick": Sizes(steps=40, reps=3, loop_reps=10, overhead_steps=50, overhead_rounds=9, d=256, batch=64,
                   loader_batches=40, compile_steps=15, compile_backend="inductor", gpt_steps=20),
    "full": Sizes(steps=120, reps=5, loop_reps=16, overhead_steps=100, overhead_rounds=9, d=256, batch=64,
                  loader_batches=78, compile_steps=40, compile_backend="inductor", gpt_steps=50),
}


# ----------------------------------------------------------------------------------------------- machine
def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    from course_lib.perf.loaders import usable_cores

    info = {
        "cpu": cpu, "cores": usable_cores(), "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "device": str(pick_device("auto")),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    return info


# ------------------------------------------------------------------------------------ (a) training loops
@dataclass(frozen=True)
class LoopCase:
    """One model of section (a): ``Net(d_in=32, d, n_blocks)`` on batches of ``batch``, ``steps`` per run, a log line
    every ``log_every`` steps (``None``: one, at the end).

    Taught in lesson 10 (``notebooks/10_lightning.ipynb``).
    """

    label: str
    d: int
    n_blocks: int
    batch: int
    steps: int
    log_every: int | None = None

    def describe(self) -> str:
        return f"Net(d_in=32, d={self.d}, n_blocks={self.n_blocks}), batch {self.batch}, fp32, CPU"


def loop_cases(sizes: Sizes, steps: int | None = None, log_every: int | None = None) -> tuple[LoopCase, LoopCase]:
    """The bench model (compute dominates) and a tiny one (the framework's per-step overhead dominates); the tiny
    model runs five times the steps (``sizes.steps`` unless ``steps`` is given), so both runs last about as long."""
    steps = sizes.steps if steps is None else steps
    return (LoopCase("bench model", d=sizes.d, n_blocks=4, batch=sizes.batch, steps=steps, log_every=log_every),
            LoopCase("tiny model", d=16, n_blocks=1, batch=8, steps=steps * 5, log_every=log_every))


# Section (a)'s clock: "wall" (the course's wall clock, course_lib/clock.py) or "cpu" (time.thread_time: the CPU
# time of the training thread, which excludes the time the thread waited for a core; with one intra-op thread all of
# a CPU step's work runs in that thread, so on a shared machine it measures what the step costs rather than what
# the neighbours took).
STEP_CLOCKS: dict[str, Callable[[], float]] = {"wall": clock.now, "cpu": time.thread_time}
step_clock = "wall"


class TimedBatches:
    """An endless iterable over fixed batches that stamps the time of every batch request.

    The steady-state step time of *any* training loop is the median gap between consecutive requests: set-up
    before the first batch and evaluation after the last are excluded, whoever runs the loop.
    """

    def __init__(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], limit: int) -> None:
        self.batches, self.limit = list(batches), limit
        self.clock = STEP_CLOCKS[step_clock]
        self.stamps: list[float] = []

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(self.limit):
            self.stamps.append(self.clock())
            yield self.batches[i % len(self.batches)]

    def step_s(self) -> float:
        gaps = [b - a for a, b in zip(self.stamps[1:], self.stamps[2:])]  # skip the first (warm-up) step
        return statistics.median(gaps) if gaps else float("nan")


def _mlp_and_data(case: LoopCase, seed: int = 0) -> tuple[torch.nn.Module, list, list]:
    from course_lib.models import Net

    torch.manual_seed(seed)
    model = Net(d_in=32, d=case.d, n_blocks=case.n_blocks, n_out=10)
    g = torch.Generator().manual_seed(seed)
    batches = [(torch.randn(case.batch, 32, generator=g), torch.randint(0, 10, (case.batch,), generator=g))
               for _ in range(8)]
    return model, batches, batches[:1]


def _cfg(case: LoopCase) -> Any:
    from course_lib.train import TrainConfig

    return TrainConfig(steps=case.steps, bs=case.batch, lr=1e-3, wd=0.05, clip=1.0, amp_dtype="fp32",
                       device="cpu", model="net", log_every=case.log_every or case.steps, eval_every=case.steps)


def run_course_train(model: torch.nn.Module, batches: list, val: list, case: LoopCase) -> float:
    """``course_lib.train.train()`` on the batches, no files; returns its steady step time (s)."""
    import contextlib
    import io

    from course_lib.train import train

    timed = TimedBatches(batches, limit=case.steps + 1)
    # No progress bar, as for Lightning (a notebook would draw one per run); the evaluation line is not reported.
    with contextlib.redirect_stdout(io.StringIO()):
        train(model, timed, val, _cfg(case), device="cpu", ckpt_path=None, progress=False)
    return timed.step_s()


def run_minimal_loop(model: torch.nn.Module, batches: list, val: list, case: LoopCase) -> float:
    """The same work written out by hand: AdamW groups, lr per step, clipping, the loss and gradient norm read at each
    log line, an evaluation at the end."""
    from course_lib.train import lr_at, param_groups
    from course_lib.train.optim import BETAS

    cfg = _cfg(case)
    groups = [{k: v for k, v in g.items() if k != "names"} for g in param_groups(model, cfg.wd)]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=BETAS)
    timed = TimedBatches(batches, limit=case.steps + 1)
    model.train()
    it = iter(timed)
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        x, y = next(it)
        loss = mean_cross_entropy(model(x), y)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % cfg.log_every == 0:
            loss.item(), grad_norm.item()  # the log line: what nanoGPT's loop reads every log_interval steps
    next(it, None)
    model.eval()
    with torch.no_grad():
        for x, y in val:
            mean_cross_entropy(model(x), y).item()
    return timed.step_s()


def _lightning_module(model: torch.nn.Module, cfg: Any) -> Any:
    import lightning as L

    from course_lib.train import lr_at, param_groups
    from course_lib.train.optim import BETAS

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return mean_cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            groups = [{k: v for k, v in g.items() if k != "names"} for g in param_groups(self.net, cfg.wd)]
            opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=BETAS)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_at(step, cfg) / cfg.lr)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    return Module()


def run_lightning(model: torch.nn.Module, batches: list, val: list, case: LoopCase) -> float:
    """PyTorch Lightning doing the same work, made fair: no logger, checkpoint, progress bar or model summary."""
    import logging

    import lightning as L
    from lightning.pytorch.plugins.environments import LightningEnvironment

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    cfg = _cfg(case)
    timed = TimedBatches(batches, limit=case.steps + 2)
    trainer = L.Trainer(
        max_steps=cfg.steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=cfg.clip,
        log_every_n_steps=cfg.log_every, num_sanity_val_steps=0, limit_val_batches=0, deterministic=False,
        plugins=[LightningEnvironment()],  # one process: no probe for a cluster launcher (it would start MPI)
    )
    trainer.fit(_lightning_module(model, cfg), train_dataloaders=timed)
    model.eval()
    with torch.no_grad():
        for x, y in val:
            mean_cross_entropy(model(x), y).item()
    return timed.step_s()


def aten_calls_per_step(run: Callable[..., float], model: torch.nn.Module, batches: list, val: list,
                        case: LoopCase) -> float:
    """Operator calls (``aten::*``) per training step of ``run``, counted by the profiler (evaluation included).

    The count, unlike a time, does not depend on background load: it is how a loop's extra work is diagnosed.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run(model, batches, val, case)
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::")) / case.steps


CONTENDERS: dict[str, Callable[..., float]] = {
    "course_train": run_course_train, "minimal_loop": run_minimal_loop, "lightning": run_lightning,
}
GOAL_TRAIN_VS_MINIMAL = 1.02  # train()'s step time at most 2 % above the minimal loop's
GOAL_OVERHEAD_VS_LIGHTNING = 0.25  # train()'s overhead (ms above the minimal loop) at most a quarter of Lightning's
GOAL_OVERHEAD_OF_STEP = 0.02  # ... or at most 2 % of the minimal loop's step, whichever is larger


def interleaved_step_times(case: LoopCase, reps: int, log: Callable[[str], None],
                           contenders: dict[str, Callable[..., float]] | None = None) -> dict[str, list[float]]:
    """Each contender's steady step time (s) in each repetition, the order reversed every other one (A B C, C B A).

    The compare() protocol's interleaving: a slow drift in background load hits every contender alike, and the
    contenders of one repetition ran back to back, so their *paired* differences and ratios are what is reported.
    """
    contenders = CONTENDERS if contenders is None else contenders
    base, batches, val = _mlp_and_data(case)
    names = list(contenders)
    times: dict[str, list[float]] = {k: [] for k in names}
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            times[name].append(contenders[name](copy.deepcopy(base), batches, val, case))
        log(f"  {case.label} rep {rep + 1}/{reps}: "
            + ", ".join(f"{k} {1000 * v[-1]:.3f} ms" for k, v in times.items()))
    return times


def median_and_quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """``(median, low, high)``: the quartiles with four or more values, else the minimum and maximum."""
    vals = sorted(values)
    if len(vals) < 4:
        return statistics.median(vals), vals[0], vals[-1]
    low, mid, high = statistics.quantiles(vals, n=4, method="inclusive")
    return mid, low, high


def summarise_loops(case: LoopCase, times: dict[str, list[float]]) -> dict[str, Any]:
    """Ratios and overheads from paired repetitions, each with its spread (quartiles over the repetitions)."""
    m = {k: Measurement(k, tuple(v), unit="step") for k, v in times.items()}
    vs_min = verdict_from_times(m["minimal_loop"], m["course_train"], band=GOAL_TRAIN_VS_MINIMAL - 1)
    overhead = {k: median_and_quartiles([1000 * (t - b) for t, b in zip(times[k], times["minimal_loop"])])
                for k in ("course_train", "lightning")}
    train_ms, lightning_ms = overhead["course_train"][0], overhead["lightning"][0]
    share = train_ms / lightning_ms if lightning_ms > 0 else math.inf
    return {
        "model": case.describe(), "steps": case.steps, "reps": len(times["minimal_loop"]),
        "clock": step_clock,
        "step_ms": {k: 1000 * statistics.median(v) for k, v in times.items()},
        "all_step_ms": {k: [1000 * t for t in v] for k, v in times.items()},
        "ratio_train_vs_minimal": vs_min.ratio, "ratio_train_vs_minimal_quartiles": [vs_min.low, vs_min.high],
        "verdict_train_vs_minimal": vs_min.outcome,
        "overhead_ms": {k: {"median": v[0], "low": v[1], "high": v[2]} for k, v in overhead.items()},
        "overhead_train_vs_lightning": share,
        "met_train_vs_minimal": vs_min.ratio <= GOAL_TRAIN_VS_MINIMAL,
        "met_overhead_vs_lightning": share <= GOAL_OVERHEAD_VS_LIGHTNING,
    }


def bench_training_loops(sizes: Sizes, log: Callable[[str], None]) -> dict[str, Any]:
    """Section (a) on both models: interleaved repetitions, ratios and ms of overhead with their spreads."""
    cases = {}
    for case in loop_cases(sizes):
        result = summarise_loops(case, interleaved_step_times(case, sizes.loop_reps, log))
        base, batches, val = _mlp_and_data(case)
        ops = {name: aten_calls_per_step(CONTENDERS[name], copy.deepcopy(base), batches, val, case)
               for name in ("course_train", "minimal_loop")}
        result["aten_calls_per_step"] = ops
        result["ratio_ops_train_vs_minimal"] = ops["course_train"] / ops["minimal_loop"]
        cases[case.label] = result
    return {
        "cases": cases, "goal_train_vs_minimal": GOAL_TRAIN_VS_MINIMAL,
        "goal_overhead_vs_lightning": GOAL_OVERHEAD_VS_LIGHTNING,
        "met": all(c["met_train_vs_minimal"] and c["met_overhead_vs_lightning"] for c in cases.values()),
    }


# --------------------------------------------------------------------------------- (a) per-step overhead
# A log line every 50 steps in the overhead runs (TrainConfig's default for a 1000-step run, and Lightning's
# log_every_n_steps): whatever a loop does once per log line is then counted in its per-step cost.
OVERHEAD_LOG_EVERY = 50


def overhead_cases(sizes: Sizes) -> tuple[LoopCase, LoopCase]:
    """Section (a)'s two models, with ``N = sizes.overhead_steps`` steps (the tiny model 5 N) and a log interval."""
    return loop_cases(sizes, steps=sizes.overhead_steps, log_every=OVERHEAD_LOG_EVERY)


def timed_run(run: Callable[..., float], base: torch.nn.Module, batches: list, val: list,
              case: LoopCase) -> tuple[float, float]:
    """``(wall, CPU)`` seconds of one whole run of ``run`` on a fresh copy of ``base``: set-up, ``case.steps`` steps,
    the final evaluation. CPU: this process's (``time.process_time``: every thread, not the time spent waiting)."""
    model = copy.deepcopy(base)
    wall, cpu = clock.now(), time.process_time()
    run(model, batches, val, case)
    return clock.now() - wall, time.process_time() - cpu


def seconds_per_step(run: Callable[..., float], base: torch.nn.Module, batches: list, val: list,
                     case: LoopCase, tries: int = 3) -> tuple[float, float]:
    """``(wall, CPU)`` seconds per step of ``run``: (time of a 2N-step run - time of an N-step run) / N, N =
    ``case.steps``. What a run does once (building the optimizer or the Trainer, the final evaluation) cancels;
    what it does every step, or every log line, stays. A pair whose difference is not positive (a stall in the
    shorter run longer than N steps) is run again, ``tries`` times at most.

    Taught in lesson 10 (``notebooks/10_lightning.ipynb``).
    """
    double = replace(case, steps=2 * case.steps)
    for _ in range(tries):
        once = timed_run(run, base, batches, val, case)
        twice = timed_run(run, base, batches, val, double)
        per_step = ((twice[0] - once[0]) / case.steps, (twice[1] - once[1]) / case.steps)
        if min(per_step) > 0:
            return per_step
    raise RuntimeError(f"{case.label}: a {2 * case.steps}-step run never took longer than a {case.steps}-step one in "
                       f"{tries} tries; the machine is too busy to time {case.steps} steps. Use more steps, or "
                       "measure when it is quieter.")


def step_overhead(case: LoopCase, rounds: int, log: Callable[[str], None] = lambda _: None,
                  contenders: dict[str, Callable[..., float]] | None = None) -> Comparison:
    """Every contender's seconds per step (:func:`seconds_per_step`) in ``rounds`` interleaved rounds (the order
    reversed every other round), as a :class:`~course_lib.perf.compare.Comparison`: its verdicts choose wall or CPU
    time as every comparison of the course does, and round ``i`` of each contender ran back to back, so per-round
    differences and ratios are paired.

    Taught in lesson 10 (``notebooks/10_lightning.ipynb``).
    """
    contenders = CONTENDERS if contenders is None else contenders
    base, batches, val = _mlp_and_data(case)
    names = list(contenders)
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    with OtherPrograms() as others:
        for i in range(rounds):
            for name in names if i % 2 == 0 else names[::-1]:
                rows[name].append(seconds_per_step(contenders[name], base, batches, val, case))
            log(f"  {case.label} round {i + 1}/{rounds}: "
                + ", ".join(f"{name} {1000 * r[-1][0]:.3f} ms/step" for name, r in rows.items()))
    measurements = {name: Measurement(name, tuple(w for w, _ in r), unit="step", cpu_seconds=tuple(c for _, c in r))
                    for name, r in rows.items()}
    return Comparison(measurements, threads=torch.get_num_threads(), measured_others_cores=others.cores)


def python_calls_per_step(run: Callable[..., float], case: LoopCase) -> float:
    """Python function calls per step of ``run`` (calls of Python functions and of C functions from Python, as
    ``sys.setprofile`` sees them): (calls in a 2N-step run - calls in an N-step run) / N, after a short warm-up run
    (lazy initialisation). A count, not a time: the same on a busy machine, and it says where a loop's time goes.

    Taught in lesson 10 (``notebooks/10_lightning.ipynb``).
    """
    base, batches, val = _mlp_and_data(case)

    def calls(steps: int) -> int:
        count = 0

        def hook(frame: Any, event: str, arg: Any) -> None:
            nonlocal count
            count += event in ("call", "c_call")

        model, previous = copy.deepcopy(base), sys.getprofile()
        sys.setprofile(hook)
        try:
            run(model, batches, val, replace(case, steps=steps))
        finally:
            sys.setprofile(previous)
        return count

    run(copy.deepcopy(base), batches, val, replace(case, steps=2))
    return (calls(2 * case.steps) - calls(case.steps)) / case.steps


def summarise_overhead(case: LoopCase, per_step: dict[str, Sequence[float]], quantity: str) -> dict[str, Any]:
    """The overhead row of one model from each contender's seconds per step, round by round: ``train()``'s and
    Lightning's ms per step above the minimal loop and ``train()``'s ratio to it, each paired per round (the
    median and middle half over the rounds), against the goals."""
    minimal = per_step["minimal_loop"]
    overhead = {k: median_and_quartiles([1000 * (t - m) for t, m in zip(per_step[k], minimal)])
                for k in ("course_train", "lightning")}
    ratio = median_and_quartiles([t / m for t, m in zip(per_step["course_train"], minimal)])
    step_ms = 1000 * statistics.median(minimal)
    allowed_ms = max(GOAL_OVERHEAD_VS_LIGHTNING * overhead["lightning"][0], GOAL_OVERHEAD_OF_STEP * step_ms)
    return {
        "model": case.describe(), "steps": [case.steps, 2 * case.steps], "log_every": case.log_every,
        "rounds": len(minimal), "quantity": quantity,
        "step_ms": {k: 1000 * statistics.median(v) for k, v in per_step.items()},
        "all_step_ms": {k: [1000 * t for t in v] for k, v in per_step.items()},
        "overhead_ms": {k: {"median": v[0], "low": v[1], "high": v[2]} for k, v in overhead.items()},
        "allowed_overhead_ms": allowed_ms,
        "ratio_train_vs_minimal": ratio[0], "ratio_train_vs_minimal_middle_half": [ratio[1], ratio[2]],
        "met_overhead": overhead["course_train"][0] <= allowed_ms,
        "met_ratio": ratio[0] <= GOAL_TRAIN_VS_MINIMAL,
    }


def bench_step_overhead(sizes: Sizes, log: Callable[[str], None]) -> dict[str, Any]:
    """The per-step overhead row on both models: ``train()`` and Lightning against the minimal loop.

    Decided on section (a)'s clock: wall time, or with ``--clock cpu`` this process's CPU time.
    """
    quantity = step_clock
    cases = {}
    for case in overhead_cases(sizes):
        comparison = step_overhead(case, sizes.overhead_rounds, log)
        per_step = {name: m.per_unit(quantity) for name, m in comparison.measurements.items()}
        cases[case.label] = summarise_overhead(case, per_step, quantity)
        cases[case.label]["others_cores"] = comparison.others_cores
        counted = replace(case, steps=OVERHEAD_LOG_EVERY)  # a count is exact: runs of one and two log lines do
        cases[case.label]["python_calls_per_step"] = {name: python_calls_per_step(run, counted)
                                                      for name, run in CONTENDERS.items()}
    return {
        "cases": cases, "goal_train_vs_minimal": GOAL_TRAIN_VS_MINIMAL,
        "goal_overhead_vs_lightning": GOAL_OVERHEAD_VS_LIGHTNING, "goal_overhead_of_step": GOAL_OVERHEAD_OF_STEP,
        "met": all(c["met_overhead"] and c["met_ratio"] for c in cases.values()),
    }


# ------------------------------------------------------------------------------------------ (b) loaders
def bench_loaders(sizes: Sizes, log: Callable[[str], None], workers: int = 2) -> dict[str, Any]:
    from course_lib.data import load_image_datasets
    from course_lib.perf.loaders import measure_loader

    data = load_image_datasets("shapes")
    bs = min(sizes.batch, len(data.train) // max(1, sizes.loader_batches))
    n = min(sizes.loader_batches, len(data.train) // bs)
    runs: dict[str, list[float]] = {"workers_0": [], f"workers_{workers}": []}
    with_startup: dict[str, list[float]] = {"workers_0": [], f"workers_{workers}": []}
    for rep in range(sizes.reps):
        for w in ((0, workers) if rep % 2 == 0 else (workers, 0)):
            r = measure_loader(data.train, n_batches=n, batch_size=bs, num_workers=w,
                               prefetch_factor=4 if w else None)
            runs[f"workers_{w}"].append(r["steady_samples_per_s"])
            with_startup[f"workers_{w}"].append(r["samples_per_s"])
    med = {k: statistics.median(v) for k, v in runs.items()}
    med_startup = {k: statistics.median(v) for k, v in with_startup.items()}
    ratio = med[f"workers_{workers}"] / med["workers_0"]
    ratio_startup = med_startup[f"workers_{workers}"] / med_startup["workers_0"]
    log(f"  loader: workers={workers} vs 0: {ratio:.2f}x steady, {ratio_startup:.2f}x with start-up")
    return {
        "dataset": f"shapes JPEG, {len(data.train)} train images, {data.image_size}px, decode+augment per sample",
        "batch_size": bs, "n_batches": n, "tuned": {"num_workers": workers, "prefetch_factor": 4},
        "samples_per_s": med, "samples_per_s_with_startup": med_startup,
        "ratio_tuned_vs_workers0": ratio, "ratio_with_startup": ratio_startup, "goal": 1.7, "met": ratio >= 1.7,
        "note": "steady state: after each run's first batch (worker start-up is reported separately, "
                "as the ratio with start-up); on a shared or 2-core machine workers compete with the main process",
    }


def bench_in_memory(sizes: Sizes, log: Callable[[str], None]) -> dict[str, Any]:
    from torch.utils.data import DataLoader, TensorDataset

    from course_lib.data import DeviceBatcher, load_image_tensors

    t = load_image_tensors("shapes", progress=False)
    device = pick_device("auto")
    images, labels = t.train_images, t.train_labels
    bs = min(sizes.batch, len(images))
    mean = torch.tensor(t.mean).view(1, -1, 1, 1)
    std = torch.tensor(t.std).view(1, -1, 1, 1)
    floats = (images.float() / 255.0 - mean) / std  # pre-normalised: the DataLoader side does *less* work
    plain = DeviceBatcher(images, labels, batch_size=bs, device=device, augment=False, mean=t.mean, std=t.std)
    augmented = DeviceBatcher(images, labels, batch_size=bs, device=device, augment=True, mean=t.mean, std=t.std)
    loader = DataLoader(TensorDataset(floats, labels), batch_size=bs, shuffle=True, drop_last=True)

    def epoch(it: Any) -> float:
        synchronize(device)
        t0 = clock.now()
        count = 0
        for x, y in it:
            x, y = x.to(device), y.to(device)
            count += len(y)
        synchronize(device)
        return count / (clock.now() - t0)

    contenders = {"device_batcher": plain, "device_batcher_augmented": augmented, "dataloader_tensordataset": loader}
    runs: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(max(2, sizes.reps)):
        for name, it in contenders.items():
            runs[name].append(epoch(it))
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratio = med["device_batcher"] / med["dataloader_tensordataset"]
    ratio_aug = med["device_batcher_augmented"] / med["dataloader_tensordataset"]
    log(f"  in-memory: DeviceBatcher vs DataLoader(TensorDataset): {ratio:.2f}x ({ratio_aug:.2f}x with augmentation)")
    return {
        "dataset": f"shapes as uint8 tensors, {len(images)} images", "batch_size": bs, "device": str(device),
        "samples_per_s": med, "ratio_devicebatcher_vs_dataloader": ratio,
        "ratio_devicebatcher_augmented_vs_dataloader": ratio_aug,
        "why_workers_do_not_help": (
            "the data is already decoded in memory: a batch is one index + gather. DataLoader(TensorDataset) "
            "indexes sample by sample and stacks them in Python; worker processes would add pickling/shared-memory "
            "transfer of every batch, which costs more than the gather itself. DeviceBatcher gathers a whole batch "
            "in one tensor operation on the device; its augmented variant also crops and flips there."),
    }


# ----------------------------------------------------------------------------------- (c) compile, precision
def bench_compile(sizes: Sizes, log: Callable[[str], None]) -> dict[str, Any]:
    from course_lib.perf.compile import measure_compile

    model, batches, _ = _mlp_and_data(loop_cases(sizes)[0])
    model.eval()  # dropout off: same work in both
    counter = iter(range(10**9))
    result = measure_compile(model, lambda: batches[next(counter) % len(batches)], steps=sizes.compile_steps,
                             backend=sizes.compile_backend)
    log(f"  compile ({sizes.compile_backend}): steady {result['speedup']:.2f}x, "
        f"cold {result['cold_first_step_s']:.1f} s")
    result["ratio_compiled_vs_eager_step_time"] = result["compiled_step_s"] / result["eager_step_s"]
    result["model"] = f"Net(d_in=32, d={sizes.d}, n_blocks=4), batch {sizes.batch}"
    return result


def bench_precision(sizes: Sizes, log: Callable[[str], None]) -> dict[str, Any]:
    from course_lib.models import Net
    from course_lib.perf.precision import compare_precisions

    device = pick_device("auto")
    precisions = ("fp32", "bf16") if device.type != "cuda" else ("fp32", "bf16", "fp16")

    def make_model() -> torch.nn.Module:
        torch.manual_seed(0)
        return Net(d_in=32, d=sizes.d * 2, n_blocks=4, n_out=10, p=0.0)

    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(sizes.batch * 2, 32, generator=g), torch.randint(0, 10, (sizes.batch * 2,), generator=g))
            for _ in range(4)]
    rows = compare_precisions(make_model, lambda: data, device=device, steps=max(3, sizes.steps // 2),
                              precisions=precisions)
    bf16 = next(r for r in rows if r["precision"] == "bf16")
    log(f"  precision: bf16 step time {bf16['step_time_vs_fp32']:.2f}x fp32")
    return {"device": str(device), "rows": rows, "ratio_bf16_vs_fp32_step_time": bf16["step_time_vs_fp32"],
            "model": f"Net(d_in=32, d={sizes.d * 2}, n_blocks=4), batch {sizes.batch * 2}"}


# ------------------------------------------------------------------------------------------- (d) GPU only
def bench_gpt_mfu(sizes: Sizes, log: Callable[[str], None], peak_tflops: float | None) -> dict[str, Any]:
    """GPT-2 small (or the tiny GPT for ``--tiny``): tokens/s and MFU, bf16 + compile vs eager vs fp32.

    See :mod:`course_lib.perf.mfu` for the model, the contenders, the FLOP count and the peak table.
    """
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA GPU: tokens/s and MFU are reported on a GPU only"}
    from course_lib.perf.mfu import CONTENDERS, RECIPE, GPTBenchConfig, run_gpt_bench

    cfg = GPTBenchConfig(model=sizes.gpt_model, warmup_steps=10 if sizes.gpt_model == "gpt2-small" else 2,
                         timed_steps=sizes.gpt_steps, rounds=min(5, sizes.gpt_steps),
                         contenders=CONTENDERS + RECIPE)
    result = run_gpt_bench(cfg, torch.device("cuda"), peak_tflops=peak_tflops, log=log)
    # MFU against what this GPU's matmuls really reach too (lesson 14), beside the datasheet's figure.
    from course_lib.perf.ceiling import PRECISION_DTYPES, cached_ceiling

    ceiling = cached_ceiling("cuda", progress=False)
    result["measured_peaks"] = dict(ceiling.matmul)
    for row in result["rows"]:
        peak = ceiling.peak(PRECISION_DTYPES.get(row["precision"], "float32"))
        row["mfu_measured"] = row["tokens_per_s"] * result["flops_per_token"] / peak
    head = result["rows"][0]
    log(f"  GPT: {head['contender']} {head['tokens_per_s']:,.0f} tokens/s"
        + (f", MFU {head['mfu']:.1%}" if head["mfu"] is not None else ""))
    return result


# ------------------------------------------------------------------------------------------------- report
def _fmt(x: Any, spec: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def _met(flag: Any) -> str:
    return "-" if flag is None else ("met" if flag else "NOT met")


def _range(low: float, high: float, spec: str) -> str:
    return f"{format(low, spec)} to {format(high, spec)}"


def _rows_loops(a: dict[str, Any]) -> list[str]:
    rows = []
    for label, c in a["cases"].items():
        low, high = c["ratio_train_vs_minimal_quartiles"]
        over = {k: f"{v['median']:+.3f} ({_range(v['low'], v['high'], '+.3f')})" for k, v in c["overhead_ms"].items()}
        rows.append(f"| (a) {label}: `train()` step time / minimal loop (quartiles {_range(low, high, '.3f')}) | "
                    f"{_fmt(c['ratio_train_vs_minimal'], '.3f')}x | <= {a['goal_train_vs_minimal']:.2f}x | "
                    f"{_met(c['met_train_vs_minimal'])} |")
        rows.append(f"| (a) {label}: ms per step above the minimal loop, `train()` {over['course_train']} vs "
                    f"Lightning {over['lightning']}; `train()`'s / Lightning's | "
                    f"{_fmt(c['overhead_train_vs_lightning'])} | <= {a['goal_overhead_vs_lightning']:.2f} | "
                    f"{_met(c['met_overhead_vs_lightning'])} |")
        rows.append(f"| (a) {label}: `train()` operator calls per step / minimal loop | "
                    f"{_fmt(c['ratio_ops_train_vs_minimal'], '.3f')}x | - | load-independent |")
    return rows


def _rows_overhead(a: dict[str, Any]) -> list[str]:
    rows = []
    for label, c in a["cases"].items():
        over = {k: f"{v['median']:+.3f} ms ({_range(v['low'], v['high'], '+.3f')})"
                for k, v in c["overhead_ms"].items()}
        low, high = c["ratio_train_vs_minimal_middle_half"]
        rows.append(f"| (a) {label}, per-step overhead above the minimal loop's {c['step_ms']['minimal_loop']:.3f} ms "
                    f"(start-up cancelled): `train()` {over['course_train']} vs Lightning {over['lightning']} | "
                    f"{c['overhead_ms']['course_train']['median']:+.3f} ms | <= {c['allowed_overhead_ms']:.3f} ms = "
                    f"max({a['goal_overhead_vs_lightning']:.2f} x Lightning's, {a['goal_overhead_of_step']:.0%} of the "
                    f"step) | {_met(c['met_overhead'])} |")
        rows.append(f"| (a) {label}, `train()` / minimal loop per step, paired per round (middle half "
                    f"{_range(low, high, '.3f')}) | {_fmt(c['ratio_train_vs_minimal'], '.3f')}x | "
                    f"<= {a['goal_train_vs_minimal']:.2f}x | {_met(c['met_ratio'])} |")
    return rows


def _rows_loaders(b: dict[str, Any]) -> list[str]:
    return [f"| (b) tuned loader (workers={b['tuned']['num_workers']}) / workers=0, steady samples/s | "
            f"{_fmt(b['ratio_tuned_vs_workers0'])}x | >= 1.7x | {_met(b['met'])} |",
            f"| (b) the same, worker start-up included | {_fmt(b['ratio_with_startup'])}x | - | - |"]


def _rows_in_memory(im: dict[str, Any]) -> list[str]:
    return [f"| (b) DeviceBatcher / DataLoader(TensorDataset), samples/s | "
            f"{_fmt(im['ratio_devicebatcher_vs_dataloader'])}x | - | same work: gather + normalise |",
            f"| (b) DeviceBatcher with crop/flip on the device / DataLoader(TensorDataset, no augmentation) | "
            f"{_fmt(im['ratio_devicebatcher_augmented_vs_dataloader'])}x | - | augmented side does more |"]


def _rows_compile(c: dict[str, Any]) -> list[str]:
    return [f"| (c) compiled / eager steady-state step time ({c['backend']}) | "
            f"{_fmt(c['ratio_compiled_vs_eager_step_time'])}x | - | - |",
            f"| (c) cold first compiled step / eager step | {_fmt(c['cold_first_step_s'] / c['eager_step_s'], '.0f')}x "
            f"({_fmt(c['cold_first_step_s'], '.1f')} s) | - | - |"]


def _rows_precision(p: dict[str, Any]) -> list[str]:
    return [f"| (c) bf16 / fp32 step time on {p['device']} | {_fmt(p['ratio_bf16_vs_fp32_step_time'])}x | - | - |"]


def _rows_gpu(d: dict[str, Any]) -> list[str]:
    if "skipped" in d:
        return [f"| (d) GPT tokens/s, MFU | skipped | - | {d['skipped']} |"]
    rows = []
    for row in d["rows"]:
        mfu_text = _fmt(row["mfu"], ".1%") if row["mfu"] is not None else "-"
        rows.append(f"| (d) {d['model']} on {d['gpu']}, {row['contender']}: {row['tokens_per_s']:,.0f} tokens/s, "
                    f"MFU {mfu_text}; tokens/s vs {d['rows'][0]['contender']} | {_fmt(row['vs_first'])}x | - | "
                    f"{d['peak_source']} |")
    rows += [f"| (d) {name} | error | - | {err} |" for name, err in d.get("failed", {}).items()]
    rows += [f"| (d) {name} | skipped | - | {why} |" for name, why in d.get("skipped_contenders", {}).items()]
    return rows


def _details_loops(a: dict[str, Any]) -> list[str]:
    lines = []
    for label, c in a["cases"].items():
        ops = c["aten_calls_per_step"]
        lines.append(
            f"(a) {label}: {c['model']}, {c['steps']} steps x {c['reps']} repetitions, {c['clock']} clock, the "
            "order reversed every "
            "other repetition; step time = median gap between batch requests within a run; ratio and overhead per "
            "repetition (contenders back to back), then the median and quartiles over the repetitions. Median "
            "step ms: " + ", ".join(f"{k} {v:.3f}" for k, v in c["step_ms"].items()) + "; per repetition: " +
            "; ".join(f"{k} " + ", ".join(f"{t:.3f}" for t in v) for k, v in c["all_step_ms"].items()) +
            f". Operator calls per step (profiler): train() {ops['course_train']:.0f} vs minimal loop "
            f"{ops['minimal_loop']:.0f}: train()'s extra calls count each group's targets (exact accumulation), "
            "divide the summed loss by that count and keep the loss for the log line.")
    return lines


def _details_overhead(a: dict[str, Any]) -> list[str]:
    lines = []
    for label, c in a["cases"].items():
        n, n2 = c["steps"]
        clock_name = {"wall": "wall-clock", "cpu": "this process's CPU"}[c["quantity"]]
        others = c.get("others_cores")
        others = "" if others is None else f"; other programs used {others:.1f} cores meanwhile"
        lines.append(
            f"(a) per-step overhead, {label}: {c['model']}; each round runs every contender for {n} and {n2} steps "
            f"(a log line every {c['log_every']} steps) and keeps (time for {n2} - time for {n}) / {n}, so set-up and "
            f"the final evaluation cancel; {c['rounds']} rounds, the order reversed every other one, {clock_name} "
            f"time{others}. Overheads and ratios are paired per round, then the median and middle half. Median ms "
            "per step: " + ", ".join(f"{k} {v:.3f}" for k, v in c["step_ms"].items()) + "; per round: "
            + "; ".join(f"{k} " + ", ".join(f"{t:.3f}" for t in v) for k, v in c["all_step_ms"].items())
            + ". Python function calls per step (counted, load-independent): "
            + ", ".join(f"{k} {v:.0f}" for k, v in c["python_calls_per_step"].items()) + ".")
    return lines


def _details_loaders(b: dict[str, Any]) -> list[str]:
    return [f"(b) {b['dataset']}; batch {b['batch_size']}, {b['n_batches']} batches; samples/s: " +
            ", ".join(f"{k} {v:.0f}" for k, v in b["samples_per_s"].items()) + f". {b['note']}."]


def _details_in_memory(im: dict[str, Any]) -> list[str]:
    return [f"(b) in memory, {im['dataset']}: samples/s " +
            ", ".join(f"{k} {v:.0f}" for k, v in im["samples_per_s"].items()) +
            f". Why workers do not help here: {im['why_workers_do_not_help']}"]


def _details_compile(c: dict[str, Any]) -> list[str]:
    fallback = f"; fallback: {c['fallback_reason']}" if c["fallback_reason"] else ""
    return [f"(c) compile: {c['model']}, mode {c['mode']}, eager {1000 * c['eager_step_s']:.2f} ms vs compiled "
            f"{1000 * c['compiled_step_s']:.2f} ms per step; cold first step {c['cold_first_step_s']:.1f} s{fallback}."]


def _details_precision(p: dict[str, Any]) -> list[str]:
    return [f"(c) precision: {p['model']}: " + "; ".join(
        f"{row['precision']} {row['step_ms']:.2f} ms/step, final loss {row['final_loss']:.4f}"
        for row in p["rows"]) + "."]


def _details_gpu(d: dict[str, Any]) -> list[str]:
    if "skipped" in d:
        return []
    return [f"(d) {d['model']}: {d['n_params_non_embedding'] / 1e6:.1f} M parameters without position embeddings, "
            f"batch {d['batch']} x {d['seq_len']} tokens, {d['warmup_steps']} warm-up steps, {d['rounds']} interleaved "
            f"rounds of {d['steps_per_round']} steps; FLOPs/token = 6N + 12 L H Q T = {d['flops_per_token'] / 1e9:.3f} "
            f"GFLOP; peak: {d['peak_source']}. " + " ".join(d["verdicts"])]


# The sections `--only` can name, in the order they run.
SECTIONS = ("loops", "overhead", "loaders", "in_memory", "compile", "precision", "gpu")
# Each section's table rows and detail lines, in the order of the table.
SECTION_TEXT: dict[str, tuple[Callable[[dict[str, Any]], list[str]], Callable[[dict[str, Any]], list[str]]]] = {
    "training_loops": (_rows_loops, _details_loops),
    "step_overhead": (_rows_overhead, _details_overhead),
    "loaders": (_rows_loaders, _details_loaders),
    "in_memory": (_rows_in_memory, _details_in_memory),
    "compile": (_rows_compile, _details_compile),
    "precision": (_rows_precision, _details_precision),
    "gpu_gpt": (_rows_gpu, _details_gpu),
}


def _header(report: dict[str, Any]) -> list[str]:
    m = report["machine"]
    gpu = f" ({m['gpu']})" if m.get("gpu") else ""
    return [
        "# Benchmark table", "",
        f"Measured {m['date']} with `python -m course_lib bench {' '.join(report['argv'])}` (preset "
        f"`{report['preset']}`). All figures are ratios or differences of runs made side by side in this one run, "
        "contenders interleaved, median of the repetitions (quartiles in brackets).", "",
        f"Machine: {m['cpu']}, {m['cores']} usable cores, {m['os']}, Python {m['python']}, torch {m['torch']}, "
        f"{m['torch_threads']} thread(s), device `{m['device']}`{gpu}. Load average (1, 5, 15 min) at start: "
        f"{m.get('load_average')}, at the end: {report.get('load_average_end')}. " + report["shared_note"], "",
        "| what | ratio | goal | status |", "|---|---|---|---|",
    ]


def to_markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown table (one or more rows per section) followed by the details of each section."""
    results = report["results"]
    rows, details = [], []
    for key, (section_rows, section_details) in SECTION_TEXT.items():
        if results.get(key):
            rows += section_rows(results[key])
            details += section_details(results[key])
    rows += [f"| {name} | error | - | {err} |" for name, err in report.get("errors", {}).items()]
    return "\n".join(_header(report) + rows + ["", "## Details", ""] + details) + "\n"


def run_bench(preset: str = "quick", *, sections: Sequence[str] = SECTIONS, peak_tflops: float | None = None,
              log: Callable[[str], None] = print, argv: Sequence[str] = ()) -> dict[str, Any]:
    sizes = PRESETS[preset]
    report: dict[str, Any] = {
        "preset": preset, "argv": list(argv), "machine": machine(), "sizes": sizes.__dict__, "results": {},
        "errors": {},
        "shared_note": "The machine may be shared with other work while measuring: ratios of interleaved runs are "
                       "robust to that; absolute times are not.",
    }
    jobs: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
        "loops": ("training_loops", lambda: bench_training_loops(sizes, log)),
        "overhead": ("step_overhead", lambda: bench_step_overhead(sizes, log)),
        "loaders": ("loaders", lambda: bench_loaders(sizes, log)),
        "in_memory": ("in_memory", lambda: bench_in_memory(sizes, log)),
        "compile": ("compile", lambda: bench_compile(sizes, log)),
        "precision": ("precision", lambda: bench_precision(sizes, log)),
        "gpu": ("gpu_gpt", lambda: bench_gpt_mfu(sizes, log, peak_tflops)),
    }
    for section in sections:
        key, job = jobs[section]
        log(f"[bench] {key} ...")
        t0 = clock.now()
        try:
            report["results"][key] = job()
        except Exception as exc:
            report["errors"][key] = f"{type(exc).__name__}: {exc}"
            log(f"  {key} failed: {report['errors'][key]}")
        log(f"  ({clock.now() - t0:.1f} s)")
    report["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return report


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = CommandParser(prog="python -m course_lib bench", description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="fewer steps and repetitions (a few minutes on 2 cores)")
    size.add_argument("--tiny", action="store_true", help="wiring check only: tiny sizes, numbers are meaningless")
    parser.add_argument("--out", default="benchmarks/results", help="folder for latest.md and latest.json")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's dense bf16 (fp16 before Ampere) peak TFLOP/s for MFU, when it is not in "
                             "the built-in table")
    parser.add_argument("--clock", choices=sorted(STEP_CLOCKS), default="wall",
                        help="section (a)'s step clock: wall time, or the training thread's CPU time (needs "
                             "--threads 1; steadier on a machine shared with other work)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice). On a machine shared with other work, "
                             "1 avoids the stalls of oversubscribed OpenMP threads spinning for busy cores")
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads={args.threads} must be >= 1")
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu needs --threads 1: the CPU time of other intra-op threads is not counted")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        parser.error(f"--peak-tflops={args.peak_tflops} must be > 0")
    preset = "tiny" if args.tiny else "quick" if args.quick else "full"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sections = args.only or list(SECTIONS)
    global step_clock
    previous_threads, previous_clock = torch.get_num_threads(), step_clock
    step_clock = args.clock
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        report = run_bench(preset, sections=sections, peak_tflops=args.peak_tflops, argv=argv)
    finally:
        torch.set_num_threads(previous_threads)  # callers (notebooks, tests) keep their own setting
        step_clock = previous_clock
    atomic.write_text(out / "latest.json", json.dumps(report, indent=2, default=str) + "\n")
    atomic.write_text(out / "latest.md", to_markdown(report))
    print(to_markdown(report))
    print(f"written: {out / 'latest.md'}, {out / 'latest.json'}")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
