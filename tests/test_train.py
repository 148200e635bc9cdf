"""The training template: schedule, optimizer groups, config checks, evaluation, determinism, exact resume, CLI."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from course_lib import clock as course_clock
from course_lib.data import pad_collate
from course_lib.models import GPTConfig, Net, TinyGPT
from course_lib.train import ConfigError, TrainConfig, evaluate, lr_at, param_groups, run, train
from course_lib.train import cli as train_cli
from course_lib.train import loop as loop_module
from tiny_run import tiny_run

REPO = Path(__file__).resolve().parents[1]
THROUGHPUT_KEYS = ("examples_per_s", "tokens_per_s")  # measured, so never identical between two runs


pytestmark = pytest.mark.usefixtures("one_thread")


def _without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in THROUGHPUT_KEYS} for r in records]


# ----------------------------------------------------------------------------------------------- schedule
def test_lr_at_warmup_cosine_and_floor() -> None:
    cfg = TrainConfig(lr=1e-3, warmup=10, steps=110, device="cpu")
    assert lr_at(0, cfg) == 0.0
    assert lr_at(5, cfg) == pytest.approx(5e-4)
    assert lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(60, cfg) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # half-way down the cosine
    assert lr_at(110, cfg) == pytest.approx(1e-4)
    assert lr_at(500, cfg) == pytest.approx(1e-4)
    warm = [lr_at(s, cfg) for s in range(0, 11)]
    decay = [lr_at(s, cfg) for s in range(10, 111)]
    assert all(a < b for a, b in zip(warm, warm[1:]))
    assert all(a > b for a, b in zip(decay, decay[1:]))
    no_warmup = TrainConfig(lr=1e-3, warmup=0, steps=10, device="cpu")
    assert lr_at(0, no_warmup) == pytest.approx(1e-3)


# ---------------------------------------------------------------------------------------------- optimizer
def test_param_groups_decay_only_matrices_and_skip_frozen() -> None:
    model = Net(d_in=6, d=8, n_blocks=1, n_out=2)
    model.inp.weight.requires_grad_(False)
    decay, no_decay = param_groups(model, wd=0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() < 2 for p in no_decay["params"])
    assert "inp.weight" not in decay["names"] + no_decay["names"]
    assert "blocks.0.norm.weight" in no_decay["names"] and "out.bias" in no_decay["names"]
    trainable = sum(1 for p in model.parameters() if p.requires_grad)
    assert len(decay["params"]) + len(no_decay["params"]) == trainable


# ------------------------------------------------------------------------------------------------- config
INVALID = [
    ("lr", 0.0), ("lr", -1e-3), ("lr", float("nan")), ("wd", -0.1), ("steps", 0), ("steps", 2.5),
    ("warmup", -1), ("warmup", 10_000), ("bs", 0), ("accum", 0), ("clip", -1.0), ("eval_every", 0),
    ("log_every", 0), ("seed", -1), ("workers", -2), ("compile", "yes"), ("dataset", "mnist"),
    ("model", "resnet"), ("amp_dtype", "fp8"), ("device", "gpu"), ("out", ""),
]


@pytest.mark.parametrize("field, value", INVALID, ids=[f"{f}={v!r}" for f, v in INVALID])
def test_every_invalid_value_raises_a_config_error_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}="):
        TrainConfig(**{field: value, "steps": 100} if field != "steps" else {field: value})


def test_config_cross_field_checks() -> None:
    with pytest.raises(ConfigError, match="model='gpt' cannot train on dataset='shapes'"):
        TrainConfig(model="gpt", dataset="shapes")
    with pytest.raises(ConfigError, match="amp_dtype='fp16' needs a CUDA GPU"):
        TrainConfig(amp_dtype="fp16", device="cpu")
    cfg = TrainConfig(device="cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.bs = -3  # a config is fixed once validated: change it with dataclasses.replace, which validates again
    with pytest.raises(ConfigError, match="bs=-3"):
        dataclasses.replace(cfg, bs=-3)
    assert TrainConfig(clip=0).clip == 0 and TrainConfig(clip=None).clip is None


def test_mode_sized_defaults_are_resolved_values() -> None:
    cfg = TrainConfig(steps=40)
    assert (cfg.warmup, cfg.eval_every, cfg.log_every) == (2, 10, 2)
    resolved = cfg.resolved("cpu").to_dict()
    assert resolved["device"] == "cpu" and resolved["amp_dtype"] == "fp32"
    assert all(v is not None for k, v in resolved.items() if k != "clip")


# ---------------------------------------------------------------------------------------------- evaluate
def test_evaluate_is_invariant_to_batch_size_and_restores_mode() -> None:
    torch.manual_seed(0)
    model = Net(d_in=12, d=16, n_blocks=1, n_out=3)
    x, y = torch.randn(23, 12), torch.randint(0, 3, (23,))
    y[[2, 7]] = -100
    results = [evaluate(model, DataLoader(TensorDataset(x, y), batch_size=b), "cpu") for b in (1, 5, 23)]
    for r in results[1:]:
        assert r["loss"] == pytest.approx(results[0]["loss"], rel=1e-6) and r["acc"] == results[0]["acc"]
    keep = y != -100
    with torch.no_grad():
        logits = model.eval()(x)
    expected = torch.nn.functional.cross_entropy(logits[keep], y[keep]).item()
    assert results[0]["loss"] == pytest.approx(expected, rel=1e-5)
    assert results[0]["acc"] == pytest.approx((logits[keep].argmax(1) == y[keep]).float().mean().item())
    model.train()
    evaluate(model, DataLoader(TensorDataset(x, y), batch_size=8), "cpu")
    assert model.training
    model.eval()
    evaluate(model, DataLoader(TensorDataset(x, y), batch_size=8), "cpu")
    assert not model.training


def test_evaluate_text_batches_ignores_padding() -> None:
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=7, block_size=8, n_layer=1, n_head=2, n_embd=8))
    seqs = [torch.randint(0, 7, (n,)) for n in (3, 9, 5, 2)]
    one = evaluate(model, DataLoader(seqs, batch_size=1, collate_fn=pad_collate), "cpu")
    all_ = evaluate(model, DataLoader(seqs, batch_size=4, collate_fn=pad_collate), "cpu")
    assert one["loss"] == pytest.approx(all_["loss"], rel=1e-5) and one["acc"] == pytest.approx(all_["acc"])


# ------------------------------------------------------------------------------------ training in-process
_setup = tiny_run


def test_training_is_deterministic_and_logs_what_it_promises(tmp_path: Path) -> None:
    histories = []
    for run_dir in ("a", "b"):
        model, tl, vl, cfg = _setup(tmp_path / run_dir)
        histories.append(train(model, tl, vl, cfg))
    assert _without_timing(histories[0]) == _without_timing(histories[1])
    history = histories[0]
    train_lines = [r for r in history if "loss" in r]
    eval_lines = [r for r in history if "val_loss" in r]
    assert [r["step"] for r in train_lines] == list(range(1, 9))
    assert [r["step"] for r in eval_lines] == [3, 6, 8]
    assert set(train_lines[0]) == {"step", "loss", "lr", "grad_norm", "examples_per_s"}
    assert train_lines[0]["lr"] == 0.0 and train_lines[2]["lr"] == pytest.approx(1e-2)
    assert all(math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in train_lines)
    lines = [json.loads(s) for s in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert lines == history
    assert (tmp_path / "a" / "ckpt.pt").is_file()


def test_throughput_is_the_rate_of_each_log_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock that ticks one second per reading: every window (start, then close) lasts exactly 1 s, evaluations
    included, so each line's rate is the examples of its own step (groups of 16, 16, 8 per 40-sample epoch)."""
    ticks = iter(range(10_000))
    monkeypatch.setattr(course_clock, "wall", lambda: float(next(ticks)))
    model, tl, vl, cfg = _setup(tmp_path / "run")
    history = train(model, tl, vl, cfg, ckpt_path=None)
    assert [r["examples_per_s"] for r in history if "loss" in r] == [16.0, 16.0, 8.0, 16.0, 16.0, 8.0, 16.0, 16.0]


