"""Data-parallel training with one process per device: the pieces every training script needs.

The model of the world
----------------------
``torchrun`` starts N copies of the same script. Each copy (a *rank*) owns one device, builds the same model
from the same seed, reads a different shard of the data, and after ``backward()`` the ranks *all-reduce* their
gradients so that every rank applies the identical update. Nothing else is shared: no threads, no GIL, no
"master GPU" that gathers everything (which is what the outdated ``nn.DataParallel`` did).

``torchrun`` tells each copy who it is through environment variables:

* ``RANK``        — this process's index in the whole job (0 .. WORLD_SIZE-1);
* ``WORLD_SIZE``  — how many processes in total (over all machines);
* ``LOCAL_RANK``  — this process's index on *this* machine: which GPU to use;
* ``MASTER_ADDR``/``MASTER_PORT`` — where the rendezvous store lives.

``setup()`` reads them and calls ``torch.distributed.init_process_group``; launched as plain ``python script.py``
it returns a single-process context and initialises nothing, so the same script runs both ways. Every helper
here (``all_reduce_sum``, ``wrap_model``, ``no_sync_if``...) is the identity when there is only one process.

Typical use::

    ctx = dist.setup()
    model = dist.wrap_model(build_model(...).to(ctx.device), ctx, strategy="ddp")
    ...
    if ctx.is_main:
        save(dist.unwrap(model).state_dict())
    dist.teardown()

Only ``torch.distributed`` collectives are used: they are tested, fast, and work the same on gloo and NCCL.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import nn

from course_lib.device import pick_device

STRATEGIES = ("ddp", "fsdp", "none")
LR_RULES = ("linear", "sqrt")
BACKENDS = ("nccl", "gloo")


@dataclass(frozen=True)
class DistContext:
    """Who this process is in the job, and where its tensors live.

    ``is_main`` is ``rank == 0``: the one process that logs, writes metrics and saves checkpoints (all ranks hold
    the same weights after every step, so one copy is enough, and N processes writing one file would corrupt it).
    ``backend`` is ``None`` for a single-process run (nothing initialised).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    is_main: bool = True
    backend: str | None = None

    @property
    def distributed(self) -> bool:
        """True when a process group is in use (more than one process, or launched by torchrun)."""
        return self.backend is not None


def launched_by_torchrun() -> bool:
    """Whether this process was started by ``torchrun`` (it sets ``RANK`` and ``WORLD_SIZE``)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer; torchrun sets it, do not edit "
                         "it.") from exc


def _pick_dist_device(device: str | torch.device, local_rank: int, world_size: int) -> torch.device:
    """One device per process: ``cuda:LOCAL_RANK`` on GPUs, else the CPU.

    MPS has no multi-process collective backend, so several processes on a Mac share the CPU instead.
    """
    if isinstance(device, torch.device):
        chosen = device
    elif device == "auto":
        if torch.cuda.is_available():
            chosen = torch.device("cuda")
        elif world_size > 1:
            chosen = torch.device("cpu")
        else:
            chosen = pick_device("auto")
    else:
        chosen = pick_device(device)
    if chosen.type == "cuda" and chosen.index is None:
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA device(s) are visible; "
                "launch with --nproc_per_node at most the number of GPUs."
            )
        chosen = torch.device("cuda", local_rank)
    return chosen


def setup(backend: str | None = None, device: str | torch.device = "auto") -> DistContext:
    """Join the process group torchrun prepared, or return a single-process context.

    * Not launched by torchrun (no ``RANK``/``WORLD_SIZE`` in the environment): nothing is initialised, the
      context says rank 0 of 1 on ``pick_device(device)``.
    * Launched by torchrun: ``backend`` defaults to ``"nccl"`` on CUDA (GPU-to-GPU collectives over
      NVLink/InfiniBand) and ``"gloo"`` on the CPU; on CUDA the process binds to ``cuda:LOCAL_RANK`` *before*
      initialising, so NCCL never puts two ranks on GPU 0. Calling ``setup()`` twice is harmless.

    Taught in lesson 09 (``notebooks/09_distributed.ipynb``).
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; use 'nccl' (CUDA), 'gloo' (CPU) or None (automatic).")
    if not launched_by_torchrun():
        chosen = _pick_dist_device(device, 0, 1)
        return DistContext(rank=0, world_size=1, local_rank=0, device=chosen, is_main=True, backend=None)

    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} is outside 0..WORLD_SIZE-1 (WORLD_SIZE={world_size}); check the launcher.")
    chosen = _pick_dist_device(device, local_rank, world_size)
    if backend is None:
        backend = "nccl" if chosen.type == "cuda" else "gloo"
    if backend == "nccl" and chosen.type != "cuda":
        raise ValueError(f"backend='nccl' needs CUDA tensors but the device is {chosen}; use backend='gloo' on the "
                         "CPU.")
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    if not torch_dist.is_initialized():
        kwargs: dict[str, Any] = {"backend": backend}
        if chosen.type == "cuda":
            kwargs["device_id"] = chosen  # lets NCCL connect eagerly and avoids a guess about the device
        torch_dist.init_process_group(**kwargs)
    return DistContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        device=chosen,
        is_main=rank == 0,
        backend=torch_dist.get_backend(),
    )


