"""The course's one loss: cross-entropy over the real targets, as a sum and a count.

Targets equal to :data:`IGNORE_INDEX` (``-100``: text padding, see :func:`course_lib.data.pad_collate`) are not
targets: they add nothing to the loss and are not counted. Returning the *sum* and the *count* separately (rather
than a mean) is what lets accumulation and evaluation divide once, by the right number, whatever the batch sizes.

Logits are ``[B, K]`` (images) or ``[B, T, V]`` (text: one prediction per position, flattened to ``[B*T, V]``).
The loss is computed in fp32 even under autocast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from course_lib.data.text import IGNORE_INDEX


def flatten_predictions(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``([N, classes], [N])``: a language model's ``[B, T, V]`` / ``[B, T]`` flattened; image batches unchanged."""
    if logits.dim() == 2:
        return logits, targets  # already flat: no reshape on the training loop's hot path
    return logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)


def _fp32(logits: torch.Tensor) -> torch.Tensor:
    """The loss is computed in fp32 even under autocast (a no-op, and no dispatch, for fp32 logits)."""
    return logits if logits.dtype == torch.float32 else logits.float()


def real_targets(targets: torch.Tensor) -> torch.Tensor:
    """Boolean mask of the targets that count (not :data:`IGNORE_INDEX`)."""
    return targets != IGNORE_INDEX


def cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of the per-target cross-entropy over the real targets, in fp32 (a 0-d tensor on the device)."""
    logits, targets = flatten_predictions(logits, targets)
    return F.cross_entropy(_fp32(logits), targets, ignore_index=IGNORE_INDEX, reduction="sum")


def summed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of per-target cross-entropy in fp32, number of real targets)``, both 0-d tensors on the device."""
    return cross_entropy_sum(logits, targets), real_targets(targets).sum()


def mean_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the real targets of one batch (what a plain training step minimises)."""
    logits, targets = flatten_predictions(logits, targets)
    return F.cross_entropy(_fp32(logits), targets, ignore_index=IGNORE_INDEX)


__all__ = ["IGNORE_INDEX", "flatten_predictions", "real_targets", "cross_entropy_sum", "summed_cross_entropy",
           "mean_cross_entropy"]
