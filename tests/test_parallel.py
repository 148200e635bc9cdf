"""course_lib.parallel: the arithmetic on one process, and every mechanism on 2 real gloo ranks (one torchrun launch).

The rank side is ``tests/parallel_ranks.py``: it trains, counts and measures, and writes ``rank<R>.json``; the
tests below read those numbers. Tolerances (fp32, max absolute difference over all parameters, 5 steps):

* Data parallelism (all-reduce after backward, overlapped, bucketed) vs one process on the concatenated batch:
  ``DP_ATOL`` = 1e-6 (observed 3e-8 with SGD + momentum, 9e-8 with AdamW). Half-batch means averaged over ranks
  only reorder float additions. With gradient accumulation (two micro-batches of halved losses) AdamW drifts
  further, ``ACCUM_ATOL`` = 1e-5 (observed 3e-6): Adam divides by the root of tiny second moments, which magnifies
  rounding. A wrong average (a sum, a missing rank) is off by 1e-2 or more.
* vs torch's DDP on the same split (with ``no_sync`` for accumulation): **bitwise equal**. On 2 ranks DDP's
  divide-then-sum and our sum-then-divide are the same float operations (halving is exact).
* ZeRO-1 vs AdamW on the averaged gradients: bitwise equal (AdamW is element-wise); vs one process: ``DP_ATOL``.
* Tensor parallelism vs the unsplit block: ``TP_ATOL`` = 1e-6 for the output and the input gradient (the row-split
  matmul sums its halves in another order; observed 1e-7 and 2e-7); the weight gradients are bitwise equal.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_lib.magics import run_torchrun
from course_lib.parallel import comm, data_parallel, tensor_parallel, zero
from course_lib.parallel.comm import (
    CommLog,
    CommRecord,
    count_collectives,
    fit_bandwidth_latency,
    predicted_allreduce_seconds,
    ring_allreduce_bytes,
    ring_bytes_sent,
)
from course_lib.parallel.data_parallel import assign_buckets
from course_lib.parallel.zero import shard_bounds

DP_ATOL = 1e-6
ACCUM_ATOL = 1e-5
TP_ATOL = 1e-6
LESSON = "Taught in lesson 13 (``notebooks/13_parallel.ipynb``)."


# --- one process: formulas, bucketing, shards, the counter's bookkeeping ------------------------------------------


def test_ring_allreduce_bytes_and_the_alpha_beta_model() -> None:
    assert ring_allreduce_bytes(1000, 1) == 0
    assert ring_allreduce_bytes(1000, 2) == 1000
    assert ring_allreduce_bytes(1000, 8) == 1750
    # 2 (world - 1) latencies + ring bytes / bandwidth
    assert predicted_allreduce_seconds(4e6, 4, bandwidth=1e9, latency=1e-5) == pytest.approx(6e-5 + 6e6 / 1e9)
    with pytest.raises(ValueError, match="bandwidth=0"):
        predicted_allreduce_seconds(1, 2, bandwidth=0, latency=0)


@pytest.mark.parametrize("world", [2, 4])
def test_fit_recovers_the_bandwidth_and_latency_that_made_the_times(world: int) -> None:
    sizes = [2**k for k in range(10, 24, 2)]
    rows = [(n, predicted_allreduce_seconds(n, world, bandwidth=3e9, latency=2e-5)) for n in sizes]
    bandwidth, latency = fit_bandwidth_latency(rows, world)
    assert bandwidth == pytest.approx(3e9, rel=1e-9) and latency == pytest.approx(2e-5, rel=1e-9)


def test_fit_refuses_what_it_cannot_fit_and_clamps_a_negative_latency() -> None:
    with pytest.raises(ValueError, match="two different message sizes"):
        fit_bandwidth_latency([(1024, 1e-3), (1024, 2e-3)], 2)
    with pytest.raises(ValueError, match="world=1"):
        fit_bandwidth_latency([(1, 1.0), (2, 2.0)], 1)
    with pytest.raises(ValueError, match="do not grow"):
        fit_bandwidth_latency([(1024, 2e-3), (2**20, 1e-3)], 2)
    # times proportional to size minus a constant: the best line has a negative intercept -> latency 0
    bandwidth, latency = fit_bandwidth_latency([(1e6, 0.9e-3), (2e6, 1.9e-3), (4e6, 3.9e-3)], 2)
    assert latency == 0.0 and bandwidth > 0


def _lesson_13_cells(*needles: str) -> list[str]:
    nb = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / "13_parallel.ipynb").read_text())
    sources = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    return [next(s for s in sources if needle in s) for needle in needles]


@pytest.mark.parametrize("busy", [True, False])
def test_lesson_13_teaches_on_when_a_busy_sweep_cannot_be_fitted(busy: bool, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Other programs on the cores can make large all-reduces time no slower than small ones: the fit refuses, and
    the lesson plots what was measured, says why there is no fit, and the cells after it still run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [2**k for k in range(12, 25, 2)]
    if busy:  # the times fall as the messages grow
        rows = [(n, 0.01 / (i + 1)) for i, n in enumerate(sizes)]
        with pytest.raises(ValueError) as refusal:
            fit_bandwidth_latency(rows, 2)
        bandwidth, latency, refused = None, None, str(refusal.value)
    else:
        rows = [(n, comm.predicted_allreduce_seconds(n, 2, 1e9, 50e-6)) for n in sizes]
        (bandwidth, latency), refused = fit_bandwidth_latency(rows, 2), ""
    buckets = {str(cap): {"messages": m, "measured_s": 0.001 * m,
                          "predicted_s": None if busy else 0.0008 * m} for cap, m in ((0.25, 9), (25.0, 1))}
    (tmp_path / "cost.json").write_text(json.dumps({"rows": rows, "bandwidth": bandwidth, "latency": latency,
                                                    "refused": refused, "buckets": buckets}))
    # the data-parallel steps: 2,000,000 parameters (8 MB of gradients), 10 ms of compute, 30 ms of all-reduce
    dp = {"parameters": 2_000_000, "versions": {"after backward": {"all_reduce calls": 30}},
          "after backward phases": {"compute_ms": 10.0, "allreduce_ms": 30.0}}
    said: list[str] = []
    namespace = {"json": json, "run_dir": tmp_path, "plt": plt, "comm": comm, "dp": dp,
                 "lesson": SimpleNamespace(say=said.append)}
    for source in _lesson_13_cells('cost = json.loads((run_dir / "cost.json")', "bytes sent per rank",
                                   "comm.comm_bound_world("):
        exec(compile(source, "lesson-13-cell", "exec"), namespace)
    plt.close("all")
    out = "\n".join(said) + capsys.readouterr().out
    assert ("No fit this time" in out and refused in out and "no fit (see above)" in out) == busy
    assert ("Fitted on this machine" in out and "measured / predicted" in out) == (not busy)
    assert ("the model has nothing to predict from" in out) == busy
    if not busy:  # 1 GB/s and 50 us: 8 MB take 8.1 ms on 2 ranks, 10 ms of compute are reached at 3 ranks
        assert comm.comm_bound_world(0.010, 8e6, 50e-6, 1e9) == 3
        assert "prices that all-reduce on 2 ranks at 8.1 ms" in out and "reaches the compute at 3 ranks" in out
        assert f"at 8 ranks {comm.bandwidth_for_compute(0.010, 8e6, 8, 50e-6) / 1e9:.2f} GB/s" in out
        assert "at 64 ranks none: the latency term alone, 2 · 63 · α = 6.3 ms" not in out  # 6.3 < 10 ms: a link
        assert "30.0 ms as the steps sent it (3.70x" in out


@pytest.mark.parametrize(("waiting", "answer"), [((0.50, 0.12), "less with 8"), ((0.55, 0.50), "the same share"),
                                                 ((0.02, 0.01), "none with either")])
def test_lesson_13_pipeline_reveal_follows_the_measured_waiting(tmp_path: Path, waiting: tuple[float, float],
                                                               answer: str) -> None:
    """The bubble's reveal picks its answer from the waiting shares it was given, and says where they sit against
    (p - 1)/(m + p - 1)."""
    (reveal,) = _lesson_13_cells('glob("pipeline.rank*.json")')
    for rank in range(2):
        runs = {m: {"step_s": 0.2, "waiting": share, "bubble": 1 / (m + 1)} for m, share in zip((1, 8), waiting)}
        (tmp_path / f"pipeline.rank{rank}.json").write_text(json.dumps({"rank": rank, "rows": 1440, "runs": runs}))
    shown: list[tuple[str, str]] = []
    exec(compile(reveal, "lesson-13-cell", "exec"),
         {"json": json, "run_dir": tmp_path, "lesson": SimpleNamespace(say=lambda text: None),
          "guess_bubble": SimpleNamespace(reveal=lambda actual, why: shown.append((actual, why)))})
    (actual, why), = shown
    assert actual.startswith(answer), actual
    assert f"{waiting[1]:.0%} with 8 (the model: 11%)" in why
    assert ("Above the model with 1 and 8" in why) == (answer == "the same share")


def test_buckets_fill_to_the_cap_and_a_large_parameter_travels_alone() -> None:
    def p(n: int, dtype: torch.dtype = torch.float32) -> nn.Parameter:
        return nn.Parameter(torch.zeros(n, dtype=dtype))

    named = [("a", p(10)), ("b", p(10)), ("c", p(30)), ("d", p(5)), ("e", p(5)), ("f", p(5, torch.float64))]
    assert assign_buckets(named, cap_bytes=80) == [["a", "b"], ["c"], ["d", "e"], ["f"]]  # 120-byte c alone
    assert assign_buckets(named, cap_bytes=10**6) == [["a", "b", "c", "d", "e"], ["f"]]  # dtype change splits
    assert assign_buckets(named, cap_bytes=1) == [[n] for n, _ in named]
    with pytest.raises(ValueError, match="cap_bytes=0"):
        assign_buckets(named, 0)


def test_shards_are_contiguous_cover_everything_and_only_the_last_are_short() -> None:
    assert shard_bounds(10, 3) == [(0, 4), (4, 8), (8, 10)]
    assert shard_bounds(433, 2) == [(0, 217), (217, 433)]
    assert shard_bounds(5, 4) == [(0, 2), (2, 4), (4, 5), (5, 5)]  # more ranks than a fair split: one empty
    assert shard_bounds(12, 4) == [(0, 3), (3, 6), (6, 9), (9, 12)]
    with pytest.raises(ValueError):
        shard_bounds(10, 0)


def test_lesson_13_zero_model_has_uneven_shards_and_its_sentence_follows_the_shard_sizes(tmp_path: Path) -> None:
    """The ZeRO cell's model has an odd parameter count, so its two shards differ (as the lesson says); the reveal
    renders the shard sizes it was given, equal or not."""
    import ast

    from course_lib.models import Net

    script, reveal = _lesson_13_cells("ShardedOptimizer(m.parameters()", 'zero.rank*.json')
    script = "\n".join(line for line in script.splitlines() if not line.startswith("%%"))
    build = next(node for node in ast.parse(script).body if isinstance(node, ast.FunctionDef) and node.name == "build")
    namespace: dict[str, Any] = {"torch": torch, "Net": Net}
    exec(compile(ast.Module(body=[build], type_ignores=[]), "lesson-13-build", "exec"), namespace)
    numel = sum(p.numel() for p in namespace["build"]().parameters())
    sizes = [end - start for start, end in shard_bounds(numel, 2)]
    assert sizes[0] != sizes[1], f"{numel} parameters split evenly on 2 ranks: the lesson promises uneven shards"

    def said(numel: int) -> str:
        run_dir = tmp_path / str(numel)
        run_dir.mkdir(exist_ok=True)
        ranks = [{"rank": r, "numel": numel, "shard": list(bounds), "difference": 0.0, "adamw_state": 8 * numel,
                  "zero1_state": 8 * (bounds[1] - bounds[0]),
                  "replica": {"params": 1, "grads": 1, "optimizer_state": 1},
                  "fsdp": {"params": 1, "grads": 1, "optimizer_state": 1}}
                 for r, bounds in enumerate(shard_bounds(numel, 2))]
        for r in ranks:
            (run_dir / f"zero.rank{r['rank']}.json").write_text(json.dumps(r))
        text: list[str] = []
        guess = SimpleNamespace(reveal=lambda answer, why: text.append(why))
        exec(compile(reveal, "lesson-13-cell", "exec"),
             {"json": json, "run_dir": run_dir, "guess_zero": guess, "lesson": SimpleNamespace(say=text.append)})
        return "\n".join(text)

    assert "792,673 and 792,672" in said(1_585_345) and "the last is 1 shorter" in said(1_585_345)
    assert "800 and 800" in said(1_600) and "equal" in said(1_600) and "shorter" not in said(1_600)


def test_the_counter_puts_the_real_functions_back_even_after_an_exception() -> None:
    originals = {op: getattr(dist, op) for op in comm.PAYLOAD_ARGUMENT}
    with pytest.raises(KeyError):
        with count_collectives() as log:
            assert all(getattr(dist, op) is not fn for op, fn in originals.items())
            raise KeyError("escapes")
    assert all(getattr(dist, op) is fn for op, fn in originals.items()) and len(log) == 0


def test_the_log_sums_per_op() -> None:
    log = CommLog([CommRecord("all_reduce", 40, False, 0.0, 1.0), CommRecord("broadcast", 8, False, 1.0, 2.0),
                   CommRecord("all_reduce", 4, True, 2.0, None)])
    assert log.counts() == {"all_reduce": 2, "broadcast": 1}
    assert log.bytes_by_op() == {"all_reduce": 44, "broadcast": 8} and log.total_bytes == 52
    assert log.summary().splitlines()[0].split()[:2] == ["all_reduce", "2"]


def test_tensor_parallel_layers_hold_their_slice_and_refuse_uneven_splits() -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(6, 8), nn.GELU(approximate="tanh"), nn.Linear(8, 6))
    tp = tensor_parallel.TPMLP.from_full(block, rank=1, world=2)
    assert torch.equal(tp.fc.weight, block[0].weight[4:]) and torch.equal(tp.fc.bias, block[0].bias[4:])
    assert torch.equal(tp.proj.weight, block[2].weight[:, 4:]) and torch.equal(tp.proj.bias, block[2].bias)
    assert tp.act.approximate == "tanh"
    with pytest.raises(ValueError, match="out_features=8 is not divisible by world=3"):
        tensor_parallel.TPMLP.from_full(block, rank=0, world=3)
    with pytest.raises(ValueError, match="exactly two nn.Linear"):
        tensor_parallel.TPMLP.from_full(nn.Linear(2, 2), rank=0, world=1)


def test_every_public_object_names_its_lesson() -> None:
    for module in (comm, data_parallel, zero, tensor_parallel):
        assert LESSON in (module.__doc__ or ""), module.__name__
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj):
                assert (obj.__doc__ or "").strip().endswith(LESSON), f"{module.__name__}.{name}"


# --- two real ranks -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """One 2-process gloo job runs every check (about 15 s on 2 cores, most of it starting the processes)."""
    out = tmp_path_factory.mktemp("parallel")
    returncode, output = run_torchrun(Path(__file__).with_name("parallel_ranks.py"), nproc=2, timeout=240,
                                      script_args=[str(out)])
    assert returncode == 0, output[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.distributed
def test_the_counter_records_every_collective_with_its_bytes(ranks: list[dict[str, Any]]) -> None:
    for result in ranks:
        c = result["comm"]
        assert c["counts"] == {"all_reduce": 2, "broadcast": 1, "all_gather_into_tensor": 1, "all_gather": 1,
                               "reduce_scatter_tensor": 1, "reduce_scatter": 1}
        # bytes this rank passes in: 10 + 5 floats, 3 doubles, 2 floats, 4 floats, 3*2 floats, 2 lists of 2 floats
        assert c["bytes"] == {"all_reduce": 60, "broadcast": 24, "all_gather_into_tensor": 8, "all_gather": 16,
                              "reduce_scatter_tensor": 24, "reduce_scatter": 16}
        assert [r["async_op"] for r in c["records"]] == [False, False, True, False, False, False, False]
        assert all(r["finished"] is not None and r["finished"] >= r["issued"] for r in c["records"])
        assert c["restored_after_exception"]


@pytest.mark.distributed
def test_allreduce_measurements_agree_across_ranks_and_fit_the_model(ranks: list[dict[str, Any]]) -> None:
    rows = ranks[0]["comm"]["rows"]
    assert rows == ranks[1]["comm"]["rows"]  # the slowest rank's median, shared
    assert [n for n, _ in rows] == [2**10, 2**16, 2**20] and all(t > 0 for _, t in rows)
    # Times measured beside other tests may not grow with the size (a busy moment on the small message): then the
    # fit refuses with its own message, which lesson 13 shows a learner. The fit itself is tested on exact rows above.
    fit = ranks[0]["comm"]["fit"]
    if isinstance(fit, str):
        assert fit.startswith("the times do not grow with the message size"), fit
    else:
        bandwidth, latency = fit
        assert bandwidth > 0 and latency >= 0


DP_RUNS = [f"{kind}/{version}" for kind in ("sgd", "adamw")
           for version in ("naive", "overlapped", "bucketed", "overlapped+accum", "bucketed+accum")]


@pytest.mark.distributed
@pytest.mark.parametrize("run", DP_RUNS)
def test_data_parallel_trains_like_one_process_and_like_ddp(ranks: list[dict[str, Any]], run: str) -> None:
    atol = ACCUM_ATOL if run.endswith("+accum") else DP_ATOL
    for result in ranks:
        got = result["equivalence"][run]
        assert got["vs_rank0"] == 0.0  # the replicas never drift apart
        assert got["vs_ddp"] == 0.0, got  # bitwise torch's DDP on the same split
        assert got["vs_reference"] <= atol, got


@pytest.mark.distributed
def test_accumulation_sends_once_per_step_and_ddp_itself_matches(ranks: list[dict[str, Any]]) -> None:
    eq = ranks[0]["equivalence"]
    n_params = eq["n_params"]
    for kind in ("sgd", "adamw"):
        assert eq[f"{kind}/ddp"]["vs_reference"] <= DP_ATOL
        assert eq[f"{kind}/ddp+accum"]["vs_reference"] <= ACCUM_ATOL
        for version in ("naive", "overlapped"):
            assert eq[f"{kind}/{version}"]["allreduces_per_step"] == [n_params] * 5
        assert eq[f"{kind}/overlapped+accum"]["allreduces_per_step"] == [n_params] * 5  # not 2 x: no_sync
        # cap 0.001 MiB = 1048 B, reverse order: [4.bias 16 B + 4.weight 512 B + 2.bias 128 B], [2.weight 4096 B],
        # [0.bias 128 B] (+ 0.weight 1024 B would pass the cap), [0.weight]
        assert eq[f"{kind}/bucketed"]["allreduces_per_step"] == [4] * 5
        assert eq[f"{kind}/bucketed+accum"]["allreduces_per_step"] == [4] * 5


@pytest.mark.distributed
def test_bucketed_dp_sends_one_message_per_bucket(ranks: list[dict[str, Any]]) -> None:
    """Four Linear(256, 256): weights of 256 KiB, biases of 1 KiB, in reverse order 3.bias, 3.weight, 2.bias ..."""
    b = ranks[0]["buckets"]
    param_bytes = 4 * (256 * 256 + 256) * 4
    names = [f"{i}.{kind}" for i in (3, 2, 1, 0) for kind in ("bias", "weight")]
    expected = {
        "cap=0.0001": [[n] for n in names],  # 104 bytes: every parameter alone
        "cap=0.25": [[n] for n in names],  # a weight fills 0.25 MiB exactly: nothing fits beside it
        "cap=1.0": [names[:7], names[7:]],  # 3 x (bias + weight) + 1 bias = 790528 B; + the last weight > 1 MiB
        "cap=25.0": [names],
    }
    for cap, buckets in expected.items():
        got = b[cap]
        assert got["buckets"] == buckets, cap
        assert got["collectives_per_step"] == len(buckets) == got["counted"]["all_reduce"], cap
        assert got["counted"] == {"all_reduce": len(buckets)}  # nothing else is sent
        assert got["bytes_per_step"] == got["counted_bytes"]["all_reduce"] == got["param_bytes"] == param_bytes
    for cap in ("0.25", "1.0", "4.0", "25.0"):  # the lesson's ~2 M-parameter Net: every byte once, per bucket
        net = b[f"net/cap={cap}"]
        assert net["collectives"] == net["collectives_per_step"] and net["bytes"] == 4 * b["net_params"]
    assert b["net/cap=25.0"]["collectives"] == 1 and b["net/cap=0.25"]["collectives"] > b["net/cap=4.0"]["collectives"]


@pytest.mark.distributed
def test_buckets_are_issued_in_bucket_order_whatever_order_gradients_became_ready(
        ranks: list[dict[str, Any]]) -> None:
    """Every rank must issue its collectives in the same order: bucket k leaves only after buckets 0 .. k-1."""
    for result in ranks:
        order = result["order"]
        assert order["bucket_bytes"] == [64, 512, 16, 256]
        assert order["ready_bytes"][:2] != order["bucket_bytes"][:2]  # the model makes the late layer's first
        assert order["issued_bytes"] == order["bucket_bytes"], order


@pytest.mark.distributed
def test_ddp_allreduces_are_recorded_by_the_comm_hook(ranks: list[dict[str, Any]]) -> None:
    for result in ranks:
        for step in result["order"]["ddp"]:
            assert step["bytes"] == result["order"]["ddp_param_bytes"], step
            assert step["first_issued_before_backward_returned"] and step["all_finished"], step
        assert result["order"]["ddp"][-1]["count"] >= 4, result["order"]["ddp"]  # rebuilt at 0.25 MiB: 1 MiB in 4+


@pytest.mark.distributed
def test_sharded_optimizer_is_a_torch_optimizer_with_groups_a_schedule_and_a_saved_state(
        ranks: list[dict[str, Any]]) -> None:
    for result in ranks:
        z = result["zero_optimizer"]
        assert z["is_optimizer"]
        assert z["groups_and_schedule_vs_adamw"] <= 1e-6, z  # weight decay per group, LR halved each step
        # the groups carry the schedule's lr; the shard's optimizer took the one each step ran with (the 4th: 0.5**3)
        assert z["lrs"] == [0.01 * 0.5**4] * 2 and set(z["inner_lrs"]) == {0.01 * 0.5**3}, z
        assert z["grads_after_zero_grad"] == 0
        assert z["resumed_vs_straight"] == 0.0, z
        assert "shard" in z["saved_keys"] and "param_groups" in z["saved_keys"]
        assert "load each rank's own file" in z["other_rank_refused"], z["other_rank_refused"]
    # rank 0's shard [0, 217) lies in the weights' group; rank 1's [217, 433) crosses into the biases'
    assert ranks[0]["zero_optimizer"]["inner_weight_decays"] == [0.1]
    assert ranks[1]["zero_optimizer"]["inner_weight_decays"] == [0.1, 0.0]
    assert ranks[0]["zero_optimizer"]["state_bytes"] > 0 and ranks[1]["zero_optimizer"]["state_bytes"] > 0


@pytest.mark.distributed
def test_overlapped_versions_send_before_backward_ends(ranks: list[dict[str, Any]]) -> None:
    """The first layer's gradient is the last one backward produces: a message issued before it overlaps."""
    for result in ranks:
        b = result["buckets"]
        for version in ("overlapped", "bucketed"):
            o = b[f"overlap/{version}"]
            assert o["all_async"] and o["first_issued"] < o["first_layer_ready"] < o["last_finished"], version
        naive = b["overlap/naive"]
        assert not naive["all_async"] and naive["first_issued"] > naive["first_layer_ready"]