def test_log_window_sums_on_device_and_reads_once(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter([10.0, 12.5, 13.0])
    monkeypatch.setattr(course_clock, "wall", lambda: next(ticks))
    stream = types.SimpleNamespace(samples=100)  # what the stream had handed out when the window opened
    window = loop_module.LogWindow(stream, world_size=2)
    window.add(torch.tensor(3.0), 4)
    window.add(torch.tensor(5.0), torch.tensor(6))
    stream.samples = 105  # this rank's samples in the window, read once at its end: 2 ranks took 10
    assert window.close() == (8.0, 10, 10, 2.5)
    assert window.losses == [] and window.start_samples == 105 and window.start == 13.0


def test_the_progress_bar_moves_once_per_log_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-step bookkeeping is what a hand-written loop does not do: the bar advances by each window's steps at its
    log line (every 3 steps, and at the evaluations at steps 4 and 8), and ends at the last step."""
    updates: list[int] = []

    class Bar(loop_module.tqdm):
        def update(self, n: float = 1) -> bool | None:
            updates.append(n)
            return super().update(n)

    shown = {"disable": False, "file": io.StringIO()}  # drawn, as in a terminal, into a string
    monkeypatch.setattr(loop_module, "tqdm", lambda **kwargs: Bar(**{**kwargs, **shown}))
    model, tl, vl, cfg = _setup(tmp_path / "run", log_every=3, eval_every=4)
    train(model, tl, vl, cfg, ckpt_path=None)
    assert updates == [3, 1, 2, 2] and sum(updates) == cfg.steps


def test_progress_false_hides_the_bar_even_in_a_notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A notebook's tqdm draws a bar whatever ``disable=None`` says; ``progress=False`` asks for none at all."""
    made, real = [], loop_module.tqdm
    monkeypatch.setattr(loop_module, "tqdm", lambda **kwargs: made.append(kwargs["disable"]) or real(**kwargs))
    for progress in (True, False):
        model, tl, vl, cfg = _setup(tmp_path / "run", steps=2)
        train(model, tl, vl, cfg, ckpt_path=None, progress=progress)
    assert made == [None, True]


def test_bf16_autocast_and_disabled_clipping_still_train_and_log_the_norm(tmp_path: Path) -> None:
    model, tl, vl, cfg = _setup(tmp_path / "run", steps=3, amp_dtype="bf16", clip=None)
    history = train(model, tl, vl, cfg, ckpt_path=None)
    train_lines = [r for r in history if "loss" in r]
    assert len(train_lines) == 3
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in train_lines)


