"""The training loop: every concern of a real run, each in one place, readable top to bottom.

One optimizer step of :func:`train` (:func:`training_steps`):

1. set the learning rate of every parameter group from the step number (:func:`set_lr`);
2. take ``accum`` micro-batches, count their targets, forward/backward each (``backward_group``);
3. :func:`optimizer_step`: with fp16, ``scaler.unscale_`` first; measure the gradient norm *after* unscaling and
   clip it; step (``scaler.step`` + ``scaler.update`` with fp16), then ``zero_grad(set_to_none=True)``;
4. remember the step's loss for the log (:class:`LogWindow`: a list append, no device work).

The hot path does only what a hand-written loop does: nothing calls ``.item()`` (which waits for the GPU) except
at the ``log_every`` and ``eval_every`` boundaries, the GradScaler is not called when it is disabled (fp32, bf16),
and the parameter list for clipping is built once. Everything else a log line needs (examples seen, elapsed time,
the progress bar) is read or updated once per log line, not per step: per-step Python is what keeps a GPU idle
between kernel launches (``python -m course_lib bench --only overhead`` measures it against a hand-written loop).

Every ``eval_every`` steps (and at the end) the model is evaluated and a checkpoint is written
(:func:`evaluate_and_checkpoint`); ``train(..., resume=True)`` continues from it exactly where the run stopped.

Metrics go three ways: the returned history (a list of dicts), ``<out>/metrics.jsonl`` (one JSON object per
line; rank 0 only) and a tqdm progress bar (rank 0 only).

Nothing is lost or poisoned: the run folder is claimed first (a fresh run never silently replaces a run, and two
processes never write one folder: :mod:`~course_lib.train.rundir`); a loss or gradient norm that turns ``inf``/``nan``
stops the run before anything non-finite is saved (:mod:`~course_lib.train.guard`); and when a run stops on an
error, ``metrics.jsonl`` is cut back to what the last checkpoint holds, so the two always agree.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from course_lib import atomic, clock
from course_lib.device import resolve_amp_dtype
from course_lib.distributed import all_reduce_sum, get_rank, get_world_size, unwrap
from course_lib.interrupts import ctrl_c_deferred
from course_lib.progress import tqdm
from course_lib.train.accumulate import backward_group
from course_lib.train.checkpoint import (
    atomic_write_text,
    hold_until_read,
    load_checkpoint,
    save_checkpoint,
    write_error,
)
from course_lib.train.compiling import maybe_compile
from course_lib.train.config import TrainConfig
from course_lib.train.evaluate import evaluate
from course_lib.train.guard import NonFiniteError, check_record, divergence_message, json_safe
from course_lib.train.optim import build_optimizer
from course_lib.train.rundir import run_folder
from course_lib.train.schedule import lr_at
from course_lib.train.stream import BatchStream

AUTO = "auto"  # ckpt_path="auto" means <cfg.out>/ckpt.pt
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = "ckpt.pt"
Batches = Iterable[Sequence[torch.Tensor]]

def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, numpy and torch (CPU and every GPU) in one call."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)

class MetricsLog:
    """The run's history in memory, mirrored to ``metrics.jsonl`` (one JSON object per line) on rank 0.

    Non-finite floats are stored as ``null`` (JSON has no NaN). :meth:`committed` marks what the last checkpoint
    holds; :meth:`roll_back` cuts the file and the history back to it (a truncation: it works on a full disk).
    """

    def __init__(self, path: Path | None, history: list[dict[str, Any]], *, fresh: bool) -> None:
        self.path = path
        self.history = history
        self._committed_records = len(history)
        self._committed_bytes = 0
        if path is not None:
            # A fresh run starts an empty file; a resumed run rewrites it from the checkpoint's history, dropping
            # lines the killed run wrote after its last checkpoint (they will be produced again, identically).
            lines = "" if fresh else "".join(json.dumps(r) + "\n" for r in history)
            atomic_write_text(path, lines)
            self._committed_bytes = len(lines.encode("utf-8"))

    def append(self, record: dict[str, Any]) -> None:
        record = json_safe(record)
        self.history.append(record)
        if self.path is not None:
            try:
                with atomic.open_append(self.path) as f:  # never through a planted link
                    f.write(json.dumps(record, allow_nan=False) + "\n")
            except OSError as exc:
                raise write_error(self.path, exc) from exc

    def committed(self) -> None:
        """The last checkpoint now holds the history up to here."""
        self._committed_records = len(self.history)
        if self.path is not None:
            self._committed_bytes = self.path.stat().st_size

    def roll_back(self) -> None:
        """Forget what came after the last checkpoint (best effort: called while handling another error)."""
        del self.history[self._committed_records:]
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.truncate(self.path, self._committed_bytes)


class LogWindow:
    """The steps since the last log line: their losses (device tensors) and target counts; examples and time.

    Adding a step is a list append and an integer addition: no device work and no host-device sync. The losses are
    summed, and read, once per log line by :meth:`close`, which also starts the next window: every rate is the
    rate of its own window. ``nan``/``inf`` survive the sum, so one bad step shows in the logged loss. The examples
    and the time are read at the window's two ends (the stream counts the samples it hands out), not per step.
    """

    def __init__(self, stream: BatchStream, world_size: int = 1) -> None:
        self.stream, self.world_size = stream, world_size
        self.restart()

    def restart(self) -> None:
        """Start an empty window now (after a log line, and after evaluation and checkpointing)."""
        self.losses: list[torch.Tensor] = []
        self.device_counts: list[torch.Tensor] = []  # target counts still on the device, read at close
        self.host_count = 0  # target counts already on the host
        self.start, self.start_samples = clock.now(), self.stream.samples

    def add(self, loss_sum: torch.Tensor, count: torch.Tensor | int) -> None:
        """One step: its loss summed over its targets and how many targets (a device tensor or an int)."""
        self.losses.append(loss_sum)
        if isinstance(count, int):
            self.host_count += count
        else:
            self.device_counts.append(count)

    def close(self) -> tuple[float, int, int, float]:
        """``(loss sum over all ranks, targets, examples over all ranks, seconds)`` of this window; the next one
        starts now."""
        loss_sum = float(all_reduce_sum(torch.stack(self.losses).sum()))  # the one host sync per log line
        targets = self.host_count + (int(torch.stack(self.device_counts).sum()) if self.device_counts else 0)
        seconds = max(clock.now() - self.start, 1e-9)
        examples = (self.stream.samples - self.start_samples) * self.world_size  # every rank takes as many
        self.restart()
        return loss_sum, targets, examples, seconds


@dataclass
class Run:
    """What one run holds, built once by :func:`train`, handed to each step."""

    cfg: TrainConfig
    device: torch.device
    amp_dtype: torch.dtype | None
    model: nn.Module  # the module whose state is saved (DDP-wrapped under torchrun)
    train_model: nn.Module  # the module that is called: ``model``, or its compiled version
    params: list[nn.Parameter]  # for clipping: listed once, not walked through the modules every step
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    stream: BatchStream
    val_loader: Batches
    ckpt: Path | None
    log: MetricsLog
    bar: tqdm
    world_size: int
    is_main: bool
    last_good: int | None  # the step of the last checkpoint written (or resumed from)

    def last_good_sentence(self) -> str:
        """What a divergence error says about the checkpoint on disk."""
        if self.ckpt is None:
            return "No checkpoint is written in this run (ckpt_path=None)."
        if self.last_good is None:
            return f"No checkpoint had been written yet ({self.ckpt} was not created)."
        return (f"The last good checkpoint, step {self.last_good}, is unchanged in {self.ckpt}; nothing after the "
                "divergence was saved.")

    def check(self, record: dict[str, Any], step: int) -> None:
        """Stop the run when ``record`` shows a divergence (:mod:`~course_lib.train.guard`)."""
        check_record(record, step=step, cfg=self.cfg, scaler_enabled=self.scaler.is_enabled(),
                     last_good=self.last_good_sentence())


def _default_ckpt_path(ckpt_path: str | Path | None, cfg: TrainConfig) -> Path | None:
    if ckpt_path is None:
        return None
    if isinstance(ckpt_path, str) and ckpt_path == AUTO:
        return Path(cfg.out) / CHECKPOINT_FILE
    return Path(ckpt_path)


def train(
    model: nn.Module,
    train_loader: Batches,
    val_loader: Batches,
    cfg: TrainConfig,
    device: torch.device | str | None = None,
    ckpt_path: str | Path | None = AUTO,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Train ``model`` for ``cfg.steps`` optimizer steps; return the history of logged metrics.

    Args:
        model: the model (plain, or already wrapped in DDP by :func:`course_lib.distributed.wrap_model`).
        train_loader / val_loader: iterables of ``(x, y)`` or ``(x, y, lengths)`` batches. A training loader built
            by ``course_lib.data.make_loader`` (a ``ResumableSampler``) resumes at the exact sample.
        cfg: the :class:`TrainConfig`; validated before anything happens.
        device: where to train (default: ``cfg.device`` resolved).
        ckpt_path: checkpoint file; ``"auto"`` = ``<cfg.out>/ckpt.pt``. ``None`` writes nothing at all
            (no checkpoint and no ``metrics.jsonl``): handy in notebooks and tests.
        resume: continue from ``ckpt_path`` (which must exist and match the config).
        overwrite: start fresh even though ``cfg.out`` already holds a run (its checkpoint and metrics are deleted).
            Without it (and without ``resume``) a folder holding a run is refused with a
            :class:`~course_lib.train.rundir.RunFolderError`.
        progress: show a progress bar (rank 0; in a terminal or a notebook, not when stderr is a pipe). ``False``
            hides it, as ``Trainer(enable_progress_bar=False)`` does (the benchmark's comparisons).

    Raises :class:`~course_lib.train.guard.NonFiniteError` when the run diverges (the last good checkpoint is kept)
    and :class:`~course_lib.train.checkpoint.WriteError` when a file cannot be written (disk full, read-only...).

    History records: train lines ``{"step", "loss", "lr", "grad_norm", "examples_per_s"}`` (plus
    ``"tokens_per_s"`` for text) and eval lines ``{"step", "val_loss", "val_acc"}``.

    Taught in lesson 04 (``notebooks/04_template.ipynb``).
    """
    cfg.validate()
    device = torch.device(device) if device is not None else cfg.torch_device()
    cfg = cfg.resolved(device)  # what the checkpoint stores: "cpu", "fp32"... not "auto"
    ckpt = _default_ckpt_path(ckpt_path, cfg)
    if resume and ckpt is None:
        raise ValueError("resume=True needs a checkpoint path (ckpt_path is None).")
    owns_files = ckpt is not None and get_rank() == 0
    folder = run_folder(cfg.out, ckpt, resume=resume, overwrite=overwrite) if owns_files else contextlib.nullcontext()
    with folder as claim:
        if claim is not None and overwrite and not resume:
            claim.start_fresh([ckpt, Path(cfg.out) / METRICS_FILE])
        run, start_step = build_run(model, train_loader, val_loader, cfg, device, ckpt, resume, progress=progress)
        try:
            with stops_between_steps():
                training_steps(run, start_step)
        except BaseException:
            run.log.roll_back()  # metrics.jsonl never gets ahead of the last checkpoint
            raise
        finally:
            run.bar.close()
        return run.log.history


