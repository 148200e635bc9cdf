"""Checks for exercise 12: Lightning's plateau scheduler, stopping and checkpoint callbacks, best weights.

The learner defines ``LitClassifier`` (a subclass of the notebook's ``ClassifierBase``) whose
``configure_optimizers`` returns the optimizer with a ``ReduceLROnPlateau`` scheduler in Lightning's dict form,
``make_callbacks(dirpath, patience=3, min_delta=1e-3)`` returning ``[EarlyStopping, ModelCheckpoint]`` on
``val_loss``, and ``load_best(trainer, cls)`` loading the best checkpoint. The returned objects are inspected, then
a tiny CPU ``Trainer`` (three short epochs, no logger, no progress bar) fits with the learner's callbacks.

Part 12.4 (what a run reports): ``make_early_stop`` is inspected and run through two seeded val_loss sequences
(``stopping_threshold`` vs ``min_delta``, no fit); one more tiny fit with a sanity check, observed once for two
checks, judges ``ValLossHistory`` and ``MeteredClassifier``'s TorchMetrics ``val_acc`` against values the grader
recomputes from the final weights; ``wiring_check`` runs a ``fast_dev_run`` whose batches a counting module tallies.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed

MONITOR = "val_loss"


def _module(ns: dict[str, Any], lr: float) -> Any:
    cls = need(ns, "LitClassifier", "define `class LitClassifier(ClassifierBase)` with configure_optimizers")
    torch.manual_seed(0)
    return cls(lr=lr)


def _describe_scheduler(scheduler: Any, optimizer: Any) -> dict[str, Any]:
    plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    return {"type": type(scheduler).__name__, "plateau": plateau,
            "mode": getattr(scheduler, "mode", None) if plateau else None,
            "factor": float(scheduler.factor) if plateau else None,
            "same_optimizer": plateau and scheduler.optimizer is optimizer}


def _lr(ns: dict[str, Any]) -> float:
    """The module's learning rate: different in every grading run."""
    return round(0.01 + run_seed(ns) % 97 / 10_000, 4)


def _configured(ns: dict[str, Any], lr: float) -> dict[str, Any]:
    """configure_optimizers' return value, described as data (Lightning's dict forms)."""
    config = call(_module(ns, lr).configure_optimizers)
    if not isinstance(config, dict):
        return {"form": type(config).__name__}
    opt = config.get("optimizer")
    out: dict[str, Any] = {"form": "dict", "keys": sorted(map(str, config)),
                           "optimizer": {"is_optimizer": isinstance(opt, torch.optim.Optimizer),
                                         "lr": float(opt.param_groups[0]["lr"]) if isinstance(
                                             opt, torch.optim.Optimizer) else None, "shown": one_line(opt)},
                           "monitor": one_line(config["monitor"]) if "monitor" in config else None}
    sched = config.get("lr_scheduler")
    if isinstance(sched, dict):
        out["lr_scheduler"] = {"form": "dict", **_describe_scheduler(sched.get("scheduler"), opt),
                               **{k: one_line(sched[k]) for k in ("monitor", "interval", "frequency") if k in sched}}
    else:
        out["lr_scheduler"] = {"form": "scheduler", **_describe_scheduler(sched, opt)}
    return out


