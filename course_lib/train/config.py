"""The run's configuration: one plain dataclass, checked completely before any work starts.

Every knob of the template is a field of :class:`TrainConfig`; the command line is generated from the fields
(``--eval-every 20``), and the checkpoint stores the *resolved* values (``device="cpu"``, not ``"auto"``;
the step count of the mode it was started in), so a resumed run can tell whether it is continuing the same
experiment.

Sizes that depend on the course mode (``COURSE_MODE=smoke|full``) are chosen when the config is created, via
``default_factory``; fields left as ``None`` (``warmup``, ``eval_every``, ``log_every``) are derived from
``steps`` in ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from course_lib.device import PRECISIONS, pick_device, resolve_amp_dtype
from course_lib.mode import by_mode

DATASETS = ("shapes", "cifar10", "text")
MODELS = ("cnn", "net", "gpt")
# Which models can read which data: the image models take [B, C, H, W], the GPT takes token ids [B, T].
COMPATIBLE = {"cnn": ("shapes", "cifar10"), "net": ("shapes", "cifar10"), "gpt": ("text",)}
AMP_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", None: "fp32"}
# Device types that hold real data ("meta" tensors have shapes only; nothing can be trained there).
TRAINING_DEVICES = ("cpu", "cuda", "mps")
# torch, numpy and the sampler all accept a seed this large, with room for the per-rank and per-epoch offsets.
MAX_SEED = 2**32 - 1


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field, the value and what is allowed.

    Taught in lesson 04 (``notebooks/04_template.ipynb``).
    """


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs to know.

    Optimisation: ``lr`` (peak learning rate), ``wd`` (AdamW weight decay, matrices only), ``warmup`` (linear
    warm-up steps, ``None`` = 5% of ``steps``), ``steps`` (optimizer steps), ``bs`` (micro-batch size),
    ``accum`` (micro-batches per optimizer step: effective batch = ``bs * accum * world_size``), ``clip``
    (max gradient norm; ``0``/``None`` disables clipping but the norm is still logged).

    Precision and device: ``amp_dtype`` (``"auto"|"bf16"|"fp16"|"fp32"``), ``device`` (``"auto"|"cpu"|"cuda"|
    "cuda:N"|"mps"``), ``compile`` (``torch.compile`` the model).

    Data and model: ``dataset`` (``"shapes"|"cifar10"|"text"``), ``model`` (``"cnn"|"net"|"gpt"``),
    ``workers`` (DataLoader worker processes), ``seed``.

    Bookkeeping: ``eval_every`` (evaluate + checkpoint period, ``None`` = a quarter of ``steps``), ``log_every``
    (``None`` = a twentieth of ``steps``), ``out`` (run directory for ``metrics.jsonl`` and ``ckpt.pt``).

    Taught in lesson 04 (``notebooks/04_template.ipynb``).
    """

    lr: float = 3e-3
    wd: float = 0.05
    warmup: int | None = None
    steps: int = field(default_factory=lambda: by_mode(smoke=12, full=1000))
    bs: int = field(default_factory=lambda: by_mode(smoke=16, full=64))
    accum: int = 1
    clip: float | None = 1.0
    amp_dtype: str = "auto"
    eval_every: int | None = None
    log_every: int | None = None
    seed: int = 0
    device: str = "auto"
    dataset: str = "shapes"
    model: str = "cnn"
    workers: int = 0
    compile: bool = False
    out: str = "runs/train"

    def __post_init__(self) -> None:
        # Derived defaults, only when steps itself is valid (validate() reports a bad steps value first).
        # (object.__setattr__: the config is frozen once built, so every part of a run reads the same values.)
        if _is_int(self.steps) and self.steps >= 1:
            if self.warmup is None:
                object.__setattr__(self, "warmup", self.steps // 20)
            if self.eval_every is None:
                object.__setattr__(self, "eval_every", max(1, self.steps // 4))
            if self.log_every is None:
                object.__setattr__(self, "log_every", max(1, self.steps // 20))
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> TrainConfig:
        """Check every field; raise :class:`ConfigError` naming the first bad one. Returns ``self``."""
        _check_number("lr", self.lr, low=0.0, low_open=True)
        _check_number("wd", self.wd, low=0.0)
        _check_int("steps", self.steps, low=1)
        _check_int("warmup", self.warmup, low=0)
        if self.warmup > self.steps:  # type: ignore[operator]
            raise ConfigError(f"warmup={self.warmup!r} must be <= steps={self.steps!r} "
                              "(warm-up steps are part of the run).")
        _check_int("bs", self.bs, low=1)
        _check_int("accum", self.accum, low=1)
        if self.clip is not None:
            _check_number("clip", self.clip, low=0.0, hint="use 0 or None to disable clipping")
        _check_int("eval_every", self.eval_every, low=1)
        _check_int("log_every", self.log_every, low=1)
        _check_int("seed", self.seed, low=0)
        if self.seed > MAX_SEED:
            raise ConfigError(f"seed={self.seed!r} is too large: seeds must be between 0 and {MAX_SEED} (2**32 - 1); "
                              "any value in that range gives an equally good random stream.")
        _check_int("workers", self.workers, low=0)
        if not isinstance(self.compile, bool):
            raise ConfigError(f"compile={self.compile!r} must be True or False.")
        _check_choice("dataset", self.dataset, DATASETS)
        _check_choice("model", self.model, MODELS)
        if self.dataset not in COMPATIBLE[self.model]:
            raise ConfigError(
                f"model={self.model!r} cannot train on dataset={self.dataset!r}; "
                f"{self.model!r} works with {COMPATIBLE[self.model]}."
            )
        if not isinstance(self.out, str) or not self.out:
            raise ConfigError(f"out={self.out!r} must be a non-empty directory path.")
        if not isinstance(self.device, str):
            raise ConfigError(f"device={self.device!r} must be a string such as 'auto', 'cpu', 'cuda', 'cuda:0' "
                              "or 'mps'.")
        try:
            device = pick_device(self.device)
        except ValueError as exc:
            raise ConfigError(f"device={self.device!r} is not usable here: {exc}") from None
        if device.type not in TRAINING_DEVICES:
            raise ConfigError(
                f"device={self.device!r} cannot train: {device.type!r} tensors hold no data (or are not supported "
                f"by the template); use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'."
            )
        _check_choice("amp_dtype", self.amp_dtype, PRECISIONS)
        if self.amp_dtype == "fp16" and device.type != "cuda":
            raise ConfigError(
                f"amp_dtype='fp16' needs a CUDA GPU (fp16 training relies on the GradScaler and fast fp16 kernels), "
                f"but device={self.device!r} resolves to {device.type!r}; use 'bf16' or 'fp32'."
            )
        try:
            resolve_amp_dtype(self.amp_dtype, device)
        except ValueError as exc:
            raise ConfigError(f"amp_dtype={self.amp_dtype!r}: {exc}") from None
        return self

    # --------------------------------------------------------------- resolution
    def torch_device(self) -> torch.device:
        """The device ``device`` resolves to on this machine."""
        return pick_device(self.device)

    def resolved(self, device: torch.device | str | None = None) -> TrainConfig:
        """A copy with ``device`` and ``amp_dtype`` replaced by what they mean here (``"auto"`` -> ``"cpu"``...)."""
        dev = torch.device(device) if device is not None else self.torch_device()
        return dataclasses.replace(self, device=str(dev), amp_dtype=AMP_NAMES[resolve_amp_dtype(self.amp_dtype, dev)])

    def to_dict(self) -> dict[str, Any]:
        """Plain ``dict`` of the fields (what the checkpoint and ``metrics`` store)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Rebuild a config from :meth:`to_dict` output; unknown keys are a :class:`ConfigError`."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s) {unknown}; known fields: {sorted(known)}.")
        return cls(**values)


# ---------------------------------------------------------------------- helpers
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: Any, *, low: int) -> None:
    if not _is_int(value) or value < low:
        raise ConfigError(f"{name}={value!r} must be an integer >= {low}.")


def _check_number(name: str, value: Any, *, low: float, low_open: bool = False, hint: str = "") -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low)
    if not ok:
        relation = ">" if low_open else ">="
        extra = f"; {hint}" if hint else ""
        raise ConfigError(f"{name}={value!r} must be a finite number {relation} {low}{extra}.")


def _check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not one of {allowed}.")
