"""Checkpoints: exact round trip, atomic writes, and clear refusals that change nothing."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from course_lib.models import Net
from course_lib.train import (
    CheckpointError,
    TrainConfig,
    build_optimizer,
    evaluate,
    load_checkpoint,
    save_checkpoint,
)
from course_lib.train import checkpoint as checkpoint_module

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net(d_in=12, d=16, n_blocks=1, n_out=3)


def _cfg(tmp_path: Path, **overrides) -> TrainConfig:
    values = dict(steps=10, bs=4, out=str(tmp_path), device="cpu", model="net")
    values.update(overrides)
    return TrainConfig(**values)


def _trained(tmp_path: Path) -> tuple[Net, torch.optim.Optimizer, TrainConfig]:
    model = _model()
    cfg = _cfg(tmp_path)
    opt = build_optimizer(model, cfg)
    x, y = torch.randn(8, 12), torch.randint(0, 3, (8,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    return model, opt, cfg


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_round_trip_gives_identical_evaluation_and_state(tmp_path: Path) -> None:
    model, opt, cfg = _trained(tmp_path)
    rng_before = torch.get_rng_state()
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=opt, step=5, config=cfg.resolved(),
                           history=[{"step": 5, "val_loss": 1.0}], data_state={"epoch": 1, "samples_in_epoch": 8})
    loader = DataLoader(TensorDataset(torch.randn(10, 12), torch.randint(0, 3, (10,))), batch_size=4)
    expected = evaluate(model, loader, "cpu")
    torch.rand(100)  # move the RNG on; loading must bring it back

    fresh = _model(seed=1)
    fresh_opt = build_optimizer(fresh, cfg)
    state = load_checkpoint(path, model=fresh, optimizer=fresh_opt, config=cfg.resolved())
    assert evaluate(fresh, loader, "cpu") == expected
    assert state["step"] == 5 and state["history"] == [{"step": 5, "val_loss": 1.0}]
    assert state["data"] == {"epoch": 1, "samples_in_epoch": 8}
    assert torch.equal(torch.get_rng_state(), rng_before)
    a, b = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert all(torch.equal(a[k]["exp_avg"], b[k]["exp_avg"]) for k in a)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupted_checkpoint_raises_naming_the_file_and_changes_nothing(tmp_path: Path, damage: str) -> None:
    model, opt, cfg = _trained(tmp_path)
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=opt, step=3, config=cfg)
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"not a checkpoint" * 10, "empty": b""}[damage])
    before = _digest(path)
    target = _model(seed=1)
    weights = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(CheckpointError, match="ckpt.pt") as info:
        load_checkpoint(path, model=target, config=cfg)
    assert "corrupted" in str(info.value)
    assert _digest(path) == before
    assert all(torch.equal(weights[k], v) for k, v in target.state_dict().items())


def test_incompatible_config_names_file_fields_and_both_values(tmp_path: Path) -> None:
    model, opt, cfg = _trained(tmp_path)
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=opt, step=6, config=cfg.resolved())
    before = _digest(path)
    target = _model(seed=1)
    weights = {k: v.clone() for k, v in target.state_dict().items()}
    other = _cfg(tmp_path, bs=8, seed=3).resolved()
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path, model=target, config=other)
    message = str(info.value)
    assert "ckpt.pt" in message
    assert "bs: checkpoint has 4, current config has 8" in message
    assert "seed: checkpoint has 0, current config has 3" in message
    assert _digest(path) == before
    assert all(torch.equal(weights[k], v) for k, v in target.state_dict().items())

    with pytest.raises(CheckpointError, match="steps"):  # steps may grow, never shrink below the checkpoint
        load_checkpoint(path, model=target, config=_cfg(tmp_path, steps=4).resolved())
    load_checkpoint(path, model=target, config=_cfg(tmp_path, steps=50, warmup=0, eval_every=7).resolved())  # allowed


def test_checkpoint_for_another_model_is_refused_before_loading(tmp_path: Path) -> None:
    model, opt, cfg = _trained(tmp_path)
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, step=1, config=cfg)
    wider = Net(d_in=12, d=32, n_blocks=1, n_out=3)
    weights = {k: v.clone() for k, v in wider.state_dict().items()}
    with pytest.raises(CheckpointError, match="shape mismatch"):
        load_checkpoint(path, model=wider)
    assert all(torch.equal(weights[k], v) for k, v in wider.state_dict().items())


def test_missing_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt", model=_model())


def test_failed_save_leaves_the_previous_checkpoint_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt, cfg = _trained(tmp_path)
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=opt, step=2, config=cfg)
    before = _digest(path)

    def half_written_then_crash(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a zip file")
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(checkpoint_module.torch, "save", half_written_then_crash)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(path, model=model, optimizer=opt, step=3, config=cfg)
    monkeypatch.undo()

    assert _digest(path) == before
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]  # no temporary file left behind
    assert load_checkpoint(path, model=_model())["step"] == 2