def build_run(model: nn.Module, train_loader: Batches, val_loader: Batches, cfg: TrainConfig, device: torch.device,
              ckpt: Path | None, resume: bool, progress: bool = True) -> tuple[Run, int]:
    """The run's components (optimizer, scaler, data stream, log, progress bar), restored when resuming."""
    rank, world_size = get_rank(), get_world_size()
    is_main = rank == 0
    amp_dtype = resolve_amp_dtype(cfg.amp_dtype, device)
    model.to(device)
    optimizer = build_optimizer(unwrap(model), cfg)
    # The GradScaler only does something for fp16 (bf16 and fp32 have fp32's exponent range: no underflow).
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    stream = BatchStream(train_loader)
    seed_everything(cfg.seed + rank)  # each rank its own dropout stream; the same stream on every run
    start_step, history = 0, []
    if resume:
        state = load_checkpoint(
            ckpt, model=model, optimizer=optimizer, scaler=scaler, config=cfg,  # type: ignore[arg-type]
            restore_rng=world_size == 1,  # the file holds rank 0's RNG; other ranks re-seed below
        )
        start_step, history = state["step"], list(state["history"])
        if state.get("data") is not None:
            stream.load_state_dict(state["data"])
        if world_size > 1:
            seed_everything(cfg.seed + rank + 1_000_003 * start_step)
    metrics_path = Path(cfg.out) / METRICS_FILE if (ckpt is not None and is_main) else None
    # disable=None: shown in a terminal and in a notebook, hidden when stderr is a pipe (torchrun, CI logs), where
    # every redraw would arrive as one more line; the log lines carry the same information there.
    bar = tqdm(total=cfg.steps, initial=start_step, disable=None if is_main and progress else True, mininterval=2.0,
               desc="train", unit="step")
    run = Run(cfg=cfg, device=device, amp_dtype=amp_dtype, model=model, train_model=maybe_compile(model, cfg.compile),
              params=list(model.parameters()), optimizer=optimizer, scaler=scaler, stream=stream,
              val_loader=val_loader, ckpt=ckpt, log=MetricsLog(metrics_path, history, fresh=not resume), bar=bar,
              world_size=world_size, is_main=is_main, last_good=start_step if resume else None)
    return run, start_step