@check_for("12", "plateau scheduler dict", points=2, parts=("12.1",))
def plateau_dict(ns: dict[str, Any]) -> None:
    lr = _lr(ns)
    config = observe(ns, _configured, lr)
    if config["form"] != "dict" or "optimizer" not in config["keys"] or "lr_scheduler" not in config["keys"]:
        raise CheckFailed(
            "configure_optimizers should return a dict with 'optimizer' and 'lr_scheduler': a plateau scheduler "
            "needs to know which metric to watch, and only the dict form can say so",
            hint="return {'optimizer': opt, 'lr_scheduler': {'scheduler': ..., 'monitor': 'val_loss', ...}}",
            got=config["form"] if config["form"] != "dict" else config["keys"],
        )
    opt, sched = config["optimizer"], config["lr_scheduler"]
    if not opt["is_optimizer"] or abs(opt["lr"] - lr) > 1e-12:
        raise CheckFailed(
            "the optimizer should train this module's parameters at the module's learning rate (self.hparams.lr)",
            expected=f"an Optimizer with lr={lr}",
            got=opt["shown"],
        )
    # Lightning's two spellings: {"lr_scheduler": {"scheduler": s, "monitor": ...}} or the flat
    # {"lr_scheduler": s, "monitor": ...}; interval and frequency default to "epoch" and 1.
    monitor = sched.get("monitor") if sched["form"] == "dict" else config["monitor"]
    got = {"monitor": monitor, "interval": sched.get("interval", repr("epoch")),
           "frequency": sched.get("frequency", repr(1))}
    want = {"monitor": repr(MONITOR), "interval": repr("epoch"), "frequency": repr(1)}
    if not sched["plateau"] or got != want:
        raise CheckFailed(
            "the scheduler should be a ReduceLROnPlateau watching val_loss once per epoch",
            hint="{'optimizer': opt, 'lr_scheduler': {'scheduler': ReduceLROnPlateau(opt, mode='min'), "
            "'monitor': 'val_loss'}} (interval 'epoch' and frequency 1 are the defaults)",
            expected={"scheduler": "ReduceLROnPlateau", **want},
            got={"scheduler": sched["type"], **got},
        )
    if not sched["same_optimizer"] or sched["mode"] != "min":
        raise CheckFailed(
            "the plateau scheduler should drive the returned optimizer and treat lower val_loss as better",
            expected={"same optimizer": True, "mode": "min"},
            got={"same optimizer": sched["same_optimizer"], "mode": sched["mode"]},
        )
    if not 0 < sched["factor"] < 1:
        raise CheckFailed(
            "the plateau scheduler should lower the learning rate, not end training: each plateau multiplies it by "
            "factor, so factor=0 sets it to 0 and every later step changes nothing",
            hint="ReduceLROnPlateau(opt, mode='min', factor=0.5): any factor between 0 and 1",
            expected="0 < factor < 1", got=sched["factor"])


def _stopping(ns: dict[str, Any]) -> tuple[int, float]:
    """patience and min_delta passed to make_callbacks: different in every grading run."""
    return 2 + run_seed(ns) % 7, round(0.005 + run_seed(ns) % 50 / 1000, 3)


def _callbacks(ns: dict[str, Any], patience: int, min_delta: float) -> Any:
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    make = need(ns, "make_callbacks", "define `make_callbacks(dirpath, patience=3, min_delta=1e-3)` returning a list")
    with tempfile.TemporaryDirectory() as tmp:
        cbs = call(make, tmp, patience=patience, min_delta=min_delta)
    if not isinstance(cbs, (list, tuple)):
        return one_line(cbs)
    out = []
    for c in cbs:
        if isinstance(c, EarlyStopping):
            out.append({"kind": "EarlyStopping", "monitor": c.monitor, "mode": c.mode, "patience": c.patience,
                        "min_delta": float(c.min_delta)})  # signed: Lightning stores it negated for mode='min'
        elif isinstance(c, ModelCheckpoint):
            out.append({"kind": "ModelCheckpoint", "monitor": c.monitor, "mode": c.mode, "save_top_k": c.save_top_k})
        else:
            out.append({"kind": type(c).__name__})
    return out


def _as_passed(stored: Any, mode: Any) -> Any:
    """The min_delta a learner passed, from what EarlyStopping stored (its sign flipped for mode='min', whatever
    the Lightning version does): a negative min_delta, which counts a worse val_loss as an improvement, stays
    negative instead of being hidden by abs()."""
    from lightning.pytorch.callbacks import EarlyStopping

    if not isinstance(stored, float) or mode not in ("min", "max"):
        return stored
    return stored if EarlyStopping(monitor=MONITOR, mode=mode, min_delta=1.0).min_delta > 0 else -stored


