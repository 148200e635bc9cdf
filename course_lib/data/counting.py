"""A dataset wrapper that counts its ``__getitem__`` calls: where does per-worker state go?

Module scope, so DataLoader workers can unpickle it under ``spawn``.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset


class CountingDataset(Dataset):
    """Wrap ``dataset`` and count ``__getitem__`` calls in ``self.calls``: the worker-local state demonstration.

    With ``num_workers=0`` the count grows in the notebook's process. With worker processes each worker
    increments *its own copy* of the object (it was pickled or forked into the worker), so ``self.calls`` in the
    notebook stays 0: per-worker counters, logs and caches are never aggregated back for you.

    Taught in lesson 02 (``notebooks/02_dataloader.ipynb``).
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.calls = 0
        # Keep the wrapped dataset's (index, aug_seed) protocol visible to make_loader.
        self.accepts_aug_seed = bool(getattr(dataset, "accepts_aug_seed", False))

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: Any) -> Any:
        self.calls += 1
        return self.dataset[key]