def test_ckpt_path_none_writes_nothing(tmp_path: Path) -> None:
    model, tl, vl, cfg = _setup(tmp_path / "run", steps=2)
    train(model, tl, vl, cfg, ckpt_path=None)
    assert not (tmp_path / "run").exists()


def test_a_loader_without_resumable_sampler_warns_once(tmp_path: Path) -> None:
    model, _, vl, cfg = _setup(tmp_path / "run", steps=4, eval_every=2)
    plain = DataLoader(TensorDataset(torch.randn(16, 3, 2, 2), torch.randint(0, 4, (16,))), batch_size=8, shuffle=True)
    with pytest.warns(UserWarning, match="ResumableSampler") as record:
        train(model, plain, vl, cfg)
    assert sum("ResumableSampler" in str(w.message) for w in record) == 1


class _Killed(Exception):
    pass


def test_resume_after_a_crash_is_bit_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tl, vl, cfg = _setup(tmp_path / "full")
    reference = train(model, tl, vl, cfg)

    real_save = loop_module.save_checkpoint

    def save_then_die(*args, **kwargs):  # the process "dies" right after its first checkpoint
        real_save(*args, **kwargs)
        raise _Killed

    monkeypatch.setattr(loop_module, "save_checkpoint", save_then_die)
    model, tl, vl, cfg = _setup(tmp_path / "crash")
    with pytest.raises(_Killed):
        train(model, tl, vl, cfg)
    monkeypatch.undo()

    torch.manual_seed(999)  # whatever the process did before, the checkpoint restores the RNG
    model, tl, vl, cfg = _setup(tmp_path / "crash")
    resumed = train(model, tl, vl, cfg, resume=True)
    assert _without_timing(resumed) == _without_timing(reference)
    on_disk = [json.loads(s) for s in (tmp_path / "crash" / "metrics.jsonl").read_text().splitlines()]
    assert _without_timing(on_disk) == _without_timing(reference)