@check_for("12", "EarlyStopping and ModelCheckpoint settings", points=2, parts=("12.2",))
def callbacks(ns: dict[str, Any]) -> None:
    patience, min_delta = _stopping(ns)
    cbs = observe(ns, _callbacks, patience, min_delta)
    kinds = [c["kind"] for c in cbs] if isinstance(cbs, list) else cbs
    stops = [c for c in cbs if c["kind"] == "EarlyStopping"] if isinstance(cbs, list) else []
    ckpts = [c for c in cbs if c["kind"] == "ModelCheckpoint"] if isinstance(cbs, list) else []
    if len(stops) != 1 or len(ckpts) != 1:
        raise CheckFailed("make_callbacks should return one EarlyStopping and one ModelCheckpoint", got=kinds)
    es, mc = stops[0], ckpts[0]
    got_es = {k: es[k] for k in ("monitor", "mode", "patience", "min_delta")}
    got_es["min_delta"] = _as_passed(got_es["min_delta"], got_es["mode"])
    want_es = {"monitor": MONITOR, "mode": "min", "patience": patience, "min_delta": min_delta}
    if got_es["monitor"] != MONITOR or got_es["mode"] != "min" or got_es["patience"] != patience or abs(
        got_es["min_delta"] - min_delta
    ) > 1e-12:
        raise CheckFailed(
            "EarlyStopping should watch val_loss (lower is better) with the patience and min_delta passed in",
            hint="min_delta is the smallest change that counts as an improvement; stopping_threshold is a different "
            "thing (stop once a target value is reached)",
            expected=want_es,
            got=got_es,
        )
    got_mc = {k: mc[k] for k in ("monitor", "mode", "save_top_k")}
    want_mc = {"monitor": MONITOR, "mode": "min", "save_top_k": 1}
    if got_mc != want_mc:
        raise CheckFailed(
            "ModelCheckpoint should keep the single best checkpoint by val_loss",
            hint="ModelCheckpoint(dirpath=dirpath, monitor='val_loss', mode='min', save_top_k=1)",
            expected=want_mc,
            got=got_mc,
        )


def _loaders(seed: int) -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(1 + seed)
    x = torch.randn(48, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    train = DataLoader(TensorDataset(x[:32], y[:32]), batch_size=8)
    val = DataLoader(TensorDataset(x[32:], y[32:]), batch_size=8)
    return train, val


def _planted_weights(seed: int, shapes: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    """Weights written into the best checkpoint, drawn from the grading run's seed.

    The grader computes them itself from the shapes, so the only way to return them is to load that file: a
    submission cannot make a recorded "best" and a recorded "loaded" agree by changing both.
    """
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(shapes[k], generator=g) for k in sorted(shapes)}


# ClassifierBase's parameters (the notebook's set-up cell): the planted checkpoint must cover at least these.
_BASE_SHAPES = {"net.0.weight": [32, 8], "net.0.bias": [32], "net.2.weight": [3, 32], "net.2.bias": [3]}


def _fit(ns: dict[str, Any], seed: int) -> dict[str, Any]:
    make = need(ns, "make_callbacks", "define `make_callbacks(dirpath, patience=3, min_delta=1e-3)`")
    load_best = need(ns, "load_best",
                     "define `load_best(trainer, cls)` returning a model loaded from the best checkpoint")
    module = _module(ns, lr=0.05)
    train, val = _loaders(seed)
    quiet = logging.getLogger("lightning.pytorch")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # no "GPU available: ..." banner inside the check table
    try:
        return _fit_and_load(module, type(module), make, load_best, train, val, seed)
    finally:
        quiet.setLevel(level)


def _fit_and_load(module: Any, cls: type, make: Any, load_best: Any, train: DataLoader, val: DataLoader,
                  seed: int) -> dict[str, Any]:
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
            callbacks=call(make, tmp),
            default_root_dir=tmp,
        )
        trainer.fit(module, train, val)
        best_path = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if not best_path:
            return {"best": None}
        # Plant weights only the grader can predict in the best checkpoint (keeping Lightning's other entries).
        checkpoint = torch.load(best_path, map_location="cpu", weights_only=False)
        shapes = {k: list(v.shape) for k, v in checkpoint["state_dict"].items() if v.is_floating_point()}
        checkpoint["state_dict"].update(_planted_weights(seed, shapes))
        torch.save(checkpoint, best_path)
        # What the trainer holds now is the *last* state; make it clearly different from the best one.
        with torch.no_grad():
            for p in trainer.lightning_module.parameters():
                p.add_(1.0)
        loaded = call(load_best, trainer, cls)
        return {"best": shapes, "best_name": best_path.rsplit("/", 1)[-1],
                "loaded_type": type(loaded).__name__, "is_cls": isinstance(loaded, cls),
                "loaded": {k: v.detach().cpu() for k, v in loaded.state_dict().items()} if isinstance(loaded, cls)
                else None}


