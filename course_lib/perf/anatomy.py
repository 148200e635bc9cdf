"""The anatomy of one training step: the FLOPs it does and the memory it holds, counted and predicted.

The model is a plain MLP (:class:`MLPSpec`, :func:`build_mlp`): an optional token embedding, then ``Linear`` layers
with a ``ReLU`` (and optionally a ``Dropout``) between them, trained with ``cross_entropy``. Small enough to reason
about exactly, and the same arithmetic as a transformer's MLP block.

**FLOPs** (:func:`step_flops`, checked against :func:`counted_step_flops`, which runs
``torch.utils.flop_counter.FlopCounterMode``). A ``Linear(a, b)`` on ``N = batch * tokens`` rows is a matrix multiply
of ``N x a`` by ``a x b``: ``2 N a b`` FLOPs forward (a multiply-add is two FLOPs; the bias add is not counted).
Backward does two such multiplies: the weight's gradient (``x^T @ grad``) and the input's gradient (``grad @ W``)
-- so a training step costs three forwards, the "6 N per token" rule. Except where the input's gradient is not
needed: the first layer of a model fed raw floats (the data needs no gradient) does only the weight's. An embedding
is a lookup, not a multiply (0 FLOPs), but its output needs a gradient, so the first ``Linear`` after it does both.

**Memory** of a training step, by category (:func:`measured_memory` measures it, :func:`predict_memory` predicts it
by formula, and the two agree to the byte):

* *parameters* and *gradients*: one tensor each per parameter, in the model's dtype;
* *optimizer state*: AdamW keeps two tensors per parameter (``exp_avg``, ``exp_avg_sq``, model dtype) and a
  float32 ``step`` scalar per parameter tensor; SGD with momentum one (``momentum_buffer``); plain SGD nothing;
* *activations*: what autograd saves for backward during the forward and the loss (PyTorch on a CPU):

  ============================  ==========================================================================
  operation                     saves
  ============================  ==========================================================================
  ``Embedding``                 the token ids (int64)
  ``Linear``                    its input (even the data, which needs no gradient: the weight's gradient
                                reads it); the weight too, but that is a parameter, not counted again
  ``ReLU``                      its output
  ``Dropout`` (CPU)             its mask, a tensor of the activation's dtype (not bool); its output is the
                                next ``Linear``'s input
  ``cross_entropy``             ``log_softmax``'s output (rows x classes), the int64 targets and a 0-dim
                                ``total_weight`` in the activation dtype
  ============================  ==========================================================================

  A storage saved by two operations is one piece of memory: without dropout the ``ReLU``'s output *is* the next
  ``Linear``'s input, counted once.

Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from course_lib.perf.precision import saved_activation_bytes

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
OPTIMIZERS = ("adamw", "sgd", "sgd_momentum")
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations")
INDEX_BYTES = 8  # token ids and class targets are int64
STEP_BYTES = 4  # AdamW's per-tensor ``step`` counter: a float32 scalar on the CPU


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class MLPSpec:
    """One MLP and its batch. ``widths``: input width, hidden widths..., classes (at least two entries).

    ``vocab``: when set, the input is ``(batch, tokens)`` token ids fed to ``nn.Embedding(vocab, widths[0])``;
    otherwise a float input ``(batch, tokens, widths[0])`` (``(batch, widths[0])`` when ``tokens == 1``) that needs no
    gradient. ``dropout`` > 0 puts a ``Dropout`` after each ``ReLU``. ``dtype`` (``"float32"`` or ``"bfloat16"``) is
    the whole model's and input's dtype (no autocast).

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """

    widths: tuple[int, ...]
    batch: int
    tokens: int = 1
    vocab: int | None = None
    dropout: float = 0.0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if isinstance(self.widths, list):
            object.__setattr__(self, "widths", tuple(self.widths))  # a list is fine; stored as a tuple (hashable)
        problem = None
        if not isinstance(self.widths, tuple) or len(self.widths) < 2 or not all(
                _whole(w) and w > 0 for w in self.widths):
            problem = (f"widths={self.widths!r} must be a tuple of at least two positive ints (input width, hidden "
                       "widths..., classes), e.g. (16, 32, 10)")
        elif not _whole(self.batch) or self.batch < 1:
            problem = f"batch={self.batch!r} must be a positive int"
        elif not _whole(self.tokens) or self.tokens < 1:
            problem = f"tokens={self.tokens!r} must be a positive int (1 for one example per row)"
        elif self.vocab is not None and (not _whole(self.vocab) or self.vocab < 1):
            problem = f"vocab={self.vocab!r} must be None (float inputs) or a positive int (token ids)"
        elif isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not (
                0 <= self.dropout < 1):
            problem = f"dropout={self.dropout!r} must be a probability in [0, 1) (0 for no Dropout layers)"
        elif self.dtype not in DTYPES:
            problem = f"dtype={self.dtype!r} is not one of {sorted(DTYPES)}; give its name as a string"
        if problem:
            raise ValueError(f"MLPSpec: {problem}.")

    @property
    def rows(self) -> int:
        """Rows every ``Linear`` multiplies: ``batch * tokens``."""
        return self.batch * self.tokens

    @property
    def element_size(self) -> int:
        """Bytes per element of the model's dtype."""
        return torch.finfo(DTYPES[self.dtype]).bits // 8


def _layers(spec: MLPSpec) -> list[tuple[int, int]]:
    return list(zip(spec.widths[:-1], spec.widths[1:]))


