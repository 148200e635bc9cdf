"""Run a learner's distributed code on real processes and collect what every rank did (exercises 11 and 21).

How the learner's code crosses the process boundary. The function lives in a notebook: ``__main__`` of a
kernel (or of the grading worker), which the ``spawn`` start method cannot pickle. So its *source* travels
instead: :func:`run_ranks` writes the source of the cell that defines it to ``RUN_DIR/cell.py`` and the job to
``RUN_DIR/job.json``, then starts one process per rank (:func:`rank_process`, a module-level function, so it works
with ``spawn``; on Linux a ``forkserver`` is used, which skips importing torch again) with the environment ``torchrun``
would give it (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``). Each
rank (:func:`rank_main`)

1. builds the model (same seed on every rank) and a :class:`RecordingDataset` (defined
   here), and counts DDP's gradient all-reduces (a communication hook registered on every
   ``DistributedDataParallel`` built in this process) and the files ``torch.save`` writes;
2. executes the cell in a fresh namespace (``__name__`` is not ``"__main__"``) and calls
   ``fn(rank, world_size, model, dataset, cfg, out_dir)``;
3. writes ``RUN_DIR/rank<R>.pt`` (``torch.save`` of plain data): indices it read, its final parameters, the
   all-reduce count, the paths it saved to, or the exception it raised.

A job may instead name a trusted **driver** (``run_ranks(..., driver="module:function")``, one of :data:`DRIVERS`,
never a name the learner's code chooses): each rank then imports it and calls ``driver(load_cell, rank, world_size,
cfg)``, where ``load_cell()`` executes the cell and returns its namespace. The driver joins the process group
itself, instruments what it likes before the cell runs, calls the learner's functions on models and data it builds
from ``cfg`` and returns a plain-data record (exercise 21: :mod:`course_lib.grading.parallel_driver`; exercise 22:
:mod:`course_lib.grading.beyond_dp_driver`).

Only loopback networking is needed (gloo over 127.0.0.1), so this also runs inside the grading sandbox, which has
no network. A rank that fails makes the others wait in a collective forever: the launcher stops every rank a few
seconds after the first failure, and all of them at the timeout.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import linecache
import multiprocessing
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from course_lib import atomic, ddp_demo
from course_lib import distributed as dist

CHECKPOINT = "model.pt"
# The drivers a job may name ("module:function"): trusted code of the course, imported inside each rank. A job that
# names anything else is refused there, so the name in job.json can never import what a learner chose.
DRIVERS = frozenset({"course_lib.grading.parallel_driver:rank_driver",  # exercise 21
                     "course_lib.grading.beyond_dp_driver:rank_driver"})  # exercise 22
CELL_NAME = "<exercise cell>"
GRACE_S = 5.0  # after one rank failed, how long the others may still finish on their own


class RecordingDataset(Dataset):
    """``(x, y)`` pairs that remember which indices this process read, in order (``reads``).

    Exercise 11 hands one to the learner's DDP loop on every rank: what a rank *read* shows whether it used a
    ``DistributedSampler`` (disjoint shards) and called ``set_epoch`` (a new order each epoch). Read it with
    ``num_workers=0``: worker processes would record into their own copies.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows but y has {len(y)}; they must pair up.")
        self.x, self.y = x, y
        self.reads: list[int] = []

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads.append(int(index))
        return self.x[index], self.y[index]


def make_recording_dataset(n: int = 48, seed: int = 0) -> RecordingDataset:
    """:func:`course_lib.ddp_demo.make_dataset`'s samples in a :class:`RecordingDataset`."""
    x, y = ddp_demo.make_dataset(n, seed).tensors
    return RecordingDataset(x, y)


class RanksFailed(RuntimeError):
    """The ranks could not be started or did not report (timeout, crash before writing their results)."""