@check_for("12", "tiny fit; load_best restores the best checkpoint", points=2, parts=("12.1", "12.2", "12.3"))
def fit_and_load_best(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _fit, seed)
    if seen["best"] is None:
        raise CheckFailed("no best checkpoint was written", hint="pass dirpath to ModelCheckpoint and monitor val_loss")
    if not seen["is_cls"]:
        raise CheckFailed(
            "load_best should return a new LitClassifier built from the checkpoint file",
            hint="cls.load_from_checkpoint(trainer.checkpoint_callback.best_model_path)",
            got=seen["loaded_type"],
        )
    shapes, state = seen["best"], seen["loaded"]
    if not isinstance(shapes, dict) or any(shapes.get(k) != v for k, v in _BASE_SHAPES.items()):
        raise CheckFailed("the best checkpoint should hold the LitClassifier's weights (ClassifierBase's layers)",
                          expected=_BASE_SHAPES, got=shapes)
    best = _planted_weights(seed, shapes)
    wrong = [k for k, v in best.items() if k not in state or not torch.equal(state[k], v)]
    if wrong:
        raise CheckFailed(
            "the returned model does not hold the best checkpoint's weights: stopping (or finishing) leaves the "
            "trainer with the *last* weights, not the best",
            hint="load from trainer.checkpoint_callback.best_model_path",
            expected=f"weights of {seen['best_name']}",
            got=f"{len(wrong)} tensor(s) differ, e.g. {wrong[0]}",
        )


# ------------------------------------------------------------------ 12.4: what a run reports


def _stop_inputs(seed: int) -> tuple[int, float, float, list[float], list[float]]:
    """patience, min_delta, target and two val_loss sequences, all different in every grading run.

    The first sequence falls below ``target`` before patience can run out (stopping_threshold decides); the second
    never reaches it and keeps improving by less than ``min_delta`` (patience, counted with min_delta, decides).
    """
    rng = torch.Generator().manual_seed(seed)
    patience = 2 + seed % 3
    min_delta = round(0.01 + seed % 7 / 200, 3)
    start = 1.0 + seed % 11 / 10
    drops = (min_delta * (2 + torch.rand(8, generator=rng))).tolist()
    falling = [start - sum(drops[:i]) for i in range(9)]
    target = round(falling[3 + seed % 4] + min_delta / 2, 4)
    tiny = (min_delta * (0.1 + 0.5 * torch.rand(12, generator=rng))).tolist()
    creeping = [start - sum(tiny[:i]) for i in range(13)]
    creeping[1 + seed % 2] -= 2 * min_delta  # one real improvement early on resets the wait
    return patience, min_delta, target, falling, creeping


def reference_stop(values: list[float], patience: int, min_delta: float, target: float) -> int | None:
    """The check index at which EarlyStopping(mode='min', min_delta, stopping_threshold=target) stops, or None."""
    best, wait = math.inf, 0
    for i, value in enumerate(values):
        if value < target:
            return i
        if value + min_delta < best:
            best, wait = value, 0
        else:
            wait += 1
            if wait >= patience:
                return i
    return None


def _early_stop(ns: dict[str, Any], patience: int, min_delta: float, target: float,
                sequences: list[list[float]]) -> Any:
    from lightning.pytorch.callbacks import EarlyStopping

    make = need(ns, "make_early_stop", "define `make_early_stop(patience, min_delta, target)` returning EarlyStopping")
    stops: list[int | None] = []
    es: Any = None
    for values in sequences:  # a fresh callback per sequence: it keeps its best score and wait count
        es = call(make, patience, min_delta, target)
        if not isinstance(es, EarlyStopping):
            return one_line(es)
        stops.append(None)
        for i, value in enumerate(values):  # what Lightning runs after every validation
            if es._evaluate_stopping_criteria(torch.tensor(value))[0]:
                stops[-1] = i
                break
    threshold = es.stopping_threshold
    return {"monitor": es.monitor, "mode": es.mode, "patience": es.patience, "min_delta": abs(float(es.min_delta)),
            "stopping_threshold": None if threshold is None else float(threshold), "stops": stops}


