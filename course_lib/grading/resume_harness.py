"""Kill a tiny training run and resume it with *given* checkpoint functions: the test bed of exercise 14.

A run continues exactly only if the checkpoint restores everything that shapes the next steps. This is the smallest
run in which each of those things matters:

* **model and optimizer state**: AdamW (its moments and step count change every update);
* **every global RNG**: dropout draws from torch's generator, each batch is scaled by ``random.uniform`` (Python's
  ``random``) and gets noise from ``np.random`` (numpy's global generator, whose state includes a cached Gaussian);
* **the data position**: a shuffled order (:class:`~course_lib.data.sampler.ResumableSampler`, a pure function of
  seed and epoch) read batch by batch, so a run stopped mid-epoch must continue mid-epoch;
* **the GradScaler**: enabled in fp32 with a scale that doubles every ``growth_interval`` steps. The scale is a power
  of two, so scaling and unscaling are exact and the losses do not depend on it: its state is observed on its own.

:func:`run` trains from scratch, or resumes with ``load(path, model=, optimizer=, scaler=, data=) -> step``, and
saves every ``save_every`` steps with ``save(path, model=, optimizer=, scaler=, data=, step=)``. Each call starts
like a fresh process (global RNGs seeded from the config), so an in-process interruption (``stop_after=k`` raises
:class:`Interrupted` after step ``k``) tests the same thing as a real kill; :func:`killed_run` does the real thing
on Linux: the run goes on in a child process that ``SIGKILL``s itself after step ``k``.

The run is bit-for-bit reproducible across processes (one intra-op thread while it runs), so the grader can compare
a learner's resumed losses, computed in the sandbox, with an uninterrupted run computed in the grader. The caller's
RNG states and thread count are restored afterwards.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import random
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from course_lib.data.sampler import ResumableSampler
from course_lib.train.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state

SaveFn = Callable[..., Any]
LoadFn = Callable[..., Any]
D_IN, D_OUT = 8, 4


@dataclass(frozen=True)
class HarnessConfig:
    """The tiny run. ``samples`` a multiple of ``batch``; with ``samples == batch`` and ``shuffle=False`` every step
    sees the same batch in the same order, so the data position cannot matter."""

    seed: int = 0
    steps: int = 10
    batch: int = 4
    samples: int = 20
    shuffle: bool = True
    save_every: int = 2
    dropout: float = 0.3
    augment: bool = True  # random.uniform scale and np.random noise per batch
    lr: float = 0.05
    width: int = 32
    init_scale: float = 2.0**8
    growth_interval: int = 3

    def __post_init__(self) -> None:
        if self.samples % self.batch or self.samples < self.batch:
            raise ValueError(f"HarnessConfig: samples={self.samples} must be a positive multiple of batch={self.batch}")
        if self.steps < 1 or self.save_every < 1:
            raise ValueError(f"HarnessConfig: steps={self.steps} and save_every={self.save_every} must be >= 1")

    def last_save_before(self, step: int) -> int:
        """The step of the newest checkpoint a run stopped after ``step`` has left (0: none)."""
        return step - step % self.save_every


class Interrupted(Exception):
    """Raised by :func:`run` after step ``stop_after``, as if the process had died there."""


class BatchStream:
    """Batches of indices in a shuffled order that is a pure function of (seed, epoch); tracks its position.

    ``epoch`` and ``position`` (samples already consumed in this epoch) are all it needs to continue:
    :meth:`state_dict` / :meth:`load_state_dict` save and restore them.
    """

    def __init__(self, samples: int, batch: int, seed: int, shuffle: bool = True) -> None:
        self.batch = batch
        self.sampler = ResumableSampler(samples, shuffle=shuffle, seed=seed, yield_seeds=False)
        self.epoch = 0
        self.position = 0
        self._iterator: Iterator[int] | None = None

    def next_batch(self) -> torch.Tensor:
        """The next ``batch`` indices; starts the next epoch when this one is used up."""
        if self.position >= self.sampler.n:
            self.epoch, self.position = self.epoch + 1, 0
            self._iterator = None
        if self._iterator is None:
            self.sampler.set_epoch(self.epoch)
            self.sampler.set_position(self.position)
            self._iterator = iter(self.sampler)
        indices = [next(self._iterator) for _ in range(self.batch)]
        self.position += self.batch
        return torch.tensor(indices)

    def state_dict(self) -> dict[str, int]:
        """Where the data order stands: the epoch and the samples consumed in it."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a :meth:`state_dict` (the next batch is the one after the saved position)."""
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._iterator = None