def build_mlp(spec: MLPSpec, seed: int = 0) -> nn.Sequential:
    """``[Embedding] Linear ReLU [Dropout] ... Linear`` in ``spec.dtype``, initialised from ``seed`` (the global
    random state is left as it was).

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    last = len(spec.widths) - 2
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        modules: list[nn.Module] = [nn.Embedding(spec.vocab, spec.widths[0])] if spec.vocab else []
        for i, (a, b) in enumerate(_layers(spec)):
            modules.append(nn.Linear(a, b))
            if i < last:
                modules.append(nn.ReLU())
                if spec.dropout > 0:
                    modules.append(nn.Dropout(spec.dropout))
    return nn.Sequential(*modules).to(DTYPES[spec.dtype])


def example_batch(spec: MLPSpec, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` for ``spec``: token ids or floats (see :class:`MLPSpec`), and int64 class targets, one per token.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    g = torch.Generator().manual_seed(seed)
    if spec.vocab:
        x = torch.randint(0, spec.vocab, (spec.batch, spec.tokens), generator=g)
    else:
        shape = (spec.batch, spec.widths[0]) if spec.tokens == 1 else (spec.batch, spec.tokens, spec.widths[0])
        x = torch.randn(shape, generator=g).to(DTYPES[spec.dtype])
    y = torch.randint(0, spec.widths[-1], x.shape[:2] if spec.vocab or spec.tokens > 1 else (spec.batch,),
                      generator=g)
    return x, y


def step_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The step's loss: ``cross_entropy`` over every token's logits.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


# ---------------------------------------------------------------- FLOPs
def step_flops(spec: MLPSpec) -> int:
    """FLOPs of one training step (forward, loss, backward) by formula; equal to :func:`counted_step_flops`.

    Per ``Linear(a, b)``: ``2 N a b`` forward, as much again for the weight's gradient, and as much again for the
    input's gradient unless the input needs none (the first layer without an embedding). Embedding, ReLU, dropout
    and the loss: 0 (``FlopCounterMode`` counts matrix multiplies).

    Written by the learner in exercise 19 (``exercises/19_flops.ipynb``).

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    total = 0
    for i, (a, b) in enumerate(_layers(spec)):
        forward = 2 * spec.rows * a * b
        input_grad = 0 if i == 0 and not spec.vocab else forward
        total += forward + forward + input_grad
    return total


def counted_step_flops(spec: MLPSpec) -> int:
    """FLOPs of one training step of :func:`build_mlp` on :func:`example_batch`, as ``FlopCounterMode`` counts them
    (the step runs: keep the spec small).

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    model = build_mlp(spec).train()
    x, y = example_batch(spec)
    with FlopCounterMode(display=False) as counter:
        step_loss(model(x), y).backward()
    return int(counter.get_total_flops())


# ---------------------------------------------------------------- memory
def make_optimizer(name: str, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """``"adamw"`` (AdamW), ``"sgd"`` (plain SGD) or ``"sgd_momentum"`` (SGD, momentum 0.9).

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    if name == "sgd_momentum":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    raise ValueError(f"optimizer={name!r} is not one of {list(OPTIMIZERS)}.")


def _bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measured_memory(spec: MLPSpec, optimizer: str) -> dict[str, int]:
    """Bytes by category (``parameters``, ``gradients``, ``optimizer_state``, ``activations``) of one training step
    of :func:`build_mlp`, measured: the tensors themselves after backward and one optimizer step, and what autograd
    saved during the forward and the loss (:func:`~course_lib.perf.precision.saved_activation_bytes`: each storage
    once, parameters apart).

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} is not one of {list(OPTIMIZERS)}.")
    model = build_mlp(spec).train()
    x, y = example_batch(spec)
    saved = saved_activation_bytes(model, x, loss_fn=lambda logits: step_loss(logits, y))
    opt = make_optimizer(optimizer, model.parameters())
    step_loss(model(x), y).backward()
    opt.step()
    params = list(model.parameters())
    return {
        "parameters": _bytes(params),
        "gradients": _bytes(p.grad for p in params if p.grad is not None),
        "optimizer_state": _bytes(v for state in opt.state.values() for v in state.values()
                                  if isinstance(v, torch.Tensor)),
        "activations": saved["activation_bytes"],
    }


def predict_memory(spec: MLPSpec, optimizer: str) -> dict[str, int]:
    """The same four categories as :func:`measured_memory`, by formula (the table in the module's docstring); equal
    to the measurement to the byte.

    Written by the learner in exercise 20 (``exercises/20_memory_anatomy.ipynb``).

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} is not one of {list(OPTIMIZERS)}.")
    size, rows = spec.element_size, spec.rows
    numel = sum(a * b + b for a, b in _layers(spec)) + (spec.vocab * spec.widths[0] if spec.vocab else 0)
    tensors = 2 * len(_layers(spec)) + (1 if spec.vocab else 0)
    state = {"adamw": 2 * numel * size + STEP_BYTES * tensors, "sgd_momentum": numel * size, "sgd": 0}[optimizer]
    # The first Linear's input: the data itself, or the embedding's output (plus the ids the embedding keeps).
    saved = rows * spec.widths[0] * size + (rows * INDEX_BYTES if spec.vocab else 0)
    for hidden in spec.widths[1:-1]:
        # ReLU's output; with dropout also the mask and dropout's output (the next Linear's input).
        saved += rows * hidden * size * (3 if spec.dropout > 0 else 1)
    saved += rows * spec.widths[-1] * size + rows * INDEX_BYTES + size  # log_softmax, targets, total_weight
    return {"parameters": numel * size, "gradients": numel * size, "optimizer_state": state, "activations": saved}


__all__ = [
    "CATEGORIES", "DTYPES", "OPTIMIZERS", "MLPSpec", "build_mlp", "counted_step_flops", "example_batch",
    "make_optimizer", "measured_memory", "predict_memory", "step_flops", "step_loss",
]