@pytest.mark.distributed
def test_zero1_steps_like_adamw_with_a_shard_of_the_state(ranks: list[dict[str, Any]]) -> None:
    total_state = 0
    for rank, result in enumerate(ranks):
        z = result["zero"]
        assert z["vs_dp_adamw"] == 0.0 and z["vs_reference"] <= DP_ATOL, z
        assert z["numel"] == 433 and z["bounds"] == [[0, 217], [217, 433]]  # the last shard one shorter
        start, end = z["bounds"][rank]
        # exp_avg and exp_avg_sq (fp32) of the shard, and one fp32 step counter
        assert z["state_bytes"] == 8 * (end - start) + 4
        # unsharded AdamW: the moments of all 433, and one step counter per parameter tensor
        assert z["unsharded_state_bytes"] == 8 * 433 + 4 * z["n_tensors"]
        # one all-gather per step, of the padded shard (217 floats each)
        assert z["step_collectives"] == {"all_gather_into_tensor": 1}
        assert z["step_bytes"] == {"all_gather_into_tensor": 217 * 4}
        total_state += z["state_bytes"]
    assert total_state == 8 * 433 + 4 * 2  # the moments once over the ranks; a step counter on each


@pytest.mark.distributed
def test_zero1_by_hand_sends_one_and_a_half_times_data_parallelism_and_a_reduce_scatter_would_send_one(
        ranks: list[dict[str, Any]]) -> None:
    """One step's traffic, counted: data parallelism all-reduces the gradients (433 floats, one call per tensor);
    ShardedOptimizer all-reduces them too, then all-gathers the padded shards (217 floats from each rank). On the ring
    that is 1.5x data parallelism's bytes; a reduce-scatter of the padded gradients in place of the all-reduce
    (exercise 22) sends what data parallelism sends. Lesson 13 shows the same count on its Net."""
    world = len(ranks)
    for result in ranks:
        z = result["zero"]
        dp, zero1 = z["dp_traffic"], z["zero_traffic"]
        assert [op for op, _ in dp] == ["all_reduce"] * z["n_tensors"], dp
        assert sum(n for _, n in dp) == 433 * 4
        assert [op for op, _ in zero1] == ["all_reduce"] * z["n_tensors"] + ["all_gather_into_tensor"], zero1
        assert zero1[:-1] == dp and zero1[-1][1] == 217 * 4
        sent = {name: sum(ring_bytes_sent(op, n, world) for op, n in traffic)
                for name, traffic in (("dp", dp), ("zero1", zero1))}
        assert sent == {"dp": 433 * 4, "zero1": 433 * 4 + 217 * 4}
        assert sent["zero1"] / sent["dp"] == pytest.approx(1.5, abs=0.005)  # off by the padding: 434 / 433
        reduce_scatter = (ring_bytes_sent("reduce_scatter_tensor", 2 * 217 * 4, world)
                          + ring_bytes_sent(*zero1[-1], world))
        assert reduce_scatter == ring_bytes_sent("all_reduce", 2 * 217 * 4, world)  # one all-reduce of the padded
        assert reduce_scatter / sent["dp"] == pytest.approx(1.0, abs=0.005)


