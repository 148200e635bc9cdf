"""``make_loader``: one place that builds every DataLoader of the course, with each argument checked first.

The DataLoader knobs and what they trade:

* ``batch_size``: samples per step. Bigger batches amortise per-step overhead but change the optimisation.
* ``num_workers``: processes that run ``dataset[key]`` (decode + augment) in parallel with training.
  ``0`` runs everything in the main process: slower, but the place to debug (breakpoints and prints work).
* ``prefetch_factor``: batches each worker prepares ahead; about ``num_workers * prefetch_factor`` batches are in
  flight. Only meaningful with worker processes, so giving it with ``num_workers=0`` is an error here (torch would
  also refuse it) rather than something silently ignored.
* ``persistent_workers``: keep the worker processes alive between epochs (saves their start-up each epoch).
  Also only meaningful with workers.
* ``pin_memory``: copy batches into page-locked host memory, which lets ``tensor.to("cuda", non_blocking=True)``
  run as an asynchronous DMA transfer that overlaps with compute. It only helps with a CUDA device, and pinning
  costs a copy and locked RAM, so it is applied only when ``torch.cuda.is_available()``; elsewhere the loader
  does not pin and says so once per process (a warning, not an error), so one notebook runs unchanged on a
  laptop and on a GPU machine.
* ``shuffle``: training reads a fresh permutation per epoch (through :class:`ResumableSampler`); validation
  reads a stable order so two evaluations are comparable.
* ``drop_last``: defaults to True for training (every step sees the same batch shape: no tiny last batch that
  makes BatchNorm statistics noisy or triggers a recompilation) and False for validation (every sample counts).
* ``collate_fn``: how samples become a batch; variable-length text needs padding (:func:`pad_collate`), which
  datasets announce with a ``default_collate_fn`` class attribute.

Reproducibility: the order comes from the sampler (a pure function of seed and epoch), augmentation from the
``(index, aug_seed)`` keys, and the worker processes' own RNGs from a seeded ``generator`` plus
:func:`seed_worker`.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from course_lib.data.errors import LoaderConfigError
from course_lib.data.sampler import ResumableSampler


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn``: seed Python's and NumPy's RNGs in each worker from torch's per-worker seed.

    The DataLoader already gives each worker its own torch seed (base seed + worker id); ``random`` and
    ``numpy`` are not covered, so without this every worker could produce the same "random" numbers, and they
    would differ from run to run. Module scope, so it pickles under the ``spawn`` start method.
    """
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


def _quiet_exit(signum: int, frame: Any) -> None:
    os._exit(0)


def _init_worker(worker_id: int) -> None:
    """``worker_init_fn`` of :func:`make_loader`: :func:`seed_worker`, and Ctrl-C and SIGTERM left to the main process.

    A terminal's Ctrl-C and a scheduler's SIGTERM reach the whole process group. A worker that died of one made the
    main process fail with "DataLoader worker ... killed by signal" (with a traceback from the loader's ``__del__``)
    before it could stop cleanly. Here Ctrl-C is ignored (the main process stops, then shuts its workers down), and
    SIGTERM ends the worker with status 0, which PyTorch does not report (ignoring it would defeat the loader's own
    ``terminate()`` of a stuck worker). A worker whose main process is killed outright still exits (its watchdog).
    """
    seed_worker(worker_id)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _quiet_exit)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise LoaderConfigError(message)


