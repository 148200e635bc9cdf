"""Measuring a DataLoader, and the order in which to tune one.

Tuning a loader by rule of thumb ("num_workers = number of cores") is guessing. The course measures instead, one
change at a time, in this order (:func:`experiment_order`):

1. **Baseline**: ``num_workers=0`` -- everything in the main process. Debug here first; record samples/s.
2. **Worker counts** 1, 2, 4, ... up to the core count: workers decode and augment in parallel with the model.
   Past the number of free cores, more workers only compete with each other and with the training process.
3. **Batch size**: bigger batches amortise per-batch overhead (collation, Python, kernel launches) -- but change
   the optimisation, so the learning rate may need to follow.
4. **Pinned memory** (``pin_memory=True`` + ``.to(device, non_blocking=True)``): page-locked host buffers let the
   copy to a CUDA GPU run asynchronously. Only meaningful when the batches go to a CUDA device; on a CPU-only
   machine it has nothing to speed up (the sweep says so instead of measuring noise).
5. **prefetch_factor**: batches each worker prepares ahead (``workers x prefetch_factor`` batches in flight).
   Helps with bursty loading; costs host memory. Only valid with workers > 0.
6. **persistent_workers**: keep the worker processes alive between epochs, so epoch 2 does not pay the start-up
   (process spawn, dataset pickling, worker imports) again. Visible only from the second epoch: those rows run 2.

Every measurement builds its loader through :func:`course_lib.data.make_loader`, so a bad combination (say,
``prefetch_factor`` with ``num_workers=0``) is rejected with the same clear error the rest of the course gives.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil
import torch
from torch.utils.data import Dataset

from course_lib import clock
from course_lib.device import synchronize
from course_lib.interrupts import ctrl_c_deferred
from course_lib.perf.compare import Comparison, compare
from course_lib.perf.memory import host_rss_mb, process_footprint_mb
from course_lib.perf.timing import first_tensor, now, to_device

CONFIG_KEYS = ("num_workers", "batch_size", "pin_memory", "prefetch_factor", "persistent_workers", "epochs")


def usable_cores() -> int:
    """CPU cores this process may run on (respects taskset/cgroup affinity where the OS reports it).

    Taught in lesson 01 (``notebooks/01_bottleneck.ipynb``).
    """
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def recommend_workers() -> int:
    """A starting point for ``num_workers``: the usable cores, at most 8. A guess to measure from, not a rule.

    Workers are separate processes; each takes a core while decoding. With more workers than cores they take
    turns, and beyond about 8 the returns usually vanish while memory (each worker copies the dataset object)
    keeps growing. :func:`loader_sweep` tells you the right number for *this* machine and dataset.
    """
    return max(1, min(usable_cores(), 8))


def _make_loader(dataset: Dataset, **kwargs: Any) -> torch.utils.data.DataLoader:
    from course_lib.data import make_loader  # imported here: data sits below perf, and is only needed when measuring

    return make_loader(dataset, train=True, **kwargs)


def _batch_size_of(batch: Any) -> int:
    first = first_tensor(batch)
    return int(first.shape[0]) if first is not None and first.dim() > 0 else 1


def measure_loader(
    dataset: Dataset,
    *,
    n_batches: int,
    batch_size: int,
    num_workers: int = 0,
    pin_memory: bool = False,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    device: torch.device | str = "cpu",
    epochs: int = 1,
) -> dict[str, Any]:
    """Iterate ``n_batches`` per epoch for ``epochs`` epochs and report how fast batches arrived on ``device``.

    Returns the configuration plus:

    * ``samples_per_s``: samples delivered to the device per second, start-up included (what training sees);
    * ``steady_samples_per_s``: the same after each epoch's first batch (start-up excluded: the rate a long
      epoch settles at; ``None`` when each epoch has a single batch);
    * ``first_batch_s``: seconds from ``iter(loader)`` to the first batch of the first epoch (worker start-up);
    * ``epoch_first_batch_s``: the same for every epoch -- with ``persistent_workers`` the second is much smaller;
    * ``total_s``, ``samples``, ``batches``;
    * ``host_mb`` and ``workers_mb``: this process's memory and the workers' (summed), read while the workers
      were alive, as ``memory_kind`` says -- PSS on Linux, so shared pages are split between the processes
      sharing them and ``host_mb + workers_mb`` is the real footprint (see
      :func:`course_lib.perf.memory.process_footprint_mb`); ``host_rss_mb`` and ``workers_rss_mb``: the same
      as RSS, for reference only (summed RSS counts the pages workers share with this process once per worker).
      Reading memory is slow (the OS walks the page tables), so the clock is paused meanwhile.

    Batches are copied to ``device`` with ``non_blocking=pin_memory`` (an asynchronous copy needs pinned memory),
    and the device is synchronised before the clock stops.
    """
    if not isinstance(n_batches, int) or n_batches < 1:
        raise ValueError(f"n_batches={n_batches!r} must be an int >= 1.")
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs={epochs!r} must be an int >= 1.")
    device = torch.device(device)
    loader = _make_loader(
        dataset, batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory,
        prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
    )
    available = len(loader)
    if n_batches > available:
        raise ValueError(
            f"n_batches={n_batches} but the dataset only gives {available} batches of {batch_size} per epoch; "
            "lower n_batches or batch_size."
        )
    timed = _time_epochs(loader, n_batches=n_batches, epochs=epochs, device=device, non_blocking=pin_memory)
    return {
        "num_workers": num_workers, "batch_size": batch_size, "pin_memory": pin_memory,
        "prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers, "epochs": epochs,
        "device": str(device), "n_batches": n_batches, **timed,
    }


def _time_epochs(
    loader: Iterable[Any], *, n_batches: int, epochs: int, device: torch.device, non_blocking: bool
) -> dict[str, Any]:
    """Deliver ``n_batches`` per epoch to ``device``; the timing and memory fields of :func:`measure_loader`.

    Taught in lesson 02 (``notebooks/02_dataloader.ipynb``).
    """
    samples = batches = steady_samples = 0
    epoch_first: list[float] = []
    steady_s = 0.0
    memory: dict[str, Any] = {}
    paused = 0.0  # seconds spent reading memory, taken off the clock
    synchronize(device)
    t_start = now()
    it: Any = None
    try:
        for _ in range(epochs):
            t0 = now()
            with ctrl_c_deferred():  # a Ctrl-C while workers fork is lost in fork's own handlers: hold it till after
                it = iter(loader)
            for i in range(n_batches):
                n = _batch_size_of(to_device(next(it), device, non_blocking=non_blocking))
                samples += n
                batches += 1
                if i == 0:
                    synchronize(device)
                    epoch_first.append(now() - t0)
                    if not memory:  # first epoch: read memory while the workers are alive
                        t_read = now()
                        memory = _memory_now()
                        paused += now() - t_read
                    t_first = now()
                else:
                    steady_samples += n
            synchronize(device)
            steady_s += now() - t_first
            # Non-persistent workers shut down here (persistent ones wait for the next epoch), explicitly and with a
            # Ctrl-C held: in the iterator's __del__ it would be ignored ("Exception ignored in"), a lost interrupt.
            with ctrl_c_deferred():
                if not getattr(loader, "persistent_workers", False) and hasattr(it, "_shutdown_workers"):
                    it._shutdown_workers()
                it = None
    except BaseException:
        # Interrupted (Ctrl-C) or failed: a notebook keeps the traceback, and with it this iterator, so its workers
        # would outlive the cell; stop them now.
        if hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        _shut_down_persistent_workers(loader)
        raise
    _shut_down_persistent_workers(loader)  # inside the clock, as the non-persistent workers' shut-downs are
    synchronize(device)
    total = now() - t_start - paused
    return {
        "batches": batches, "samples": samples, "total_s": total,
        "samples_per_s": samples / total if total > 0 else float("inf"),
        "steady_samples_per_s": steady_samples / steady_s if steady_samples and steady_s > 0 else None,
        "first_batch_s": epoch_first[0], "epoch_first_batch_s": epoch_first, **memory,
    }


def _shut_down_persistent_workers(loader: Iterable[Any]) -> None:
    """Stop a DataLoader's persistent worker processes now (they would otherwise live until the loader dies).

    Without persistent workers every epoch's iterator shuts its workers down when it is dropped, inside the timed
    region; persistent workers would be shut down later, outside it. Shutting them down here makes every
    configuration pay its workers' whole life -- start-up and shut-down -- on the clock.
    """
    iterator = getattr(loader, "_iterator", None)  # where DataLoader keeps the persistent workers' iterator
    if getattr(loader, "persistent_workers", False) and iterator is not None:
        iterator._shutdown_workers()
        loader._iterator = None  # type: ignore[attr-defined]


def samples_unit(configs: Sequence[dict[str, Any]]) -> int:
    """The smallest sample count every config can deliver exactly: the LCM of each ``batch_size x epochs``.

    A count that is a multiple of it gives every config whole batches in every epoch, and so the same samples.
    """
    sizes = []
    for c in configs:
        bs, epochs = c.get("batch_size"), c.get("epochs", 1)
        if not (isinstance(bs, int) and bs >= 1 and isinstance(epochs, int) and epochs >= 1):
            raise ValueError(f"config {c.get('label', c)!r}: batch_size={bs!r} and epochs={epochs!r} must be "
                             "ints >= 1.")
        sizes.append(bs * epochs)
    return math.lcm(*sizes)


def batches_per_epoch(cfg: dict[str, Any], n_samples: int) -> int:
    """Batches per epoch that make ``cfg`` deliver exactly ``n_samples`` samples over all its epochs."""
    per_batch = cfg["batch_size"] * cfg.get("epochs", 1)
    if n_samples % per_batch:
        raise ValueError(f"n_samples={n_samples} is not a multiple of batch_size x epochs = {per_batch} for config "
                         f"{cfg.get('label', cfg)!r}: it would deliver a different number of samples.")
    return n_samples // per_batch


def _check_samples(configs: Sequence[dict[str, Any]], n_samples: int) -> int:
    """``samples_unit(configs)``, after refusing an ``n_samples`` that some config cannot deliver exactly."""
    if not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples={n_samples!r} must be an int >= 1.")
    unit = samples_unit(configs)
    if n_samples % unit:
        lower, upper = n_samples // unit * unit, (n_samples // unit + 1) * unit
        raise ValueError(
            f"n_samples={n_samples} is not a multiple of {unit} (the least common multiple of every config's "
            f"batch_size x epochs), so the configs would deliver different numbers of samples; use "
            + (f"{lower} or {upper}." if lower else f"{upper}.")
        )
    return unit


def _memory_now() -> dict[str, Any]:
    """This process's and its worker processes' memory right now (PSS where the OS reports it)."""
    host, kind = process_footprint_mb()
    children = psutil.Process().children(recursive=True)
    workers = [process_footprint_mb(k) for k in children]
    kinds = {kind, *(k for _, k in workers)}
    return {
        "host_mb": host, "workers_mb": sum(v for v, _ in workers), "n_worker_processes": len(workers),
        "memory_kind": kind if len(kinds) == 1 else "/".join(sorted(kinds)), "host_rss_mb": host_rss_mb(),
        "workers_rss_mb": sum(_rss_mb(k) for k in children),
    }


def _rss_mb(proc: psutil.Process) -> float:
    try:
        return proc.memory_info().rss / 2**20
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0


def _config(step: str, label: str, *, batch_size: int, num_workers: int = 0, pin_memory: bool = False,
            prefetch_factor: int | None = None, persistent_workers: bool = False, epochs: int = 1,
            note: str = "") -> dict[str, Any]:
    return {
        "step": step, "label": label, "num_workers": num_workers, "batch_size": batch_size,
        "pin_memory": pin_memory, "prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers,
        "epochs": epochs, "note": note,
    }


def experiment_order(batch_size: int = 64, max_workers: int | None = None) -> list[dict[str, Any]]:
    """The loader configurations to try, in the order the course recommends (see the module docstring).

    ``max_workers`` defaults to the usable core count. Worker counts are 1, 2, 4, ... up to it (and it itself);
    later steps keep ``min(2, max_workers)`` workers -- one change at a time, against a fixed reference -- except
    that you would normally carry forward the best worker count you measured.

    Taught in lesson 02 (``notebooks/02_dataloader.ipynb``).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be an int >= 1.")
    cap = usable_cores() if max_workers is None else max_workers
    if not isinstance(cap, int) or cap < 0:
        raise ValueError(f"max_workers={max_workers!r} must be None or an int >= 0.")
    configs = [_config("baseline", "workers=0 (main process)", batch_size=batch_size)]
    counts, w = [], 1
    while w <= cap:
        counts.append(w)
        w *= 2
    if cap >= 1 and counts[-1] != cap:
        counts.append(cap)
    configs += [_config("workers", f"workers={n}", batch_size=batch_size, num_workers=n) for n in counts]
    ref = min(2, cap)
    half = max(1, batch_size // 2)
    for bs in sorted({half, batch_size * 2} - {batch_size}):
        configs.append(_config("batch_size", f"batch={bs}, workers={ref}", batch_size=bs, num_workers=ref))
    configs.append(_config(
        "pin_memory", f"pinned, workers={ref}", batch_size=batch_size, num_workers=ref, pin_memory=True,
        note="only meaningful when batches are copied to a CUDA GPU",
    ))
    if ref > 0:
        configs.append(_config("prefetch_factor", f"prefetch=4, workers={ref}", batch_size=batch_size,
                               num_workers=ref, prefetch_factor=4, note="default is 2 batches per worker"))
        configs.append(_config("persistent_workers", f"2 epochs, workers={ref}, not persistent",
                               batch_size=batch_size, num_workers=ref, epochs=2))
        configs.append(_config("persistent_workers", f"2 epochs, workers={ref}, persistent", batch_size=batch_size,
                               num_workers=ref, persistent_workers=True, epochs=2,
                               note="look at the second epoch's first_batch_s"))
    return configs


def _check_sweep(configs: Sequence[dict[str, Any]], n_batches: int | None, n_samples: int | None,
                 repeats: int) -> None:
    """Refuse a sweep that could not measure equal, well-defined work, before any loader starts."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1.")
    if (n_batches is None) == (n_samples is None):
        raise ValueError(f"give exactly one of n_batches={n_batches!r} and n_samples={n_samples!r}.")
    for c in configs:
        missing = [k for k in ("num_workers", "batch_size") if k not in c]
        if missing:
            raise ValueError(f"config {c!r} lacks {missing}; build configs with experiment_order().")
    if n_samples is not None:
        _check_samples(configs, n_samples)


def loader_sweep(
    dataset: Dataset,
    configs: Sequence[dict[str, Any]],
    *,
    n_batches: int | None = None,
    n_samples: int | None = None,
    device: torch.device | str = "cpu",
    repeats: int = 1,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Measure every configuration in order, live; one row per config (the median of ``repeats`` runs).

    Rows are measured one after the other, so a burst of load elsewhere can land on one row only: use it to
    watch a sweep fill in (the playground does), and :func:`compare_loaders` to draw conclusions from one.

    Give exactly one of ``n_samples`` -- every config delivers that many samples over all its epochs, so the
    rows' samples/s come from equal work (it must be a multiple of every ``batch_size x epochs``, see
    :func:`samples_unit`) -- and ``n_batches`` per epoch (configs with a bigger batch or more epochs then deliver
    more samples, and their rates amortise start-up over more of them).

    Each row is the config plus :func:`measure_loader`'s fields and ``speedup`` (samples/s relative to the first
    row). ``on_row(row)`` is called as each row finishes, so a widget can plot the sweep live. Pinned-memory rows on
    a non-CUDA device are not measured (``skipped`` says why, ``samples_per_s`` is ``None``).
    """
    _check_sweep(configs, n_batches, n_samples, repeats)
    device = torch.device(device)
    rows: list[dict[str, Any]] = []
    iterator: Iterable[dict[str, Any]] = configs
    if progress:
        from course_lib.progress import tqdm

        iterator = tqdm(configs, desc="loader sweep", unit="config")
    base: float | None = None
    warm = False
    for cfg in iterator:
        row = dict(cfg)
        if not warm and not (cfg.get("pin_memory") and device.type != "cuda"):
            # One untimed pass first: the first loader ever built pays for cold file caches and lazy imports,
            # which would otherwise make whichever row comes first look slow.
            measure_loader(dataset, n_batches=1, device=device, batch_size=cfg["batch_size"])
            warm = True
        if cfg.get("pin_memory") and device.type != "cuda":
            row.update(samples_per_s=None, speedup=None,
                       skipped=f"pin_memory only speeds up copies to a CUDA GPU; the batches go to {device.type}")
        else:
            kwargs = {k: cfg[k] for k in CONFIG_KEYS if k in cfg}
            per_epoch = n_batches if n_samples is None else batches_per_epoch(cfg, n_samples)
            runs = [measure_loader(dataset, n_batches=per_epoch, device=device, **kwargs) for _ in range(repeats)]
            runs.sort(key=lambda r: r["samples_per_s"])
            row.update(runs[len(runs) // 2])
            row["repeats"] = repeats
            base = base if base is not None else row["samples_per_s"]
            row["speedup"] = row["samples_per_s"] / base
            row["skipped"] = None
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def compare_loaders(
    dataset: Dataset,
    configs: Sequence[dict[str, Any]],
    *,
    n_batches: int | None = None,
    n_samples: int | None = None,
    device: torch.device | str = "cpu",
    rounds: int = 3,
    budget_s: float | None = None,
    progress: bool = True,
) -> tuple[Comparison, list[dict[str, Any]]]:
    """Measure loader configurations through the course's protocol (:func:`course_lib.perf.compare.compare`).

    Each configuration is a contender named by its ``label``; one call builds its loader and delivers its samples
    (worker start-up and shut-down included, as in training). **Every contender delivers the same number of
    samples**: ``n_samples`` in all, over all its epochs (a two-epoch config delivers half of them per epoch), as
    whole batches -- so ``n_samples`` must be a multiple of every config's ``batch_size x epochs``
    (:func:`samples_unit`; anything else is refused). ``n_batches`` per epoch instead is accepted only when every
    config has the same ``batch_size x epochs``, which again means the same samples. Every contender is warmed up
    once, then the rounds run them in alternating order, so a cold cache or a burst of load elsewhere hits all of
    them alike; ``budget_s`` stops the rounds early (never before three), and when the first warm-up shows that even
    three rounds would overrun it (a busy machine), the sample count is shortened by the same factor for every
    config (to no less than a tenth, rounded down to a multiple of :func:`samples_unit`, at least one unit;
    ``rows[i]["samples"]`` and ``rows[i]["n_batches"]`` say what was measured) so the comparison fits. Returns the
    :class:`Comparison` (ask it for verdicts: ``comparison.verdict("workers=2", "workers=0 (main process)")``) and
    one row per config as :func:`loader_sweep` gives them: the run with the median time, ``samples_per_s`` at the
    median time over the rounds, ``speedup`` over the first measured config, ``rounds``. Pinned-memory configs on a
    non-CUDA device are not measured (``skipped`` says why).

    Taught in lesson 02 (``notebooks/02_dataloader.ipynb``).
    """
    device = torch.device(device)
    measured = _measurable_configs(configs, n_batches, n_samples, device)
    n_samples = _equal_samples(measured, n_batches, n_samples)
    work = _EqualWork(n_samples, unit=_check_samples(measured, n_samples))
    runs: dict[str, list[dict[str, Any]]] = {c["label"]: [] for c in measured}
    bar = _comparison_bar(len(measured) * (2 + rounds)) if progress else None
    contenders = {c["label"]: _loader_contender(dataset, c, work, device, runs[c["label"]], bar) for c in measured}
    try:
        # The warm-up, done here rather than in compare(): its duration says whether the rounds fit the budget.
        started = clock.now()
        for run in contenders.values():
            run()
        one_round_s = clock.now() - started
        min_rounds = min(3, rounds)
        work.shrink = _shrink_to_budget(one_round_s, budget_s, min_rounds)
        samples = {c["label"]: work.batches_of(c) * c["batch_size"] * c.get("epochs", 1) for c in measured}
        assert len(set(samples.values())) == 1, f"unequal work: {samples}"  # batches_per_epoch guarantees it
        # compare()'s own warm-up call is one more epoch per config; the rows ignore both warm-ups.
        comparison = compare(contenders, rounds=rounds, warmup=1, work=samples, min_round_s=0.0,
                             budget_s=None if budget_s is None else max(budget_s - one_round_s, 1e-3),
                             min_rounds=min_rounds, device=device, unit="sample",
                             kind="parallel")  # about workers
    finally:
        if bar is not None:
            _close_bar(bar)
    return comparison, _comparison_rows(configs, runs, comparison, work.batches_of, device)


def _equal_samples(measured: Sequence[dict[str, Any]], n_batches: int | None, n_samples: int | None) -> int:
    """The samples every contender delivers: ``n_samples``, or ``n_batches`` per epoch when that is the same work
    for every config (the same ``batch_size x epochs``); refused otherwise."""
    if n_samples is not None:
        return n_samples
    if len({c["batch_size"] * c.get("epochs", 1) for c in measured}) > 1:
        raise ValueError(
            "compare_loaders(n_batches=...) with configs of different batch_size x epochs would give them "
            "different numbers of samples; give n_samples (a multiple of every batch_size x epochs) instead."
        )
    return n_batches * measured[0]["batch_size"] * measured[0].get("epochs", 1)


@dataclass
class _EqualWork:
    """The samples every config of a comparison delivers: all of ``n_samples``, or, once the warm-up showed that the
    rounds would overrun the budget, the same shortened count (``shrink``, in whole units) for every config."""

    n_samples: int
    unit: int
    shrink: float = 1.0

    def samples(self) -> int:
        if self.shrink == 1.0:
            return self.n_samples
        return max(self.unit, int(self.n_samples * self.shrink) // self.unit * self.unit)

    def batches_of(self, cfg: dict[str, Any]) -> int:
        return batches_per_epoch(cfg, self.samples())


def _loader_contender(dataset: Dataset, cfg: dict[str, Any], work: _EqualWork, device: torch.device,
                      runs: list[dict[str, Any]], bar: Any) -> Callable[[], None]:
    """One call: build ``cfg``'s loader and deliver its samples (start-up and shut-down included); kept in ``runs``."""
    kwargs = {k: cfg[k] for k in CONFIG_KEYS if k in cfg}

    def run() -> None:
        runs.append(measure_loader(dataset, n_batches=work.batches_of(cfg), device=device, **kwargs))
        if bar is not None:
            bar.update()

    return run


def _comparison_bar(total: int) -> Any:
    from course_lib.progress import tqdm

    return tqdm(total=total, desc="loader comparison", unit="run")


def _close_bar(bar: Any) -> None:
    bar.total = bar.n  # stopped by the budget: the bar ends where the measurement ended
    bar.refresh()
    bar.close()


def _measurable_configs(configs: Sequence[dict[str, Any]], n_batches: int | None, n_samples: int | None,
                        device: torch.device) -> list[dict[str, Any]]:
    """The configs :func:`compare_loaders` can measure on ``device``; clear errors for bad arguments first."""
    if (n_batches is None) == (n_samples is None):
        raise ValueError(f"give exactly one of n_batches={n_batches!r} and n_samples={n_samples!r}.")
    if n_samples is not None and (not isinstance(n_samples, int) or n_samples < 1):
        raise ValueError(f"n_samples={n_samples!r} must be an int >= 1.")
    if n_batches is not None and (not isinstance(n_batches, int) or n_batches < 1):
        raise ValueError(f"n_batches={n_batches!r} must be an int >= 1.")
    labels = [c.get("label") for c in configs]
    if any(not label for label in labels) or len(set(labels)) != len(labels):
        raise ValueError(f"every config needs a distinct 'label' (the contender's name); got {labels}.")
    measured = [c for c in configs if not (c.get("pin_memory") and device.type != "cuda")]
    if len(measured) < 2:
        raise ValueError(f"compare_loaders needs at least two configs it can measure on {device}; got {labels}.")
    return measured


def _shrink_to_budget(one_round_s: float, budget_s: float | None, min_rounds: int) -> float:
    """The factor every config's samples are shortened by so the rest fits ``budget_s`` (1.0: no need).

    Unshrunk, the rest takes compare()'s warm-up plus ``min_rounds`` rounds, each about ``one_round_s``.
    """
    if budget_s is None or one_round_s * (2 + min_rounds) <= budget_s:
        return 1.0
    return max(0.1, (budget_s - one_round_s) / (one_round_s * (1 + min_rounds)))


def _comparison_rows(configs: Sequence[dict[str, Any]], runs: dict[str, list[dict[str, Any]]],
                     comparison: Comparison, batches_of: Callable[[dict[str, Any]], int],
                     device: torch.device) -> list[dict[str, Any]]:
    """One row per config: its median run, its rate from the comparison, its speed-up over the first measured."""
    rows: list[dict[str, Any]] = []
    base: float | None = None
    for cfg in configs:
        row = dict(cfg)
        if cfg["label"] not in runs:
            row.update(samples_per_s=None, speedup=None,
                       skipped=f"pin_memory only speeds up copies to a CUDA GPU; the batches go to {device.type}")
        else:
            timed = sorted(runs[cfg["label"]][2:], key=lambda r: r["total_s"])  # the first two runs: warm-ups
            m = comparison[cfg["label"]]
            row.update(timed[len(timed) // 2])
            row.update(samples_per_s=m.rate, rounds=len(m.seconds), n_batches=batches_of(cfg), skipped=None)
            base = base if base is not None else m.rate
            row["speedup"] = m.rate / base
        rows.append(row)
    return rows


__all__ = ["measure_loader", "experiment_order", "loader_sweep", "compare_loaders", "recommend_workers",
           "usable_cores", "samples_unit", "batches_per_epoch"]