@contextlib.contextmanager
def failed_run_is_a_failed_check(hint: str) -> Iterator[None]:
    """Inside a check: a two-process run that did not complete fails the check (``hint``: what the learner can look
    at); processes that could not be started are the grader's machine's fault, and the message says so."""
    from course_lib.grading.api import CheckFailed

    try:
        yield
    except RanksFailed as exc:
        raise CheckFailed(f"the two-process run did not complete: {exc}", hint=hint) from None
    except (EOFError, OSError) as exc:
        raise CheckFailed(f"the grader could not start the two processes ({type(exc).__name__}: {exc}); this is not "
                          "your code: grade this exercise again") from None


def cell_source(fn: Callable[..., Any]) -> str:
    """The whole source of the notebook cell (or file) that defined ``fn``, as Python registered it.

    Jupyter and the grading worker both register every cell's text with :mod:`linecache`; ``inspect`` would give
    only the function, without the imports and helpers of its cell.
    """
    filename = fn.__code__.co_filename
    lines = linecache.getlines(filename)
    if not lines:
        raise RanksFailed(f"the source of {fn.__name__} cannot be found (defined in {filename!r}); define it in a "
                          "notebook cell or a file")
    return "".join(lines)


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """What ``torchrun`` would set for this rank (on one machine), plus one thread per rank."""
    env = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
    if sys.platform.startswith("linux") and "GLOO_SOCKET_IFNAME" not in os.environ:
        env["GLOO_SOCKET_IFNAME"] = "lo"  # no hostname lookup: works without a network (the grading sandbox)
    return env


def start_method() -> str:
    """``forkserver`` on Linux, ``spawn`` elsewhere.

    The fork server is a clean process started once, with torch and DDP's imports preloaded: each rank forks from
    it in milliseconds, and never from the grader's own process, which may already run autograd's worker threads
    (forking those is an error). Every method runs the same code: the cell's *source* is executed afresh in each
    rank, so nothing depends on what the parent process holds. ``COURSE_DDP_START=spawn`` (or ``fork``) overrides.
    """
    wanted = os.environ.get("COURSE_DDP_START") or ("forkserver" if sys.platform.startswith("linux") else "spawn")
    if wanted not in multiprocessing.get_all_start_methods():
        raise ValueError(f"COURSE_DDP_START={wanted!r} is not available here; use one of "
                         f"{multiprocessing.get_all_start_methods()}")
    return wanted


# What every rank would import on its own (seconds each time): DistributedDataParallel's constructor imports both.
PRELOAD = ("torch._dynamo", "torch.nn.parallel")


def _preload() -> None:
    """Import once, before forking, what every rank would import on its own."""
    for module in PRELOAD:
        importlib.import_module(module)


def _start_ranks(run_dir: Path, world_size: int, method: str | None = None) -> list[BaseProcess]:
    """Start one process per rank; if one cannot be started, stop those that were and raise."""
    method = method or start_method()
    context = multiprocessing.get_context(method)
    if method == "fork":
        _preload()
    elif method == "forkserver":
        context.set_forkserver_preload([__name__, *PRELOAD])  # takes effect when the server starts (once)
    port = free_port()
    procs: list[BaseProcess] = []
    try:
        for rank in range(world_size):
            proc = context.Process(target=rank_process, args=(str(run_dir), rank, _rank_env(rank, world_size, port)),
                                   name=f"ddp-rank{rank}", daemon=False)
            proc.start()
            procs.append(proc)
    except BaseException:
        for proc in procs:
            _stop(proc)
        raise
    return procs


def _start_ranks_or_spawn(run_dir: Path, world_size: int) -> list[BaseProcess]:
    """:func:`_start_ranks`; when the fork server fails to start a rank, start them all again with ``spawn``.

    The fork server is a shared helper process of the grader, not the learner's code: once in 20 graded classes
    (four notebooks at a time beside other work) it ended while a rank was being started, and the parent read an
    EOF where the rank's PID should be. ``spawn`` does not depend on it.
    """
    try:
        return _start_ranks(run_dir, world_size)
    except (EOFError, OSError) as exc:
        if start_method() != "forkserver":
            raise
        print(f"ddp_ranks: the fork server could not start a rank ({type(exc).__name__}: {exc}); "
              "starting the ranks with spawn", file=sys.stderr, flush=True)
        return _start_ranks(run_dir, world_size, method="spawn")


