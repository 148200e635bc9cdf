"""Checks for exercise 08: one mixed-precision training step in the modern ``torch.amp`` spelling.

The learner defines ``make_scaler(device, amp_dtype)`` (a ``torch.amp.GradScaler`` enabled only for fp16) and
``amp_step(model, batch, optimizer, scaler, device, amp_dtype, max_norm)`` returning ``{"loss", "grad_norm"}``.

All checks run on the CPU. The key one uses an *enabled* scaler with a large scale in fp32: the gradients after
``backward`` are then 4096 times too large until ``unscale_`` fixes them, so a missing or misplaced ``unscale_``
shows up in the reported norm and in the weights after clipping. Expected values come from a plain fp32 step.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.grading.api import CheckFailed, check_for, need

SCALE = 4096.0
MAX_NORM = 0.05  # small, so clipping is active and its placement matters


class _Probe(nn.Module):
    """A small classifier that records the autocast state of each forward call."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.net = nn.Sequential(nn.Linear(7, 16), nn.ReLU(), nn.Linear(16, 4))
        self.autocast: list[tuple[bool, torch.dtype]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.autocast.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return self.net(x)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    return torch.randn(10, 7, generator=g), torch.randint(0, 4, (10,), generator=g)


def _reference_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[nn.Module, float]:
    """fp32, no scaler: backward, clip, SGD step. Returns the updated copy and the pre-clip norm."""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM))
    opt.step()
    return model, norm


def _run(ns: dict[str, Any], scaler: torch.amp.GradScaler, amp_dtype: torch.dtype | None) -> tuple[_Probe, dict[str, Any], _Probe]:
    step = need(ns, "amp_step", "define `amp_step(model, batch, optimizer, scaler, device, amp_dtype, max_norm)`")
    model = _Probe()
    start = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    result = step(model, _batch(), opt, scaler, torch.device("cpu"), amp_dtype, MAX_NORM)
    if not isinstance(result, dict) or not {"loss", "grad_norm"} <= set(result):
        raise CheckFailed("amp_step should return {'loss': float, 'grad_norm': float}", got=result)
    return model, result, start


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


@check_for("08", "scaler enabled only for fp16", points=1)
def scaler_choice(ns: dict[str, Any]) -> None:
    make = need(ns, "make_scaler", "define `make_scaler(device, amp_dtype)` returning a torch.amp.GradScaler")
    cpu = torch.device("cpu")
    for dtype, want in ((torch.float16, True), (torch.bfloat16, False), (None, False)):
        scaler = make(cpu, dtype)
        if not isinstance(scaler, torch.amp.GradScaler):
            raise CheckFailed(
                "make_scaler should return torch.amp.GradScaler (torch.cuda.amp.GradScaler is the outdated spelling)",
                hint="torch.amp.GradScaler(device.type, enabled=...)",
                got=type(scaler).__module__ + "." + type(scaler).__name__,
            )
        if scaler.is_enabled() != want:
            raise CheckFailed(
                f"for amp_dtype={dtype} the scaler should be {'enabled' if want else 'disabled'}: only fp16 has "
                "the narrow exponent range that makes small gradients underflow; bf16 and fp32 do not need scaling",
                hint="enabled=(amp_dtype == torch.float16)",
                expected=want,
                got=scaler.is_enabled(),
            )


@check_for("08", "grad norm measured after unscale_", points=2)
def norm_after_unscale(ns: dict[str, Any]) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE, growth_interval=1)
    model, result, start = _run(ns, scaler, None)
    _, norm = _reference_step(start, _batch())
    got = float(result["grad_norm"])
    if not math.isclose(got, norm, rel_tol=1e-4):
        hint = (
            f"the norm is {SCALE:.0f}x too large: it was measured on scaled gradients. Call scaler.unscale_(optimizer) "
            "before clip_grad_norm_"
            if math.isclose(got, norm * SCALE, rel_tol=1e-3)
            else "return the value clip_grad_norm_ returns (the total norm before clipping), after scaler.unscale_"
        )
        raise CheckFailed(
            "grad_norm is not the norm of the true (unscaled) gradients", hint=hint, expected=norm, got=got
        )


@check_for("08", "clip, step, update in order", points=2)
def params_updated(ns: dict[str, Any]) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE, growth_interval=1)
    model, _, start = _run(ns, scaler, None)
    truth, _ = _reference_step(start, _batch())
    diff = _max_diff(model, truth)
    if diff > 1e-5:
        unchanged = _max_diff(model, start) == 0
        raise CheckFailed(
            "the weights after the step differ from: unscale -> clip to max_norm -> step",
            hint="call scaler.step(optimizer) (not before zero_grad)" if unchanged else
            "clip after scaler.unscale_(optimizer): clipping scaled gradients clips far too hard",
            expected="max |weight difference| < 1e-5",
            got=f"{diff:.3g}",
        )
    if scaler.get_scale() != SCALE * 2:
        raise CheckFailed(
            "scaler.update() was not called after the step (it adjusts the scale for the next step)",
            hint="end the step with scaler.update()",
            expected=SCALE * 2,
            got=scaler.get_scale(),
        )


@check_for("08", "works with the scaler disabled (bf16 on the CPU)", points=1)
def bf16_without_scaler(ns: dict[str, Any]) -> None:
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    model, result, start = _run(ns, scaler, torch.bfloat16)
    if not model.autocast or not all(on and dtype == torch.bfloat16 for on, dtype in model.autocast):
        raise CheckFailed(
            "the forward pass did not run under autocast to bfloat16",
            hint="with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=amp_dtype is not None):",
            expected=[(True, torch.bfloat16)],
            got=model.autocast,
        )
    if not math.isfinite(float(result["loss"])) or not math.isfinite(float(result["grad_norm"])):
        raise CheckFailed("loss or grad_norm is not finite with bf16 autocast", got=result)
    if _max_diff(model, start) == 0:
        raise CheckFailed(
            "the weights did not change: with a disabled scaler, scaler.step(optimizer) simply calls optimizer.step()",
            hint="keep the same scale -> backward -> unscale_ -> clip -> step -> update sequence; disabled, each is a no-op "
            "pass-through",
        )


@check_for("08", "the model stays fp32 (no .half())", points=1)
def stays_fp32(ns: dict[str, Any]) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    model, _, _ = _run(ns, scaler, torch.float16)
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    if dtypes != ["torch.float32"]:
        raise CheckFailed(
            "the model's weights were converted: autocast chooses a precision per operation and keeps the weights "
            "(and the optimizer's update) in fp32",
            hint="never call model.half() or .to(torch.float16) with autocast",
            expected=["torch.float32"],
            got=dtypes,
        )
    if not model.autocast or not all(on and dtype == torch.float16 for on, dtype in model.autocast):
        raise CheckFailed(
            "with amp_dtype=torch.float16 the forward pass should run under autocast to float16",
            expected=[(True, torch.float16)],
            got=model.autocast,
        )
