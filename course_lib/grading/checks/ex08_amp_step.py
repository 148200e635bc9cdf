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
import random
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed
from course_lib.grading.checks.common import CountingSGD

SCALE = 4096.0
MAX_NORM = 0.05  # small, so clipping is active and its placement matters


class _Probe(nn.Module):
    """A small classifier that records the autocast state of each forward call."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(2 + seed)  # weights and batch differ in every grading run
        self.net = nn.Sequential(nn.Linear(7, 16), nn.ReLU(), nn.Linear(16, 4))
        self.autocast: list[tuple[bool, torch.dtype]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.autocast.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return self.net(x)


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4 + seed)
    return torch.randn(10, 7, generator=g), torch.randint(0, 4, (10,), generator=g)


def _overflowing(model: _Probe, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch whose scaled gradients are certain to overflow: huge inputs, and labels the model gets wrong.

    With inputs of 1e30 the softmax saturates, so a sample the model already classifies right has a gradient of
    exactly 0: a batch of only such samples would not overflow at all (one seed in a few hundred drew one).
    """
    big = x * 1e30
    with torch.no_grad():
        wrong = (model.net(big).argmax(dim=1) + 1) % 4
    return big, wrong


def _reference_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[nn.Module, float]:
    """fp32, no scaler: backward, clip, SGD step. Returns the updated copy and the pre-clip norm."""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM))
    opt.step()
    return model, norm


