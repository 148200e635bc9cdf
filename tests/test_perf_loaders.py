"""Loader measurements: the experiment order, one row per config, live rows, shared validation."""

from __future__ import annotations

import secrets
import time

import pytest
import torch

from course_lib import clock as course_clock
from course_lib.data import LoaderConfigError
from course_lib.perf import loaders
from course_lib.perf.loaders import (
    compare_loaders,
    experiment_order,
    loader_sweep,
    measure_loader,
    recommend_workers,
    samples_unit,
)
from course_lib.perf.synthetic import SyntheticImages


def test_experiment_order_follows_the_course_order() -> None:
    configs = experiment_order(batch_size=32, max_workers=4)
    steps = [c["step"] for c in configs]
    assert steps == ["baseline", "workers", "workers", "workers", "batch_size", "batch_size", "pin_memory",
                     "prefetch_factor", "persistent_workers", "persistent_workers"]
    assert [c["num_workers"] for c in configs if c["step"] == "workers"] == [1, 2, 4]
    assert configs[0]["num_workers"] == 0
    assert {c["batch_size"] for c in configs if c["step"] == "batch_size"} == {16, 64}
    assert "CUDA" in next(c for c in configs if c["pin_memory"])["note"]
    persistent = [c for c in configs if c["step"] == "persistent_workers"]
    assert [c["persistent_workers"] for c in persistent] == [False, True] and all(c["epochs"] == 2 for c in persistent)
    assert [c["num_workers"] for c in experiment_order(8, max_workers=3) if c["step"] == "workers"] == [1, 2, 3]
    assert 1 <= recommend_workers() <= 8


def test_loader_sweep_one_row_per_config_in_order_with_live_callback() -> None:
    data = SyntheticImages(n=48, shape=(3, 8, 8))
    configs = [c for c in experiment_order(batch_size=8, max_workers=1)
               if c["step"] in ("baseline", "workers", "pin_memory", "persistent_workers")]
    seen = []
    rows = loader_sweep(data, configs, n_batches=2, progress=False, on_row=seen.append)
    assert [r["label"] for r in rows] == [c["label"] for c in configs]
    assert seen == rows
    measured = [r for r in rows if not r["skipped"]]
    assert all(r["samples"] == 2 * 8 * r["epochs"] and r["samples_per_s"] > 0 for r in measured)
    assert rows[0]["speedup"] == pytest.approx(1.0)
    pinned = next(r for r in rows if r["pin_memory"])
    assert pinned["skipped"] and pinned["samples_per_s"] is None
    two_epochs = [r for r in measured if r["epochs"] == 2]
    assert two_epochs and all(len(r["epoch_first_batch_s"]) == 2 for r in two_epochs)


def test_measure_loader_shares_make_loader_validation() -> None:
    data = SyntheticImages(n=16)
    with pytest.raises(LoaderConfigError, match="prefetch_factor"):
        measure_loader(data, n_batches=1, batch_size=4, num_workers=0, prefetch_factor=2)
    with pytest.raises(ValueError, match="n_batches"):
        measure_loader(data, n_batches=10, batch_size=4)


class TimedSamples(SyntheticImages):
    """Each sample advances a fake clock by 10 ms: a batch of 4 takes 40 ms, whatever the machine."""

    def __init__(self, clock: list[float], n: int) -> None:
        super().__init__(n=n, shape=(3, 8, 8))
        self.clock = clock

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        self.clock[0] += 0.010
        return super().__getitem__(key)


def test_steady_rate_excludes_each_epochs_first_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(course_clock, "wall", lambda: clock[0])
    data = TimedSamples(clock, n=24)
    one = measure_loader(data, n_batches=1, batch_size=4)
    assert one["steady_samples_per_s"] is None  # nothing is left after the first batch
    assert one["first_batch_s"] == pytest.approx(0.04) and one["samples_per_s"] == pytest.approx(100)
    two_epochs = measure_loader(data, n_batches=3, batch_size=4, epochs=2)
    assert (two_epochs["samples"], two_epochs["batches"]) == (24, 6)
    assert two_epochs["total_s"] == pytest.approx(0.24) and two_epochs["samples_per_s"] == pytest.approx(100)
    assert two_epochs["steady_samples_per_s"] == pytest.approx(100)  # 2 x 8 samples in 2 x 80 ms
    assert two_epochs["epoch_first_batch_s"] == pytest.approx([0.04, 0.04])


