"""Runs that never lose or poison work: the non-finite guard, owned run folders, and one clear line per failure.

Each case ends as the template promises: one ``error:`` line (what, why, what to do), no traceback, exit code 2
for bad input (1 for a run that failed while running, 130 for Ctrl-C), and the files of the run as they were.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from course_lib.train import (
    CheckpointError,
    NonFiniteError,
    RunFolderError,
    TrainConfig,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
    train,
)
from course_lib.train import checkpoint as checkpoint_module
from course_lib.train import cli as train_cli
from course_lib.train import loop as loop_module
from course_lib.train.guard import check_record
from course_lib.train.rundir import LOCK_FILE, claim_run_folder, release_run_folder
from tiny_run import tiny_run

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


_setup = tiny_run


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _strict_json_lines(path: Path) -> list[dict]:
    """Parse metrics.jsonl refusing NaN/Infinity (which json.loads would otherwise accept)."""
    def refuse(token: str) -> None:
        raise ValueError(f"bare {token} in {path}")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def _cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    code = train_cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err


def _assert_one_error_line(err: str, *words: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    return lines[0]


SMOKE_CLI = ("--steps", "4", "--eval-every", "2", "--log-every", "1", "--bs", "16", "--device", "cpu")


# ----------------------------------------------------------------------------------------- non-finite guard
DIVERGE = dict(lr=1e6, warmup=6, steps=12, eval_every=2, clip=None)  # good checkpoint at step 2, nan by step 4


def test_a_diverging_run_stops_keeps_the_last_good_checkpoint_and_valid_metrics(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(NonFiniteError) as info:
        train(*_setup(out, **DIVERGE))
    message = str(info.value)
    assert "diverged at step 4" in message and "nan" in message
    assert "--lr" in message and "--clip 1.0" in message  # what to try
    assert "step 2" in message and "unchanged" in message  # the last good checkpoint
    saved = read_checkpoint(out / "ckpt.pt")
    assert saved["step"] == 2
    assert all(torch.isfinite(t).all() for t in saved["model"].values())
    # metrics.jsonl is valid JSON and exactly what the kept checkpoint holds (never ahead of it).
    assert _strict_json_lines(out / "metrics.jsonl") == saved["history"]
    # ...and that checkpoint resumes.
    load_checkpoint(out / "ckpt.pt", model=_setup(out)[0])


def test_non_finite_gradient_norm_trips_the_guard_unless_the_grad_scaler_handles_it() -> None:
    cfg = TrainConfig(device="cpu", steps=10)
    record = {"step": 3, "loss": 1.0, "grad_norm": math.inf}
    with pytest.raises(NonFiniteError, match="gradient norm is inf"):
        check_record(record, step=3, cfg=cfg, scaler_enabled=False, last_good="")
    check_record(record, step=3, cfg=cfg, scaler_enabled=True, last_good="")  # a skipped fp16 step: normal
    with pytest.raises(NonFiniteError, match="training loss is nan"):
        check_record({"step": 3, "loss": math.nan}, step=3, cfg=cfg, scaler_enabled=True, last_good="")


def test_fp16_with_grad_scaler_skipped_steps_do_not_trip_the_guard(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Real fp16 autocast on the CPU with an enabled GradScaler whose first scales are too high: the first steps
    overflow and are skipped (a normal fp16 event), then training proceeds; nothing trips the guard."""
    monkeypatch.setattr(loop_module, "resolve_amp_dtype", lambda *_: torch.float16)
    monkeypatch.setattr(loop_module.torch.amp, "GradScaler",
                        functools.partial(torch.amp.GradScaler, init_scale=2.0**20))
    out = tmp_path / "fp16"
    history = train(*_setup(out, steps=12, eval_every=4))
    norms = [r["grad_norm"] for r in history if "loss" in r]
    assert len(norms) == 12
    assert norms[0] is None, "the first step should overflow at scale 2**20 and be skipped"
    assert all(n is not None and math.isfinite(n) for n in norms[-5:]), "training should go on after the skips"
    assert _strict_json_lines(out / "metrics.jsonl") == history  # the skipped steps are null, not bare Infinity
    saved = read_checkpoint(out / "ckpt.pt")
    assert saved["step"] == 12 and saved["scaler"]["scale"] < 2.0**20