def _stop(proc: BaseProcess) -> None:
    if proc.exitcode is None:
        proc.kill()
    proc.join()


def _wait(procs: list[BaseProcess], timeout_s: float) -> bool:
    """Wait for every rank; stop them all ``GRACE_S`` after the first failure or at the timeout (then False)."""
    deadline = time.monotonic() + timeout_s
    failed_at: float | None = None
    try:
        while any(p.exitcode is None for p in procs):
            now = time.monotonic()
            if failed_at is None and any(p.exitcode not in (None, 0) for p in procs):
                failed_at = now
            if now >= deadline or (failed_at is not None and now - failed_at >= GRACE_S):
                return now < deadline
            time.sleep(0.02)
        return True
    finally:
        for proc in procs:
            _stop(proc)


def _tail(path: Path, n: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def exercise_config(seed: int = 0) -> dict[str, Any]:
    """Exercise 11's job for a grading run's seed: sizes and seeds vary with it, small enough for two CPU ranks.

    Every job has, in each epoch, a last accumulation group with fewer micro-batches than ``accum`` whose last
    micro-batch is short too; half of them have an odd dataset, which DistributedSampler pads (one sample read
    twice) so that both shards keep one length.
    """
    batch, accum, full_groups = 3 + seed % 2, 3 + (seed // 2) % 2, 1 + (seed // 4) % 2
    short = 1 + (seed // 16) % (batch - 1)  # samples in the last micro-batch of an epoch
    per_rank = batch * accum * full_groups + batch * (accum - 2) + short
    n = 2 * per_rank - (1 - (seed // 8) % 2)
    return {"seed": 1000 + seed % 9000, "n": n, "batch": batch, "accum": accum, "epochs": 2, "base_lr": 0.05,
            "base_batch": 8}


# The last run: (cell source, function name, cfg, world size) and its result, for ``reuse=True``.
_last_run: dict[str, Any] = {}


def run_ranks(fn: Callable[..., Any], cfg: dict[str, Any], *, world_size: int = 2, timeout_s: float = 180.0,
              reuse: bool = False, driver: str | None = None, source: str | None = None) -> dict[str, Any]:
    """Run ``fn(rank, world_size, model, dataset, cfg, out_dir)`` on ``world_size`` processes; collect the results.

    ``cfg`` (JSON-able) must hold ``seed`` and ``n`` (model and dataset seed, dataset size). Returns plain data:
    ``{"ranks": [per-rank record, ...], "checkpoint": flat parameters saved to out_dir/model.pt (or None, or
    "unreadable: ..."), "checkpoint_keys": the names they were saved under (or None), "files": names in
    out_dir}``; a rank record holds ``reads`` (dataset indices in the order read), ``params`` (flat tensor of the
    returned model), ``syncs``/``buckets`` (gradient all-reduces), ``saves`` (paths it gave ``torch.save``), or
    ``error`` (``{"type", "message", "where"}``) when the function raised.
    ``reuse=True`` returns the previous result when the cell, the function and ``cfg`` are unchanged (the checks of
    one grading run, and the notebook's demo before them, share one run: it is deterministic).

    With ``driver`` (one of :data:`DRIVERS`) each rank runs that trusted function instead of ``fn`` and its record
    is what the driver returned (plus ``rank``, or ``error`` when the driver itself raised); ``source`` (default: the
    cell that defined ``fn``) is the code each rank executes.
    """
    if driver is not None and driver not in DRIVERS:
        raise ValueError(f"driver={driver!r} is not one of the course's drivers {sorted(DRIVERS)}")
    source = cell_source(fn) if source is None else source
    key = json.dumps([source, fn.__name__, cfg, world_size, driver])
    if reuse and _last_run.get("key") == key:
        return _last_run["result"]
    _last_run.clear()
    result = _run_fresh(fn.__name__, source, cfg, world_size, timeout_s, driver)
    _last_run.update(key=key, result=result)
    return result


def _run_fresh(name: str, source: str, cfg: dict[str, Any], world_size: int, timeout_s: float,
               driver: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="course_ddp_ranks_") as tmp:
        run_dir = Path(tmp)
        (run_dir / "out").mkdir()
        (run_dir / "cell.py").write_text(source, encoding="utf-8")
        job = {"function": name, "cfg": cfg, **({"driver": driver} if driver is not None else {})}
        (run_dir / "job.json").write_text(json.dumps(job), encoding="utf-8")
        finished = _wait(_start_ranks_or_spawn(run_dir, world_size), timeout_s)
        ranks = []
        for rank in range(world_size):
            path = run_dir / f"rank{rank}.pt"
            if not path.exists():
                why = "did not finish within the time limit" if not finished else "ended without reporting"
                raise RanksFailed(f"rank {rank} {why} (a rank that waits in a collective the others never reach "
                                  f"hangs); its last lines:\n{_tail(run_dir / f'rank{rank}.log')}")
            ranks.append(torch.load(path, weights_only=True))
        return {"ranks": ranks, "checkpoint": _checkpoint(run_dir / "out" / CHECKPOINT),
                "checkpoint_keys": _checkpoint_keys(run_dir / "out" / CHECKPOINT),
                "files": sorted(p.name for p in (run_dir / "out").iterdir())}


def _checkpoint(path: Path) -> Any:
    if not path.exists():
        return None
    try:
        state = torch.load(path, weights_only=True)
        tensors = [v for v in state.values() if isinstance(v, torch.Tensor)] if isinstance(state, dict) else []
        if not tensors:
            return f"unreadable: {type(state).__name__} without tensors (save model.state_dict())"
        return torch.cat([t.detach().reshape(-1).float() for t in tensors])
    except Exception as exc:  # a half-written or foreign file: the check reports it
        return f"unreadable: {type(exc).__name__}: {exc}"


def _checkpoint_keys(path: Path) -> list[str] | None:
    """The names of the tensors saved to ``path``: the values alone cannot tell whether a model can load them."""
    try:
        state = torch.load(path, weights_only=True)
    except Exception:  # missing or unreadable: _checkpoint reports it
        return None
    if not isinstance(state, dict):
        return None
    return [str(k) for k, v in state.items() if isinstance(v, torch.Tensor)]


# ------------------------------------------------------------------------------------------ inside each rank


def _count_allreduces(counters: list[dist.AllReduceCounter]) -> None:
    """Register an :class:`~course_lib.distributed.AllReduceCounter` on every DDP model built from now on."""
    from torch.nn.parallel import DistributedDataParallel

    original_init = DistributedDataParallel.__init__

    def init(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        counter = dist.AllReduceCounter()
        self.register_comm_hook(None, counter.hook)
        counters.append(counter)

    DistributedDataParallel.__init__ = init  # type: ignore[method-assign]


def _record_saves(saves: list[str]) -> None:
    """Remember the target of every ``torch.save`` in this process (which ranks write checkpoints)."""
    original_save = torch.save

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        saves.append(os.fspath(f) if isinstance(f, (str, os.PathLike)) else "<file object>")
        original_save(obj, f, *args, **kwargs)

    torch.save = save  # type: ignore[assignment]


def exception_record(exc: BaseException) -> dict[str, str]:
    """An exception as plain data: its type, its message and the last lines of its traceback."""
    return {"type": type(exc).__name__, "message": str(exc), "where": traceback.format_exc(limit=-2)[-800:]}


def _load_cell(run_dir: Path) -> dict[str, Any]:
    """Execute the cell's source in a fresh namespace (``__name__`` is not ``"__main__"``) and return it."""
    source = (run_dir / "cell.py").read_text(encoding="utf-8")
    namespace: dict[str, Any] = {"__name__": "__ddp_rank__"}
    linecache.cache[CELL_NAME] = (len(source), None, source.splitlines(True), CELL_NAME)  # quoted in tracebacks
    exec(compile(source, CELL_NAME, "exec"), namespace)
    return namespace


def import_driver(name: str) -> Callable[..., dict[str, Any]]:
    """The driver ``"module:function"``, only if it is one of :data:`DRIVERS`."""
    if name not in DRIVERS:
        raise ValueError(f"driver {name!r} is not one of the course's drivers {sorted(DRIVERS)}")
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


def _driven(run_dir: Path, rank: int, world_size: int, job: dict[str, Any]) -> dict[str, Any]:
    """One rank of a driver's job: the trusted driver runs the cell (when it is ready) and reports."""
    record: dict[str, Any] = {"rank": rank}
    try:
        driver = import_driver(str(job["driver"]))
        record.update(driver(lambda: _load_cell(run_dir), rank, world_size, dict(job["cfg"])))
        record["rank"] = rank
    except BaseException as exc:  # reported to the check, which names it
        record["error"] = exception_record(exc)
    return record


def rank_main(run_dir: Path, rank: int) -> dict[str, Any]:
    """One rank: run the cell's function on the course's model and data; return this rank's record."""
    job = json.loads((run_dir / "job.json").read_text(encoding="utf-8"))
    cfg, world_size = job["cfg"], int(os.environ["WORLD_SIZE"])
    if "driver" in job:
        return _driven(run_dir, rank, world_size, job)
    counters: list[dist.AllReduceCounter] = []
    saves: list[str] = []
    _count_allreduces(counters)
    _record_saves(saves)
    model = ddp_demo.make_model(cfg["seed"])
    dataset = make_recording_dataset(cfg["n"], cfg["seed"])
    record: dict[str, Any] = {"rank": rank}
    try:
        namespace = _load_cell(run_dir)
        fn = namespace.get(job["function"])
        if not callable(fn):
            raise NameError(f"the cell no longer defines {job['function']}")
        trained = fn(rank, world_size, model, dataset, dict(cfg), str(run_dir / "out"))
        if not isinstance(trained, torch.nn.Module):
            raise TypeError(f"{job['function']} should return the trained model, not {type(trained).__name__}")
        record["params"] = ddp_demo.flat_parameters(trained)
        # The function joined the process group; leaving it is part of its job (its port, its threads).
        record["group_left_open"] = torch.distributed.is_available() and torch.distributed.is_initialized()
    except BaseException as exc:  # reported to the check, which names it
        record["error"] = exception_record(exc)
    record["reads"] = list(dataset.reads)
    record["syncs"] = sum(c.syncs for c in counters)
    record["buckets"] = sum(c.buckets for c in counters)
    record["ddp_models"] = len(counters)
    record["saves"] = [os.path.relpath(s, run_dir / "out") if os.path.isabs(s) else s for s in saves]
    return record


def rank_process(run_dir: str, rank: int, env: dict[str, str]) -> None:
    """The target of each rank's process: set the environment, run :func:`rank_main`, save its record, exit."""
    os.environ.update(env)
    with open(Path(run_dir) / f"rank{rank}.log", "ab", buffering=0) as log:  # not the parent's (kernel's) output
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    torch.set_num_threads(1)
    record = rank_main(Path(run_dir), rank)
    atomic.torch_save(record, Path(run_dir) / f"rank{rank}.pt")  # the parent sees a whole file or none
    sys.stdout.flush()
    sys.stderr.flush()
    # A process group or DDP reducer left alive by the learner's code must not abort the exit (gloo threads), and
    # a forked child must not run the parent's exit handlers.
    os._exit(1 if "error" in record else 0)