def make_loader(
    dataset: Dataset,
    *,
    batch_size: int,
    train: bool,
    num_workers: int = 0,
    pin_memory: bool = False,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    drop_last: bool | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    seed: int = 0,
    sampler: Sampler | None = None,
    rank: int = 0,
    world_size: int = 1,
    multiprocessing_context: str | None = None,
) -> DataLoader:
    """Validate every argument (raising :class:`LoaderConfigError`), then build the DataLoader.

    ``train=True``: a shuffling :class:`ResumableSampler` (reach it as ``loader.sampler`` to call
    ``set_epoch``/``set_position``); it yields ``(index, aug_seed)`` keys when the dataset declares
    ``accepts_aug_seed = True``. ``train=False``: stable order, no repeated samples. ``rank``/``world_size``
    shard the data across distributed processes. ``multiprocessing_context`` (e.g. ``"spawn"``) picks how worker
    processes start. ``pin_memory=True`` without CUDA warns once and does not pin (see the module docstring).

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    _check_arguments(
        batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory, prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers, drop_last=drop_last, collate_fn=collate_fn, seed=seed,
        sampler=sampler, rank=rank, world_size=world_size, multiprocessing_context=multiprocessing_context,
    )
    n = _dataset_length(dataset)
    drop_last = train if drop_last is None else drop_last
    shard = -(-n // world_size)
    _check(not (drop_last and shard < batch_size),
           f"batch_size={batch_size} is larger than the {shard} samples this process reads, and drop_last=True "
           "would drop them all (zero batches). Lower batch_size or pass drop_last=False.")
    if sampler is None:
        sampler = ResumableSampler(
            n, shuffle=train, seed=seed, rank=rank, world_size=world_size,
            yield_seeds=train and bool(getattr(dataset, "accepts_aug_seed", False)),
            pad=train,  # validation shards never repeat a sample, so every sample is counted once
        )
    workers: dict[str, Any] = {}
    if num_workers > 0:
        workers = {"prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers,
                   "worker_init_fn": _init_worker, "multiprocessing_context": multiprocessing_context}
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_fn if collate_fn is not None else getattr(dataset, "default_collate_fn", None),
        pin_memory=_pin_memory_possible(pin_memory),
        drop_last=drop_last,
        generator=torch.Generator().manual_seed(seed),
        **workers,
    )


def _check_arguments(
    *,
    batch_size: Any,
    num_workers: Any,
    pin_memory: Any,
    prefetch_factor: Any,
    persistent_workers: Any,
    drop_last: Any,
    collate_fn: Any,
    seed: Any,
    sampler: Any,
    rank: Any,
    world_size: Any,
    multiprocessing_context: Any,
) -> None:
    """Raise :class:`LoaderConfigError` naming the first argument of :func:`make_loader` that is invalid.

    Checks the arguments alone and in combination (e.g. ``prefetch_factor`` needs workers); the checks that need
    the dataset (its length against ``batch_size``) are made by :func:`make_loader`.
    """
    _check(_is_int(batch_size) and batch_size >= 1,
           f"batch_size={batch_size!r} must be an int >= 1 (samples per batch).")
    _check(_is_int(num_workers) and num_workers >= 0,
           f"num_workers={num_workers!r} must be an int >= 0 (0 = load in the main process).")
    if prefetch_factor is not None:
        _check(num_workers > 0,
               f"prefetch_factor={prefetch_factor!r} was given with num_workers=0: prefetching is done by worker "
               "processes, so it has no effect without them. Set num_workers >= 1 or drop prefetch_factor.")
        _check(_is_int(prefetch_factor) and prefetch_factor >= 1,
               f"prefetch_factor={prefetch_factor!r} must be an int >= 1 (batches prepared ahead per worker) "
               "or None for torch's default.")
    _check(isinstance(persistent_workers, bool),
           f"persistent_workers={persistent_workers!r} must be True or False.")
    _check(not (persistent_workers and num_workers == 0),
           "persistent_workers=True was given with num_workers=0: it keeps worker processes alive between "
           "epochs, and there are none. Set num_workers >= 1 or persistent_workers=False.")
    _check(isinstance(pin_memory, bool), f"pin_memory={pin_memory!r} must be True or False.")
    _check(drop_last is None or isinstance(drop_last, bool),
           f"drop_last={drop_last!r} must be True, False or None (None = True for train, False for val).")
    _check(collate_fn is None or callable(collate_fn),
           f"collate_fn={collate_fn!r} is not callable; pass a function list-of-samples -> batch, or None.")
    _check(_is_int(seed), f"seed={seed!r} must be an int.")
    _check(_is_int(world_size) and world_size >= 1, f"world_size={world_size!r} must be an int >= 1.")
    _check(_is_int(rank) and 0 <= rank < world_size,
           f"rank={rank!r} must be an int in [0, world_size={world_size}).")
    _check(multiprocessing_context in (None, "spawn", "fork", "forkserver"),
           f"multiprocessing_context={multiprocessing_context!r} must be None, 'spawn', 'fork' or 'forkserver'.")
    _check(not (multiprocessing_context is not None and num_workers == 0),
           f"multiprocessing_context={multiprocessing_context!r} was given with num_workers=0: it chooses how "
           "worker processes start, and there are none. Set num_workers >= 1 or drop it.")
    _check(sampler is None or (rank == 0 and world_size == 1),
           f"sampler was given together with rank={rank}, world_size={world_size}: a custom sampler does its own "
           "sharding. Pass rank/world_size to the sampler, or drop sampler to get a ResumableSampler.")


def _dataset_length(dataset: Dataset) -> int:
    """``len(dataset)``, or a :class:`LoaderConfigError` when it has none or is empty."""
    try:
        n = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        raise LoaderConfigError(f"dataset={type(dataset).__name__} has no len(); make_loader needs a map-style "
                                "dataset (with __len__ and __getitem__).") from None
    _check(n >= 1, f"dataset={type(dataset).__name__} is empty (len 0); check its path or generation.")
    return n


def _pin_memory_possible(pin_memory: bool) -> bool:
    """``pin_memory`` where CUDA is available; without CUDA, False (with a one-time warning if it was asked for)."""
    if pin_memory and not torch.cuda.is_available():
        _warn_pinning_needs_cuda()
        return False
    return pin_memory


@functools.cache
def _warn_pinning_needs_cuda() -> None:
    warnings.warn(
        "make_loader(pin_memory=True): no CUDA device here, so batches are not pinned (pinning only speeds up "
        "copies to a CUDA GPU). The same code pins on a GPU machine; this is said once per process.",
        stacklevel=4,
    )
