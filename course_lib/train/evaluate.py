"""Evaluation: sums over the whole validation set, divided once at the end.

Averaging per-batch *means* is wrong when batches differ in size (the last one usually does, and text batches
differ in their number of real tokens): a batch of 3 would weigh as much as a batch of 64. Summing per-target
losses and correct predictions, then dividing by the total count, gives the true mean, whatever the batch size.

``torch.inference_mode()`` turns off autograd bookkeeping entirely (cheaper than ``no_grad``), and ``model.eval()``
switches dropout off and BatchNorm to its running statistics. The model's previous mode is restored afterwards,
and the global RNG is forked (iterating a DataLoader draws a seed from it), so calling ``evaluate`` in the middle
of training changes neither the model's mode nor the random numbers training draws next.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from course_lib.device import autocast
from course_lib.train.accumulate import move_batch
from course_lib.train.loss import flatten_predictions, real_targets, summed_cross_entropy


def evaluate(
    model: nn.Module,
    loader: Iterable[Sequence[torch.Tensor]],
    device: torch.device | str,
    amp_dtype: torch.dtype | None = None,
) -> dict[str, float]:
    """``{"loss": mean cross-entropy, "acc": fraction correct}`` over every target != -100 in ``loader``.

    Works for image batches (logits ``[B, K]``) and text batches (logits ``[B, T, V]``). Reads the device once,
    at the end (two ``.item()`` calls in total, not two per batch).

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    device = torch.device(device)
    was_training = model.training
    model.eval()
    # float64 sums lose nothing over many batches; MPS has no float64, float32 is fine there.
    acc_dtype = torch.float32 if device.type == "mps" else torch.float64
    loss_sum = torch.zeros((), device=device, dtype=acc_dtype)
    correct = torch.zeros((), device=device, dtype=torch.long)
    count = torch.zeros((), device=device, dtype=torch.long)
    rng_devices = [device] if device.type == "cuda" else []
    try:
        with torch.inference_mode(), torch.random.fork_rng(devices=rng_devices):
            for batch in loader:
                x, y = move_batch(batch[:2], device)
                with autocast(device, amp_dtype):
                    logits = model(x)
                logits, y = flatten_predictions(logits, y)
                batch_sum, batch_count = summed_cross_entropy(logits, y)
                loss_sum += batch_sum.to(acc_dtype)
                correct += ((logits.argmax(-1) == y) & real_targets(y)).sum()
                count += batch_count
    finally:
        model.train(was_training)
    n = int(count)
    if n == 0:
        raise ValueError("evaluate: the loader produced no targets (empty loader, or every target is -100).")
    return {"loss": float(loss_sum) / n, "acc": int(correct) / n}
