"""fp32 vs bf16 vs fp16, side by side: same initial weights, same batches, same number of steps.

What mixed precision (``torch.autocast``) actually does:

* Matmuls and convolutions run in the low-precision dtype (that is where the speed is, on hardware with bf16/fp16
  units: tensor cores, AVX512-BF16/AMX on recent CPUs; elsewhere it can even be *slower*).
* Operations on the device's fp32 list have their inputs cast up to fp32, because they lose too much accuracy
  otherwise: most losses (``cross_entropy``, ``mse_loss``) on both CPU and CUDA; on CUDA also softmax,
  normalisation and reductions such as ``sum`` and ``norm``. Every other operation runs in the dtype its inputs
  arrive in: under ``torch.autocast("cpu", dtype=torch.bfloat16)``, ``sum``, ``mean`` and ``norm`` of a bf16
  activation are not cast up, they take and return bf16 (lesson 05 prints the dtypes on the learner's machine).
* There is one copy of the weights, the fp32 parameters: each operation casts them as it runs (cached for the
  forward), their gradients are fp32, and the optimizer updates them. A separate fp32 copy ("master weights")
  belongs to the older recipe that stores the model itself in fp16; autocast keeps none.
* **Memory is not simply halved**: parameters, gradients and optimizer state are unchanged; only the activations
  saved for backward shrink (and, while the forward runs, autocast caches a low-precision cast of each
  weight it uses).
  :func:`saved_activation_bytes` counts exactly what autograd keeps, so the comparison does not depend on which
  precision happened to run first (the process's resident memory does).
* **Metrics differ** slightly: rounding changes the trajectory. Compare curves, not bits.
* fp16 has a narrow exponent range, so small gradients underflow to zero: it needs a ``GradScaler`` (loss
  scaling). bf16 has fp32's range and needs none. Both autocast dtypes and the scaler work on the CPU too
  (``torch.autocast("cpu", dtype=torch.float16)``, ``torch.amp.GradScaler("cpu")``); :func:`grad_scaler_demo`
  shows the scaler skip a step on an overflow, back off, and grow again.

Test precision alone first (this module), before combining it with compile or other changes.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from course_lib import clock
from course_lib.device import autocast, resolve_amp_dtype, synchronize
from course_lib.perf.device_facts import DeviceFacts
from course_lib.perf.kernel_time import KernelShare
from course_lib.train.evaluate import evaluate
from course_lib.train.loss import mean_cross_entropy

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def amp_dtype_of(name: str, device: torch.device | str) -> torch.dtype | None:
    """``"fp32"`` -> ``None``, ``"bf16"`` -> ``torch.bfloat16``, ``"fp16"`` -> ``torch.float16``, checked for
    ``device``.

    :func:`course_lib.device.resolve_amp_dtype` without ``"auto"``: a comparison names what it measures.
    """
    if name not in PRECISIONS:
        raise ValueError(f"precision {name!r} is not one of {list(PRECISIONS)}.")
    return resolve_amp_dtype(name, device)


# --------------------------------------------------------------------------------------------------------
# Memory: what autograd saves for backward, counted exactly
# --------------------------------------------------------------------------------------------------------
_VIEW_OR_CAST = ("ToCopy", "TBackward", "Transpose", "Permute", "View", "Reshape", "Expand", "Squeeze",
                 "Unsqueeze", "Alias")


def _is_weight_copy(t: torch.Tensor) -> bool:
    """True for a parameter, or a cast/view of one (autocast's bf16 copy of a weight, its transpose...)."""
    if isinstance(t, torch.nn.Parameter):
        return True
    fn = t.grad_fn
    for _ in range(8):  # walk back through views and casts only
        if fn is None or not any(k in type(fn).__name__ for k in _VIEW_OR_CAST):
            return False
        parents = [n for n, _ in fn.next_functions if n is not None]
        if len(parents) != 1:
            return False
        fn = parents[0]
        if type(fn).__name__ == "AccumulateGrad":
            return isinstance(getattr(fn, "variable", None), torch.nn.Parameter)
    return False


def saved_activation_bytes(
    model: torch.nn.Module, inputs: torch.Tensor, *, amp_dtype: torch.dtype | None = None,
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, int]:
    """Bytes autograd keeps for the backward of one ``model(inputs)``, split into activations and weight copies.

    With ``loss_fn`` the loss is part of the step: ``loss_fn(model(inputs))`` runs inside the count too (after
    autocast, as a training step computes it), so what the loss saves (a ``log_softmax`` output, the targets) is
    counted with the rest.

    Every tensor saved for backward passes through a ``saved_tensors_hooks`` pack hook. Memory is counted once
    (a tensor saved by two operations, or overlapping views of one buffer, is one piece of memory), only the bytes
    the saved views span (a batch that is a slice of a larger tensor counts as the slice), and
    parameters -- with autocast's low-precision casts of them -- are counted apart from the activations: they are
    the model's state, not something the batch creates. The result is exact and deterministic: it does not depend
    on what ran before, unlike the process's resident memory.

    Returns ``{"activation_bytes", "weight_bytes", "saved_tensors", "shared_saves", "activation_bytes_by_dtype"}``
    (``shared_saves``: saves that pointed at a storage already counted; the last maps ``"torch.float32"`` etc. to
    bytes, which shows what was saved in fp32 under autocast).

    Taught in lesson 06 (``notebooks/06_accumulation.ipynb``).
    """
    spans: dict[int, list[tuple[int, int]]] = {}  # storage -> byte ranges saved from it
    kinds: dict[int, tuple[str, str]] = {}  # storage -> (kind, dtype) of its first save
    saves = 0
    shared = 0
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saves, shared
        saves += 1
        key = t.untyped_storage().data_ptr()
        extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())) if t.numel() else 0
        start = t.storage_offset() * t.element_size()
        if key in spans:
            shared += 1
        else:
            kind = "weight" if key in param_ptrs or _is_weight_copy(t) else "activation"
            kinds[key] = (kind, str(t.dtype))
            spans[key] = []
        spans[key].append((start, start + extent * t.element_size()))
        return t

    was_training = model.training
    model.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with autocast(inputs.device, amp_dtype):
                output = model(inputs)
            if loss_fn is not None:
                loss_fn(output)
    finally:
        model.train(was_training)
    sizes = {key: _union_bytes(ranges) for key, ranges in spans.items()}
    by_dtype: dict[str, int] = {}
    for key, (kind, dtype) in kinds.items():
        if kind == "activation":
            by_dtype[dtype] = by_dtype.get(dtype, 0) + sizes[key]
    return {
        "activation_bytes": sum(n for key, n in sizes.items() if kinds[key][0] == "activation"),
        "weight_bytes": sum(n for key, n in sizes.items() if kinds[key][0] == "weight"),
        "saved_tensors": saves,
        "shared_saves": shared,
        "activation_bytes_by_dtype": by_dtype,
    }


