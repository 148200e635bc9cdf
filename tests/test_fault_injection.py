"""Fault injection: the template killed at random points (mid checkpoint write included), resumed, equals an
uninterrupted run.

A driver process (this file run as a script, in its own process group) imports torch once, then forks one child per
attempt, so each attempt costs milliseconds instead of an interpreter start. Each child trains a tiny model with
the real template (:func:`course_lib.train.train`), resuming when the folder holds a checkpoint. Children die by
``SIGKILL``, either from inside at a chosen *fault point* (before an optimizer step, around a metrics line, between
two chunks of a checkpoint's bytes, before/after ``fsync`` and the atomic rename) or from the driver after a
random delay. A trial is killed once or twice, then resumed to the end; its final metrics and checkpoint must equal
the uninterrupted run's, bit for bit, and leave no lock or temporary file behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TRIALS = 24  # every third one is killed twice before the resume that finishes it
THROUGHPUT_KEYS = ("examples_per_s", "tokens_per_s")


@pytest.mark.slow
def test_runs_killed_at_random_points_resume_to_the_uninterrupted_result(tmp_path: Path) -> None:
    driver = subprocess.Popen(
        [sys.executable, __file__, str(tmp_path), str(TRIALS), "20261130"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
             "PYTHONFAULTHANDLER": "1"},  # SIGABRT makes every process print its threads' stacks
    )
    try:
        # A guard against a hang only (the trials take seconds): a hung driver or child prints where it is stuck.
        out, err = driver.communicate(timeout=280)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGABRT)
        _, err = driver.communicate(timeout=30)
        pytest.fail(f"the trials hung; the stacks of the driver and its children:\n{err[-8000:]}")
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)  # the driver and every child it forked
            driver.wait()
    assert driver.returncode == 0, err[-4000:]
    report = json.loads(out.strip().splitlines()[-1])
    trials = report["trials"]
    assert len(trials) == TRIALS
    kills = [kind for t in trials for kind in t["kills"]]
    assert len(kills) >= TRIALS, "every trial must be killed at least once"
    assert sum(len(t["kills"]) >= 2 for t in trials) >= TRIALS // 4, "some trials must be killed twice"
    assert "checkpoint-bytes" in kills, "at least one kill must land in the middle of a checkpoint write"
    assert {"rename", "fsync", "metrics", "step", "timer"} & set(kills), kills
    bad = [t for t in trials if not t["identical"]]
    assert not bad, f"resumed runs differ from the uninterrupted one: {bad}"
    assert all(t["clean"] for t in trials), "a lock file or temporary file was left behind"


# ------------------------------------------------------------------------------------------------ the driver
def _setup(out: Path):
    from tiny_run import tiny_run

    return tiny_run(out, steps=12)


def _install_fault_points(kill_at: int | None, events: list[str], marker: Path) -> None:
    """Count fault points in this (child) process; SIGKILL it at the ``kill_at``-th one."""
    import io

    import torch

    from course_lib.train import checkpoint as checkpoint_module
    from course_lib.train import loop as loop_module

    def point(kind: str) -> None:
        events.append(kind)
        if len(events) == kill_at:
            marker.write_text(kind)
            os.kill(os.getpid(), signal.SIGKILL)

    real_backward, real_append = loop_module.backward_group, loop_module.MetricsLog.append
    real_save, real_replace = torch.save, os.replace

    def backward_group(*args, **kwargs):
        point("step")
        return real_backward(*args, **kwargs)

    def append(self, record):
        point("metrics")
        real_append(self, record)
        point("metrics")

    def chunked_save(obj, f, *args, **kwargs):  # the same bytes, written in pieces with a fault point between
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        for start in range(0, len(data), 2048):
            point("checkpoint-bytes")
            f.write(data[start:start + 2048])

    def fsync(fd):  # a fault point, but no disk flush: fsync guards against power loss, not process kills
        point("fsync")

    def replace(src, dst):
        point("rename")
        real_replace(src, dst)
        point("rename")

    loop_module.backward_group = backward_group
    loop_module.MetricsLog.append = append
    checkpoint_module.torch.save = chunked_save
    os.fsync = fsync  # the os module course_lib.atomic calls (a forked child: undone when it exits)
    os.replace = replace


def _attempt(out: Path, kill_at: int | None, marker: Path, events_file: Path | None = None) -> int:
    """Fork a child that trains (resuming when a checkpoint exists); returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        from course_lib.train import train

        events: list[str] = []
        _install_fault_points(kill_at, events, marker)
        model, train_loader, val_loader, cfg = _setup(out)
        train(model, train_loader, val_loader, cfg, resume=(out / "ckpt.pt").exists())
        if events_file is not None:
            events_file.write_text(json.dumps(events))
    except BaseException:  # report and exit: a child must never return into the driver
        import traceback

        traceback.print_exc()
        code = 3
    os._exit(code)


