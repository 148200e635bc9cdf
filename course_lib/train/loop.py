"""The training loop: every concern of a real run, each in one place, readable top to bottom.

One optimizer step of :func:`train`:

1. set the learning rate of every parameter group from the step number (``lr_at``);
2. take ``accum`` micro-batches, count their targets, forward/backward each (``backward_group``);
3. ``scaler.unscale_`` (a no-op unless fp16), measure the gradient norm *after* unscaling and clip it;
4. ``scaler.step`` + ``scaler.update``, then ``zero_grad(set_to_none=True)``.

The loss is accumulated *on the device*: nothing calls ``.item()`` (which waits for the GPU) except at the
``log_every`` and ``eval_every`` boundaries. Every ``eval_every`` steps (and at the end) the model is evaluated and
a checkpoint is written; ``train(..., resume=True)`` continues from it exactly where the run stopped.

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
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from course_lib.device import resolve_amp_dtype
from course_lib.distributed import all_reduce_sum, get_rank, get_world_size, unwrap
from course_lib.train.accumulate import backward_group
from course_lib.train.checkpoint import atomic_write_text, load_checkpoint, save_checkpoint, write_error
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


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, numpy and torch (CPU and every GPU) in one call."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def maybe_compile(model: nn.Module, enabled: bool) -> nn.Module:
    """``torch.compile`` the model when ``enabled`` (with an honest eager fallback where compile cannot work)."""
    if not enabled:
        return model
    try:
        from course_lib.perf.compile import compile_or_eager
    except ImportError:
        return torch.compile(model)
    compiled, _reason = compile_or_eager(model)
    return compiled


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
                with open(self.path, "a", encoding="utf-8") as f:
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


def _default_ckpt_path(ckpt_path: str | Path | None, cfg: TrainConfig) -> Path | None:
    if ckpt_path is None:
        return None
    if isinstance(ckpt_path, str) and ckpt_path == AUTO:
        return Path(cfg.out) / CHECKPOINT_FILE
    return Path(ckpt_path)


def train(
    model: nn.Module,
    train_loader: Iterable[Sequence[torch.Tensor]],
    val_loader: Iterable[Sequence[torch.Tensor]],
    cfg: TrainConfig,
    device: torch.device | str | None = None,
    ckpt_path: str | Path | None = AUTO,
    resume: bool = False,
    overwrite: bool = False,
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

    Raises :class:`~course_lib.train.guard.NonFiniteError` when the run diverges (the last good checkpoint is kept)
    and :class:`~course_lib.train.checkpoint.WriteError` when a file cannot be written (disk full, read-only...).

    History records: train lines ``{"step", "loss", "lr", "grad_norm", "examples_per_s"}`` (plus
    ``"tokens_per_s"`` for text) and eval lines ``{"step", "val_loss", "val_acc"}``.
    """
    cfg.validate()
    device = torch.device(device) if device is not None else cfg.torch_device()
    cfg = cfg.resolved(device)  # what the checkpoint stores: "cpu", "fp32"... not "auto"
    amp_dtype = resolve_amp_dtype(cfg.amp_dtype, device)
    rank, world_size = get_rank(), get_world_size()
    is_main = rank == 0
    ckpt = _default_ckpt_path(ckpt_path, cfg)
    if resume and ckpt is None:
        raise ValueError("resume=True needs a checkpoint path (ckpt_path is None).")
    owns_files = ckpt is not None and is_main
    folder = run_folder(cfg.out, ckpt, resume=resume, overwrite=overwrite) if owns_files else contextlib.nullcontext()
    with folder as claim:
        if claim is not None and overwrite and not resume:
            claim.start_fresh([ckpt, Path(cfg.out) / METRICS_FILE])
        return _train(model, train_loader, val_loader, cfg, device, ckpt, resume, amp_dtype, rank, world_size)


def _train(model: nn.Module, train_loader: Iterable[Sequence[torch.Tensor]],
           val_loader: Iterable[Sequence[torch.Tensor]], cfg: TrainConfig, device: torch.device, ckpt: Path | None,
           resume: bool, amp_dtype: torch.dtype | None, rank: int, world_size: int) -> list[dict[str, Any]]:
    is_main = rank == 0
    # --- components: model, optimizer, scaler, data stream ----------------------------------------------------
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
    log = MetricsLog(metrics_path, history, fresh=not resume)
    train_model = maybe_compile(model, cfg.compile)

    last_good = {"step": start_step if resume else None}
    # disable=None: shown in a terminal and in a notebook, hidden when stderr is a pipe (torchrun, CI logs), where
    # every redraw would arrive as one more line; the log lines carry the same information there.
    bar = tqdm(total=cfg.steps, initial=start_step, disable=None if is_main else True, mininterval=2.0, desc="train",
               unit="step")
    try:
        _loop(model, train_model, optimizer, scaler, stream, val_loader, cfg, device, amp_dtype, ckpt, log, bar,
              start_step, last_good, world_size, is_main)
    except BaseException:
        log.roll_back()  # metrics.jsonl never gets ahead of the last checkpoint
        raise
    finally:
        bar.close()
    return log.history