@check_for("12", "EarlyStopping: stopping_threshold and min_delta", parts=("12.4",))
def early_stop_threshold(ns: dict[str, Any]) -> None:
    patience, min_delta, target, falling, creeping = _stop_inputs(run_seed(ns))
    seen = observe(ns, _early_stop, patience, min_delta, target, [falling, creeping])
    if not isinstance(seen, dict):
        raise CheckFailed("make_early_stop should return an EarlyStopping callback", got=seen)
    want = {"monitor": MONITOR, "mode": "min", "patience": patience, "min_delta": min_delta,
            "stopping_threshold": target}
    got = {k: seen[k] for k in want}
    if got["monitor"] != MONITOR or got["mode"] != "min" or got["patience"] != patience or any(
        got[k] is None or abs(got[k] - want[k]) > 1e-9 for k in ("min_delta", "stopping_threshold")
    ):
        raise CheckFailed(
            "EarlyStopping should watch val_loss (lower is better) with this patience and min_delta, and stop as "
            "soon as val_loss goes below the target",
            hint="min_delta: the smallest change that counts as an improvement; stopping_threshold: the target",
            expected=want, got=got,
        )
    expected = [reference_stop(v, patience, min_delta, target) for v in (falling, creeping)]
    if seen["stops"] != expected:
        raise CheckFailed(
            "run through two val_loss sequences, the callback stops at other checks than EarlyStopping with these "
            "settings should",
            expected=expected, got=seen["stops"],
        )


def _report_inputs(seed: int) -> tuple[int, int, float]:
    """Epochs, validation samples (the last batch is smaller) and learning rate of the reporting fit."""
    return 2 + seed % 2, 13 + seed % 6, round(0.03 + seed % 13 / 200, 3)