@dataclass
class Parts:
    """What one run segment trains: the objects the checkpoint functions receive."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    data: BatchStream
    inputs: torch.Tensor
    targets: torch.Tensor

    def objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "scaler": self.scaler, "data": self.data}


@dataclass
class Segment:
    """One process's share of a run: the step it started from, its losses (step -> loss), the final state."""

    start: int
    losses: dict[int, float] = field(default_factory=dict)
    params: list[torch.Tensor] = field(default_factory=list)
    scale: float = 0.0


def seed_everything(seed: int) -> None:
    """What a fresh process of this run does first: seed torch, numpy and Python's ``random``."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def build(cfg: HarnessConfig) -> Parts:
    """Data, model, AdamW, an enabled GradScaler and the batch stream, all from ``cfg.seed`` (global RNGs seeded)."""
    g = torch.Generator().manual_seed(cfg.seed + 7919)
    inputs = torch.randn(cfg.samples, D_IN, generator=g)
    targets = torch.randint(0, D_OUT, (cfg.samples,), generator=g)
    seed_everything(cfg.seed)
    # One normal drawn at start, then an even number per step: numpy's generator always holds a cached Gaussian (the
    # second of a pair), so a checkpoint that restores numpy's state without it resumes with other noise.
    np.random.standard_normal()
    model = nn.Sequential(nn.Linear(D_IN, cfg.width), nn.ReLU(), nn.Dropout(cfg.dropout), nn.Linear(cfg.width, D_OUT))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=cfg.init_scale, growth_interval=cfg.growth_interval)
    return Parts(model, optimizer, scaler, BatchStream(cfg.samples, cfg.batch, cfg.seed, cfg.shuffle), inputs, targets)


def train_step(parts: Parts, augment: bool) -> float:
    """One scaled AdamW step on the next batch; returns the loss (its exact float value)."""
    index = parts.data.next_batch()
    x, y = parts.inputs[index], parts.targets[index]
    if augment:
        x = x * random.uniform(0.8, 1.2) + torch.from_numpy(np.random.standard_normal(x.shape)).float() * 0.1
    parts.model.train()
    loss = nn.functional.cross_entropy(parts.model(x), y)
    parts.scaler.scale(loss).backward()
    parts.scaler.step(parts.optimizer)
    parts.scaler.update()
    parts.optimizer.zero_grad(set_to_none=True)
    return loss.item()


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """One intra-op thread (bit-identical results in any process), and the caller's RNGs and threads kept."""
    threads, saved = torch.get_num_threads(), rng_state()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        set_rng_state(saved)