def _run(ns: dict[str, Any], seed: int, amp_dtype: str | None, scaler_kwargs: dict[str, Any],
         big_input: bool = False) -> dict[str, Any]:
    """One learner step on a fresh probe model: what it returned, the weights, autocast states, the scale after."""
    step = need(ns, "amp_step", "define `amp_step(model, batch, optimizer, scaler, device, amp_dtype, max_norm)`")
    scaler = torch.amp.GradScaler("cpu", **scaler_kwargs)
    model = _Probe(seed)
    for p in model.parameters():  # left from an earlier step (scaled, as .grad is): "zero the gradients" comes first
        p.grad = torch.full_like(p, 0.5 * SCALE)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    dtype = getattr(torch, amp_dtype) if amp_dtype else None
    x, y = _batch(seed)
    batch = _overflowing(model, x) if big_input else (x, y)
    result = call(step, model, batch, opt, scaler, torch.device("cpu"), dtype, MAX_NORM)
    if isinstance(result, dict) and {"loss", "grad_norm"} <= set(result):
        shown: Any = {k: float(result[k]) if isinstance(result[k], (int, float, torch.Tensor)) else one_line(result[k])
                      for k in ("loss", "grad_norm")}
    else:
        shown = one_line(result)
    return {"result": shown, "weights": [p.detach() for p in model.parameters()],
            "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "autocast": [[on, str(dt)] for on, dt in model.autocast], "scale": float(scaler.get_scale())}


def _result(seen: dict[str, Any]) -> dict[str, float]:
    if not isinstance(seen["result"], dict) or not all(isinstance(v, float) for v in seen["result"].values()):
        raise CheckFailed("amp_step should return {'loss': float, 'grad_norm': float}", got=seen["result"])
    return seen["result"]


def _max_diff(a: Any, b: nn.Module) -> float:
    params = list(a.parameters()) if isinstance(a, nn.Module) else list(a)
    return max((p - q).abs().max().item() for p, q in zip(params, b.parameters()))


def _scaler_dtypes(seed: int) -> list[torch.dtype | None]:
    """Each precision once, then thirteen more drawn at random: two grading runs share the sequence with odds
    below one in ten million, so answers recorded for one run do not fit another."""
    draw = random.Random(seed)
    choices: list[torch.dtype | None] = [torch.float16, torch.bfloat16, None]
    dtypes = choices + [draw.choice(choices) for _ in range(13)]
    draw.shuffle(dtypes)
    return dtypes


def _scalers(ns: dict[str, Any], dtypes: list[torch.dtype | None]) -> list[dict[str, Any]]:
    make = need(ns, "make_scaler", "define `make_scaler(device, amp_dtype)` returning a torch.amp.GradScaler")
    out = []
    for dtype in dtypes:
        scaler = call(make, torch.device("cpu"), dtype)
        kind = f"{type(scaler).__module__}.{type(scaler).__qualname__}"
        # The input is recorded with the answer: a judge can tell answers given for another run's dtypes.
        out.append({"amp_dtype": str(dtype), "type": kind, "is_grad_scaler": isinstance(scaler, torch.amp.GradScaler),
                    "enabled": bool(scaler.is_enabled()) if isinstance(scaler, torch.amp.GradScaler) else None})
    return out


@check_for("08", "scaler enabled only for fp16", points=1, parts=("08.1",))
def scaler_choice(ns: dict[str, Any]) -> None:
    dtypes = _scaler_dtypes(run_seed(ns))
    records = observe(ns, _scalers, dtypes)
    asked = [r.get("amp_dtype") if isinstance(r, dict) else None for r in records] \
        if isinstance(records, list) else None
    if asked != [str(d) for d in dtypes]:
        raise CheckFailed("the recorded answers are not for this run's precisions (one scaler per call of make_scaler)",
                          expected=[str(d) for d in dtypes], got=asked)
    for dtype, seen in zip(dtypes, records):
        want = dtype == torch.float16
        if seen["type"].startswith("torch.cuda.amp"):
            raise CheckFailed(
                f"make_scaler built {seen['type']}, the outdated CUDA-only spelling: on a machine without a CUDA GPU "
                "it is always disabled, so fp16 gradients would underflow",
                hint="torch.amp.GradScaler(device.type, enabled=...)", expected="torch.amp.GradScaler",
                got=seen["type"])
        if not seen["is_grad_scaler"]:
            raise CheckFailed("make_scaler should return torch.amp.GradScaler",
                              hint="torch.amp.GradScaler(device.type, enabled=...)", got=seen["type"])
        if seen["enabled"] != want:
            raise CheckFailed(
                f"for amp_dtype={dtype} the scaler should be {'enabled' if want else 'disabled'}: only fp16 has "
                "the narrow exponent range that makes small gradients underflow; bf16 and fp32 do not need scaling",
                hint="enabled=(amp_dtype == torch.float16)",
                expected=want,
                got=seen["enabled"],
            )


@check_for("08", "grad norm measured after unscale_", points=2, parts=("08.2",))
def norm_after_unscale(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _run, seed, None, {"init_scale": SCALE, "growth_interval": 1})
    _, norm = _reference_step(_Probe(seed), _batch(seed))
    got = _result(seen)["grad_norm"]
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
    with torch.no_grad():
        loss = float(F.cross_entropy(_Probe(seed)(_batch(seed)[0]), _batch(seed)[1]))
    if not math.isclose(_result(seen)["loss"], loss, rel_tol=1e-4):
        raise CheckFailed("the returned loss should be the (unscaled) loss of this batch",
                          hint="return loss.item(), not the scaled loss", expected=loss, got=_result(seen)["loss"])


@check_for("08", "clip, step, update in order", points=2, parts=("08.2",))
def params_updated(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _run, seed, None, {"init_scale": SCALE, "growth_interval": 1})
    truth, _ = _reference_step(_Probe(seed), _batch(seed))
    diff = _max_diff(seen["weights"], truth)
    if diff > 1e-5:
        unchanged = _max_diff(seen["weights"], _Probe(seed)) == 0
        raise CheckFailed(
            "the weights after the step differ from: unscale -> clip to max_norm -> step",
            hint="call scaler.step(optimizer) (not before zero_grad)" if unchanged else
            "clip after scaler.unscale_(optimizer): clipping scaled gradients clips far too hard",
            expected="max |weight difference| < 1e-5",
            got=f"{diff:.3g}",
        )
    if seen["scale"] != SCALE * 2:
        raise CheckFailed(
            "scaler.update() was not called after the step (it adjusts the scale for the next step)",
            hint="end the step with scaler.update()",
            expected=SCALE * 2,
            got=seen["scale"],
        )


@check_for("08", "an overflowing step is skipped", points=1, parts=("08.2",))
def overflow_skipped(ns: dict[str, Any]) -> None:
    # Huge inputs and a huge scale: the scaled gradients overflow to inf, as fp16 ones do now and then.
    seed = run_seed(ns)
    seen = observe(ns, _run, seed, None, {"init_scale": 2.0**100, "growth_interval": 1}, True)
    changed = _max_diff(seen["weights"], _Probe(seed))
    if not changed == 0:
        raise CheckFailed(
            "after a step whose gradients overflowed (inf), the weights changed (to nan/inf): the step must be skipped",
            hint="call scaler.step(optimizer), not optimizer.step(): it skips the update when unscale_ found inf/nan",
            expected="weights unchanged", got=f"max |change| {changed:.3g}")
    if seen["scale"] != 2.0**99:
        raise CheckFailed("after an overflow scaler.update() should halve the scale", hint="end with scaler.update()",
                          expected=2.0**99, got=seen["scale"])


@check_for("08", "works with the scaler disabled (bf16 on the CPU)", points=1, parts=("08.2",))
def bf16_without_scaler(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _run, seed, "bfloat16", {"enabled": False})
    if not seen["autocast"] or not all(on and dtype == "torch.bfloat16" for on, dtype in seen["autocast"]):
        raise CheckFailed(
            "the forward pass did not run under autocast to bfloat16",
            hint="with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=amp_dtype is not None):",
            expected=[[True, "torch.bfloat16"]],
            got=seen["autocast"],
        )
    result = _result(seen)
    if not math.isfinite(result["loss"]) or not math.isfinite(result["grad_norm"]):
        raise CheckFailed("loss or grad_norm is not finite with bf16 autocast", got=result)
    _check_this_run(seed, torch.bfloat16, seen)
    if _max_diff(seen["weights"], _Probe(seed)) == 0:
        raise CheckFailed(
            "the weights did not change: with a disabled scaler, scaler.step(optimizer) simply calls optimizer.step()",
            hint="keep the same scale -> backward -> unscale_ -> clip -> step -> update sequence; disabled, each is a "
            "no-op pass-through",
        )


@check_for("08", "the model stays fp32 (no .half())", points=1, parts=("08.2",))
def stays_fp32(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _run, seed, "float16", {"init_scale": SCALE})
    if seen["dtypes"] != ["torch.float32"]:
        raise CheckFailed(
            "the model's weights were converted: autocast chooses a precision per operation and keeps the weights "
            "(and the optimizer's update) in fp32",
            hint="never call model.half() or .to(torch.float16) with autocast",
            expected=["torch.float32"],
            got=seen["dtypes"],
        )
    if not seen["autocast"] or not all(on and dtype == "torch.float16" for on, dtype in seen["autocast"]):
        raise CheckFailed(
            "with amp_dtype=torch.float16 the forward pass should run under autocast to float16",
            expected=[[True, "torch.float16"]],
            got=seen["autocast"],
        )
    _check_this_run(seed, torch.float16, seen)


def _check_this_run(seed: int, dtype: torch.dtype, seen: dict[str, Any]) -> None:
    """The weights are this run's model after one clipped step, the loss this batch's under autocast to ``dtype``."""
    moved = _max_diff(seen["weights"], _Probe(seed))
    if not moved <= 0.5 * MAX_NORM:  # SGD at lr 0.5 after clipping to MAX_NORM moves no weight further
        raise CheckFailed("the weights after one clipped step should stay next to the model's starting weights",
                          hint="clip_grad_norm_(model.parameters(), max_norm) after unscale_, then one step",
                          expected=f"max |change| <= {0.5 * MAX_NORM}", got=f"{moved:.3g}")
    got = _result(seen)["loss"]
    x, y = _batch(seed)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        loss = float(F.cross_entropy(_Probe(seed)(x), y))
    if not math.isclose(got, loss, rel_tol=2e-2):
        raise CheckFailed("the returned loss should be this batch's loss, computed under autocast",
                          hint="return loss.item() of the forward pass run under torch.autocast", expected=loss,
                          got=got)


# ------------------------------------------------------------------ AMP inside an accumulation group


def _micro_batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three micro-batches of uneven sizes (different in every grading run)."""
    x, y = _batch(seed)  # 10 samples
    first, second = 2 + seed % 3, 3 + seed % 2
    cuts = [0, first, first + second, len(x)]
    return [(x[a:b], y[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]


def _group_scale(seed: int) -> float:
    """The scaler's starting factor for the group (a power of two, different from run to run)."""
    return SCALE * 2 ** (seed % 4)


def _accumulated(ns: dict[str, Any], seed: int, overflow: bool) -> dict[str, Any]:
    """The learner's group step on a fresh probe model with an enabled CPU scaler (fp32 forward, so exact)."""
    fn = need(ns, "amp_accumulate",
              "define `amp_accumulate(model, micro_batches, optimizer, scaler, device, amp_dtype, max_norm)`")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**100 if overflow else _group_scale(seed), growth_interval=1)
    model = _Probe(seed)
    opt = CountingSGD(model.parameters(), lr=0.5)
    batches = _micro_batches(seed)
    if overflow:  # one huge micro-batch: its scaled gradients overflow, so the whole group must be skipped
        batches[1] = _overflowing(model, batches[1][0])
    result = call(fn, model, batches, opt, scaler, torch.device("cpu"), None, MAX_NORM)
    if isinstance(result, dict) and {"loss", "grad_norm"} <= set(result):
        shown: Any = {k: float(result[k]) if isinstance(result[k], (int, float, torch.Tensor)) else one_line(result[k])
                      for k in ("loss", "grad_norm")}
    else:
        shown = one_line(result)
    return {"result": shown, "weights": [p.detach() for p in model.parameters()], "steps": opt.steps_taken,
            "scale": float(scaler.get_scale())}