def _union_bytes(ranges: list[tuple[int, int]]) -> int:
    """Total length of the union of ``[start, end)`` byte ranges (overlapping saves of one buffer count once)."""
    total, reach = 0, None
    for start, end in sorted(ranges):
        if reach is None or start >= reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


# --------------------------------------------------------------------------------------------------------
# Speed: one training step per precision, for course_lib.perf.compare.compare
# --------------------------------------------------------------------------------------------------------
def precision_steps(
    make_model: Callable[[], torch.nn.Module],
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    device: torch.device | str,
    precisions: Sequence[str] = ("fp32", "bf16"),
    lr: float = 1e-3,
) -> dict[str, Callable[[], None]]:
    """``{precision: step}``: each ``step()`` trains its own copy of one model on the next batch (cycling).

    Hand the dict to :func:`course_lib.perf.compare.compare` to time the precisions in interleaved rounds. The
    copies start from the same weights; fp16 gets an enabled ``GradScaler``.

    Taught in lesson 05 (``notebooks/05_mixed_precision.ipynb``).
    """
    device = torch.device(device)
    dtypes = {p: amp_dtype_of(p, device) for p in precisions}  # bad names fail before any work
    if not batches:
        raise ValueError("batches is empty: give at least one (inputs, labels) batch.")
    base = make_model()
    moved = [tuple(t.to(device) for t in b[:2]) for b in batches]
    steps: dict[str, Callable[[], None]] = {}
    for name, dtype in dtypes.items():
        model = copy.deepcopy(base).to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)
        cursor = [0]

        def step(model=model, opt=opt, scaler=scaler, dtype=dtype, cursor=cursor) -> None:
            x, y = moved[cursor[0] % len(moved)]
            cursor[0] += 1
            with autocast(device, dtype):
                out = model(x)
            scaler.scale(mean_cross_entropy(out, y)).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)

        steps[name] = step
    return steps