def _wait(pid: int) -> str:
    """'done' when the child finished, 'killed' when it died of SIGKILL; anything else fails the driver."""
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return "killed"
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return "done"
    raise SystemExit(f"a training child failed (status {status}); see its traceback above")


def _result(out: Path) -> tuple[list[dict], dict]:
    import torch

    lines = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
    metrics = [{k: v for k, v in r.items() if k not in THROUGHPUT_KEYS} for r in lines]
    payload = torch.load(out / "ckpt.pt", weights_only=True)
    return metrics, payload


def _same_checkpoint(a: dict, b: dict) -> bool:
    import torch

    if a["step"] != b["step"] or a["model"].keys() != b["model"].keys():
        return False
    if not all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]):
        return False
    moments_a, moments_b = a["optimizer"]["state"], b["optimizer"]["state"]
    return all(torch.equal(moments_a[i][k], moments_b[i][k]) for i in moments_a for k in moments_a[i])


def _warm_up(root: Path) -> None:
    """One whole run here, before forking: imports and torch's lazy first-call set-up (seconds on a busy machine)
    are then done once, and each forked child starts training at once."""
    from course_lib.train import train

    model, train_loader, val_loader, cfg = _setup(root / "warm-up")
    train(model, train_loader, val_loader, cfg)


def driver(root: Path, trials: int, seed: int) -> None:
    import random
    import shutil
    import time

    import torch

    torch.set_num_threads(1)  # before any torch work: forked children must not inherit a thread pool
    os.environ["TQDM_DISABLE"] = "1"
    _warm_up(root)
    rng = random.Random(seed)
    reference = root / "reference"
    events_file = root / "events.json"
    started = time.perf_counter()
    assert _wait(_attempt(reference, None, root / "unused", events_file)) == "done"
    duration = time.perf_counter() - started
    events = json.loads(events_file.read_text())
    expected = _result(reference)
    by_kind: dict[str, list[int]] = {}
    for index, kind in enumerate(events, start=1):
        by_kind.setdefault(kind, []).append(index)

    report = []
    for trial in range(trials):
        out = root / f"trial{trial}"
        kills: list[str] = []
        n_kills = 2 if trial % 3 == 0 else 1
        attempts = 0
        while True:
            attempts += 1
            assert attempts < 10, "a trial did not finish"
            marker = root / f"killed{trial}-{attempts}"
            early = len(events) // 2  # a first kill in the first half leaves a second one room to land
            if len(kills) >= n_kills:
                kill_at, timer = None, None
            elif kills:  # the second kill: early in the resumed run (metrics rewrite, rename, first steps)
                kill_at, timer = rng.randint(1, 6), None
            elif trial % 4 == 1:  # aimed at the middle of a checkpoint write
                kill_at, timer = rng.choice([k for k in by_kind["checkpoint-bytes"] if k <= early]), None
            elif trial % 4 == 2:  # around the atomic rename and fsync
                kill_at, timer = rng.choice([k for k in by_kind["rename"] + by_kind["fsync"] if k <= early]), None
            elif trial % 4 == 3:  # at a random moment, from outside
                kill_at, timer = None, rng.uniform(0.05, 0.5) * duration
            else:  # at any fault point
                kill_at, timer = rng.randint(1, early), None
            pid = _attempt(out, kill_at, marker)
            if timer is not None:
                time.sleep(timer)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            outcome = _wait(pid)
            if outcome == "done":
                if (kill_at is not None or timer is not None) and not kills:
                    shutil.rmtree(out)  # the kill point lay beyond the end of the run: start the trial again
                    continue
                break
            kills.append(marker.read_text() if marker.exists() else "timer")
        metrics, payload = _result(out)
        identical = metrics == expected[0] and _same_checkpoint(payload, expected[1])
        clean = not (out / ".lock").exists() and not list(out.glob(".*.tmp"))
        report.append({"trial": trial, "kills": kills, "identical": identical, "clean": clean})
    print(json.dumps({"trials": report}))


if __name__ == "__main__":
    driver(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