def test_resuming_a_checkpoint_with_non_finite_tensors_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    train(*_setup(out, steps=3))
    payload = torch.load(out / "ckpt.pt", weights_only=True)
    name = next(iter(payload["model"]))
    payload["model"][name] = torch.full_like(payload["model"][name], math.nan)
    torch.save(payload, out / "ckpt.pt")  # as an older template would have written it
    with pytest.raises(CheckpointError, match=r"inf/nan.*diverged"):
        train(*_setup(out, steps=6), resume=True)
    with pytest.raises(NonFiniteError, match="refusing to write"):  # and nothing writes such a checkpoint
        save_checkpoint(tmp_path / "x.pt", model=torch.nn.Linear(2, 2).requires_grad_(False).apply(
            lambda m: m.weight.fill_(math.inf) if isinstance(m, torch.nn.Linear) else None))
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.slow
def test_the_diverging_command_line_run_exits_non_zero_with_one_error_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "course_lib", "train", "--steps", "40", "--eval-every", "10", "--warmup", "30",
         "--lr", "1e5", "--clip", "none", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    _assert_one_error_line(result.stderr, "training diverged at step", "--lr")
    _strict_json_lines(out / "metrics.jsonl")
    if (out / "ckpt.pt").exists():
        assert all(torch.isfinite(t).all() for t in read_checkpoint(out / "ckpt.pt")["model"].values())


# ------------------------------------------------------------------------------------------ run folders
def test_a_fresh_run_into_a_folder_holding_a_run_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    train(*_setup(out, steps=3))
    before = {p.name: _digest(p) for p in out.iterdir()}
    with pytest.raises(RunFolderError) as info:
        train(*_setup(out, steps=3))
    assert "--resume" in str(info.value) and "--overwrite" in str(info.value)
    assert {p.name: _digest(p) for p in out.iterdir()} == before
    # An explicit overwrite starts over; resume continues.
    history = train(*_setup(out, steps=3, seed=1), overwrite=True)
    assert read_checkpoint(out / "ckpt.pt")["config"]["seed"] == 1 and history
    assert not (out / LOCK_FILE).exists(), "the lock is released when the run ends"


def test_cli_fresh_run_into_existing_folder_names_resume_and_overwrite(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert _cli(capsys, *SMOKE_CLI, "--out", str(out))[0] == 0
    before = {p.name: _digest(p) for p in out.iterdir()}
    code, err = _cli(capsys, *SMOKE_CLI, "--out", str(out))
    assert code == 2
    _assert_one_error_line(err, "already holds a run", "--resume", "--overwrite")
    assert {p.name: _digest(p) for p in out.iterdir()} == before
    assert _cli(capsys, *SMOKE_CLI, "--out", str(out), "--resume", "--overwrite")[0] == 2
    assert _cli(capsys, *SMOKE_CLI, "--out", str(out), "--overwrite")[0] == 0


_HOLD_LOCK = """
import sys, time
from course_lib.train.rundir import claim_run_folder
claim_run_folder(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_a_live_lock_is_refused_naming_its_pid_and_a_killed_holders_lock_is_taken_over(tmp_path: Path) -> None:
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(out)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderError, match=rf"process {holder.pid} is writing a run there"):
            claim_run_folder(out)
    finally:
        holder.kill()
        holder.wait()
    assert (out / LOCK_FILE).exists(), "SIGKILL leaves the lock file behind"
    (out / ".ckpt.pt.abc123.tmp").write_bytes(b"half a checkpoint from the killed run")
    claim = claim_run_folder(out)
    try:
        assert claim.stale_note is not None and str(holder.pid) in claim.stale_note
        assert not (out / ".ckpt.pt.abc123.tmp").exists(), "stale temporary files are cleaned by the new holder"
        assert json.loads((out / LOCK_FILE).read_text())["pid"] == os.getpid()
    finally:
        release_run_folder(claim)
    assert not (out / LOCK_FILE).exists()


@pytest.mark.parametrize("dangling", [False, True])
def test_a_lock_file_that_is_a_planted_link_is_refused_and_its_target_is_untouched(tmp_path: Path, capsys,
                                                                                   dangling: bool) -> None:
    """Seen: ``.lock -> notebook`` was followed and the notebook overwritten by the lock's PID record."""
    notebook = tmp_path / "lesson.ipynb"
    if not dangling:
        notebook.write_bytes(b'{"cells": [], "nbformat": 4}')
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).symlink_to(notebook)
    code, err = _cli(capsys, *SMOKE_CLI, "--out", str(out))
    assert code == 2, err
    _assert_one_error_line(err, str(out / LOCK_FILE), "symbolic link", "rm ")
    if dangling:
        assert not notebook.exists()
    else:
        assert notebook.read_bytes() == b'{"cells": [], "nbformat": 4}'
    assert (out / LOCK_FILE).is_symlink(), "the learner's link is theirs to remove"


