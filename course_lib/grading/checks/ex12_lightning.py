"""Checks for exercise 12: Lightning's plateau scheduler, stopping and checkpoint callbacks, best weights.

The learner defines ``LitClassifier`` (a subclass of the notebook's ``ClassifierBase``) whose
``configure_optimizers`` returns the optimizer with a ``ReduceLROnPlateau`` scheduler in Lightning's dict form,
``make_callbacks(dirpath, patience=3, min_delta=1e-3)`` returning ``[EarlyStopping, ModelCheckpoint]`` on
``val_loss``, and ``load_best(trainer, cls)`` loading the best checkpoint. The returned objects are inspected, then
a tiny CPU ``Trainer`` (three short epochs, no logger, no progress bar) fits with the learner's callbacks.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from course_lib.grading.api import CheckFailed, check_for, need

MONITOR = "val_loss"


def _module(ns: dict[str, Any], lr: float = 0.0123) -> Any:
    cls = need(ns, "LitClassifier", "define `class LitClassifier(ClassifierBase)` with configure_optimizers")
    torch.manual_seed(0)
    return cls(lr=lr)


@check_for("12", "plateau scheduler dict", points=2)
def plateau_dict(ns: dict[str, Any]) -> None:
    module = _module(ns)
    config = module.configure_optimizers()
    if not isinstance(config, dict) or "optimizer" not in config or "lr_scheduler" not in config:
        raise CheckFailed(
            "configure_optimizers should return a dict with 'optimizer' and 'lr_scheduler': a plateau scheduler "
            "needs to know which metric to watch, and only the dict form can say so",
            hint="return {'optimizer': opt, 'lr_scheduler': {'scheduler': ..., 'monitor': 'val_loss', ...}}",
            got=type(config).__name__ if not isinstance(config, dict) else sorted(config),
        )
    opt, sched = config["optimizer"], config["lr_scheduler"]
    if not isinstance(opt, torch.optim.Optimizer) or abs(opt.param_groups[0]["lr"] - 0.0123) > 1e-12:
        raise CheckFailed(
            "the optimizer should train this module's parameters at the module's learning rate (self.hparams.lr)",
            expected="an Optimizer with lr=0.0123",
            got=opt,
        )
    want = {"monitor": MONITOR, "interval": "epoch", "frequency": 1}
    if not isinstance(sched, dict):
        raise CheckFailed("'lr_scheduler' should itself be a dict (scheduler, monitor, interval, frequency)", got=sched)
    got = {k: sched.get(k) for k in want}
    scheduler = sched.get("scheduler")
    if not isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) or got != want:
        raise CheckFailed(
            "the scheduler entry should be a ReduceLROnPlateau watching val_loss once per epoch",
            hint="{'scheduler': ReduceLROnPlateau(opt, mode='min', ...), 'monitor': 'val_loss', 'interval': 'epoch', "
            "'frequency': 1}",
            expected={"scheduler": "ReduceLROnPlateau", **want},
            got={"scheduler": type(scheduler).__name__, **got},
        )
    if scheduler.optimizer is not opt or scheduler.mode != "min":
        raise CheckFailed(
            "the plateau scheduler should drive the returned optimizer and treat lower val_loss as better",
            expected={"same optimizer": True, "mode": "min"},
            got={"same optimizer": scheduler.optimizer is opt, "mode": scheduler.mode},
        )


@check_for("12", "EarlyStopping and ModelCheckpoint settings", points=2)
def callbacks(ns: dict[str, Any]) -> None:
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    make = need(ns, "make_callbacks", "define `make_callbacks(dirpath, patience=3, min_delta=1e-3)` returning a list")
    with tempfile.TemporaryDirectory() as tmp:
        cbs = make(tmp, patience=5, min_delta=0.02)
        stops = [c for c in cbs if isinstance(c, EarlyStopping)]
        ckpts = [c for c in cbs if isinstance(c, ModelCheckpoint)]
        if len(stops) != 1 or len(ckpts) != 1:
            raise CheckFailed(
                "make_callbacks should return one EarlyStopping and one ModelCheckpoint",
                got=[type(c).__name__ for c in cbs],
            )
        es, mc = stops[0], ckpts[0]
        got_es = {"monitor": es.monitor, "mode": es.mode, "patience": es.patience, "min_delta": abs(es.min_delta)}
        want_es = {"monitor": MONITOR, "mode": "min", "patience": 5, "min_delta": 0.02}
        if got_es["monitor"] != want_es["monitor"] or got_es["mode"] != "min" or got_es["patience"] != 5 or abs(
            got_es["min_delta"] - 0.02
        ) > 1e-12:
            raise CheckFailed(
                "EarlyStopping should watch val_loss (lower is better) with the patience and min_delta passed in",
                hint="min_delta is the smallest change that counts as an improvement; stopping_threshold is a different "
                "thing (stop once a target value is reached)",
                expected=want_es,
                got=got_es,
            )
        got_mc = {"monitor": mc.monitor, "mode": mc.mode, "save_top_k": mc.save_top_k}
        want_mc = {"monitor": MONITOR, "mode": "min", "save_top_k": 1}
        if got_mc != want_mc:
            raise CheckFailed(
                "ModelCheckpoint should keep the single best checkpoint by val_loss",
                hint="ModelCheckpoint(dirpath=dirpath, monitor='val_loss', mode='min', save_top_k=1)",
                expected=want_mc,
                got=got_mc,
            )


def _loaders() -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(48, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    train = DataLoader(TensorDataset(x[:32], y[:32]), batch_size=8)
    val = DataLoader(TensorDataset(x[32:], y[32:]), batch_size=8)
    return train, val


@check_for("12", "tiny fit; load_best restores the best checkpoint", points=2)
def fit_and_load_best(ns: dict[str, Any]) -> None:
    make = need(ns, "make_callbacks", "define `make_callbacks(dirpath, patience=3, min_delta=1e-3)`")
    load_best = need(ns, "load_best", "define `load_best(trainer, cls)` returning a model loaded from the best checkpoint")
    module = _module(ns, lr=0.05)
    cls = type(module)
    train, val = _loaders()
    quiet = logging.getLogger("lightning.pytorch")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # no "GPU available: ..." banner inside the check table
    try:
        _fit_and_compare(module, cls, make, load_best, train, val)
    finally:
        quiet.setLevel(level)


def _fit_and_compare(module: Any, cls: type, make: Any, load_best: Any, train: DataLoader, val: DataLoader) -> None:
    import lightning as L

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice about workers and small datasets
        trainer = L.Trainer(
            max_epochs=3,
            limit_train_batches=2,
            limit_val_batches=2,
            num_sanity_val_steps=0,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=make(tmp),
            default_root_dir=tmp,
        )
        trainer.fit(module, train, val)
        best_path = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if not best_path:
            raise CheckFailed("no best checkpoint was written", hint="pass dirpath to ModelCheckpoint and monitor val_loss")
        best = torch.load(best_path, map_location="cpu", weights_only=False)["state_dict"]
        # What the trainer holds now is the *last* state; make it clearly different from the best one.
        with torch.no_grad():
            for p in trainer.lightning_module.parameters():
                p.add_(1.0)
        loaded = load_best(trainer, cls)
        if not isinstance(loaded, cls):
            raise CheckFailed(
                f"load_best should return a new {cls.__name__} built from the checkpoint file",
                hint="cls.load_from_checkpoint(trainer.checkpoint_callback.best_model_path)",
                got=type(loaded).__name__,
            )
        state = loaded.state_dict()
        wrong = [k for k, v in best.items() if k not in state or not torch.equal(state[k].cpu(), v)]
        if wrong:
            raise CheckFailed(
                "the returned model does not hold the best checkpoint's weights: stopping (or finishing) leaves the "
                "trainer with the *last* weights, not the best",
                hint="load from trainer.checkpoint_callback.best_model_path",
                expected=f"weights of {best_path.rsplit('/', 1)[-1]}",
                got=f"{len(wrong)} tensor(s) differ, e.g. {wrong[0]}",
            )
