"""The course's CUDA paths, each run on a real GPU and checked for what it is supposed to do.

Every test here is marked ``gpu``: where no CUDA GPU is visible it is skipped with that reason (tests/conftest.py);
a test that needs more (bf16 or TF32 tensor cores, NCCL, a C++ compiler for Inductor) skips with that reason.
``make gpu-check`` runs them (``pytest -m gpu tests``). Where the course has its own code for a path (the
accumulation step, the training loop, ``Timer``/``measure_latency``, ``PeakMemory``, ``compile_or_eager``,
``distributed.setup``), the test goes through it, so what runs here is what the lessons run.

No CPU run can execute these tests as they stand, so tests/test_gpu_tests_in_step.py keeps them in step with the code
on every machine: it runs this file with ``COURSE_GPU_STAND_IN=1``, where the ``cuda`` fixture yields the CPU and each
test runs up to its first :func:`cuda_only` step (a key, function or argument that no longer exists fails there), and
it checks statically that every name these tests import or call exists and takes the keywords they pass.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import pickle
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytestmark = pytest.mark.gpu
MiB = 2**20
STAND_IN = os.environ.get("COURSE_GPU_STAND_IN") == "1"  # the CPU run of tests/test_gpu_tests_in_step.py
STAND_IN_SKIP = "CPU stand-in run: the rest needs CUDA itself"


def cuda_only(device: torch.device, what: str) -> None:
    """Mark where a test starts to need CUDA itself (``what``): the CPU stand-in run stops there, skipped."""
    if device.type != "cuda":
        pytest.skip(f"{STAND_IN_SKIP} ({what})")


@pytest.fixture
def cuda() -> torch.device:
    if STAND_IN:
        yield torch.device("cpu")
        return
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.synchronize(device)
    yield device
    torch.cuda.synchronize(device)


@pytest.fixture(scope="module")
def cycles_per_ms() -> float:
    """GPU clock cycles per millisecond, measured, so ``torch.cuda._sleep`` kernels last a known time."""
    if STAND_IN:
        pytest.skip(f"{STAND_IN_SKIP} (torch.cuda._sleep kernels)")
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / start.elapsed_time(end)


def _net(device: torch.device, seed: int = 0) -> nn.Module:
    from course_lib.models import Net

    torch.manual_seed(seed)
    return Net(d_in=32, d=64, n_blocks=2, n_out=10, p=0.0).to(device)


def _batch(device: torch.device, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 32, generator=g).to(device), torch.randint(0, 10, (n,), generator=g).to(device)


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# ------------------------------------------------------------------------------------------- precision
def test_fp16_overflow_makes_the_scaler_skip_the_step_and_lower_the_scale(cuda: torch.device) -> None:
    # Runs whole on the CPU stand-in too: torch has fp16 autocast and a GradScaler there.
    from course_lib.train.accumulate import backward_group

    model = _net(cuda)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = _params(model)
    # A scale of 2**40 overflows fp16 in the backward pass for certain: the logits' gradient is about scale / batch.
    scaler = torch.amp.GradScaler(cuda.type, init_scale=2.0**40)
    backward_group(model, [_batch(cuda)], cuda, amp_dtype=torch.float16, scaler=scaler)
    scaler.unscale_(opt)  # the training loop's order: unscale, clip, step, update
    assert not all(torch.isfinite(p.grad).all() for p in model.parameters()), "the forced overflow did not happen"
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "an overflowed step changed weights"
    assert scaler.get_scale() == 2.0**39, f"the scale should halve after an overflow, got {scaler.get_scale()}"

    # The same step with a sane scale does update the weights and keeps the scale: the skip was the overflow's.
    healthy = torch.amp.GradScaler(cuda.type, init_scale=2.0**8)
    opt.zero_grad(set_to_none=True)
    backward_group(model, [_batch(cuda)], cuda, amp_dtype=torch.float16, scaler=healthy)
    healthy.unscale_(opt)
    healthy.step(opt)
    healthy.update()
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert healthy.get_scale() == 2.0**8


def test_bf16_autocast_produces_bf16_activations_and_fp32_loss(cuda: torch.device) -> None:
    from course_lib.device import autocast, resolve_amp_dtype, supports_bf16
    from course_lib.models import GPTConfig, TinyGPT
    from course_lib.train.accumulate import loss_and_count

    if not supports_bf16(cuda):
        pytest.skip(f"{torch.cuda.get_device_name(cuda)} does not support bf16")
    model = TinyGPT(GPTConfig()).to(cuda)
    seen: dict[str, torch.dtype] = {}
    hooks = [m.register_forward_hook(lambda mod, inp, out, name=name: seen.__setitem__(name, out.dtype))
             for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    x = torch.randint(0, 65, (4, 32), device=cuda)
    with autocast(cuda, resolve_amp_dtype("bf16", cuda)):
        loss_sum, count = loss_and_count(model, (x, x), cuda)
    for h in hooks:
        h.remove()
    assert seen and set(seen.values()) == {torch.bfloat16}, seen
    assert loss_sum.dtype == torch.float32, "the loss is reduced in fp32 even under autocast"
    loss_sum.backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters()), \
        "weights and gradients stay fp32 (autocast changes activations only)"


def test_tf32_changes_matmul_precision(cuda: torch.device) -> None:
    cuda_only(cuda, "TF32 is an NVIDIA tensor-core format")
    major, minor = torch.cuda.get_device_capability(cuda)
    if major < 8:
        pytest.skip(f"TF32 needs compute capability >= 8.0 (Ampere); this GPU is {major}.{minor}")
    from course_lib.device import matmul_precision
    from course_lib.perf.compile import enable_tf32

    g = torch.Generator(device=cuda).manual_seed(0)
    a = torch.randn(2048, 2048, device=cuda, generator=g)
    b = torch.randn(2048, 2048, device=cuda, generator=g)
    exact = a.double() @ b.double()

    def relative_error(level: str) -> float:
        with matmul_precision(level):
            out = a @ b
        return ((out.double() - exact).abs().max() / exact.abs().max()).item()

    fp32, tf32 = relative_error("highest"), relative_error("high")
    # TF32 keeps 10 mantissa bits instead of 23: its error is orders of magnitude larger.
    assert tf32 > 10 * fp32, f"TF32 error {tf32:.2e} vs fp32 {fp32:.2e}: TF32 did not engage"

    previous = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        message = enable_tf32()
        assert "enabled" in message and torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.set_float32_matmul_precision(previous[0])
        torch.backends.cudnn.allow_tf32 = previous[1]


def test_compare_precisions_runs_fp16_with_a_scaler_on_the_gpu(cuda: torch.device) -> None:
    from course_lib.device import supports_bf16
    from course_lib.perf.precision import compare_precisions

    precisions = ("fp32", "bf16", "fp16") if supports_bf16(cuda) else ("fp32", "fp16")
    data = [_batch(torch.device("cpu"), 128) for _ in range(2)]
    rows = compare_precisions(lambda: _net(torch.device("cpu")), lambda: data, device=cuda, steps=4,
                              precisions=precisions)
    assert [r["precision"] for r in rows] == list(precisions)
    for row in rows:
        assert row["device"] == str(cuda), row
        assert math.isfinite(row["final_loss"]) and math.isfinite(row["eval_loss"]), row
        assert row["skipped_steps"] < row["steps"], f"the scaler skipped every {row['precision']} step: {row}"
        assert row["activation_mb"] > 0, row
    for row in rows[1:]:  # autocast saves the matmuls' outputs in 16 bits: less than fp32 saves
        assert row["activation_vs_fp32"] < 1, row


# ------------------------------------------------------------------------------------------- transfers
def test_non_blocking_copy_from_pinned_memory_does_not_block_the_host(cuda: torch.device,
                                                                       cycles_per_ms: float) -> None:
    from course_lib.train.accumulate import move_batch

    host = torch.randn(8 * 2**20)  # 32 MiB
    pinned = host.pin_memory()
    assert pinned.is_pinned()
    stream = torch.cuda.current_stream(cuda)
    torch.cuda._sleep(int(200 * cycles_per_ms))  # the stream is busy for 200 ms: a copy queued behind it waits
    (on_device,) = move_batch((pinned,), cuda)  # non_blocking=True
    host_returned_first = not stream.query()
    torch.cuda.synchronize(cuda)
    assert host_returned_first, "the non_blocking copy from pinned memory waited for the GPU"
    assert torch.equal(on_device.cpu(), host), "the asynchronous copy delivered different data"

    torch.cuda._sleep(int(200 * cycles_per_ms))
    pinned.to(cuda, non_blocking=False)
    assert stream.query(), "a blocking copy returns only when the stream (the sleep included) is done"


def test_prefetcher_copies_the_next_batch_on_a_side_stream(cuda: torch.device) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    from course_lib.train.prefetch import Prefetcher

    data = TensorDataset(torch.randn(12, 3), torch.arange(12))
    loader = DataLoader(data, batch_size=5, pin_memory=cuda.type == "cuda")
    prefetcher = Prefetcher(loader, cuda)
    got = [(x.cpu(), y.cpu()) for x, y in prefetcher]
    assert all(torch.equal(a, b) for g, w in zip(got, loader) for a, b in zip(g, w))
    cuda_only(cuda, "a CUDA side stream")
    assert prefetcher.uses_side_stream


def test_pinned_loader_and_train_loop_in_fp16_on_the_gpu(cuda: torch.device, tmp_path: Path) -> None:
    from torch.utils.data import TensorDataset

    from course_lib.data import make_loader
    from course_lib.train import TrainConfig, train

    x, y = _batch(torch.device("cpu"), 256)
    loader = make_loader(TensorDataset(x, y), batch_size=32, train=True, pin_memory=True)
    val = make_loader(TensorDataset(x[:64], y[:64]), batch_size=32, train=False)
    fp16 = "fp16" if cuda.type == "cuda" else "bf16"  # the template trains in fp16 on CUDA only
    cfg = TrainConfig(steps=6, bs=32, lr=1e-3, amp_dtype=fp16, device=cuda.type, model="net", log_every=2,
                      eval_every=6, out=str(tmp_path))
    history = train(_net(torch.device("cpu")), loader, val, cfg, device=cuda, ckpt_path=tmp_path / "ckpt.pt")
    losses = [r["loss"] for r in history if "loss" in r]
    assert losses and all(math.isfinite(v) for v in losses), history
    payload = torch.load(tmp_path / "ckpt.pt", map_location="cpu", weights_only=False)
    assert "scaler" in payload, sorted(payload)
    cuda_only(cuda, "fp16 training and pinned memory")
    assert payload["scaler"] and payload["scaler"]["scale"] > 0, "the fp16 run must checkpoint its GradScaler"
    assert next(iter(loader))[0].is_pinned(), "pin_memory=True should pin batches when CUDA is available"


# ------------------------------------------------------------------------------------------- timing, memory
class _Sleep(nn.Module):
    """A "model" whose forward is one GPU kernel of known length: the host returns at once, the GPU is busy."""

    def __init__(self, cycles: int) -> None:
        super().__init__()
        self.cycles = cycles

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(self.cycles)
        return x


def test_cuda_events_time_an_async_kernel_where_perf_counter_does_not(cuda: torch.device,
                                                                      cycles_per_ms: float) -> None:
    from course_lib.perf.timing import Timer, measure_latency

    kernel = _Sleep(int(100 * cycles_per_ms))
    x = torch.zeros(1, device=cuda)
    t0 = time.perf_counter()
    kernel(x)
    naive_ms = (time.perf_counter() - t0) * 1000  # no synchronize: only the launch is timed
    torch.cuda.synchronize(cuda)

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    kernel(x)
    end.record()
    end.synchronize()
    event_ms = start.elapsed_time(end)

    with Timer(cuda) as timer:  # host clock, synchronised at both ends
        kernel(x)
    synced_ms = timer.elapsed * 1000
    latency = measure_latency(kernel, x, device=cuda, warmup=1, reps=3)  # the course's CUDA-event path

    assert naive_ms < 0.5 * event_ms, f"perf_counter without synchronize saw {naive_ms:.2f} ms of {event_ms:.1f} ms"
    # The synchronised host clock and the course's event-based latency agree with the events (same kernel).
    assert 0.67 < event_ms / synced_ms < 1.5, (event_ms, synced_ms)
    assert 0.67 < latency.median_ms / event_ms < 1.5, (latency.median_ms, event_ms)


def test_max_memory_allocated_grows_with_an_allocation_and_reset_forgets_it(cuda: torch.device) -> None:
    from course_lib.perf.memory import MB, PeakMemory

    size = 64 * MB
    with PeakMemory(cuda) as pm:
        block = torch.empty(size, dtype=torch.uint8, device=cuda)
        del block
    cuda_only(cuda, "the CUDA allocator's counters")
    assert "max_memory_allocated" in pm.what and pm.delta_mb >= 64, pm.summary()
    assert torch.cuda.max_memory_allocated(cuda) >= torch.cuda.memory_allocated(cuda) + size
    torch.cuda.reset_peak_memory_stats(cuda)
    assert torch.cuda.max_memory_allocated(cuda) == torch.cuda.memory_allocated(cuda)


def test_memory_snapshot_records_the_allocation_and_where_it_came_from(cuda: torch.device, tmp_path: Path) -> None:
    cuda_only(cuda, "the CUDA allocator's history")
    size = 3 * MiB + 512  # an unusual size, easy to find
    # Python frames only: symbolising C++ frames ("all") can take minutes on some builds.
    torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    try:
        tensor = torch.empty(size, dtype=torch.uint8, device=cuda)
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._dump_snapshot(str(tmp_path / "snapshot.pickle"))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    blocks = [b for seg in snapshot["segments"] for b in seg["blocks"] if b["address"] == tensor.data_ptr()]
    assert blocks, "the live tensor's block is not in the snapshot"
    assert blocks[0]["state"] == "active_allocated" and blocks[0]["size"] >= size
    files = {Path(frame["filename"]).name for frame in blocks[0]["frames"]}
    assert Path(__file__).name in files, f"the allocating line is not in the recorded stack: {sorted(files)[:10]}"
    trace = snapshot["device_traces"][cuda.index]
    assert any(e["action"] == "alloc" and e.get("addr") == tensor.data_ptr() for e in trace)
    with open(tmp_path / "snapshot.pickle", "rb") as f:
        assert "segments" in pickle.load(f)  # the file memory_viz / pytorch.org/memory_viz reads


# ------------------------------------------------------------------------------------------- compile
def _compiled(model: nn.Module, mode: str, device: torch.device) -> nn.Module:
    from course_lib.perf.compile import compile_blocker, compile_or_eager

    cuda_only(device, "compiling for the GPU")
    reason = compile_blocker(device)
    if reason:
        pytest.skip(f"torch.compile cannot work here: {reason}")
    torch._dynamo.reset()
    compiled, reason = compile_or_eager(model, mode=mode, device=device)
    assert reason is None, reason
    return compiled


@contextlib.contextmanager
def _cuda_graph_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter]:
    """Count the captures and replays of every ``torch.cuda.CUDAGraph`` while the block runs.

    Inductor's CUDA-graph trees record through ``torch.cuda.graph`` (``capture_begin``) and run a recorded graph with
    ``replay()``; recording also replays once, to produce that call's outputs.
    """
    calls: Counter = Counter()
    with monkeypatch.context() as patch:
        for name in ("capture_begin", "replay"):
            original = getattr(torch.cuda.CUDAGraph, name)

            def counted(self: torch.cuda.CUDAGraph, *args: object, _original=original, _name=name, **kwargs: object):
                calls[_name] += 1
                return _original(self, *args, **kwargs)

            patch.setattr(torch.cuda.CUDAGraph, name, counted)
        yield calls


@contextlib.contextmanager
def _cudagraph_skip_reasons() -> Iterator[list[str]]:
    """What Inductor logs when it decides not to use CUDA graphs (its ``cudagraphs`` log, ``TORCH_LOGS=cudagraphs``)."""
    reasons: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: reasons.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("torch._inductor.cudagraph_utils.__cudagraphs")
    logger.addHandler(handler)
    try:
        yield reasons
    finally:
        logger.removeHandler(handler)


def test_reduce_overhead_records_a_cuda_graph_and_replays_it(cuda: torch.device,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._dynamo.utils import counters

    model = _net(cuda).eval()
    compiled = _compiled(model, "reduce-overhead", cuda)
    counters.clear()
    x = _batch(cuda)[0]
    x2 = 2 * x
    with torch.no_grad(), _cudagraph_skip_reasons() as reasons:
        expected, expected2 = model(x), model(x2)
        # CUDA-graph trees run a function eagerly once (warm-up), record it on the next call, and replay it from then
        # on; under no_grad every call starts a new generation, so nothing holds the recorded graph back.
        for _ in range(3):
            compiled(x)
        with _cuda_graph_calls(monkeypatch) as graph_calls:
            kept = compiled(x).clone()
            kept2 = compiled(x2).clone()
    skips = counters["inductor"]["cudagraph_skips"]
    if skips:
        pytest.skip(f"Inductor chose not to use CUDA graphs here ({skips} skip(s)): "
                    f"{'; '.join(reasons) or 'reason not logged; TORCH_LOGS=cudagraphs shows it'}")
    assert graph_calls == {"replay": 2}, \
        f"after 3 calls each call should replay the recorded graph, none record: {dict(graph_calls)}"
    # Each replay computed from its own input (copied into the graph's static input buffer). Reading an earlier
    # output after the next replay would prove nothing: torch 2.11 returns the same output tensor from every replay,
    # newer versions copy a live output out of the graph's memory before the next replay, and neither raises.
    torch.testing.assert_close(kept, expected, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(kept2, expected2, rtol=1e-3, atol=1e-3)
    torch._dynamo.reset()


def test_max_autotune_compiles_and_matches_eager(cuda: torch.device) -> None:
    from course_lib.perf.compile import warm_compile

    model = _net(cuda).eval()
    x = _batch(cuda)[0]
    compiled, reason, _seconds = warm_compile(_compiled(model, "max-autotune", cuda), x)
    assert reason is None, reason
    with torch.no_grad():
        got, expected = compiled(x).clone(), model(x)
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------- NCCL
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_step_over_nccl_matches_the_single_process_step(cuda: torch.device,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    cuda_only(cuda, "NCCL")
    if not (dist.is_available() and dist.is_nccl_available()):
        pytest.skip("this PyTorch build has no NCCL backend")
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    from course_lib import distributed

    # What torchrun --nproc_per_node=1 would set: course_lib.distributed.setup() then joins an NCCL group of one.
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": str(cuda.index), "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    ctx = distributed.setup()
    try:
        assert ctx.backend == "nccl" and ctx.device == cuda, ctx
        x, y = _batch(cuda)
        ddp = DistributedDataParallel(_net(cuda), device_ids=[cuda.index])
        plain = _net(cuda)
        for model in (ddp, plain):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            F.cross_entropy(model(x), y).backward()  # DDP all-reduces the gradients over NCCL here
            opt.step()
        for a, b in zip(ddp.module.parameters(), plain.parameters()):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        total = torch.ones(3, device=cuda)
        dist.all_reduce(total)  # a bare NCCL collective: the sum over one rank is the tensor itself
        assert total.tolist() == [1.0, 1.0, 1.0]
        del ddp, opt, model  # the reducer holds the group: release it before destroying the group
        gc.collect()
    finally:
        distributed.teardown()