@check_for("08", "AMP accumulation: one step, same as one big batch", points=2, parts=("08.3",))
def accumulation_equals_big_batch(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _accumulated, seed, False)
    sizes = [len(y) for _, y in _micro_batches(seed)]
    if seen["steps"] != 1:
        raise CheckFailed(
            f"a group of {len(sizes)} micro-batches should make one optimizer step",
            hint="scaler.scale(loss).backward() for each micro-batch; unscale_, clip, step and update once, after the "
                 "last one", expected=1, got=seen["steps"])
    truth, norm = _reference_step(_Probe(seed), _batch(seed))  # the group as one batch of all its samples
    diff = _max_diff(seen["weights"], truth)
    if diff > 1e-5:
        raise CheckFailed(
            f"the step differs from one big batch of the group's {sum(sizes)} samples (micro-batches {sizes})",
            hint="scale every micro-batch's loss (scaler.scale(loss_sum / samples_in_group).backward()): an unscaled "
                 "backward mixes with scaled gradients, and unscale_ divides them all; clip only after unscale_",
            expected="max |weight difference| < 1e-5", got=f"{diff:.3g}")
    result = _result(seen)
    x, y = _batch(seed)
    with torch.no_grad():
        loss = float(F.cross_entropy(_Probe(seed)(x), y))
    if not math.isclose(result["grad_norm"], norm, rel_tol=1e-4) or not math.isclose(result["loss"], loss,
                                                                                    rel_tol=1e-4):
        raise CheckFailed("return the group's mean loss and the gradient norm measured after unscale_",
                          expected={"loss": loss, "grad_norm": norm}, got=result)