# --------------------------------------------------------------------------------------------------------
# Quality (and, for benchmarks, time and memory): train a copy per precision for the same steps
# --------------------------------------------------------------------------------------------------------
def _train_timed(model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, ...]], device: torch.device,
                 amp: torch.dtype | None, *, steps: int, lr: float) -> tuple[list[float], torch.Tensor, int]:
    """Train ``model`` for ``steps`` AdamW steps under ``amp`` (batches cycled; a GradScaler for fp16).

    Returns the seconds of each step (device synchronised), the last step's loss, and how many steps the scaler
    skipped (an overflow lowers its scale).
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)
    times: list[float] = []
    last = torch.zeros((), device=device)
    skipped = 0
    for i in range(steps):
        x, y = batches[i % len(batches)]
        synchronize(device)
        t0 = clock.now()
        with autocast(device, amp):
            out = model(x)
        loss = mean_cross_entropy(out, y)
        scale_before = scaler.get_scale() if scaler.is_enabled() else 1.0
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        synchronize(device)
        times.append(clock.now() - t0)
        last = loss.detach()
        if scaler.is_enabled() and scaler.get_scale() < scale_before:
            skipped += 1
    return times, last, skipped


def compare_precisions(
    make_model: Callable[[], torch.nn.Module],
    make_batches: Callable[[], Sequence[tuple[torch.Tensor, torch.Tensor]]],
    *,
    device: torch.device | str,
    steps: int,
    precisions: Sequence[str] = ("fp32", "bf16"),
    lr: float = 1e-3,
    val_batches: Callable[[], Sequence[tuple[torch.Tensor, torch.Tensor]]] | None = None,
) -> list[dict[str, Any]]:
    """Train a copy of one model under each precision for ``steps`` steps; one row per precision.

    ``make_model()`` is called once (the copies share its initial weights); ``make_batches()`` once (every
    precision sees the same batches in the same order, cycled). ``val_batches()``, when given, returns held-out
    batches the copies never train on: quality is judged on them (on the training batches otherwise, which says
    how well a copy fits what it saw, not how well it learned). Rows: precision, step_ms (median, first step
    excluded: a rough figure; time comparisons belong to :func:`precision_steps` + ``compare``), activation_mb,
    activation_fp32_mb and activation_int_mb (the parts saved as fp32 and as integers, e.g. max-pool indices), and
    weight_copy_mb (:func:`saved_activation_bytes`, first batch), final_loss (training loss of the last step),
    eval_loss and eval_acc (fp32 :func:`~course_lib.train.evaluate.evaluate` of the trained copy), eval_on
    (``"held-out"`` or ``"training"``: the batches eval_loss and eval_acc were computed on), and the ratios
    step_time_vs_fp32 and activation_vs_fp32 when fp32 is in the list.

    Taught in lesson 05 (``notebooks/05_mixed_precision.ipynb``).
    """
    if steps < 2:
        raise ValueError(f"steps={steps} must be >= 2 (the first step is excluded from timing).")
    device = torch.device(device)
    dtypes = {p: amp_dtype_of(p, device) for p in precisions}  # clear errors before any work
    base = make_model()
    batches = [tuple(t.to(device) for t in b[:2]) for b in make_batches()]
    if not batches:
        raise ValueError("make_batches() returned no batch.")
    held_out = None if val_batches is None else [tuple(t.to(device) for t in b[:2]) for b in val_batches()]
    if held_out is not None and not held_out:
        raise ValueError("val_batches() returned no batch.")
    rows: list[dict[str, Any]] = []
    for name, amp in dtypes.items():
        model = copy.deepcopy(base).to(device).train()
        saved = saved_activation_bytes(model, batches[0][0], amp_dtype=amp)
        times, last, skipped = _train_timed(model, batches, device, amp, steps=steps, lr=lr)
        metrics = evaluate(model, batches if held_out is None else held_out, device)
        rows.append({
            "precision": name, "device": str(device), "steps": steps,
            "step_ms": 1000 * statistics.median(times[1:]),
            "activation_mb": saved["activation_bytes"] / 2**20, "weight_copy_mb": saved["weight_bytes"] / 2**20,
            "activation_fp32_mb": saved["activation_bytes_by_dtype"].get("torch.float32", 0) / 2**20,
            "activation_int_mb": sum(n for d, n in saved["activation_bytes_by_dtype"].items()
                                     if "int" in d or "bool" in d) / 2**20,
            "final_loss": float(last), "eval_loss": metrics["loss"], "eval_acc": metrics["acc"],
            "eval_on": "training" if held_out is None else "held-out",
            "skipped_steps": skipped,
        })
    ref = next((r for r in rows if r["precision"] == "fp32"), None)
    for r in rows:
        r["step_time_vs_fp32"] = r["step_ms"] / ref["step_ms"] if ref else None
        r["activation_vs_fp32"] = r["activation_mb"] / ref["activation_mb"] if ref and ref["activation_mb"] else None
    return rows


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text side-by-side table of :func:`compare_precisions` rows (memory and quality).

    Taught in lesson 05 (``notebooks/05_mixed_precision.ipynb``).
    """
    lines = [f"{'precision':<9} {'activations MiB':>15} {'weight copies MiB':>17} {'final loss':>11} "
             f"{'eval loss':>10} {'eval acc':>9}"]
    for r in rows:
        lines.append(f"{r['precision']:<9} {r['activation_mb']:>15.2f} {r['weight_copy_mb']:>17.2f} "
                     f"{r['final_loss']:>11.4f} {r['eval_loss']:>10.4f} {r['eval_acc']:>9.3f}")
    judged_on = sorted({r["eval_on"] for r in rows if "eval_on" in r})
    if judged_on:
        lines.append(f"(eval loss and eval acc: on the {' and '.join(judged_on)} batches)")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------