def training_steps(run: Run, start_step: int) -> None:
    """Steps ``start_step .. cfg.steps - 1``: the loop itself (see the module docstring).

    Taught in lesson 04 (``notebooks/04_template.ipynb``).
    """
    cfg = run.cfg
    run.model.train()
    window = LogWindow(run.stream, run.world_size)
    for step in range(start_step, cfg.steps):
        raise_pending_stop()  # a Ctrl-C or SIGTERM under the command line lands here, between two steps
        lr = set_lr(run.optimizer, step, cfg)
        micro_batches = run.stream.next_group(cfg.accum)  # a group of one when there is no accumulation
        loss_sum, count = backward_group(run.train_model, micro_batches, run.device, amp_dtype=run.amp_dtype,
                                         scaler=run.scaler, world_size=run.world_size)
        window.add(loss_sum, count)
        grad_norm = optimizer_step(run.optimizer, run.scaler, run.params, cfg.clip)
        done = step + 1
        evaluate_now = done % cfg.eval_every == 0 or done == cfg.steps
        if done % cfg.log_every == 0 or evaluate_now:
            # Windows close at every checkpoint, so a resumed run averages over the same steps as an uninterrupted one.
            log_train_line(run, window, done, lr, grad_norm, text=micro_batches[0][1].dim() > 1)
        if evaluate_now:
            evaluate_and_checkpoint(run, done)
            window.restart()  # throughput excludes evaluation and saving