def run(
    cfg: HarnessConfig,
    path: str | Path | None = None,
    save: SaveFn | None = None,
    load: LoadFn | None = None,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> Segment:
    """Train ``cfg`` from scratch (or from ``load(path, ...)`` when ``resume``) to ``cfg.steps``.

    Saves with ``save(path, ...)`` after every ``save_every``-th step; raises :class:`Interrupted` after step
    ``stop_after``; calls ``on_step(step, loss)`` after each step. ``load`` must return the step to continue from.
    """
    with isolated():
        parts = build(cfg)
        step = 0
        if resume:
            if load is None or path is None:
                raise ValueError("run(resume=True) needs `load` and `path`")
            step = load(path, **parts.objects())
            if not isinstance(step, int) or isinstance(step, bool):
                raise TypeError(f"load_checkpoint should return the step to continue from (an int), got {step!r}")
        segment = Segment(start=step)
        while step < cfg.steps:
            loss = train_step(parts, cfg.augment)
            step += 1
            segment.losses[step] = loss
            if on_step is not None:
                on_step(step, loss)
            if save is not None and path is not None and step % cfg.save_every == 0:
                save(path, step=step, **parts.objects())
            if stop_after is not None and step >= stop_after:
                raise Interrupted(f"interrupted after step {step}")
        segment.params = [p.detach().clone() for p in parts.model.parameters()]
        segment.scale = float(parts.scaler.get_scale())
        return segment


@dataclass
class ResumedRun:
    """An interrupted run and its resumption: losses before the interruption, then from the resumed step on."""

    before: dict[int, float]
    resumed: Segment
    how: str  # "SIGKILL" or "exception"


def _check_stop(cfg: HarnessConfig, step: int) -> None:
    if not isinstance(step, int) or not 0 < step < cfg.steps:
        raise ValueError(f"interrupting after step {step!r}: choose a step before the end of the run "
                         f"(1 to {cfg.steps - 1})")


def interrupted_run(cfg: HarnessConfig, path: str | Path, save: SaveFn, load: LoadFn, stop_after: int) -> ResumedRun:
    """Run with ``save`` until step ``stop_after`` (then :class:`Interrupted`), and resume with ``load``."""
    _check_stop(cfg, stop_after)
    before: dict[int, float] = {}
    try:
        run(cfg, path, save, load, stop_after=stop_after, on_step=before.__setitem__)
    except Interrupted:
        pass
    return ResumedRun(before, run(cfg, path, save, load, resume=True), "exception")


def _child(cfg: HarnessConfig, path: str, save: SaveFn, load: LoadFn, kill_after: int, out: Any) -> None:
    """Forked child: train, report each loss through the pipe, and SIGKILL itself after step ``kill_after``."""
    def report(step: int, loss: float) -> None:
        out.send((step, loss))
        if step >= kill_after:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no flush: as if the machine had cut the process

    if not _autograd_works_here():
        out.send(("no autograd", "this process has started autograd's device threads (torch.compile does)"))
        os._exit(1)
    try:
        run(cfg, path, save, load, on_step=report)
    except BaseException as exc:
        out.send(("error", f"{type(exc).__name__}: {exc}"))
        os._exit(1)


def _autograd_works_here() -> bool:
    """Whether this (forked) process can run a backward pass: torch refuses in a child forked from a process whose
    autograd engine has started its device threads, which a ``torch.compile`` call does even on a CPU-only machine."""
    try:
        torch.ones(1, requires_grad=True).sum().backward()
    except RuntimeError:
        return False
    return True


def _importable(fn: Callable[..., Any]) -> bool:
    """Whether a fresh process can import ``fn`` by name (a notebook's ``__main__`` functions cannot)."""
    if getattr(fn, "__module__", "__main__") == "__main__":
        return False
    try:
        pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True


def killed_run(cfg: HarnessConfig, path: str | Path, save: SaveFn, load: LoadFn, kill_after: int) -> ResumedRun:
    """Like :func:`interrupted_run`, but the first part runs in a forked child killed with SIGKILL after step
    ``kill_after``; the resumption runs here. Off Linux it falls back to the in-process interrupt (Windows has no
    ``fork``; on macOS a forked child of a process that has used system frameworks may crash), and so it does when
    a forked child cannot run autograd (this process has compiled something: see :func:`_autograd_works_here`).

    The save/load functions need not be importable: a forked child inherits them (a notebook's functions work).
    Importable ones (the reference, a module's) start from a clean fork server instead: forking a process that has
    already run autograd's worker threads is an error, and a test process usually has.
    """
    if not sys.platform.startswith("linux"):
        return interrupted_run(cfg, path, save, load, kill_after)
    _check_stop(cfg, kill_after)
    if _importable(save) and _importable(load):
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])  # takes effect when the server starts (once)
    else:
        context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(cfg, str(path), save, load, kill_after, writer), daemon=True)
    child.start()
    writer.close()
    before: dict[int, float] = {}
    error = None
    while True:
        try:
            step, value = reader.recv()
        except EOFError:
            break
        if step == "error":
            error = value
        elif step == "no autograd":
            child.join()
            reader.close()
            return interrupted_run(cfg, path, save, load, kill_after)
        else:
            before[step] = value
    child.join()
    reader.close()
    not_attempted = "NotImplementedError: Exercise "
    if error is not None and error.startswith(not_attempted):  # a blank exercise: say so, as the function would
        raise NotImplementedError(error.removeprefix("NotImplementedError: "))
    if error is not None or child.exitcode != -signal.SIGKILL:
        raise RuntimeError(f"the run to be killed ended on its own (exit code {child.exitcode}) after step "
                           f"{max(before, default=0)}: {error or 'no error reported'}")
    return ResumedRun(before, run(cfg, path, save, load, resume=True), "SIGKILL")


# ------------------------------------------------------------------------------------------------ the reference
def reference_save(path: str | Path, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                   scaler: torch.amp.GradScaler, data: BatchStream, step: int) -> None:
    """The course's answer: :func:`course_lib.train.checkpoint.save_checkpoint` (atomic, every RNG) + data position."""
    save_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler, step=step, data_state=data.state_dict())


def reference_load(path: str | Path, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                   scaler: torch.amp.GradScaler, data: BatchStream) -> int:
    """Restore what :func:`reference_save` wrote; returns the step to continue from."""
    payload = load_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler)
    data.load_state_dict(payload["data"])
    return int(payload["step"])


def uninterrupted(cfg: HarnessConfig) -> Segment:
    """The run nobody killed (no checkpoints written): what a resumed run must reproduce bit for bit."""
    return run(cfg)