def _last_good_sentence(ckpt: Path | None, step: int | None) -> str:
    if ckpt is None:
        return "No checkpoint is written in this run (ckpt_path=None)."
    if step is None:
        return f"No checkpoint had been written yet ({ckpt} was not created)."
    return f"The last good checkpoint, step {step}, is unchanged in {ckpt}; nothing after the divergence was saved."


def _loop(model: nn.Module, train_model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
          stream: BatchStream, val_loader: Iterable[Sequence[torch.Tensor]], cfg: TrainConfig, device: torch.device,
          amp_dtype: torch.dtype | None, ckpt: Path | None, log: MetricsLog, bar: tqdm, start_step: int,
          last_good: dict[str, int | None], world_size: int, is_main: bool) -> None:
    """The steps themselves (see the module docstring)."""
    guard = {"cfg": cfg, "scaler_enabled": scaler.is_enabled()}
    model.train()
    window_loss = torch.zeros((), device=device)  # loss SUM since the last log line, kept on the device
    window_count = torch.zeros((), device=device, dtype=torch.long)  # targets since the last log line
    window_examples, window_start = 0, time.perf_counter()
    grad_norm = torch.zeros((), device=device)
    for step in range(start_step, cfg.steps):
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr

        micro_batches = stream.next_group(cfg.accum)
        loss_sum, count = backward_group(
            train_model, micro_batches, device, amp_dtype=amp_dtype, scaler=scaler, world_size=world_size
        )
        scaler.unscale_(optimizer)  # true gradients from here on (no-op without fp16)
        # Measured after unscaling and before clipping; max_norm=inf still measures when clipping is off.
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip or math.inf)
        scaler.step(optimizer)  # skipped by the scaler if fp16 gradients overflowed
        scaler.update()
        optimizer.zero_grad(set_to_none=True)  # frees the gradient memory until the next backward

        window_loss += loss_sum
        window_count += count
        window_examples += sum(len(b[0]) for b in micro_batches) * world_size
        done = step + 1
        bar.update(1)
        evaluate_now = done % cfg.eval_every == 0 or done == cfg.steps
        if done % cfg.log_every == 0 or evaluate_now:
            # The only host sync of the step, once per log line. Windows close at every checkpoint, so a resumed
            # run averages over exactly the same steps as an uninterrupted one.
            elapsed = max(time.perf_counter() - window_start, 1e-9)
            n_targets = int(window_count)
            record = {
                "step": done,
                "loss": float(all_reduce_sum(window_loss.clone())) / max(n_targets, 1),
                "lr": lr,
                "grad_norm": float(grad_norm),
                "examples_per_s": window_examples / elapsed,
            }
            if micro_batches[0][1].dim() > 1:  # text: targets per position, report tokens too
                record["tokens_per_s"] = n_targets / elapsed
            check_record(record, step=done, last_good=_last_good_sentence(ckpt, last_good["step"]), **guard)
            log.append(record)
            bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{lr:.2e}", refresh=False)
            window_loss.zero_()
            window_count.zero_()
            window_examples = 0

        if evaluate_now:
            # evaluate() leaves the training RNG untouched: a resumed run draws the same numbers afterwards.
            val = evaluate(unwrap(model), val_loader, device, amp_dtype)
            record = {"step": done, "val_loss": val["loss"], "val_acc": val["acc"]}
            check_record(record, step=done, last_good=_last_good_sentence(ckpt, last_good["step"]), **guard)
            log.append(record)
            if is_main:
                bar.write(f"step {done}: val_loss {val['loss']:.4f}  val_acc {val['acc']:.3f}")
            if ckpt is not None and is_main:
                stream.warn_if_inexact()
                try:
                    save_checkpoint(
                        ckpt, model=model, optimizer=optimizer, scaler=scaler, step=done, config=cfg,
                        history=log.history, data_state=stream.state_dict(),
                    )
                except NonFiniteError as exc:  # weights poisoned by a non-finite gradient between two log lines
                    raise NonFiniteError(
                        divergence_message(step=done, what="model state", value=None, cfg=cfg, tensors=exc.tensors,
                                           last_good=_last_good_sentence(ckpt, last_good["step"])),
                        step=done, what="model state", value=None, tensors=exc.tensors) from None
                last_good["step"] = done
                log.committed()
            window_start = time.perf_counter()  # throughput excludes evaluation and saving