def set_lr(optimizer: torch.optim.Optimizer, step: int, cfg: TrainConfig) -> float:
    """Write the schedule's rate for ``step`` into every parameter group (a pure function: nothing to save).

    Taught in lesson 04 (``notebooks/04_template.ipynb``).
    """
    lr = lr_at(step, cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, params: list[nn.Parameter],
                   clip: float | None) -> torch.Tensor:
    """Unscale (fp16), measure and clip the gradient norm, step, zero the gradients; returns the norm (on device).

    The norm is measured after unscaling and before clipping; ``max_norm=inf`` still measures when clipping is off.

    Taught in lesson 04 (``notebooks/04_template.ipynb``).
    """
    if not scaler.is_enabled():  # fp32 and bf16: the plain step, no scaler calls at all
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip or math.inf)
        optimizer.step()
    else:
        scaler.unscale_(optimizer)  # true gradients from here on
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip or math.inf)
        scaler.step(optimizer)  # skipped by the scaler if fp16 gradients overflowed
        scaler.update()
    optimizer.zero_grad(set_to_none=True)  # frees the gradient memory until the next backward
    return grad_norm


def log_train_line(run: Run, window: LogWindow, done: int, lr: float, grad_norm: torch.Tensor, *, text: bool) -> None:
    """Close the window into one train record: checked by the guard, logged, shown on the bar (which moves here,
    once per log line, by the window's steps)."""
    loss_sum, targets, examples, seconds = window.close()
    record = {
        "step": done,
        "loss": loss_sum / max(targets, 1),
        "lr": lr,
        "grad_norm": float(grad_norm),
        "examples_per_s": examples / seconds,
    }
    if text:  # targets per position: report tokens too
        record["tokens_per_s"] = targets / seconds
    run.check(record, done)
    run.log.append(record)
    run.bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{lr:.2e}", refresh=False)
    run.bar.update(done - run.bar.n)