def _report_data(seed: int, n_val: int) -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(7 + seed)
    x = torch.randn(32 + n_val, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return TensorDataset(x[:32], y[:32]), TensorDataset(x[32:], y[32:])


# The last reporting fit: (namespace, seed, the learner's two classes, result). Two checks judge one fit; a class
# redefined in the notebook (a new object) or another seed fits again.
_REPORT: list[Any] = []


def _report_fit(ns: dict[str, Any], seed: int) -> dict[str, Any]:
    """One tiny fit with a sanity check: the learner's MeteredClassifier and ValLossHistory, observed once."""
    import lightning as L

    cls = need(ns, "MeteredClassifier", "define `class MeteredClassifier(LitClassifier)` logging val_acc")
    history_cls = need(ns, "ValLossHistory", "define `class ValLossHistory(Callback)` with a `values` list")
    if _REPORT and _REPORT[0] is ns and _REPORT[1] == seed and _REPORT[2] is cls and _REPORT[3] is history_cls:
        return _REPORT[4]
    epochs, n_val, lr = _report_inputs(seed)
    train, val = _report_data(seed, n_val)
    torch.manual_seed(seed)
    module = call(cls, lr=lr)
    history = call(history_cls)
    quiet = logging.getLogger("lightning.pytorch")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = L.Trainer(max_epochs=epochs, limit_train_batches=2, num_sanity_val_steps=1,
                                accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                                enable_model_summary=False, enable_checkpointing=False, callbacks=[history],
                                default_root_dir=tmp)
            trainer.fit(module, DataLoader(train, batch_size=8), DataLoader(val, batch_size=8))
    finally:
        quiet.setLevel(level)
    metrics = trainer.callback_metrics
    result = {"values": [float(v) for v in getattr(history, "values", [])] if isinstance(
        getattr(history, "values", None), list) else one_line(getattr(history, "values", None)),
        "val_acc": float(metrics["val_acc"]) if "val_acc" in metrics else None,
        "logged": sorted(metrics),
        "weights": {k: v.detach().cpu() for k, v in module.net.state_dict().items()}}
    _REPORT[:] = [ns, seed, cls, history_cls, result]
    return result


def _final_val(seed: int, weights: dict[str, torch.Tensor]) -> tuple[float, float]:
    """val_loss and accuracy of the final weights over the whole validation set, computed by the grader."""
    _, n_val, _ = _report_inputs(seed)
    x, y = _report_data(seed, n_val)[1].tensors
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    net.load_state_dict(weights)
    with torch.no_grad():
        logits = net(x)
    return float(torch.nn.functional.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())


@check_for("12", "history of val_loss from callback_metrics, sanity check excluded",
           parts=("12.1", "12.5", "12.6", "12.7", "12.8"))
def val_history(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _report_fit, seed)
    epochs = _report_inputs(seed)[0]
    values = seen["values"]
    if not isinstance(values, list) or len(values) != epochs:
        raise CheckFailed(
            f"a {epochs}-epoch fit with a one-batch sanity check should leave one val_loss per epoch in "
            "ValLossHistory.values: the sanity check validates untrained weights on a batch or two and is no result",
            hint="skip when trainer.sanity_checking; read trainer.callback_metrics['val_loss'] in on_validation_end",
            expected=f"{epochs} values", got=values if not isinstance(values, list) else f"{len(values)}: {values}",
        )
    want, _ = _final_val(seed, seen["weights"])
    if abs(values[-1] - want) > 1e-4:
        raise CheckFailed(
            "the last recorded value is not the final validation's val_loss over the whole validation set",
            hint="append float(trainer.callback_metrics['val_loss']) in on_validation_end (EarlyStopping reads it)",
            expected=round(want, 5), got=[round(v, 5) for v in values],
        )


@check_for("12", "val_acc logged as a TorchMetrics object over the whole validation set",
           parts=("12.1", "12.5", "12.6", "12.7", "12.8"))
def val_accuracy(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    seen = observe(ns, _report_fit, seed)
    if seen["val_acc"] is None:
        raise CheckFailed("MeteredClassifier logged no 'val_acc'", hint="self.log('val_acc', self.val_acc)",
                          got=seen["logged"])
    _, want = _final_val(seed, seen["weights"])
    if abs(seen["val_acc"] - want) > 1e-5:
        raise CheckFailed(
            "val_acc should be the share of correct predictions over the whole last validation: not macro-averaged, "
            "not mixed with training batches (one metric object per stage), not carried over from earlier "
            "validations (reset after compute)",
            hint="self.val_acc = torchmetrics.Accuracy(task='multiclass', num_classes=n_classes); in validation_step "
            "self.val_acc(logits, y); self.log('val_acc', self.val_acc)",
            expected=round(want, 5), got=round(seen["val_acc"], 5),
        )


def _dev_run(ns: dict[str, Any], n_batches: int, seed: int) -> dict[str, Any]:
    wiring = need(ns, "wiring_check", "define `wiring_check(module, train_loader, val_loader, n_batches)`")
    base = need(ns, "ClassifierBase", "run the set-up cell (it defines ClassifierBase)")

    class Counting(base):
        """Counts the steps Lightning runs, sanity validation apart."""

        def __init__(self) -> None:
            super().__init__(lr=0.05)
            self.seen = {"train": 0, "val": 0, "sanity": 0}

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.seen["train"] += 1
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            self.seen["sanity" if self.trainer.sanity_checking else "val"] += 1
            return super().validation_step(batch, batch_idx)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    train, val = _report_data(seed, 24)
    module = Counting()
    here = os.getcwd()
    quiet = logging.getLogger("lightning.pytorch")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        os.chdir(tmp)  # whatever the trainer writes by default lands here, not in the learner's folder
        try:
            trainer = call(wiring, module, DataLoader(train, batch_size=4), DataLoader(val, batch_size=4), n_batches)
        finally:
            os.chdir(here)
            quiet.setLevel(level)
        written = sorted(str(p.relative_to(tmp)) for p in Path(tmp).rglob("*") if p.is_file())
    return {"seen": module.seen, "fast_dev_run": one_line(getattr(trainer, "fast_dev_run", None)), "written": written}


@check_for("12", "fast_dev_run: n batches of each, no sanity check, nothing written", parts=("12.9",))
def dev_run(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    n_batches = 2 + seed % 3
    seen = observe(ns, _dev_run, n_batches, seed)
    want = {"train": n_batches, "val": n_batches, "sanity": 0}
    if seen["seen"] != want or seen["written"]:
        raise CheckFailed(
            f"a wiring check should run exactly {n_batches} training and {n_batches} validation batches, skip the "
            "sanity check and write no checkpoints or logs: it proves the code runs end to end, not that it learns",
            hint="L.Trainer(fast_dev_run=n_batches, ...).fit(module, train_loader, val_loader); return the trainer",
            expected={**want, "files written": []}, got={**seen["seen"], "files written": seen["written"][:3]},
        )