def test_compare_loaders_warms_up_interleaves_and_gives_verdicts() -> None:
    data = SyntheticImages(n=48, shape=(3, 8, 8))
    configs = [c for c in experiment_order(batch_size=8, max_workers=1)
               if c["step"] in ("baseline", "workers", "pin_memory")]
    comparison, rows = compare_loaders(data, configs, n_batches=2, rounds=3, progress=False)
    assert [r["label"] for r in rows] == [c["label"] for c in configs]
    measured = [r for r in rows if not r["skipped"]]
    assert len(measured) == 2 and all(r["rounds"] == 3 and r["samples_per_s"] > 0 for r in measured)
    assert measured[0]["speedup"] == pytest.approx(1.0)
    assert all(len(comparison[r["label"]].seconds) == 3 for r in measured)  # the warm-up run is not a round
    verdict = comparison.verdict(measured[1]["label"], measured[0]["label"])
    assert verdict.outcome in ("faster", "slower", "too_close", "busy")
    assert next(r for r in rows if r["pin_memory"])["skipped"]
    with pytest.raises(ValueError, match="label"):
        compare_loaders(data, [dict(configs[0]), dict(configs[0])], n_batches=1, progress=False)
    with pytest.raises(ValueError, match="exactly one"):
        compare_loaders(data, configs, n_batches=1, n_samples=8, progress=False)
    # n_samples: every config delivers the same samples, whatever its batch size.
    sizes = [dict(configs[0], label="batch 4", batch_size=4), dict(configs[0], label="batch 8", batch_size=8)]
    _, same = compare_loaders(data, sizes, n_samples=16, rounds=1, progress=False)
    assert [r["samples"] for r in same] == [16, 16] and [r["batches"] for r in same] == [4, 2]


class SlowItems(torch.utils.data.Dataset):
    """Every item costs a fixed sleep: a loader epoch whose length the test controls."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.002)
        return torch.zeros(2)


@pytest.mark.slow
def test_compare_loaders_shortens_every_epoch_alike_when_the_rounds_would_overrun_the_budget() -> None:
    configs = [dict(label="bs 8", batch_size=8, num_workers=0), dict(label="bs 16", batch_size=16, num_workers=0)]
    # One epoch of 64 items is about 0.13 s per config: a warm-up of both is ~0.26 s, so five rounds need ~1.3 s.
    _, roomy = compare_loaders(SlowItems(), configs, n_samples=64, rounds=3, progress=False)
    assert [r["n_batches"] for r in roomy] == [8, 4]
    _, tight = compare_loaders(SlowItems(), configs, n_samples=64, rounds=3, budget_s=0.6, progress=False)
    shrunk = [r["n_batches"] for r in tight]
    assert shrunk[0] < 8 and shrunk[1] < 4, shrunk
    assert shrunk[0] * 8 == shrunk[1] * 16  # shortened alike: still exactly the same samples
    assert tight[0]["samples"] == tight[1]["samples"] < 64
    assert all(r["rounds"] == 3 for r in tight)


def _measured_samples(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the samples every measure_loader call delivers, in the order of the calls."""
    seen: list[int] = []
    real = loaders.measure_loader

    def recording(*args, **kwargs):
        row = real(*args, **kwargs)
        seen.append(row["samples"])
        return row

    monkeypatch.setattr(loaders, "measure_loader", recording)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("budget_s", [None, 0.05], ids=["roomy", "shortened to fit the budget"])
def test_every_contender_of_compare_loaders_delivers_the_same_samples(monkeypatch: pytest.MonkeyPatch,
                                                                      budget_s: float | None) -> None:
    # The experiment order's own mix: batch sizes 2, 4 and 8, and the two-epoch persistent-worker pair.
    configs = [c for c in experiment_order(batch_size=4, max_workers=1) if not c["pin_memory"]]
    assert {c["batch_size"] for c in configs} == {2, 4, 8} and {c["epochs"] for c in configs} == {1, 2}
    assert samples_unit(configs) == 8
    seen = _measured_samples(monkeypatch)
    # Items that cost time, so that a tight budget really shortens the epochs.
    _, rows = compare_loaders(SlowItems(), configs, n_samples=48, rounds=3, budget_s=budget_s, progress=False)
    first_warmup, measured = seen[:len(configs)], seen[len(configs):]
    assert set(first_warmup) == {48}  # the warm-up that sizes the rounds: every contender the full count
    assert len(set(measured)) == 1, seen  # compare()'s warm-up and every round: one count for every contender
    samples = measured[0]
    assert {r["samples"] for r in rows} == {samples} and samples % 8 == 0
    assert samples == 48 if budget_s is None else 8 <= samples < 48
    for r in rows:
        assert r["n_batches"] * r["batch_size"] * r["epochs"] == samples


def test_compare_loaders_refuses_sample_counts_that_would_differ() -> None:
    data = SyntheticImages(n=48, shape=(3, 8, 8))
    sizes = [dict(label="batch 4", batch_size=4, num_workers=0), dict(label="batch 8", batch_size=8, num_workers=0),
             dict(label="batch 8, 2 epochs", batch_size=8, num_workers=0, epochs=2)]
    with pytest.raises(ValueError, match="multiple of 16"):  # 24 samples: 6 batches of 4, 3 of 8, 1.5 per epoch
        compare_loaders(data, sizes, n_samples=24, progress=False)
    with pytest.raises(ValueError, match="n_samples"):  # n_batches per epoch: 8, 16 and 32 samples
        compare_loaders(data, sizes, n_batches=2, progress=False)