class Terminated(KeyboardInterrupt):
    """SIGTERM (what a cluster scheduler or a container sends before killing), raised where Ctrl-C raises
    KeyboardInterrupt: every Ctrl-C path (deferred around the checkpoint, metrics cut back, resume line) serves it."""


def _raise_stop(signum: int) -> None:
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


_stops: list[int] | None = None  # the signals received under stop_signals (None: not installed)
_between_steps = False  # True inside training_steps: a first stop waits for the step's end


@contextlib.contextmanager
def stop_signals(received: list[int]) -> Iterator[None]:
    """In the block, SIGINT raises KeyboardInterrupt and SIGTERM :class:`Terminated`; each is appended to ``received``.

    Inside :func:`training_steps` the first one is raised at the end of the current step instead: raised in the middle
    of fetching a batch, it cut the transfer from a loader worker and the worker printed a traceback after the
    run's last line. A second one raises at once (a step that hangs can still be stopped). The record also tells
    the command line that a failure which follows (a worker hit by the same signal) is part of the stop.
    Main thread only; the previous handlers come back at the end.
    """
    global _stops
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)
        if not (_between_steps and len(received) == 1):
            _raise_stop(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    outer, _stops = _stops, received
    try:
        yield
    finally:
        _stops = outer
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextlib.contextmanager
def stops_between_steps() -> Iterator[None]:
    """In the block, a first stop under :func:`stop_signals` waits for :func:`raise_pending_stop`."""
    global _between_steps
    outer, _between_steps = _between_steps, True
    try:
        yield
    finally:
        _between_steps = outer


def raise_pending_stop() -> None:
    """Raise the stop that :func:`stop_signals` held back until a step boundary, if there is one."""
    if _stops:
        _raise_stop(_stops[0])


def evaluate_and_checkpoint(run: Run, done: int) -> None:
    """Evaluate on the validation data, log it, and (rank 0) write the checkpoint.

    Taught in lesson 04 (``notebooks/04_template.ipynb``).
    """
    # evaluate() leaves the training RNG untouched: a resumed run draws the same numbers afterwards.
    val = evaluate(unwrap(run.model), run.val_loader, run.device, run.amp_dtype)
    record = {"step": done, "val_loss": val["loss"], "val_acc": val["acc"]}
    run.check(record, done)
    run.log.append(record)
    if run.is_main:
        run.bar.write(f"step {done}: val_loss {val['loss']:.4f}  val_acc {val['acc']:.3f}")
    if run.ckpt is None or not run.is_main:
        return
    run.stream.warn_if_inexact()
    # Ctrl-C waits until the checkpoint and the metrics file agree again: landing between the checkpoint's rename
    # and committed(), it would cut metrics.jsonl back behind the checkpoint just written.
    with ctrl_c_deferred():
        try:
            save_checkpoint(run.ckpt, model=run.model, optimizer=run.optimizer, scaler=run.scaler, step=done,
                            config=run.cfg, history=run.log.history, data_state=run.stream.state_dict())
        except NonFiniteError as exc:  # weights poisoned by a non-finite gradient between two log lines
            what = "model state"
            message = divergence_message(step=done, what=what, value=None, cfg=run.cfg, tensors=exc.tensors,
                                         last_good=run.last_good_sentence())
            raise NonFiniteError(message, step=done, what=what, value=None, tensors=exc.tensors) from None
        run.last_good = done
        run.log.committed()
    if done < run.cfg.steps:
        hold_until_read(run.ckpt, done)  # only under COURSE_CHECKPOINT_HANDSHAKE=1 (see checkpoint.py)
