"""Implementations a learner's test suite is run against: one correct, several subtly broken.

Exercise 04 asks for five pytest-style tests, each taking an ``impl`` argument with this
interface:

* ``impl.make_model(seed) -> nn.Module`` — a small classifier of ``impl.in_features`` inputs and
  ``impl.num_classes`` outputs (logits ``[B, num_classes]``); the same seed gives the same weights;
* ``impl.make_optimizer(model) -> Optimizer``;
* ``impl.train_step(model, optimizer, batch) -> float`` — one update on ``batch = (x, y)``, returns the loss;
* ``impl.make_batch(batch_size, seed) -> (x, y)``;
* ``impl.save(path, model, optimizer)`` and ``impl.load(path) -> (model, optimizer)``.

Each broken variant hides one bug that a good suite catches; the bug is written down in the
class docstring (read it *after* writing your tests). Everything is at module scope and tiny,
so the whole suite runs in well under a minute on a CPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class TinyClassifier(nn.Module):
    """Linear -> BatchNorm -> ReLU -> Linear -> ReLU -> Linear: small, but it has parameters *and* buffers."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 32) -> None:
        super().__init__()
        self.inp = nn.Linear(in_features, hidden)
        self.norm = nn.BatchNorm1d(hidden)
        self.hidden = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.norm(self.inp(x)))
        h = F.relu(self.hidden(h))
        return self.head(h)


class Reference:
    """The correct implementation: every test of a good suite passes on it."""

    name = "correct"
    in_features = 12
    num_classes = 5

    def build(self) -> nn.Module:
        return TinyClassifier(self.in_features, self.num_classes)

    def make_model(self, seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        return self.build()

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.Adam(model.parameters(), lr=1e-2)

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    def train_step(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, torch.Tensor]
    ) -> float:
        model.train()
        x, y = batch
        optimizer.zero_grad(set_to_none=True)
        loss = self.loss(model, x, y)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    def make_batch(self, batch_size: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch_size, self.in_features, generator=g)
        y = torch.randint(0, self.num_classes, (batch_size,), generator=g)
        return x, y

    def model_state(self, model: nn.Module) -> dict[str, Any]:
        return model.state_dict()

    def save(self, path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        torch.save({"model": self.model_state(model), "optimizer": optimizer.state_dict()}, path)

    def load(self, path: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
        state = torch.load(path, weights_only=True)
        # A different seed on purpose: whatever the checkpoint does not restore shows up as a difference.
        model = self.make_model(seed=987_654)
        model.load_state_dict(state["model"], strict=False)
        optimizer = self.make_optimizer(model)
        self.load_optimizer(optimizer, state)
        return model, optimizer

    def load_optimizer(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        optimizer.load_state_dict(state["optimizer"])

    def __repr__(self) -> str:
        return f"<implementation {self.name!r}>"


class _WrongShapeNet(TinyClassifier):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).squeeze()


class WrongShape(Reference):
    """Bug: the logits are ``.squeeze()``d, so a batch of one comes out as ``[num_classes]``, not ``[1, C]``."""

    name = "wrong output shape for a batch of one"

    def build(self) -> nn.Module:
        return _WrongShapeNet(self.in_features, self.num_classes)


class DetachedLoss(Reference):
    """Bug: the loss is computed from detached logits, so no gradient reaches the weights: it cannot learn."""

    name = "loss computed on a detached tensor"

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x).detach().requires_grad_(), y)


class IgnoresSeed(Reference):
    """Bug: ``make_model`` draws its seed from the OS, so two runs with the same seed differ."""

    name = "seed ignored"

    def make_model(self, seed: int = 0) -> nn.Module:
        torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
        return self.build()


class _UnusedLayerNet(TinyClassifier):
    def __init__(self, in_features: int, num_classes: int, hidden: int = 32) -> None:
        super().__init__(in_features, num_classes, hidden)
        self.skip = nn.Linear(hidden, hidden)  # registered, but forward forgets to use it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.norm(self.inp(x)))
        return self.head(F.relu(self.hidden(h)))


class UnusedLayer(Reference):
    """Bug: a registered layer is never used in ``forward``: its parameters never get a gradient."""

    name = "layer that never gets a gradient"

    def build(self) -> nn.Module:
        return _UnusedLayerNet(self.in_features, self.num_classes)