# Loss scaling, watched step by step
# --------------------------------------------------------------------------------------------------------
def grad_scaler_demo(
    *,
    steps: int = 8,
    overflow_at: Sequence[int] = (3,),
    init_scale: float = 2.0**10,
    growth_interval: int = 2,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Train a tiny model with fp16 autocast and an enabled ``GradScaler``; one row per step.

    At the steps in ``overflow_at`` the batch is multiplied by 1e6, which overflows fp16 (largest value 65,504):
    the forward produces ``inf``, the gradients are ``inf``/``nan``, and the scaler must **skip** the optimizer
    step and halve its scale (``backoff_factor=0.5``). After ``growth_interval`` clean steps in a row it doubles the
    scale (``growth_factor=2``). Rows: step, overflow (injected), scale_before, scale_after, skipped (the weights did
    not change), loss.

    Taught in lesson 05 (``notebooks/05_mixed_precision.ipynb``).
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a whole number >= 1.")
    bad = [s for s in overflow_at if not (isinstance(s, int) and 0 <= s < steps)]
    if bad:
        raise ValueError(f"overflow_at={list(overflow_at)} has steps {bad} outside 0..{steps - 1}.")
    if not isinstance(growth_interval, int) or growth_interval < 1:
        raise ValueError(f"growth_interval={growth_interval!r} must be a whole number >= 1.")
    device = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(16, 4)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, growth_interval=growth_interval)
    rows: list[dict[str, Any]] = []
    for step in range(steps):
        x = torch.randn(8, 16, generator=g).to(device)
        y = torch.randint(0, 4, (8,), generator=g).to(device)
        overflow = step in overflow_at
        if overflow:
            x = x * 1e6
        before_w = [p.detach().clone() for p in model.parameters()]
        scale_before = scaler.get_scale()
        with torch.autocast(device.type, dtype=torch.float16):
            out = model(x)
        loss = mean_cross_entropy(out, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        unchanged = all(torch.equal(a, p) for a, p in zip(before_w, model.parameters()))
        rows.append({"step": step, "overflow": overflow, "scale_before": scale_before,
                     "scale_after": scaler.get_scale(), "skipped": unchanged, "loss": float(loss.detach())})
    return rows


# --------------------------------------------------------------------------------------------------------
# Explaining a speed verdict from the device's facts
# --------------------------------------------------------------------------------------------------------
def _literal(text: str) -> str:
    """``text`` safe inside an explanation template (a brace in a device name is not a field)."""
    return text.replace("{", "{{").replace("}", "}}")


def _roofs_clause(facts: DeviceFacts, low: str) -> str:
    """``"; measured matmul roofs: bf16 758 TFLOP/s vs fp32 50.7 TFLOP/s (15x)"``, or ``""`` when not measured."""
    ratio = facts.roof_ratio(low)
    if ratio is None:
        return ""
    names = {"bf16": "bfloat16", "fp16": "float16"}
    high, base = facts.matmul[names[low]], facts.matmul["float32"]
    return (f"; measured matmul roofs: {low} {high / 1e12:,.3g} TFLOP/s vs fp32 {base / 1e12:,.3g} TFLOP/s "
            f"({ratio:,.2g}x)")


def _busy_clause(busy: Mapping[str, KernelShare], low: str) -> str:
    """What the profiler saw, e.g. ``"the profiler saw the GPU running kernels for 12% of the bf16 step's wall time
    and 30% of the fp32 step's"``."""
    parts = [f"{busy[name].share:.0%} of the {name} step's wall time" if i == 0 else f"{busy[name].share:.0%} of the "
             f"{name} step's" for i, name in enumerate(n for n in (low, "fp32") if n in busy)]
    return "the profiler saw the GPU running kernels for " + " and ".join(parts)


def _has_fast_units(facts: DeviceFacts, low: str) -> bool:
    """Tensor cores for ``low``: bf16 from compute capability 8.0, fp16 from 7.0."""
    if facts.kind != "cuda" or facts.capability is None:
        return False
    return facts.capability >= ((8, 0) if low == "bf16" else (7, 0))


def precision_speed_texts(facts: DeviceFacts, *, low: str = "bf16",
                          busy: Mapping[str, KernelShare] | None = None) -> dict[str, str]:
    """The three explanations of lesson 05's step verdict ``low`` vs ``"fp32"``, for
    ``lesson.explain(verdict, **precision_speed_texts(facts, low=..., busy=...))``.

    ``facts``: the device's reported and measured facts (:mod:`course_lib.perf.device_facts`); ``busy``: the
    profiler's kernel share of each precision's step (:func:`~course_lib.perf.kernel_time.kernel_share`), ``None``
    where there is none (a CPU, or not measured). The texts name what this device has (tensor cores and measured
    roofs on a GPU, bf16 instructions on a CPU), say "overhead-bound" only when the kernel share says so, and never
    advise keeping fp32 where the hardware has fast ``low`` units or the step was overhead-bound.

    Taught in lesson 05 (``notebooks/05_mixed_precision.ipynb``).
    """
    if low not in ("bf16", "fp16"):
        raise ValueError(f"low={low!r} must be 'bf16' or 'fp16' (the autocast dtype timed against fp32).")
    units = _literal(facts.low_precision_units)
    if facts.kind == "cpu":
        casts = ("the casts autocast adds (every weight and activation converted on the way in, results converted "
                 "back for fp32 ops)")
        if facts.cpu_bf16_units and low == "bf16":
            return {
                "faster": f"This CPU has {units}, and that gain outweighed {casts}.",
                "slower": f"This CPU has {units}, yet the {low} step was slower: at this model's size {casts} "
                          f"outweighed what the {low} instructions saved.",
                "too_close": f"This CPU has {units}, and at this model's size what they save and {casts} roughly "
                             f"cancel out: no speed reason for {low} here, and none against it.",
            }
        return {
            "faster": f"{low} won on this CPU although it has {units}: its kernels move half the bytes of fp32's, "
                      f"which outweighed {casts}.",
            "slower": f"This CPU has {units}, so the {low} kernels did not make up for {casts}: low precision cost "
                      f"time here. Keep fp32 for speed on this machine; {low} pays off where the hardware has fast "
                      f"{low} units.",
            "too_close": f"This CPU has {units}: the {low} kernels and {casts} roughly cancel out, so there is no "
                         f"speed reason for {low} here, and none against it.",
        }
    has = f"This GPU ({_literal(facts.name)}) has {units}{_roofs_clause(facts, low)}"
    fast = _has_fast_units(facts, low)
    overhead = bool(busy) and low in busy and busy[low].overhead_bound
    kernels_busy = bool(busy) and low in busy and not busy[low].overhead_bound
    cure = ("Faster arithmetic cannot show until each step gives the GPU more work (a larger batch or model) or "
            "fewer launches (torch.compile, CUDA graphs: lesson 07).")
    if overhead:
        bound = (f"{_busy_clause(busy, low)}: the step is **overhead-bound**. Python, the dispatcher and kernel "
                 f"launches set its time, not the {low} or fp32 arithmetic, and autocast's casts are extra kernels "
                 f"to launch. {cure}")
        return {
            "faster": f"{has}. The {low} step won, although {bound}",
            "slower": f"{has}, so its {low} kernels are not what made the step slower: {bound}",
            "too_close": f"{has}, yet both precisions took the same time: {bound}",
        }
    busy_sentence = f" ({_busy_clause(busy, low)})" if kernels_busy else ""
    if not fast:
        return {
            "faster": f"{has}. {low} still won{busy_sentence}: its kernels move half the bytes of fp32's, which a "
                      "memory-bound step feels even without fast matrix units.",
            "slower": f"{has}: {low} has no faster matrix units here{busy_sentence}, so autocast's casts are pure "
                      f"cost. Keep fp32 for speed on this GPU; {low} still halves the activations' memory.",
            "too_close": f"{has}: {low} has no faster matrix units here{busy_sentence}, and what its smaller bytes "
                         "save the casts cost.",
        }
    not_matmul = ("so its time is not in matmul arithmetic but in kernels that tensor cores do not speed up: "
                  "autocast's casts, normalisation and pointwise operations, the optimizer, all moving bytes")
    if kernels_busy:
        why_not = (f"{_busy_clause(busy, low)}: the kernels set the time, {not_matmul}. Lesson 07's profiler "
                   "table, sorted by device time, shows which kernels grew.")
    else:
        why_not = ("a step that does not gain from them spends its time elsewhere: in launching kernels (overhead) "
                   "or in kernels tensor cores do not speed up (casts, normalisation, the optimizer). The profiler's "
                   "kernel time against the step's wall time tells which (lesson 07).")
    return {
        "faster": f"{has}, and this step gave them enough work: autocast's {low} matmuls and convolutions outran the "
                  f"casts it adds around them{busy_sentence}.",
        "slower": f"{has}, yet the {low} step was slower: {why_not}",
        "too_close": f"{has}, yet both precisions took the same time: {why_not}",
    }


def tf32_texts(facts: DeviceFacts, *, size: int) -> dict[str, str]:
    """The three explanations of lesson 05's ``"high" (TF32 allowed)`` vs ``"highest" (strict fp32)`` verdict on a
    ``size`` x ``size`` matmul, in the words of this device (TF32 is NVIDIA's, from Ampere on; on a CPU "high" can
    only let the math library use a reduced-precision fp32 mode of its own).

    Taught in lesson 05 (``notebooks/05_mixed_precision.ipynb``).
    """
    units, name = _literal(facts.low_precision_units), _literal(facts.name)
    shape = f"{size}x{size}"
    if facts.kind == "cpu":
        return {
            "faster": "Allowing a lower-precision matmul paid off on this CPU. That is not TF32, which only NVIDIA "
                      "GPUs have, but the math library's own reduced-precision fp32 mode, if it has one; if it has "
                      "none, the difference is load that changed between rounds, so run the cell again before "
                      "believing it.",
            "slower": "The strict setting was faster, which no precision setting explains: on this CPU both run the "
                      "same kind of kernel, so this is background load hitting one side's rounds more. Run the cell "
                      "again: expect no real difference.",
            "too_close": "As expected on a CPU: TF32 exists only on NVIDIA GPUs, so both settings run the same fp32 "
                         "kernels and only noise separates them.",
        }
    gpu = f"this GPU ({name}: {units})"
    if facts.has_tf32:
        return {
            "faster": f"TF32 ran this {shape} fp32 matmul on the tensor cores of {gpu}: the operands stay fp32, and "
                      "each product is computed with a 10-bit mantissa, which the tensor cores do several times "
                      "faster than strict fp32 arithmetic.",
            "slower": f"The strict setting was faster at {shape}, which the TF32 tensor cores of {gpu} do not "
                      "explain: run the cell again; if it repeats, the profiler (lesson 07) shows which matmul "
                      "kernel each setting chose.",
            "too_close": f"At {shape} the two settings ran alike, although {gpu} has TF32 tensor cores: TF32 did not "
                         "apply (check `torch.backends.cuda.matmul.allow_tf32` and the matmul precision), or the "
                         "call is too small to keep the tensor cores busy. Run the cell again.",
        }
    noise = (f"{gpu[0].upper()}{gpu[1:]} has no TF32, which needs compute capability 8.0: both settings run the same "
             "fp32 kernels, so this difference is load that changed between rounds. Run the cell again.")
    return {
        "faster": noise,
        "slower": noise,
        "too_close": f"As expected: {gpu} has no TF32, which needs compute capability 8.0, so both settings run the "
                     "same fp32 kernels.",
    }


__all__ = [
    "PRECISIONS", "amp_dtype_of", "saved_activation_bytes", "precision_steps", "compare_precisions", "format_rows",
    "grad_scaler_demo", "precision_speed_texts", "tf32_texts",
]
