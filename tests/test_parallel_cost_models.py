"""The cost models exercise 22 grades against: bytes on a ring, ZeRO's memory per rank, the communication-bound
crossover, a pipeline's bubble and in-flight micro-batches (course_lib/parallel/comm.py, zero.py and pipeline.py).
Pure functions: no ranks."""

from __future__ import annotations

import math

import pytest

from course_lib.parallel.comm import (
    bandwidth_for_compute,
    comm_bound_world,
    predicted_allreduce_seconds,
    ring_bytes_sent,
)
from course_lib.parallel.pipeline import bubble_fraction, peak_in_flight, stage_order
from course_lib.parallel.zero import zero_bytes_per_rank


@pytest.mark.parametrize("world", [2, 3, 8, 64])
def test_zero1_with_a_reduce_scatter_sends_what_data_parallelism_sends_and_the_all_reduce_version_half_more(
        world: int) -> None:
    nbytes = 4 * 1000 * world
    data_parallel = ring_bytes_sent("all_reduce", nbytes, world)
    reduce_scatter = ring_bytes_sent("reduce_scatter_tensor", nbytes, world) + \
        ring_bytes_sent("all_gather_into_tensor", nbytes // world, world)
    all_reduce_then_gather = data_parallel + ring_bytes_sent("all_gather_into_tensor", nbytes // world, world)
    assert reduce_scatter == pytest.approx(data_parallel)
    assert all_reduce_then_gather == pytest.approx(1.5 * data_parallel)
    assert data_parallel == pytest.approx(2 * (world - 1) / world * nbytes)
    with pytest.raises(ValueError, match="broadcast"):
        ring_bytes_sent("broadcast", nbytes, world)


def test_zero_memory_is_the_papers_figure_and_stage_1_saves_at_most_2x_in_fp32_and_4x_mixed() -> None:
    # ZeRO paper, Figure 1: 7.5B parameters, 64 ranks, mixed precision with K = 12.
    gb = [zero_bytes_per_rank(7_500_000_000, 64, stage, "mixed") / 1e9 for stage in range(4)]
    assert [round(x, 1) for x in gb] == [120.0, 31.4, 16.6, 1.9]
    for precision, limit in (("fp32", 2.0), ("mixed", 4.0)):
        saving = zero_bytes_per_rank(10**9, 1, 0, precision) / zero_bytes_per_rank(10**9, 10**6, 1, precision)
        assert limit * 0.999 < saving < limit
    # A shard that does not divide evenly: the largest shard, in integers, for sizes past float's exact range.
    numel = 3 * 10**17 + 1
    assert zero_bytes_per_rank(numel, 3, 3, "fp32") == 16 * (10**17 + 1)
    with pytest.raises(ValueError, match="stage"):
        zero_bytes_per_rank(10, 2, 4)


def test_the_crossover_world_is_the_first_whose_allreduce_outlasts_the_compute() -> None:
    latency, bandwidth, grad_bytes = 50e-6, 1e9, 4e8
    for compute_s in (0.3, 0.5, 0.79, 0.81, 0.9):
        world = comm_bound_world(compute_s, grad_bytes, latency, bandwidth)
        assert world is not None
        assert predicted_allreduce_seconds(grad_bytes, world, bandwidth, latency) >= compute_s
        if world > 2:
            assert predicted_allreduce_seconds(grad_bytes, world - 1, bandwidth, latency) < compute_s
    assert comm_bound_world(100.0, grad_bytes, latency, bandwidth, max_world=64) is None
    with pytest.raises(ValueError, match="compute_s"):
        comm_bound_world(0.0, grad_bytes, latency, bandwidth)


@pytest.mark.parametrize("world", [2, 8, 100])
def test_at_the_bandwidth_found_the_allreduce_takes_exactly_the_compute_time(world: int) -> None:
    latency, grad_bytes, compute_s = 20e-6, 5e8, 0.25
    bandwidth = bandwidth_for_compute(compute_s, grad_bytes, world, latency)
    assert predicted_allreduce_seconds(grad_bytes, world, bandwidth, latency) == pytest.approx(compute_s)
    # The latency term alone takes the whole compute time: no link is fast enough.
    assert bandwidth_for_compute(2 * (world - 1) * latency, grad_bytes, world, latency) == math.inf


def test_the_bubble_shrinks_with_micro_batches_and_1f1b_keeps_at_most_p_in_flight_where_gpipe_keeps_m() -> None:
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert bubble_fraction(4, 16) == pytest.approx(3 / 19)
    assert bubble_fraction(1, 8) == 0
    for stages in range(1, 7):
        for micro_batches in range(1, 13):
            for stage in range(stages):
                for schedule, want in (("gpipe", micro_batches), ("1f1b", min(stages - stage, micro_batches))):
                    order = stage_order(schedule, stages, micro_batches, stage)
                    assert sorted(order) == sorted([("F", i) for i in range(micro_batches)]
                                                   + [("B", i) for i in range(micro_batches)])
                    assert all(order.index(("F", i)) < order.index(("B", i)) for i in range(micro_batches))
                    assert peak_in_flight(order) == want, (schedule, stages, micro_batches, stage)
    # The last stage alternates from the start; the first runs p - 1 forwards ahead.
    assert stage_order("1f1b", 3, 3, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    assert stage_order("1f1b", 3, 3, 0) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    with pytest.raises(ValueError, match="stage"):
        stage_order("1f1b", 2, 4, 2)