@check_for("08", "AMP accumulation: the scaler updates once per group", points=1, parts=("08.3",))
def accumulation_updates_once(ns: dict[str, Any]) -> None:
    start = _group_scale(run_seed(ns))
    seen = observe(ns, _accumulated, run_seed(ns), False)
    if seen["scale"] != start * 2:
        updates = math.log2(seen["scale"] / start) if seen["scale"] > 0 else float("nan")
        raise CheckFailed(
            "scaler.update() should run once per optimizer step, after the group's last micro-batch (this scaler "
            "doubles its scale on every update)",
            hint="updating inside the loop changes the scale between micro-batches, so their gradients no longer "
                 "share one factor", expected=start * 2,
            got=f"{seen['scale']:g} ({updates:g} updates)" if math.isfinite(updates) else seen["scale"])


@check_for("08", "AMP accumulation: an overflow skips the whole group", points=1, parts=("08.3",))
def accumulation_overflow(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _accumulated, seed, True)
    changed = _max_diff(seen["weights"], _Probe(seed))
    if changed != 0:
        raise CheckFailed(
            "one micro-batch overflowed (inf gradients) and the weights changed: the whole group's step must be "
            "skipped",
            hint="scaler.step(optimizer) once after unscale_ (it skips the update when any gradient is inf/nan)",
            expected="weights unchanged", got=f"max |change| {changed:.3g}")
    if seen["scale"] != 2.0**99:
        raise CheckFailed("after the overflow scaler.update() should halve the scale once",
                          expected=2.0**99, got=seen["scale"])


