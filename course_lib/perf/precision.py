"""fp32 vs bf16 (vs fp16 on CUDA), side by side: same initial weights, same batches, same number of steps.

What mixed precision (``torch.autocast``) actually does:

* Matmuls and convolutions run in the low-precision dtype (that is where the speed is, on hardware with bf16/fp16
  units: tensor cores, AVX512-BF16/AMX on recent CPUs; elsewhere it can even be *slower*).
* Reductions, softmax, normalisation layers and the loss stay in fp32 (autocast's op lists), because they lose
  too much accuracy otherwise. The weights and their gradients stay fp32; the optimizer updates fp32 weights.
* **Memory is not simply halved**: parameters, gradients and optimizer state are unchanged; only the activations
  saved for backward shrink (and autocast caches a low-precision copy of each weight during the forward).
* **Metrics differ** slightly: rounding changes the trajectory. Compare curves, not bits.
* fp16 has a narrow exponent range, so small gradients underflow to zero: it needs a ``GradScaler`` (loss
  scaling). bf16 has fp32's range and needs none. fp16 autocast is only offered on CUDA here.

Test precision alone first (this function), before combining it with compile or other changes.
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from course_lib.device import autocast, resolve_amp_dtype, synchronize
from course_lib.perf.memory import PeakMemory


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=-100)


def compare_precisions(
    make_model: Callable[[], torch.nn.Module],
    make_batches: Callable[[], Sequence[tuple[torch.Tensor, torch.Tensor]]],
    *,
    device: torch.device | str,
    steps: int,
    precisions: Sequence[str] = ("fp32", "bf16"),
    lr: float = 1e-3,
) -> list[dict[str, Any]]:
    """Train a copy of one model under each precision and return one row per precision.

    ``make_model()`` is called once (the copies share its initial weights); ``make_batches()`` once (every
    precision sees the same batches in the same order, cycled for ``steps`` steps). Rows: precision, step_ms
    (median, first step excluded), peak_mb and peak_what (see :class:`~course_lib.perf.memory.PeakMemory`),
    final_loss (training loss of the last step), eval_loss and eval_acc (fp32 evaluation of the trained copy on the
    batches), and the ratios step_time_vs_fp32 and peak_vs_fp32 when fp32 is in the list.
    """
    if steps < 2:
        raise ValueError(f"steps={steps} must be >= 2 (the first step is excluded from timing).")
    device = torch.device(device)
    for p in precisions:
        if p == "fp16" and device.type != "cuda":
            raise ValueError("precision 'fp16' needs CUDA (with a GradScaler); on this device compare fp32 and bf16.")
        resolve_amp_dtype(p, device)  # raises a clear error for unknown/unsupported names before any work
    base = make_model()
    batches = [tuple(t.to(device) for t in b[:2]) for b in make_batches()]
    if not batches:
        raise ValueError("make_batches() returned no batch.")
    rows: list[dict[str, Any]] = []
    for name in precisions:
        amp = resolve_amp_dtype(name, device)
        model = copy.deepcopy(base).to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(device.type, enabled=(name == "fp16"))
        times: list[float] = []
        last = float("nan")
        with PeakMemory(device) as pm:
            for i in range(steps):
                x, y = batches[i % len(batches)]
                synchronize(device)
                t0 = time.perf_counter()
                with autocast(device, amp):
                    out = model(x)
                loss = _loss(out, y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
                synchronize(device)
                times.append(time.perf_counter() - t0)
                last = loss.item()
        model.eval()
        total_loss, correct, count = 0.0, 0, 0
        with torch.no_grad():
            for x, y in batches:
                out = model(x).float()
                total_loss += F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=-100,
                                              reduction="sum").item()
                mask = y.reshape(-1) != -100
                correct += (out.reshape(-1, out.shape[-1]).argmax(-1)[mask] == y.reshape(-1)[mask]).sum().item()
                count += int(mask.sum())
        rows.append({
            "precision": name, "device": str(device), "steps": steps,
            "step_ms": 1000 * statistics.median(times[1:]), "peak_mb": pm.peak_mb, "peak_delta_mb": pm.delta_mb,
            "peak_what": pm.what, "final_loss": last, "eval_loss": total_loss / max(1, count),
            "eval_acc": correct / max(1, count),
        })
    ref = next((r for r in rows if r["precision"] == "fp32"), None)
    for r in rows:
        r["step_time_vs_fp32"] = r["step_ms"] / ref["step_ms"] if ref else None
        r["peak_vs_fp32"] = r["peak_delta_mb"] / ref["peak_delta_mb"] if ref and ref["peak_delta_mb"] > 0 else None
    return rows


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text side-by-side table of :func:`compare_precisions` rows."""
    lines = [f"{'precision':<9} {'step ms':>9} {'x fp32':>7} {'peak +MiB':>10} {'final loss':>11} {'eval acc':>9}"]
    for r in rows:
        ratio = f"{r['step_time_vs_fp32']:.2f}" if r.get("step_time_vs_fp32") else "-"
        lines.append(f"{r['precision']:<9} {r['step_ms']:>9.2f} {ratio:>7} {r['peak_delta_mb']:>10.1f} "
                     f"{r['final_loss']:>11.4f} {r['eval_acc']:>9.3f}")
    return "\n".join(lines)


__all__ = ["compare_precisions", "format_rows"]
