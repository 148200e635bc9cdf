"""The non-finite guard: a diverged run stops with an explanation instead of poisoning its checkpoint.

When the loss or the gradient norm becomes ``inf`` or ``nan`` the weights are, or are about to be, garbage; every
step after that only spreads it, and the next checkpoint would replace the last good one with it. So the loop
stops with :class:`NonFiniteError` (step, value, the likely cause and what to try), and nothing non-finite is
ever written: the last good checkpoint stays as it was.

Where it looks, and why there (the per-step hot path gets no extra host-device synchronisation):

* the training loss is summed over a window *on the device* and read once per log line; ``nan``/``inf`` are
  sticky under addition, so one bad step anywhere in the window shows in that one number;
* the gradient norm is read at the same moment (the one of the logged step);
* before every checkpoint write, every tensor about to be saved (weights, buffers, optimizer moments) is
  checked: they are copied to the CPU for saving anyway. A non-finite gradient applied between two log lines has
  made the weights non-finite, so it is caught here at the latest, before anything reaches the disk.

With fp16 the GradScaler deliberately produces non-finite gradients now and then (its scale is too high), skips
that optimizer step and lowers the scale: a normal event, so a non-finite gradient norm is *not* an error when
the scaler is enabled. The loss itself is computed in fp32 and stays a real divergence signal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch


class NonFiniteError(RuntimeError):
    """Training produced ``inf``/``nan``; the message names the step, the value, the likely cause and a fix."""

    def __init__(self, message: str, *, step: int, what: str, value: float | None,
                 tensors: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.step, self.what, self.value, self.tensors = step, what, value, tensors


def is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def json_safe(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with every non-finite float replaced by ``None`` (JSON has no NaN/Infinity: ``null``)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


def nonfinite_tensors(named: Iterable[tuple[str, Any]]) -> list[str]:
    """Names of the floating-point tensors among ``named`` holding at least one ``inf``/``nan``."""
    bad = []
    for name, value in named:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
            if not bool(torch.isfinite(value).all()):
                bad.append(name)
    return bad


def optimizer_tensors(state: Mapping[str, Any] | None) -> list[tuple[str, Any]]:
    """``(name, tensor)`` pairs of an optimizer ``state_dict()``'s per-parameter state (AdamW's moments...)."""
    if not state:
        return []
    return [(f"optimizer.{index}.{key}", value) for index, slots in state.get("state", {}).items()
            for key, value in slots.items()]


def likely_cause(cfg: Any) -> str:
    """A sentence on why a run with this config may diverge, and what to try."""
    hints = []
    lr = getattr(cfg, "lr", None)
    if lr is not None and lr > 0.05:
        hints.append(f"the learning rate is very high (lr={lr:g}): try 10x lower, e.g. --lr {lr / 10:g}")
    else:
        hints.append("the learning rate may be too high for this model: try --lr 10x lower")
    if getattr(cfg, "clip", 1.0) in (None, 0, 0.0):
        hints.append("gradient clipping is off: try --clip 1.0")
    warmup, steps = getattr(cfg, "warmup", None), getattr(cfg, "steps", None)
    if warmup is not None and steps and warmup < max(1, steps // 20):
        hints.append(f"a longer warm-up helps (--warmup {max(1, steps // 20)})")
    if getattr(cfg, "amp_dtype", "fp32") == "fp16":
        hints.append("fp16 overflows above 65504: try --amp-dtype bf16 or fp32")
    return "; ".join(hints)


def divergence_message(*, step: int, what: str, value: float | None, cfg: Any, last_good: str,
                       tensors: tuple[str, ...] = ()) -> str:
    if tensors:
        found = (f"{len(tensors)} tensor(s) of the {what} hold inf/nan (e.g. {', '.join(tensors[:3])}) although the "
                 f"logged loss was still finite")
    else:
        found = f"the {what} is {'nan' if value is None or math.isnan(value) else repr(value)} (not finite)"
    return f"training diverged at step {step}: {found}. Likely cause and what to try: {likely_cause(cfg)}. {last_good}"


def check_record(record: Mapping[str, Any], *, step: int, cfg: Any, scaler_enabled: bool, last_good: str) -> None:
    """Raise :class:`NonFiniteError` when a metrics record shows a divergence (see the module docstring)."""
    for key, what in (("loss", "training loss"), ("val_loss", "validation loss")):
        if key in record and not is_finite_number(record[key]):
            raise NonFiniteError(divergence_message(step=step, what=what, value=record[key], cfg=cfg,
                                                    last_good=last_good), step=step, what=what, value=record[key])
    if "grad_norm" in record and not scaler_enabled and not is_finite_number(record["grad_norm"]):
        raise NonFiniteError(divergence_message(step=step, what="gradient norm", value=record["grad_norm"], cfg=cfg,
                                                last_good=last_good),
                             step=step, what="gradient norm", value=record["grad_norm"])
