"""Exercise 21's driver: the jobs it builds from a seed, its recording of collectives, and who may name a driver.

The driver's runs on two real processes are exercised by the exercise's variant table
(``tests/variant_tables/ex21.py``) and the validity proof; these tests are the cheap, in-process part.
"""

from __future__ import annotations

import pytest
import torch

from course_lib.grading import ddp_ranks
from course_lib.grading import parallel_driver as driver
from course_lib.grading.checks.ex21_parallel import _buckets
from course_lib.parallel.data_parallel import assign_buckets

SEEDS = range(0, 400)


def _named_buckets(cfg: dict) -> list[list[str]]:
    model = driver.make_dp_model(cfg, 0)
    return assign_buckets(list(model.named_parameters())[::-1], cfg["dp"]["cap_bytes"])


@pytest.mark.parametrize("seed", SEEDS[::7])
def test_every_job_has_the_buckets_the_checks_rely_on(seed: int) -> None:
    """Four buckets: the first sent early, shared.weight alone (larger than the cap), aux with a used parameter (only
    finish() sends it, and it matters), inp.weight last; ZeRO's count is odd; the TP hidden width splits evenly."""
    cfg = driver.exercise_config(seed)
    buckets = _named_buckets(cfg)
    model = driver.make_dp_model(cfg, 0)
    assert buckets == [["out.bias", "out.weight", "shared.bias"], ["shared.weight"],
                       ["aux.bias", "aux.weight", "inp.bias"], ["inp.weight"]]
    assert model.shared.weight.numel() * 4 > cfg["dp"]["cap_bytes"]
    exact = sum(dict(model.named_parameters())[n].numel() * 4 for n in buckets[0]) == cfg["dp"]["cap_bytes"]
    assert exact == (seed % 3 == 0)  # a bucket that reaches the cap exactly, every third run
    assert sum(torch.Size(s).numel() for s in cfg["zero"]["shapes"]) % 2 == 1
    assert (4 * cfg["tp"]["d"]) % driver.WORLD == 0


def test_every_seed_makes_tensors_that_exist() -> None:
    """Every shape of every seed's job is positive: seed 41 once asked for a tensor of -1 elements (the third
    ZeRO tensor was what was left of too small a total), and the solution failed that run."""
    for seed in range(0, 2000):
        cfg = driver.exercise_config(seed)
        shapes = cfg["zero"]["shapes"] + [[cfg["tp"]["d"]], [cfg["tp"]["batch"], cfg["tp"]["tokens"]]]
        assert all(n > 0 for shape in shapes for n in shape), (seed, shapes)


def test_consecutive_seeds_ask_different_questions() -> None:
    """An observation recorded for one run's seed cannot pass the next run's checks: every judged quantity moves."""
    def questions(seed: int) -> tuple:
        cfg = driver.exercise_config(seed)
        return (cfg["dp"]["model_seed"], _buckets(cfg), sum(torch.Size(s).numel() for s in cfg["zero"]["shapes"]),
                (cfg["tp"]["batch"], cfg["tp"]["tokens"], cfg["tp"]["d"]), cfg["zero"]["seed"], cfg["tp"]["seed"])

    for seed in SEEDS:
        a, b = questions(seed), questions(seed + 1)
        assert all(x != y for x, y in zip(a, b)), (seed, a, b)
        all_bytes, early = a[1]
        assert len(early) == 2 and len(all_bytes) == 4


def test_the_same_seed_builds_the_same_job_and_leaves_the_global_generator_alone() -> None:
    cfg = driver.exercise_config(5)
    state = torch.get_rng_state()
    a, b = driver.make_dp_model(cfg, 0), driver.make_dp_model(cfg, 0)
    assert torch.equal(driver.flat(a.parameters()), driver.flat(b.parameters()))
    assert not torch.equal(driver.flat(a.parameters()), driver.flat(driver.make_dp_model(cfg, 1).parameters()))
    assert torch.equal(driver.flat(driver.tp_block(cfg).parameters()), driver.flat(driver.tp_block(cfg).parameters()))
    assert torch.equal(torch.get_rng_state(), state)


def _doubling(tensor: torch.Tensor, op: object = None, group: object = None, async_op: bool = False) -> None:
    """Stands in for all_reduce on two ranks holding the same values: the sum doubles them."""
    tensor.mul_(2)


def test_an_async_all_reduce_takes_effect_only_when_waited_for() -> None:
    tape = driver._Tape()
    all_reduce = driver._recording("all_reduce", _doubling, tape)
    t = torch.ones(3)
    with driver._stage(tape, "backward"):
        work = all_reduce(t, async_op=True)
    assert torch.equal(t, torch.ones(3)), "nothing happens at launch"
    (event,) = tape.events
    assert event == {"op": "all_reduce", "nbytes": 12, "async": True, "stage": "backward", "before_marker": True,
                     "waited": None}
    with driver._stage(tape, "finish"):
        assert work.wait() is True
    assert torch.equal(t, torch.full((3,), 2.0)) and event["waited"] == "finish"
    work.wait()
    assert torch.equal(t, torch.full((3,), 2.0)), "a second wait does not reduce again"

    tape.marker_fired = True
    u = torch.ones(2)
    all_reduce(u)  # blocking: at once
    assert torch.equal(u, torch.full((2,), 2.0)) and tape.events[-1]["before_marker"] is False
    future = all_reduce(torch.ones(1), None, None, True).get_future()  # positional async_op, a future
    assert torch.equal(future.wait()[0], torch.full((1,), 2.0))


def test_moment_bytes_leave_out_the_step_counters() -> None:
    shard = torch.nn.Parameter(torch.zeros(7))
    optimizer = torch.optim.AdamW([shard], lr=0.1)
    shard.grad = torch.ones(7)
    optimizer.step()
    assert driver.moment_bytes(optimizer) == 2 * 4 * 7


def test_only_the_course_drivers_may_be_named(tmp_path) -> None:
    def fn() -> None:
        pass

    with pytest.raises(ValueError, match="not one of the course's drivers"):
        ddp_ranks.run_ranks(fn, {"seed": 0}, driver="os:system", source="x = 1")
    with pytest.raises(ValueError, match="not one of the course's drivers"):
        ddp_ranks.import_driver("os:system")
    assert ddp_ranks.import_driver(driver.DRIVER) is driver.rank_driver


def test_a_cell_split_over_several_cells_travels_whole(tmp_path) -> None:
    """Each name's defining cell is sent once, in the exercise's order; a decorated method does not point into
    torch's sources."""
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_text("def broadcast_parameters(model):\n    pass\n")
    second.write_text("import torch\n\nclass ShardedAdamW:\n    def __init__(self):\n        pass\n\n"
                      "    @torch.no_grad()\n    def step(self):\n        pass\n")
    ns: dict = {}
    for path in (second, first):
        exec(compile(path.read_text(), str(path), "exec"), ns)
    source = driver.cell_sources(ns)
    assert source == first.read_text() + "\n\n" + second.read_text()