# ---------------------------------------------------------------------------------------------------- CLI
def test_cli_options_are_generated_from_the_config() -> None:
    parser = train_cli.build_parser()
    args = parser.parse_args(["--eval-every", "20", "--no-compile", "--clip", "none", "--amp-dtype", "bf16"])
    assert (args.eval_every, args.compile, args.clip, args.amp_dtype) == (20, False, None, "bf16")
    options = {a for action in parser._actions for a in action.option_strings}
    assert {"--lr", "--wd", "--warmup", "--steps", "--bs", "--accum", "--log-every", "--workers", "--out",
            "--compile", "--no-compile", "--resume", "--dataset", "--model", "--device", "--seed"} <= options


def test_cli_clip_none_disables_clipping_and_absent_options_keep_defaults() -> None:
    parser = train_cli.build_parser()
    cfg = train_cli.config_from_args(parser.parse_args(["--clip", "none", "--steps", "7"]))
    assert cfg.clip is None and cfg.steps == 7
    assert train_cli.config_from_args(parser.parse_args([])).clip == TrainConfig().clip


def test_run_stays_the_function_after_its_module_is_imported() -> None:
    import course_lib.train
    import course_lib.train.launch

    assert callable(course_lib.train.run) and course_lib.train.run is run


def test_cli_rejects_bad_values_with_exit_code_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert train_cli.main(["--bs", "0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "bs=0" in err and "Traceback" not in err
    assert train_cli.main(["--model", "gpt", "--out", str(tmp_path)]) == 2
    assert "cannot train on dataset='shapes'" in capsys.readouterr().err
    assert train_cli.main(["--resume", "--out", str(tmp_path / "empty")]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert train_cli.main(["--steps", "many"]) == 2


def test_cli_uses_the_course_thread_count(tmp_path: Path, capsys: pytest.CaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ckpt.pt").write_bytes(b"a run")  # refused after the threads are set, before any data is loaded
    monkeypatch.setenv("COURSE_THREADS", "2")
    assert train_cli.main(["--out", str(tmp_path), "--steps", "2"]) == 2
    assert torch.get_num_threads() == 2 and "threads: 2 (COURSE_THREADS overrides)" in capsys.readouterr().out
    monkeypatch.setenv("COURSE_THREADS", "none")
    assert train_cli.main(["--out", str(tmp_path / "new"), "--steps", "2"]) == 2
    assert "COURSE_THREADS='none'" in capsys.readouterr().err


CLI_ARGS = dict(steps=8, warmup=2, eval_every=3, log_every=1, bs=8, accum=2, device="cpu")


def _cli(out: Path, workers: int, resume: bool = False, **extra_env: str) -> subprocess.Popen:
    args = [f"--{k.replace('_', '-')}={v}" for k, v in CLI_ARGS.items()] + [f"--workers={workers}", f"--out={out}"]
    env = {**os.environ, "COURSE_MODE": "smoke", "OMP_NUM_THREADS": "1", **extra_env}
    return subprocess.Popen([sys.executable, "-m", "course_lib.train", *args, *(["--resume"] if resume else [])],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _metrics(out: Path) -> list[dict]:
    return _without_timing([json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()])


@pytest.mark.slow
def test_cli_run_killed_with_sigkill_and_resumed_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    """A CLI run SIGKILLed right after its first checkpoint, resumed with ``--resume``, ends exactly like an
    uninterrupted run. The resumed part uses 2 DataLoader workers: the sampler gives every sample its own
    augmentation seed, so which process decodes it does not matter either.
    """
    # The run holds at its first checkpoint (nobody reads it: up to the handshake's guard), so the kill lands there
    # however long this process sleeps between its polls on a busy machine.
    killed = _cli(tmp_path / "run", workers=0, COURSE_CHECKPOINT_HANDSHAKE="600")
    ckpt = tmp_path / "run" / "ckpt.pt"
    while not ckpt.exists() and killed.poll() is None:
        time.sleep(0.005)
    killed.send_signal(signal.SIGKILL)
    output, _ = killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL, f"the run ended before it could be killed:\n{output}"

    resumed = _cli(tmp_path / "run", workers=2, resume=True)
    # Meanwhile, the uninterrupted reference runs in this process, through the same entry point as the CLI.
    expected = _without_timing(run(TrainConfig(**CLI_ARGS, workers=0, out=str(tmp_path / "reference"))))
    assert [r["step"] for r in expected if "val_loss" in r] == [3, 6, 8]
    assert _metrics(tmp_path / "reference") == expected

    output, _ = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, output
    assert "metrics:" in output and "checkpoint:" in output
    assert _metrics(tmp_path / "run") == expected, "the resumed run differs from the uninterrupted one"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_under_the_handshake_a_run_holds_at_each_checkpoint_until_it_is_read_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A poller that sleeps long between its reads still sees every checkpoint: the run waits for two reads. The
    guard (600 s) is far beyond the test's time limit, so the run ends only because the reads released it."""
    from course_lib.train.checkpoint import HANDSHAKE_ENV, read_checkpoint

    monkeypatch.setenv(HANDSHAKE_ENV, "600")  # this process's reads count (the grader's sandbox sets it likewise)
    proc = _cli(tmp_path / "run", workers=0)
    ckpt = tmp_path / "run" / "ckpt.pt"
    seen = []
    try:
        for step in (3, 6):  # the checkpoints before the last (eval_every=3, steps=8)
            while not (ckpt.exists() and read_checkpoint(ckpt)["step"] == step):
                assert proc.poll() is None, proc.communicate()[0]
                time.sleep(0.01)
            time.sleep(0.5)  # a poller descheduled for a long while: the run must not have moved on
            seen.append(read_checkpoint(ckpt)["step"])  # the second read releases it
        output, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
        proc.wait()
    assert seen == [3, 6] and proc.returncode == 0, output
    assert read_checkpoint(ckpt)["step"] == 8


def test_without_the_handshake_holding_returns_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from course_lib.train.checkpoint import HANDSHAKE_ENV, hold_until_read

    monkeypatch.delenv(HANDSHAKE_ENV, raising=False)
    assert hold_until_read(tmp_path / "ckpt.pt", 3) is False
    monkeypatch.setenv(HANDSHAKE_ENV, "600")
    (tmp_path / "ckpt.pt.reads").write_text("3\n4\n3\n")
    assert hold_until_read(tmp_path / "ckpt.pt", 3) is True
    monkeypatch.setenv(HANDSHAKE_ENV, "0.05")
    assert hold_until_read(tmp_path / "ckpt.pt", 4) is False  # read once only: held until the guard
    monkeypatch.setenv(HANDSHAKE_ENV, "soon")
    with pytest.raises(ValueError, match="COURSE_CHECKPOINT_HANDSHAKE='soon'"):
        hold_until_read(tmp_path / "ckpt.pt", 4)
