"""The tiny training run the template's tests share: 40 samples, micro-batches of 8, 2 per step, dropout on."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from course_lib.data import make_loader
from course_lib.models import Net
from course_lib.train import TrainConfig


def tiny_run(out: Path, **overrides):
    """``(model, train_loader, val_loader, cfg)`` for a deterministic run into ``out`` (groups 2, 2, 1 per epoch)."""
    g = torch.Generator().manual_seed(123)
    x, y = torch.randn(40, 3, 2, 2, generator=g), torch.randint(0, 4, (40,), generator=g)
    train_loader = make_loader(TensorDataset(x, y), batch_size=8, train=True, seed=0)
    val_loader = make_loader(TensorDataset(x[:20], y[:20]), batch_size=8, train=False)
    torch.manual_seed(0)
    model = Net(d_in=12, d=16, n_blocks=1, n_out=4, p=0.2)
    values = dict(lr=1e-2, warmup=2, steps=8, bs=8, accum=2, eval_every=3, log_every=1, device="cpu",
                  model="net", out=str(out))
    values.update(overrides)
    return model, train_loader, val_loader, TrainConfig(**values)