class _PrunedNet(TinyClassifier):
    def __init__(self, in_features: int, num_classes: int, hidden: int = 32) -> None:
        super().__init__(in_features, num_classes, hidden)
        keep = torch.ones(hidden)
        keep[-hidden // 4 :] = 0.0  # the last quarter of the hidden units is pruned
        self.register_buffer("keep", keep)
        import numpy as np

        with torch.no_grad():  # the pruned units' weights from NumPy's generator, which torch.manual_seed leaves alone
            pruned = self.hidden.weight[-hidden // 4 :]
            pruned.copy_(torch.from_numpy(np.random.uniform(-0.1, 0.1, tuple(pruned.shape))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.norm(self.inp(x)))
        return self.head(F.relu(self.hidden(h)) * self.keep)


class PrunedUnseeded(Reference):
    """Bug: the weights of pruned hidden units (a mask zeroes their output) come from NumPy's random generator,
    which ``torch.manual_seed`` does not seed. They never change the loss, so two seeded runs give the same losses,
    but one weight tensor differs between them: the saved weights are not reproducible."""

    name = "one weight tensor differs between seeded runs"

    def build(self) -> nn.Module:
        return _PrunedNet(self.in_features, self.num_classes)


class _ZeroGateNet(TinyClassifier):
    def __init__(self, in_features: int, num_classes: int, hidden: int = 32) -> None:
        super().__init__(in_features, num_classes, hidden)
        self.branch = nn.Linear(hidden, hidden)
        self.register_buffer("gate", torch.zeros(()))  # meant to be an nn.Parameter: as a buffer it stays 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.norm(self.inp(x)))
        h = F.relu(self.hidden(h)) + self.gate * self.branch(h)
        return self.head(h)


class ZeroGradient(Reference):
    """Bug: an extra branch is scaled by a gate registered as a buffer, not a parameter, so it stays 0: the branch's
    weights are in the graph and get a ``.grad``, but it is all zeros, and they never learn."""

    name = "layer whose gradient is all zeros"

    def build(self) -> nn.Module:
        return _ZeroGateNet(self.in_features, self.num_classes)


class _PlainListNet(TinyClassifier):
    def __init__(self, in_features: int, num_classes: int, hidden: int = 32) -> None:
        super().__init__(in_features, num_classes, hidden)
        del self.hidden
        self.blocks = [nn.Linear(hidden, hidden)]  # a plain list: invisible to parameters() and state_dict()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.norm(self.inp(x)))
        for block in self.blocks:
            h = F.relu(block(h))
        return self.head(h)


class PlainList(Reference):
    """Bug: a hidden layer lives in a plain Python list: not trained, not saved, not restored."""

    name = "layer kept in a plain list"

    def build(self) -> nn.Module:
        return _PlainListNet(self.in_features, self.num_classes)


class DropsOptimizer(Reference):
    """Bug: the checkpoint restores the weights but starts a fresh optimizer (Adam's moments are lost)."""

    name = "checkpoint drops the optimizer state"

    def load_optimizer(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        pass


class DropsBuffers(Reference):
    """Bug: the checkpoint saves parameters only, so BatchNorm's running statistics (buffers) are lost."""

    name = "checkpoint drops the BatchNorm buffers"

    def model_state(self, model: nn.Module) -> dict[str, Any]:
        return {k: v.detach().clone() for k, v in model.named_parameters()}


BROKEN: tuple[type[Reference], ...] = (WrongShape, DetachedLoss, IgnoresSeed, PrunedUnseeded, UnusedLayer,
                                       ZeroGradient, PlainList, DropsOptimizer, DropsBuffers)
TEST_NAMES = ("test_shapes", "test_overfit_one_batch", "test_determinism", "test_gradient_flow",
              "test_checkpoint_roundtrip")


NOT_ATTEMPTED = "not attempted yet: "


def run_suite(tests: dict[str, Callable[[Any], None]], impl: Reference, tmp_dir: str | Path) -> dict[str, str]:
    """Run each test against ``impl``; return ``{test name: ""}`` for a pass or the error text for a failure
    (``"not attempted yet: Exercise 04.k: ..."`` for a test still blank).

    Tests that take a second parameter receive ``tmp_dir`` (like pytest's ``tmp_path``).
    """
    import inspect

    outcome = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tensors this small only lose time to thread hand-offs
    try:
        for name, test in tests.items():
            try:
                params = len(inspect.signature(test).parameters)
                torch.manual_seed(0)
                test(impl, Path(tmp_dir)) if params >= 2 else test(impl)
                outcome[name] = ""
            except NotImplementedError as exc:
                if not str(exc).startswith("Exercise "):
                    raise
                outcome[name] = f"{NOT_ATTEMPTED}{exc}"  # a blank test: the others are still judged
            except Exception as exc:  # a failing test is data here, not an error
                outcome[name] = f"{type(exc).__name__}: {exc}".strip()[:200] or type(exc).__name__
    finally:
        torch.set_num_threads(threads)
    return outcome


def print_suite(tests: dict[str, Callable[[Any], None]], impl: Reference | None = None) -> dict[str, str]:
    """Run the suite in a temporary folder and print one line per test (for the notebook)."""
    import tempfile

    impl = impl or Reference()
    with tempfile.TemporaryDirectory() as tmp:
        outcome = run_suite(tests, impl, tmp)
    for name, error in outcome.items():
        print(f"{'pass' if not error else 'FAIL'}  {name}  {error}")
    return outcome