def test_a_run_never_writes_through_links_planted_at_its_metrics_or_checkpoint(tmp_path: Path, capsys) -> None:
    """Both are replaced whole (a temporary file created with O_EXCL, then a rename): the link goes, not its target."""
    notebook = tmp_path / "lesson.ipynb"
    notebook.write_bytes(b'{"cells": [], "nbformat": 4}')
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").symlink_to(notebook)
    code, err = _cli(capsys, *SMOKE_CLI, "--out", str(out))
    assert code == 0, err
    (out / "ckpt.pt").unlink()
    (out / "ckpt.pt").symlink_to(notebook)
    code, err = _cli(capsys, *SMOKE_CLI, "--overwrite", "--out", str(out))
    assert code == 0, err
    assert notebook.read_bytes() == b'{"cells": [], "nbformat": 4}'
    assert not (out / "metrics.jsonl").is_symlink() and not (out / "ckpt.pt").is_symlink()


def _start_cli(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "course_lib", "train", *extra, "--out", str(out)], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True)


@pytest.mark.slow
def test_two_concurrent_runs_into_one_folder_and_ctrl_c(tmp_path: Path) -> None:
    """A second run into a folder being written is refused naming the first one's PID; Ctrl-C of the first prints
    one line with the resume command (exit 130), and its metrics match its checkpoint."""
    out = tmp_path / "run"
    first = _start_cli(out, "--steps", "100000", "--eval-every", "5", "--log-every", "5", "--bs", "16",
                       "--device", "cpu")
    try:
        deadline = time.monotonic() + 120
        while not (out / "ckpt.pt").exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.05)
        second = subprocess.run([sys.executable, "-m", "course_lib", "train", "--bs", "16", "--device", "cpu",
                                 "--overwrite", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
        assert second.returncode == 2, second.stdout + second.stderr
        _assert_one_error_line(second.stderr, "is in use", f"process {first.pid}")
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert first.returncode == 130, err
    line = _assert_one_error_line(err, "interrupted", "--resume", str(out))
    assert "python -m course_lib train --out" in line
    saved = read_checkpoint(out / "ckpt.pt")
    assert _strict_json_lines(out / "metrics.jsonl") == saved["history"]
    steps = [r["step"] for r in saved["history"] if "loss" in r]
    assert steps == sorted(set(steps)), "each step logged once"
    assert not (out / LOCK_FILE).exists()


@pytest.mark.slow
@pytest.mark.parametrize(("stop", "workers"), [("SIGTERM", 0), ("SIGTERM", 2), ("SIGINT", 2)])
def test_sigterm_stops_like_ctrl_c_with_one_line_naming_the_resume_command(tmp_path: Path, stop: str,
                                                                           workers: int) -> None:
    """SIGTERM is what a cluster scheduler or a container sends before killing. Seen: the run exited silently, no
    word on how to resume; and Ctrl-C beside loader workers sometimes ended in a traceback. With workers the signal
    goes to the whole process group, as a terminal's Ctrl-C and a scheduler's SIGTERM do."""
    signum = getattr(signal, stop)
    out = tmp_path / "run"
    first = _start_cli(out, "--steps", "100000", "--eval-every", "3", "--log-every", "3", "--bs", "16",
                       "--device", "cpu", "--workers", str(workers))
    try:
        deadline = time.monotonic() + 180  # a hang guard only
        while not (out / "ckpt.pt").exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "no checkpoint within 180 s"
            time.sleep(0.05)
        if workers:
            os.killpg(first.pid, signum)
        else:
            first.send_signal(signum)
        _, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert first.returncode == (143 if stop == "SIGTERM" else 130), err
    line = _assert_one_error_line(err, "SIGTERM" if stop == "SIGTERM" else "Ctrl-C", "--resume", str(out))
    assert "python -m course_lib train --out" in line and "last checkpoint (step" in line
    saved = read_checkpoint(out / "ckpt.pt")
    assert _strict_json_lines(out / "metrics.jsonl") == saved["history"]
    assert not (out / LOCK_FILE).exists()


def test_ctrl_c_right_after_the_checkpoint_is_written_leaves_metrics_equal_to_it(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The Ctrl-C lands after the checkpoint's rename and before the metrics file is marked as matching it (seen once
    beside two busy processes: the checkpoint then held a step that metrics.jsonl had been cut back behind)."""
    real_save = loop_module.save_checkpoint

    def save_then_ctrl_c(*args, **kwargs):
        real_save(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)  # the checkpoint is on disk; the metrics are not committed yet

    monkeypatch.setattr(loop_module, "save_checkpoint", save_then_ctrl_c)
    model, train_loader, val_loader, cfg = _setup(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        train(model, train_loader, val_loader, cfg)
    saved = read_checkpoint(tmp_path / "run" / "ckpt.pt")
    assert saved["step"] == 3  # the first checkpoint (eval_every=3), and the interrupt came right after it
    assert _strict_json_lines(tmp_path / "run" / "metrics.jsonl") == saved["history"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C works as before afterwards


# ------------------------------------------------------------------------------- raw tracebacks, now lines
def test_out_on_a_file_under_proc_and_under_a_file_are_one_line_errors(tmp_path: Path, capsys) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    for out, words in ((a_file, "is a file"), ("/proc/course-run", "cannot be created"),
                       ("/proc/self", "not writable"), (a_file / "run", "cannot be created")):
        code, err = _cli(capsys, *SMOKE_CLI, "--out", str(out))
        assert code == 2, err
        _assert_one_error_line(err, str(out), words, "--out")
    assert a_file.read_text() == "keep me"


@contextlib.contextmanager
def _mounted_tmpfs(where: Path, options: str):
    """A tmpfs mounted at ``where`` (root only, where the container allows it); yields False when it cannot."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        yield False
        return
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_out_under_a_read_only_parent_is_a_one_line_error(tmp_path: Path, capsys, monkeypatch) -> None:
    parent = tmp_path / "readonly"
    with _mounted_tmpfs(parent, "ro,size=64k") as mounted:
        if not mounted and os.geteuid() != 0:
            parent.chmod(0o555)
        elif not mounted:  # root without mount rights: permissions do not stop root, so simulate the refusal
            def refuse(*_args, **_kwargs):
                raise PermissionError(errno.EACCES, "Permission denied")
            monkeypatch.setattr(Path, "mkdir", refuse)
        code, err = _cli(capsys, *SMOKE_CLI, "--out", str(parent / "run"))
        if not mounted:
            parent.chmod(0o755)
    assert code == 2
    _assert_one_error_line(err, str(parent / "run"), "cannot be created", "--out")


@pytest.mark.parametrize("argv, words", [
    (("--seed", str(2**70)), ("seed=", "2**32 - 1")),
    (("--device", "meta"), ("device='meta'", "cpu")),
    (("--bs", "100000"), ("bs=100000", "training samples", "--bs")),
    (("--resume", "--overwrite"), ("--resume and --overwrite",)),
], ids=["seed-beyond-64-bits", "device-meta", "bs-larger-than-dataset", "resume-and-overwrite"])
def test_bad_values_are_one_line_errors_before_any_work(tmp_path: Path, capsys, argv, words) -> None:
    out = tmp_path / "run"
    code, err = _cli(capsys, "--steps", "2", "--device", "cpu", *argv, "--out", str(out))
    assert code == 2
    _assert_one_error_line(err, *words)
    assert not (out / "ckpt.pt").exists() and not (out / "metrics.jsonl").exists()


def test_cifar10_without_a_copy_is_one_line_and_never_downloads(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("COURSE_ALLOW_DOWNLOAD", raising=False)  # downloads allowed: the CLI still must not try

    def no_download(*_args, **_kwargs):
        raise AssertionError("the training command tried to download CIFAR-10")

    monkeypatch.setattr("torchvision.datasets.CIFAR10.download", no_download)
    code, err = _cli(capsys, *SMOKE_CLI, "--dataset", "cifar10", "--out", str(tmp_path / "run"))
    assert code == 2
    _assert_one_error_line(err, "CIFAR-10 is not in", "data prepare --which cifar10", "--dataset shapes")


def _finished_run(capsys, out: Path) -> None:
    assert _cli(capsys, *SMOKE_CLI, "--out", str(out))[0] == 0


def test_an_immutable_checkpoint_fails_in_one_line_and_metrics_stay_with_the_checkpoint(tmp_path: Path, capsys,
                                                                                     monkeypatch) -> None:
    out = tmp_path / "run"
    _finished_run(capsys, out)
    ckpt = out / "ckpt.pt"
    before = _digest(ckpt)
    immutable = shutil.which("chattr") is not None and subprocess.run(
        ["chattr", "+i", str(ckpt)], capture_output=True).returncode == 0
    if not immutable:  # no chattr rights here: os.replace fails exactly as it does over an immutable file
        def refuse(*_args, **_kwargs):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        monkeypatch.setattr(os, "replace", refuse)
    try:
        code, err = _cli(capsys, "--steps", "8", "--out", str(out), "--resume")
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(ckpt)], check=True)
    assert code == 1
    _assert_one_error_line(err, f"cannot write {ckpt}", "immutable", "--resume")
    assert _digest(ckpt) == before
    saved = read_checkpoint(ckpt)
    assert saved["step"] == 4 and _strict_json_lines(out / "metrics.jsonl") == saved["history"]
    assert not list(out.glob(".*.tmp"))


def test_disk_full_while_saving_is_one_line_and_keeps_the_previous_checkpoint(tmp_path: Path, capsys,
                                                                               monkeypatch) -> None:
    out = tmp_path / "run"
    _finished_run(capsys, out)
    before = _digest(out / "ckpt.pt")
    real_save = torch.save

    def torch_runs_out_of_space(obj, f, *args, **kwargs):  # what torch's zip writer says on a full disk
        real_save({"a": torch.zeros(4)}, f)
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 1088 vs 1002")

    monkeypatch.setattr(checkpoint_module.torch, "save", torch_runs_out_of_space)
    code, err = _cli(capsys, "--steps", "8", "--out", str(out), "--resume")
    assert code == 1
    _assert_one_error_line(err, "disk is full", "--resume")
    assert _digest(out / "ckpt.pt") == before
    assert _strict_json_lines(out / "metrics.jsonl") == read_checkpoint(out / "ckpt.pt")["history"]
    assert not list(out.glob(".*.tmp"))


def test_a_really_full_disk_keeps_the_previous_checkpoint(tmp_path: Path, capsys) -> None:
    """The same on a real, tiny file system (a 160 KiB tmpfs: one ~110 KB checkpoint fits, a second copy does
    not), where mounting one is allowed."""
    disk = tmp_path / "disk"
    with _mounted_tmpfs(disk, "size=160k") as mounted:
        if not mounted:
            pytest.skip("cannot mount a tmpfs here (needs root in a container that allows it)")
        out = disk / "run"
        code, err = _cli(capsys, *SMOKE_CLI, "--out", str(out))
        assert code == 1, err
        _assert_one_error_line(err, "disk is full", "--resume")
        saved = read_checkpoint(out / "ckpt.pt")
        assert saved["step"] == 2
        assert _strict_json_lines(out / "metrics.jsonl") == saved["history"]
        assert not list(out.glob(".*.tmp"))


def test_a_full_mode_checkpoint_resumed_in_smoke_mode_names_course_mode(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    _finished_run(capsys, out)
    payload = torch.load(out / "ckpt.pt", weights_only=True)
    payload["mode"] = "full"
    torch.save(payload, out / "ckpt.pt")
    code, err = _cli(capsys, "--steps", "8", "--out", str(out), "--resume")
    assert code == 2
    _assert_one_error_line(err, "COURSE_MODE=full", "COURSE_MODE=smoke")


class _NotATensor:
    pass


@pytest.mark.parametrize("content", ["garbage", "foreign-pickle", "empty"])
def test_a_garbage_checkpoint_never_suggests_weights_only_false(tmp_path: Path, capsys, content: str) -> None:
    out = tmp_path / "run"
    _finished_run(capsys, out)
    ckpt = out / "ckpt.pt"
    if content == "garbage":
        ckpt.write_bytes(b"\x00not a checkpoint" * 50)
    elif content == "foreign-pickle":
        torch.save({"format": 1, "model": _NotATensor()}, ckpt)
    else:
        ckpt.write_bytes(b"")
    code, err = _cli(capsys, "--out", str(out), "--resume")
    assert code == 2
    line = _assert_one_error_line(err, str(ckpt), "cannot be read")
    assert "weights_only" not in line and "arbitrary code" not in line


# ---------------------------------------------------------------------- resume: refused before any data is made
def test_a_smoke_run_resumed_in_full_mode_is_refused_before_any_data_is_generated(tmp_path: Path, capsys,
                                                                                   monkeypatch) -> None:
    """Seen: refused only after generating the full-mode data (68 s)."""
    out = tmp_path / "run"
    _finished_run(capsys, out)
    before = _digest(out / "ckpt.pt")
    empty = tmp_path / "no-data-yet"
    monkeypatch.setenv("COURSE_DATA_DIR", str(empty))
    monkeypatch.setenv("COURSE_MODE", "full")
    code, err = _cli(capsys, "--out", str(out), "--resume")
    assert code == 2
    _assert_one_error_line(err, "COURSE_MODE=smoke", "COURSE_MODE=full")
    assert not empty.exists(), "nothing is generated for a run that is refused"
    assert _digest(out / "ckpt.pt") == before


def _rewrite_checkpoint(path: Path, **changes) -> None:
    payload = torch.load(path, weights_only=True)
    for key, value in changes.items():
        if key == "config":
            payload["config"].update(value)
        else:
            payload[key] = value
    torch.save(payload, path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has the CUDA GPU the checkpoint asks for")
def test_an_fp16_gpu_checkpoint_resumed_on_a_cpu_gives_advice_that_is_accepted(tmp_path: Path, capsys) -> None:
    """Seen: the advice (use bf16 or fp32) was refused in turn, as a change of the run's trajectory."""
    out = tmp_path / "run"
    _finished_run(capsys, out)
    _rewrite_checkpoint(out / "ckpt.pt", config={"amp_dtype": "fp16", "device": "cuda:0"})
    code, err = _cli(capsys, "--out", str(out), "--resume")
    assert code == 2
    _assert_one_error_line(err, "fp16", "CUDA GPU", "another --out", "--amp-dtype fp32")
    # What it says to do works: a new run with fp32 in another folder...
    assert _cli(capsys, *SMOKE_CLI, "--amp-dtype", "fp32", "--out", str(tmp_path / "fp32"))[0] == 0
    # ...while continuing this one in another precision is refused, as the line says, before any work.
    code, err = _cli(capsys, "--out", str(out), "--resume", "--amp-dtype", "fp32")
    assert code == 2
    _assert_one_error_line(err, "amp_dtype", "different run")


def test_a_checkpoint_from_a_newer_format_names_the_update(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    _finished_run(capsys, out)
    _rewrite_checkpoint(out / "ckpt.pt", format=checkpoint_module.FORMAT_VERSION + 1)
    code, err = _cli(capsys, "--out", str(out), "--resume")
    assert code == 2
    _assert_one_error_line(err, "newer course_lib", "git pull", "another --out")


def test_a_loader_worker_killed_by_the_oom_killer_is_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    """Seen: a traceback. The out-of-memory killer sends SIGKILL to a worker; the run's checkpoint stays intact."""
    from course_lib.data.images import KeyedImageFolder

    real = KeyedImageFolder.load_image

    def killed_in_a_worker(self, index):
        if torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, index)

    monkeypatch.setattr(KeyedImageFolder, "load_image", killed_in_a_worker)
    code, err = _cli(capsys, *SMOKE_CLI, "--workers", "1", "--out", str(tmp_path / "run"))
    assert code == 1, err
    _assert_one_error_line(err, "worker process died", "out-of-memory", "--workers 0")


def test_exhausted_shared_memory_in_a_loader_worker_is_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    """/dev/shm full (a container's 64 MB default): the worker's error as PyTorch raises it, wrapped."""
    from course_lib.data.images import KeyedImageFolder

    def no_shared_memory(self, index):
        raise RuntimeError("unable to write to file </torch_4242_1234567_0>: No space left on device (28)")

    monkeypatch.setattr(KeyedImageFolder, "load_image", no_shared_memory)
    code, err = _cli(capsys, *SMOKE_CLI, "--workers", "1", "--out", str(tmp_path / "run"))
    assert code == 1, err
    _assert_one_error_line(err, "shared memory", "--workers 0", "--shm-size")