def _next_group(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A second group of 9 samples (micro-batches of 4 and 5) to follow the first."""
    g = torch.Generator().manual_seed(6 + seed)
    x, y = torch.randn(9, 7, generator=g), torch.randint(0, 4, (9,), generator=g)
    return [(x[:4], y[:4]), (x[4:], y[4:])]


def _two_groups(ns: dict[str, Any], seed: int) -> dict[str, Any]:
    """Two groups in a row through one optimizer and a disabled scaler (bf16 on a CPU needs none; the forward runs
    in fp32 here, so the weights are exact). Gradients the first group leaves in .grad are not divided by a scale
    in the second, so a step that still holds them differs plainly."""
    fn = need(ns, "amp_accumulate",
              "define `amp_accumulate(model, micro_batches, optimizer, scaler, device, amp_dtype, max_norm)`")
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    model = _Probe(seed)
    opt = CountingSGD(model.parameters(), lr=0.5)
    for group in (_micro_batches(seed), _next_group(seed)):
        call(fn, model, group, opt, scaler, torch.device("cpu"), None, MAX_NORM)
    return {"weights": [p.detach() for p in model.parameters()], "steps": opt.steps_taken}


@check_for("08", "AMP accumulation: the next group starts from zero gradients", points=1, parts=("08.3",))
def accumulation_next_group(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _two_groups, seed)
    if seen["steps"] != 2:
        raise CheckFailed("two groups, called one after the other, should make two optimizer steps",
                          expected=2, got=seen["steps"])
    first, _ = _reference_step(_Probe(seed), _batch(seed))
    x, y = (torch.cat(t) for t in zip(*_next_group(seed)))
    truth, _ = _reference_step(first, (x, y))
    diff = _max_diff(seen["weights"], truth)
    if diff > 1e-5:
        raise CheckFailed(
            "after two groups in a row the weights differ from two big-batch steps: the second step should use only "
            "the second group's gradients",
            hint="backward() adds into .grad: zero the gradients once per group, before its first micro-batch (or "
                 "after the step), or the previous group's gradients join the next step",
            expected="max |weight difference| < 1e-5", got=f"{diff:.3g}")


def _fp16_group(ns: dict[str, Any], seed: int) -> dict[str, Any]:
    """One group with amp_dtype=torch.float16 and an enabled scaler: the autocast state of every forward."""
    fn = need(ns, "amp_accumulate",
              "define `amp_accumulate(model, micro_batches, optimizer, scaler, device, amp_dtype, max_norm)`")
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    model = _Probe(seed)
    call(fn, model, _micro_batches(seed), CountingSGD(model.parameters(), lr=0.5), scaler, torch.device("cpu"),
         torch.float16, MAX_NORM)
    return {"autocast": [[on, str(dt)] for on, dt in model.autocast],
            "dtypes": sorted({str(p.dtype) for p in model.parameters()})}


@check_for("08", "AMP accumulation: every forward under autocast to amp_dtype", points=1, parts=("08.3",))
def accumulation_autocast(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _fp16_group, seed)
    want = [[True, "torch.float16"]] * len(_micro_batches(seed))
    if seen["autocast"] != want:
        raise CheckFailed(
            "with amp_dtype=torch.float16 each micro-batch's forward should run under autocast to float16 (autocast "
            "without dtype= picks the device's default: bfloat16 on a CPU, float16 on a GPU)",
            hint="with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=amp_dtype is not None): "
                 "around each forward", expected=want, got=seen["autocast"])
    if seen["dtypes"] != ["torch.float32"]:
        raise CheckFailed("the model's weights were converted: autocast keeps them in fp32",
                          hint="never call model.half() with autocast", expected=["torch.float32"], got=seen["dtypes"])
