"""course_lib.distributed: single-process behaviour, and real 2-process runs under torchrun (gloo, CPU).

The demo (ddp/fsdp/none) under torchrun is checked through the notebook cell magic in ``test_magics.py``.

The equivalence check: the same GLOBAL batch split over 2 processes follows the single-process loss trajectory.
Tolerance: relative 1e-5 per logged loss over 10 steps (fp32, TinyGPT on the text data: no dropout, no
BatchNorm). Splitting a batch only reorders float additions (two partial sums, then an all-reduce), so the
observed differences are at the float32 rounding level (~1e-7 relative); a bug in the loss scaling, the count
all-reduce or the sharding shows up at 1e-2 or more.
"""

from __future__ import annotations

import json
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from torch import nn

from course_lib import distributed as dist
from course_lib.magics import run_torchrun

LOSS_RTOL = 1e-5
STEPS = 10


def free_port() -> int:
    """A TCP port nobody listens on right now (bind to port 0 and let the OS choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- single process: no torchrun, nothing initialised ------------------------------------------------------------


def test_setup_without_torchrun_is_single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    ctx = dist.setup(device="cpu")
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.is_main, ctx.backend) == (0, 1, 0, True, None)
    assert ctx.device == torch.device("cpu")
    assert not torch.distributed.is_initialized()
    assert (dist.get_rank(), dist.get_world_size(), dist.is_main_process()) == (0, 1, True)
    dist.teardown()  # harmless without a process group


def test_helpers_are_identities_single_process() -> None:
    ctx = dist.DistContext(device=torch.device("cpu"))
    model = nn.Linear(3, 2)
    for strategy in dist.STRATEGIES:
        assert dist.wrap_model(model, ctx, strategy) is model
    assert dist.unwrap(model) is model
    t = torch.tensor([1.0, 2.0])
    assert dist.all_reduce_sum(t) is t and t.tolist() == [1.0, 2.0]
    assert dist.all_reduce_mean(t).tolist() == [1.0, 2.0]
    with dist.no_sync_if(model, True):  # not DDP: plain context, gradients still computed
        model(torch.ones(1, 3)).sum().backward()
    assert model.weight.grad is not None


def test_bad_arguments_fail_before_any_work() -> None:
    ctx = dist.DistContext()
    with pytest.raises(ValueError, match="strategy='zero'"):
        dist.wrap_model(nn.Linear(1, 1), ctx, "zero")
    with pytest.raises(ValueError, match="backend='mpi'"):
        dist.setup(backend="mpi")
    with pytest.raises(ValueError, match="floating-point"):
        dist.all_reduce_mean(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="rule='cubic'"):
        dist.scaled_lr(0.1, 32, 64, rule="cubic")
    with pytest.raises(ValueError, match="global_batch=0"):
        dist.scaled_lr(0.1, 32, 0)


def test_scaled_lr_rules() -> None:
    assert dist.scaled_lr(0.1, 256, 1024) == pytest.approx(0.4)
    assert dist.scaled_lr(0.1, 256, 1024, rule="sqrt") == pytest.approx(0.2)
    assert dist.scaled_lr(3e-4, 64, 64, rule="sqrt") == pytest.approx(3e-4)
    assert dist.scaled_lr(0.1, 256, 128) == pytest.approx(0.05)  # smaller batch: smaller step


# --- real multi-process runs -------------------------------------------------------------------------------------


def _losses(metrics: Path) -> list[tuple[int, str, float]]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [(r["step"], "val_loss" if "val_loss" in r else "loss", r.get("val_loss", r.get("loss"))) for r in rows]


@pytest.mark.distributed
def test_two_processes_follow_the_single_process_trajectory(tmp_path: Path) -> None:
    """Same global batch (8 samples per step): 1 process x bs 8 vs 2 processes x bs 2 x accum 2.

    The 2-process run is launched multi-node style (c10d rendezvous on a free port, --nnodes=1) and exercises the
    template's DDP path: sharded sampler, target count all-reduced per group, no_sync on the first micro-batch.
    """
    from course_lib.train import TrainConfig
    from course_lib.train.launch import run

    common = dict(model="gpt", dataset="text", steps=STEPS, log_every=1, eval_every=5, device="cpu",
                  amp_dtype="fp32", seed=0)
    one_out, two_out = tmp_path / "one", tmp_path / "two"
    cli_args = [f"--{k.replace('_', '-')}={v}" for k, v in common.items()]
    cli_args += ["--bs=2", "--accum=2", f"--out={two_out}"]

    def two_processes() -> tuple[int, str]:
        return run_torchrun(
            "-m course_lib.train", nproc=2, timeout=240, script_args=cli_args,
            rdzv_endpoint=f"127.0.0.1:{free_port()}",
        )

    with ThreadPoolExecutor(1) as pool:  # the reference runs here while torchrun runs in the background
        future = pool.submit(two_processes)
        run(TrainConfig(bs=8, accum=1, out=str(one_out), **common))
        returncode, output = future.result()
    assert returncode == 0, output

    reference, split = _losses(one_out / "metrics.jsonl"), _losses(two_out / "metrics.jsonl")
    # Rank 0 alone logs and saves: one copy of each record (a second writer would duplicate lines), one banner.
    assert [r[:2] for r in split] == [r[:2] for r in reference]
    assert len([r for r in split if r[1] == "loss"]) == STEPS
    assert output.count("config: ") == 1 and output.count("final: step") == 1
    assert (two_out / "ckpt.pt").is_file()
    for (step, kind, want), (_, _, got) in zip(reference, split):
        assert got == pytest.approx(want, rel=LOSS_RTOL), f"step {step} {kind}: 1 process {want}, 2 processes {got}"


def test_demo_runs_single_process(capsys: pytest.CaptureFixture[str]) -> None:
    from course_lib import ddp_demo

    assert ddp_demo.main(["--strategy", "ddp", "fsdp", "--epochs", "1", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("world_size=1") == 2  # fsdp at world size 1 is a plain model
    assert out.count("parameters identical on all ranks after training: yes") == 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))


# --- the exercise-11 harness and the all-reduce counter ------------------------------------------------------------

_HARNESS_CELL = '''
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from course_lib.distributed import AllReduceCounter


def count_buckets(rank, world_size, model, dataset, cfg, out_dir):
    """Backward three times: once inside no_sync (no all-reduce), twice outside (once per bucket each)."""
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = DDP(model, bucket_cap_mb=cfg["cap_mb"])
    x, y = dataset[rank]
    with model.no_sync():
        model(x[None]).sum().backward()
    for _ in range(2):  # the first synchronised backward uses one bucket; DDP then rebuilds them at the cap
        model(x[None]).sum().backward()
    dist.destroy_process_group()
    return model.module


def fails_on_rank_1(rank, world_size, model, dataset, cfg, out_dir):
    if rank == 1:
        raise ValueError("rank 1 gives up before joining")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)  # waits for rank 1 forever
    return model
'''


def _harness_functions(tmp_path: Path) -> dict:
    """The cell above, defined from a file so that its source can be found again (as a notebook cell's can)."""
    path = tmp_path / "cell.py"
    path.write_text(_HARNESS_CELL)
    ns: dict = {}
    exec(compile(_HARNESS_CELL, str(path), "exec"), ns)
    return ns


def test_ranks_run_a_cell_and_report_allreduces_reads_and_saves(tmp_path: Path) -> None:
    """Two real ranks: the counter sees the synchronised backward only, split into buckets by bucket_cap_mb."""
    from course_lib.grading.ddp_ranks import run_ranks

    fn = _harness_functions(tmp_path)["count_buckets"]
    result = run_ranks(fn, {"seed": 0, "n": 4, "cap_mb": 0.002}, timeout_s=120)
    for rank, record in enumerate(result["ranks"]):
        assert "error" not in record, record
        assert record["reads"] == [rank] and record["syncs"] == 2 and record["ddp_models"] == 1
        assert record["buckets"] > 2 and record["saves"] == []
    a, b = (r["params"] for r in result["ranks"])
    assert torch.equal(a, b) and result["checkpoint"] is None and result["files"] == []
    assert run_ranks(fn, {"seed": 0, "n": 4, "cap_mb": 0.002}, reuse=True) is result  # same cell and job


def test_a_failing_rank_is_reported_and_the_waiting_one_stopped(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from course_lib.grading import ddp_ranks

    monkeypatch.setattr(ddp_ranks, "GRACE_S", 0.5)
    fn = _harness_functions(tmp_path)["fails_on_rank_1"]
    with pytest.raises(ddp_ranks.RanksFailed, match="rank 0 ended without reporting"):
        ddp_ranks.run_ranks(fn, {"seed": 0, "n": 4}, timeout_s=120)


@pytest.mark.slow
def test_when_the_fork_server_fails_to_start_a_rank_the_ranks_start_again_with_spawn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fork server ending while rank 1 starts (the parent reads an EOF for its PID) is the grader's problem,
    never the learner's: rank 0 is stopped and both ranks start again with spawn."""
    import multiprocessing

    from course_lib.grading import ddp_ranks

    real_start, real_env, methods = ddp_ranks._start_ranks, ddp_ranks._rank_env, []

    def env_failing_for_rank_1(rank: int, *args: object) -> dict:
        if rank == 1:
            raise EOFError("unexpected EOF")
        return real_env(rank, *args)

    def start(run_dir: Path, world_size: int, method: str | None = None) -> list:
        methods.append(method)
        if method is None:  # the fork server's attempt: rank 0 starts, rank 1 cannot
            monkeypatch.setattr(ddp_ranks, "_rank_env", env_failing_for_rank_1)
            try:
                return real_start(run_dir, world_size, method)
            finally:
                monkeypatch.setattr(ddp_ranks, "_rank_env", real_env)
        return real_start(run_dir, world_size, method)

    monkeypatch.setattr(ddp_ranks, "_start_ranks", start)
    monkeypatch.setattr(ddp_ranks, "start_method", lambda: "forkserver")
    fn = _harness_functions(tmp_path)["count_buckets"]
    result = ddp_ranks.run_ranks(fn, {"seed": 1, "n": 4, "cap_mb": 0.002}, timeout_s=120)
    assert methods == [None, "spawn"]
    assert all("error" not in record and record["syncs"] == 2 for record in result["ranks"]), result["ranks"]
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("ddp-rank")]