def teardown() -> None:
    """Leave the process group (if one was initialised). Call once at the end of the script, on every rank.

    Let the DDP/FSDP model go first (e.g. train inside a function that has returned): DDP's reducer holds
    the process group, and destroying the group under a live reducer can abort the process at exit with
    ``terminate called without an active exception`` (seen intermittently with gloo).
    """
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def _initialised() -> bool:
    return torch_dist.is_available() and torch_dist.is_initialized()


def get_rank() -> int:
    """This process's rank (0 without a process group)."""
    return torch_dist.get_rank() if _initialised() else 0


def get_world_size() -> int:
    """Number of processes in the job (1 without a process group)."""
    return torch_dist.get_world_size() if _initialised() else 1


def is_main_process() -> bool:
    """True on rank 0 (and in single-process runs): the process that logs and saves."""
    return get_rank() == 0


def barrier() -> None:
    """Wait until every rank gets here (no-op single-process). E.g. others wait while rank 0 writes a file."""
    if _initialised():
        torch_dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place, and return it (identity single-process).

    Every rank must call it with a tensor of the same shape and dtype, in the same order, or the job hangs.
    With NCCL the tensor must live on this rank's GPU.
    """
    if _initialised() and torch_dist.get_world_size() > 1:
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
    return tensor


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Average ``tensor`` over all ranks, in place (sum then divide: gloo has no AVG reduction).

    Integer tensors cannot hold a mean: pass a floating tensor.
    """
    if not tensor.is_floating_point():
        raise ValueError(f"all_reduce_mean needs a floating-point tensor, got {tensor.dtype}; call .float() first.")
    world = get_world_size()
    if world > 1:
        all_reduce_sum(tensor)
        tensor.div_(world)
    return tensor


def _fully_shard() -> Any:
    """``fully_shard`` (FSDP2): public in ``torch.distributed.fsdp`` from torch 2.6, ``_composable`` before."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard  # type: ignore[no-redef]
    return fully_shard


def _fsdp_module_class() -> type | None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch < 2.6
        try:
            from torch.distributed._composable.fsdp import FSDPModule  # type: ignore[no-redef]
        except ImportError:
            return None
    return FSDPModule


def is_fsdp(model: nn.Module) -> bool:
    """Whether ``model`` was sharded with FSDP2's ``fully_shard``."""
    cls = _fsdp_module_class()
    return cls is not None and isinstance(model, cls)