@pytest.mark.distributed
def test_fsdp_keeps_about_half_of_everything_on_each_rank(ranks: list[dict[str, Any]]) -> None:
    replicated = ranks[0]["fsdp"]["replicated"]
    n_tensors = ranks[0]["fsdp"]["n_tensors"]
    shards = [r["fsdp"]["fsdp"] for r in ranks]
    for key in ("params", "grads"):
        assert sum(s[key] for s in shards) == replicated[key]  # each element on exactly one rank
        assert all(s[key] < 0.6 * replicated[key] for s in shards)
    # the moments are sharded; the per-tensor step counters (4 bytes) are kept on every rank
    assert sum(s["optimizer_state"] for s in shards) == replicated["optimizer_state"] + 4 * n_tensors


@pytest.mark.distributed
def test_tensor_parallel_block_matches_the_full_block_with_one_message_each_way(
        ranks: list[dict[str, Any]]) -> None:
    for result in ranks:
        tp = result["tensor_parallel"]
        assert tp["out"] <= TP_ATOL and tp["x_grad"] <= TP_ATOL, tp
        for name in ("fc_weight_grad", "fc_bias_grad", "proj_weight_grad", "proj_bias_grad"):
            assert tp[name] == 0.0, (name, tp)
        assert tp["local_weights"] == [[32, 16], [16, 32]]  # half of Linear(16, 64)'s rows, of Linear(64, 16)'s cols
        nbytes = tp["activation_bytes"]  # [3, 5, 16] fp32 = 960 bytes
        assert tp["forward"] == [{"all_reduce": 1}, {"all_reduce": nbytes}]
        assert tp["backward"] == [{"all_reduce": 1}, {"all_reduce": nbytes}]