def test_loader_sweep_with_n_samples_gives_every_row_the_same_samples() -> None:
    data = SyntheticImages(n=48, shape=(3, 8, 8))
    configs = [c for c in experiment_order(batch_size=8, max_workers=1) if not c["pin_memory"]]
    rows = loader_sweep(data, configs, n_samples=32, progress=False)
    assert {r["samples"] for r in rows} == {32}
    assert {r["batch_size"]: r["batches"] for r in rows if r["epochs"] == 1} == {4: 8, 8: 4, 16: 2}
    with pytest.raises(ValueError, match="multiple of 16"):
        loader_sweep(data, configs, n_samples=40, progress=False)


def test_persistent_workers_are_shut_down_inside_the_timed_region() -> None:
    import psutil

    data = SyntheticImages(n=32, shape=(3, 8, 8))
    loader = loaders._make_loader(data, batch_size=8, num_workers=1, persistent_workers=True)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    loaders._time_epochs(loader, n_batches=2, epochs=2, device=torch.device("cpu"), non_blocking=False)
    # The loader is still alive here, yet its workers are gone: their shut-down was paid before the clock stopped,
    # as a non-persistent loader's is.
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]
    assert loader._iterator is None and not left, left


def test_worker_memory_is_proportional_not_summed_rss() -> None:
    data = SyntheticImages(n=32, shape=(3, 8, 8))
    row = measure_loader(data, n_batches=2, batch_size=8, num_workers=2)
    if row["memory_kind"] != "PSS":
        pytest.skip(f"this OS reports {row['memory_kind']}, not PSS")
    assert row["n_worker_processes"] >= 2
    # Forked workers share the main process's pages: their proportional share is far below a full copy each.
    assert 0 < row["workers_mb"] < row["workers_rss_mb"]
    assert row["host_mb"] <= row["host_rss_mb"]


@pytest.mark.slow
def test_an_interrupted_measurement_leaves_no_worker_and_loses_no_interrupt() -> None:
    """Seen in lesson 02: Ctrl-C during the worker sweep left two worker processes alive (the notebook's traceback
    kept their iterator), and one Ctrl-C in three was lost in fork's handlers (`Exception ignored in: _releaseLock`)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    probe = Path(__file__).with_name("interrupt_loader_probe.py")
    seed = secrets.randbelow(10**6)
    done = subprocess.run([sys.executable, str(probe), str(seed), "10"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    trials = json.loads(done.stdout.splitlines()[-1])
    assert len(trials) == 10
    assert all(t["raised"] for t in trials), (seed, trials)
    assert all(t["children"] == 0 for t in trials), (seed, trials)


SWEEP_FOREVER = """
from course_lib.data import load_image_datasets
from course_lib.perf.loaders import compare_loaders, experiment_order

data = load_image_datasets("shapes")
configs = experiment_order(batch_size=8, max_workers=2)

def sweep():
    return compare_loaders(data.train, configs, n_samples=48, device="cpu", rounds=3)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_interrupting_lesson_02s_sweep_in_a_live_kernel_ten_times() -> None:
    """Seen in JupyterLab: interrupting lesson 02's worker sweep left 2 worker processes alive, and 1 interrupt of 3
    was swallowed (the sweep ran on to its end). Here a real kernel runs the lesson's sweep call in a loop that
    never ends by itself, is interrupted the way JupyterLab interrupts it, at 10 random moments: each interrupt
    must end the cell with KeyboardInterrupt (a swallowed one would leave the loop running: the reply never comes)
    and leave the kernel without a child process; afterwards the sweep runs again to its end."""
    import random
    from queue import Empty

    import psutil
    from jupyter_client.manager import start_new_kernel

    seed = secrets.randbelow(10**6)
    rng = random.Random(seed)
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        kernel = psutil.Process(km.provisioner.process.pid)

        def reply_to(msg_id: str, timeout: float) -> dict:
            while True:
                msg = kc.get_shell_msg(timeout=timeout)
                if msg["parent_header"].get("msg_id") == msg_id:
                    return msg["content"]

        def run(code: str, timeout: float = 300) -> dict:
            return reply_to(kc.execute(code), timeout)

        assert run(SWEEP_FOREVER)["status"] == "ok"
        for trial in range(10):
            for _ in range(100):  # after an error the kernel aborts what was queued meanwhile: wait till it runs code
                if run("pass")["status"] == "ok":
                    break
                time.sleep(0.2)
            msg_id = kc.execute("while True:\n    sweep()")
            time.sleep(rng.uniform(0.2, 4.0))  # workers starting, fetching, shutting down, or between sweeps
            km.interrupt_kernel()
            try:
                reply = reply_to(msg_id, timeout=120)
            except Empty:
                pytest.fail(f"interrupt {trial + 1} was swallowed: the sweep loop went on (seed {seed})")
            assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", (seed, trial, reply)
            deadline = time.monotonic() + 20
            while kernel.children(recursive=True) and time.monotonic() < deadline:
                time.sleep(0.1)
            left = [p.pid for p in kernel.children(recursive=True)]
            assert not left, (seed, trial, "child processes left alive", left)
        done = run("comparison, rows = sweep()\nprint(len(rows))")
        assert done["status"] == "ok", (seed, done)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