def wrap_model(model: nn.Module, ctx: DistContext, strategy: str = "ddp") -> nn.Module:
    """Make ``model`` data-parallel across the ranks of ``ctx``; the identity when ``world_size == 1``.

    * ``"ddp"``: ``DistributedDataParallel``. Each rank keeps a full copy; during ``backward()`` gradients are
      all-reduced in buckets *while* the rest of backward still runs, so communication hides behind compute.
      On CUDA ``device_ids=[local_rank]``; on the CPU no device ids.
    * ``"fsdp"``: FSDP2 ``fully_shard`` (ZeRO-3 style). Each rank stores only 1/world_size of every parameter,
      gradient and optimizer state; a layer's full weights are all-gathered just before it runs and freed after.
      Every element of an ``nn.ModuleList`` (the repeated blocks) is sharded as its own unit, then the root, so
      only one block is ever materialised at a time. Create the optimizer *after* wrapping: the parameters become
      sharded ``DTensor`` objects.
    * ``"none"``: returned as is (each rank trains alone: only useful to show why gradients must be averaged).

    The model is moved to ``ctx.device`` first.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {STRATEGIES}; 'ddp' is the usual choice.")
    model = model.to(ctx.device)
    if ctx.world_size == 1 or strategy == "none":
        return model
    if not _initialised():
        raise RuntimeError("wrap_model needs a process group when world_size > 1; call "
                           "course_lib.distributed.setup() first.")
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    # FSDP2
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard = _fully_shard()
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for module in list(model.modules()):
        if isinstance(module, nn.ModuleList):
            for block in module:
                if any(True for _ in block.parameters()):
                    fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


@contextlib.contextmanager
def no_sync_if(model: nn.Module, condition: bool) -> Iterator[None]:
    """Skip the gradient all-reduce inside this block when ``condition`` is true.

    With gradient accumulation only the *last* micro-batch of a group needs synchronised gradients; the earlier
    ones can accumulate locally and save one all-reduce each::

        with no_sync_if(model, not is_last_microbatch):
            loss.backward()

    DDP: ``model.no_sync()``. FSDP2: ``set_requires_gradient_sync(False)`` for the block, restored after.
    Anything else (single process, unwrapped model) or ``condition`` false: a plain ``nullcontext``.
    """
    if not condition:
        yield
        return
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
        return
    if is_fsdp(model):
        model.set_requires_gradient_sync(False)  # type: ignore[attr-defined]
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)  # type: ignore[attr-defined]
        return
    yield


class AllReduceCounter:
    """A DDP communication hook that all-reduces as DDP does by default and counts what it sends.

    ``model.register_comm_hook(None, counter.hook)`` (before the first backward). DDP groups gradients into *buckets*
    (``bucket_cap_mb``, 25 MB by default) and all-reduces each bucket as soon as its gradients are ready; this
    hook is called once per bucket. ``syncs`` counts backward passes that synchronised (``no_sync`` blocks skip
    the hook entirely), ``buckets`` every bucket sent, ``bucket_elements`` the sizes of the last pass's buckets.
    """

    def __init__(self) -> None:
        self.syncs = 0
        self.buckets = 0
        self.bucket_elements: list[int] = []
        self._current: list[int] = []

    # DDP rejects a hook whose ``bucket``/return annotations are not the runtime GradBucket/Future classes
    # (postponed annotations are strings), so these two stay unannotated.
    def hook(self, state: object, bucket):  # type: ignore[no-untyped-def]
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        self.buckets += 1
        self._current.append(bucket.buffer().numel())
        if bucket.is_last():
            self.syncs += 1
            self.bucket_elements, self._current = self._current, []
        return allreduce_hook(None, bucket)  # type: ignore[arg-type]  # None: the default process group


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP (``.module``) and ``torch.compile`` (``._orig_mod``) wrappers.

    Save ``unwrap(model).state_dict()`` so checkpoints load into a plain model without ``module.`` prefixes.
    FSDP2 shards in place (no wrapper): its ``state_dict()`` holds sharded ``DTensor`` objects; use
    ``full_state_dict`` to gather a plain one.
    """
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    while True:
        if isinstance(model, (DistributedDataParallel, DataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A plain (unsharded, CPU) ``state_dict`` of ``model``, for saving; works for DDP, FSDP2 and plain models.

    For FSDP2 this is a collective (every rank must call it): the shards are all-gathered onto rank 0's CPU,
    and the other ranks get an empty dict (they would not save it anyway). DDP and plain models: every rank
    gets the full dict (the replicas are identical).
    """
    model = unwrap(model)
    if is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def scaled_lr(base_lr: float, base_batch: int, global_batch: int, rule: str = "linear") -> float:
    """The learning rate for ``global_batch`` given one tuned at ``base_batch``.

    Data parallelism multiplies the batch: the *effective* (global) batch is
    ``per_device_batch x world_size x accumulation_steps``. The gradient of a bigger batch is an average over
    more samples: the same expected direction with less noise, so each step can be larger.

    * ``"linear"`` (Goyal et al., 2017, for SGD): k times the batch, k times the LR. Rationale: one step on a
      batch of kB should move the weights about as far as k steps on batches of B. Holds up to a limit, and needs
      a warm-up at the start; used with SGD/momentum.
    * ``"sqrt"``: k times the batch, sqrt(k) times the LR. Keeps the noise of the update roughly constant (the
      gradient's standard deviation shrinks as 1/sqrt(batch)); the usual rule of thumb for Adam/AdamW.

    Either way it is a starting point for tuning, not a law: past the "critical batch size" a larger batch no
    longer buys fewer steps.

    Taught in lesson 09 (``notebooks/09_distributed.ipynb``).
    """
    if rule not in LR_RULES:
        raise ValueError(f"rule={rule!r} is not one of {LR_RULES}; use 'linear' (SGD) or 'sqrt' (Adam).")
    if not base_lr > 0:
        raise ValueError(f"base_lr={base_lr!r} must be positive.")
    for name, value in (("base_batch", base_batch), ("global_batch", global_batch)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a positive integer (a number of samples).")
    ratio = global_batch / base_batch
    return base_lr * (ratio if rule == "linear" else math.sqrt(ratio))
