"""Model FLOPs utilisation (MFU): how much of the GPU's peak arithmetic a training run actually uses.

The benchmark's GPU section trains a GPT-2-small-sized :class:`~course_lib.models.TinyGPT` (12 layers, 12 heads,
width 768, 1024 positions, vocabulary 50304: about 124 M parameters, the size nanoGPT reports MFU for) on random
tokens, and reports tokens/s and MFU for several contenders side by side in one run:

* ``bf16 + compile``: bf16 autocast, ``torch.compile`` (Inductor), fused AdamW -- nanoGPT's recipe;
* ``bf16 eager``: the same without compile (what compile buys);
* ``fp32 eager``: plain fp32 with TF32 off (what the tensor cores buy);
* the course's recipe for the hardware's limit, one step a row (:data:`RECIPE`; the benchmark runs them): the
  compiled bf16 step at the batch the GPU's memory allows (:func:`recipe_batch`: 64 on an H200, where the three
  rows above run at 16), then the same replayed as CUDA graphs (``mode="reduce-overhead"``). Every row trains
  with fused AdamW and attention through ``scaled_dot_product_attention`` (flash kernels on the GPU).

On GPUs without bf16 tensor cores (compute capability < 8.0: T4, V100) the low-precision contenders use fp16 with a
``GradScaler`` instead. Contenders are interleaved in rounds (A, B, C, B, C, A, ...) so that clock changes and
background load hit them alike; each figure is the median over rounds.

**FLOPs per token** (nanoGPT's ``estimate_mfu``, from the PaLM paper's appendix B)::

    flops_per_token = 6 * N + 12 * L * H * Q * T

``N`` parameters (position embeddings excluded, as nanoGPT does; the token embedding counts once because it is tied
to the output layer), ``L`` layers, ``H`` heads of width ``Q`` (so ``H * Q`` is the model width), ``T`` the
sequence length. ``6 N``: every parameter does one multiply-add (2 FLOPs) per token forward and two backward;
``12 L H Q T``: the attention scores and their weighted sum, which grow with the sequence and have no parameters.

**MFU** = ``tokens/s * flops_per_token / peak FLOP/s``. The peak is the dense (no sparsity) datasheet figure of the
precision the contender computes in: bf16/fp16 tensor cores for the low-precision rows, plain fp32 for the fp32 row
(:data:`GPU_PEAK_TFLOPS`, matched by device name; ``--peak-tflops`` gives the bf16/fp16 peak of a GPU not listed).
Attention through ``scaled_dot_product_attention`` with ``is_causal=True`` skips half the score matrix, so the
formula slightly over-counts work done and MFU is an upper estimate -- the same convention nanoGPT uses.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from course_lib import clock
from course_lib.device import autocast, matmul_precision
from course_lib.models import GPTConfig, TinyGPT
from course_lib.perf.timing import Timer
from course_lib.train.loss import mean_cross_entropy
from course_lib.train.optim import BETAS, param_groups

# Dense peak TFLOP/s from vendor datasheets: (bf16 or fp16 tensor cores with fp32 accumulation, plain fp32).
# Keys are matched as whole words in torch.cuda.get_device_name(), the longest key first ("H100 PCIe" before
# "H100", "A10G" before "A10", "L40S" before "L40"), so the SXM figure is the default for a bare "H100".
GPU_PEAK_TFLOPS: dict[str, tuple[float, float]] = {
    "B200": (2250.0, 80.0),
    "H200 NVL": (835.0, 60.0),
    "H200": (989.0, 67.0),
    "GH200": (989.0, 67.0),
    "H100 NVL": (835.0, 60.0),
    "H100 PCIe": (756.0, 51.0),
    "H100": (989.0, 67.0),
    "A100": (312.0, 19.5),
    "A800": (312.0, 19.5),
    "A10G": (70.0, 35.0),
    "A10": (125.0, 31.2),
    "A30": (165.0, 10.3),
    "L40S": (362.0, 91.6),
    "L40": (181.0, 90.5),
    "L4": (121.0, 30.3),
    "RTX 6000 Ada": (364.0, 91.1),
    "RTX A6000": (155.0, 38.7),
    "RTX 4090": (165.2, 82.6),
    "RTX 4080": (97.5, 48.7),
    "RTX 3090": (71.0, 35.6),
    "V100": (125.0, 15.7),
    "T4": (65.0, 8.1),
}

GPT2_SMALL = GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768, dropout=0.0, bias=True)
TINY = GPTConfig(vocab_size=256, block_size=128, n_layer=2, n_head=4, n_embd=128, dropout=0.0, bias=True)
MODELS = {"gpt2-small": GPT2_SMALL, "tiny": TINY}


def gpt_flops_per_token(n_params: int, n_layer: int, n_embd: int, seq_len: int) -> float:
    """Training FLOPs per token, ``6 N + 12 L H Q T`` (``n_embd = H * Q``): see the module docstring.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    return 6 * n_params + 12 * n_layer * n_embd * seq_len


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation, a fraction of ``peak_flops`` (``None`` when the peak is unknown)."""
    if not peak_flops:
        return None
    return tokens_per_s * flops_per_token / peak_flops


def _find_key(name: str) -> str | None:
    for key in sorted(GPU_PEAK_TFLOPS, key=len, reverse=True):
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name, flags=re.IGNORECASE):
            return key
    return None


def peak_flops(name: str, override_tflops: float | None = None, precision: str = "bf16") -> float | None:
    """Dense peak FLOP/s of GPU ``name`` for ``precision`` (``"bf16"``/``"fp16"`` or ``"fp32"``), or ``None``.

    ``override_tflops`` (the ``--peak-tflops`` flag) is the bf16/fp16 peak and wins over the table; an fp32 peak
    comes from the table only. ``None`` means unknown: MFU is then left out and the report says to pass the flag.
    """
    if precision not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"precision={precision!r} must be 'bf16', 'fp16' or 'fp32'.")
    if override_tflops is not None and precision != "fp32":
        if override_tflops <= 0:
            raise ValueError(f"peak TFLOP/s must be > 0, got {override_tflops}.")
        return override_tflops * 1e12
    key = _find_key(name)
    if key is None:
        return None
    half, single = GPU_PEAK_TFLOPS[key]
    return (single if precision == "fp32" else half) * 1e12


def non_embedding_params(model: TinyGPT) -> int:
    """Parameters counted in ``6 N``: all of them (tied ones once) except the position embeddings.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    return sum(p.numel() for p in model.parameters()) - model.pos_emb.weight.numel()


# ------------------------------------------------------------------------------------------------ the run
@dataclass(frozen=True)
class Contender:
    """One way of training the same model: a precision (``"low"`` = bf16, or fp16 without bf16), compile, the batch
    (``memory_batch``: as large as the device's memory allows, :func:`recipe_batch`; else the run's batch) and the
    compile mode (``"reduce-overhead"``: Inductor replays the step as CUDA graphs; a CUDA GPU only)."""

    name: str
    precision: str  # "low" or "fp32"
    compiled: bool
    memory_batch: bool = False
    compile_mode: str | None = None


CONTENDERS = (Contender("bf16 + compile", "low", True), Contender("bf16 eager", "low", False),
              Contender("fp32 eager", "fp32", False))
# The course's recipe, one step a row after the three above: the compiled bf16 step (fused AdamW, attention through
# SDPA's flash kernels) at the batch the memory allows, then replayed as CUDA graphs.
RECIPE = (Contender("bf16 + compile, batch for memory", "low", True, memory_batch=True),
          Contender("bf16 + compile, batch for memory, CUDA graphs", "low", True, memory_batch=True,
                    compile_mode="reduce-overhead"))


@dataclass
class GPTBenchConfig:
    """What the GPU section runs: model size, steps, rounds, batch and a soft time budget."""

    model: str = "gpt2-small"
    warmup_steps: int = 10  # untimed; the compiled contender compiles in its first step
    timed_steps: int = 20  # per contender, split over ``rounds``
    rounds: int = 5
    batch: int | None = None  # None: chosen from the device's memory, halved on out-of-memory
    time_budget_s: float = 120.0  # from the start (compile included), no new round starts once this is spent
    compile_backend: str = "inductor"
    contenders: Sequence[Contender] = field(default_factory=lambda: CONTENDERS)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model={self.model!r} is not one of {sorted(MODELS)}.")
        for name in ("warmup_steps", "timed_steps", "rounds"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (0 if name == "warmup_steps" else 1):
                raise ValueError(f"{name}={value!r} must be a positive integer.")
        if self.batch is not None and (not isinstance(self.batch, int) or self.batch < 1):
            raise ValueError(f"batch={self.batch!r} must be a positive integer or None (automatic).")
        if not self.contenders:
            raise ValueError("contenders must name at least one contender.")


class LMLoss(nn.Module):
    """Mean next-token cross-entropy of a language model: compiled as one module, logits and loss fuse."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.model(x)
        return mean_cross_entropy(logits, y)  # flattened to [B*T, V], in fp32


def batch_for_memory(total_gib: float) -> int:
    """GPT-2-small sequences per batch that leave room for three contenders on a GPU of ``total_gib``.

    About 2 GiB per contender for weights, gradients and AdamW moments, about 1.5 GiB per sequence for fp32 eager
    activations and logits, 60 % of the memory used, rounded down to a power of two, at most 16: 16 on 80 GB,
    8 on 40 GB, 4 on 24 GB, 2 on 16 GB. An out-of-memory error halves it anyway.
    """
    fits = int(max(1.0, (0.6 * total_gib - 6.0) / 1.5))
    return min(16, 2 ** (fits.bit_length() - 1))


def recipe_batch(total_gib: float, contenders: int = len(CONTENDERS) + len(RECIPE)) -> int:
    """GPT-2-small sequences per batch for the recipe's compiled bf16 step on a GPU of ``total_gib``.

    About 2 GiB per contender for its weights, gradients and AdamW moments (every contender keeps its copy), about
    1 GiB per sequence for a compiled bf16 step's activations and logits (flash attention keeps no score matrix),
    70 % of the memory used, rounded down to a power of two, at most 128: 64 on 141 GB, 32 on 80 GB, 8 on 24 GB.
    An out-of-memory error halves it for that contender alone.
    """
    fits = int(max(1.0, 0.7 * total_gib - 2.0 * contenders))
    return min(128, 2 ** (fits.bit_length() - 1))


def auto_batch(device: torch.device, model: str = "gpt2-small") -> int:
    """:func:`batch_for_memory` of ``device`` for GPT-2 small on CUDA; 8 otherwise (the tiny model, the CPU)."""
    if model != "gpt2-small" or device.type != "cuda":
        return 8
    return batch_for_memory(torch.cuda.get_device_properties(device).total_memory / 2**30)


def low_precision_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the GPU has bf16 tensor cores (compute capability >= 8.0) or on the CPU; fp16 otherwise."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 8:
        return torch.float16
    return torch.bfloat16


class _Runner:
    """A contender's model copy, optimizer and training steps (weights identical across contenders)."""

    def __init__(self, contender: Contender, base: TinyGPT, device: torch.device, backend: str,
                 batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.contender = contender
        self.device = device
        self.model = copy.deepcopy(base).to(device).train()
        groups = [{k: v for k, v in g.items() if k != "names"} for g in param_groups(self.model, 0.1)]
        fused = True if device.type == "cuda" else None  # fused AdamW: one kernel for the whole update
        self.opt = torch.optim.AdamW(groups, lr=6e-4, betas=BETAS, fused=fused)
        loss = LMLoss(self.model)
        options = {"mode": contender.compile_mode} if contender.compile_mode else {}
        self.loss = torch.compile(loss, backend=backend, **options) if contender.compiled else loss
        self.amp = low_precision_dtype(device) if contender.precision == "low" else None
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.amp == torch.float16)
        self.x, self.y = batch
        self.tokens_per_step = self.x.numel()
        self.last_loss: torch.Tensor | None = None

    @property
    def precision_name(self) -> str:
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.amp]

    def steps(self, n: int) -> None:
        # fp32 means fp32: TF32 off, so the fp32 row shows what the tensor cores add.
        strict = matmul_precision("highest") if self.amp is None else contextlib.nullcontext()
        graphs = self.contender.compile_mode == "reduce-overhead"
        with strict:
            for _ in range(n):
                if graphs:  # a replay overwrites the last one's outputs: tell the graphs a new step begins
                    torch.compiler.cudagraph_mark_step_begin()
                with autocast(self.device, self.amp):
                    loss = self.loss(self.x, self.y)
                self.scaler.scale(loss).backward()
                self.scaler.step(self.opt)
                self.scaler.update()
                self.opt.zero_grad(set_to_none=True)
                self.last_loss = loss.detach().clone() if graphs else loss.detach()


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def memory_batch_size(device: torch.device, batch: int) -> int:
    """The recipe's batch on ``device``: :func:`recipe_batch` of a CUDA GPU's memory; twice ``batch`` elsewhere (the
    tiny model on a CPU, so the recipe's rows run in the tests)."""
    if device.type != "cuda":
        return 2 * batch
    return recipe_batch(torch.cuda.get_device_properties(device).total_memory / 2**30)


def _warm_up(cfg: GPTBenchConfig, gpt_cfg: GPTConfig, base: TinyGPT, device: torch.device, batch: int,
             log: Callable[[str], None]
             ) -> tuple[list[_Runner], dict[str, float], dict[str, str], dict[str, str]]:
    """Build every contender and run its warm-up steps; a contender that fails is reported, not fatal.

    Contenders at the run's ``batch``: out of memory is re-raised (the caller halves the batch). A recipe contender
    at the memory's batch halves its own batch on out of memory, down to twice ``batch``. Any other failure (a
    compile error, say) drops that contender with its reason. Returns runners, warm-up seconds, failures, skips.
    """
    g = torch.Generator().manual_seed(1)
    data: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def batch_of(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        if size not in data:
            shape = (size, gpt_cfg.block_size)
            data[size] = (torch.randint(0, gpt_cfg.vocab_size, shape, generator=g).to(device),
                          torch.randint(0, gpt_cfg.vocab_size, shape, generator=g).to(device))
        return data[size]

    big = memory_batch_size(device, batch)
    runners, warm_s, failed, skipped = [], {}, {}, {}
    for contender in cfg.contenders:
        if contender.compile_mode == "reduce-overhead" and device.type != "cuda":
            skipped[contender.name] = "CUDA graphs need a CUDA GPU"
            continue
        if contender.memory_batch and big <= batch:
            skipped[contender.name] = f"the memory allows no batch above {batch}"
            continue
        size = big if contender.memory_batch else batch
        while True:
            try:
                runner = _Runner(contender, base, device, cfg.compile_backend, batch_of(size))
                with Timer(device) as t:
                    runner.steps(max(1, cfg.warmup_steps))
                error = None
            except Exception as exc:  # compile errors come in many types; one contender must not sink all
                if _is_oom(exc) and not contender.memory_batch:
                    raise
                error = _error_text(exc)
                oom = _is_oom(exc)
            if error is None or not oom or size // 2 < 2 * batch:
                break
            runner = None  # the failed copy's memory goes before the retry
            data.pop(size, None)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            size //= 2
            log(f"  {contender.name}: out of memory, retrying with batch {size}")
        if error is not None:
            failed[contender.name] = error
            log(f"  {contender.name}: failed: {error}")
            continue
        runners.append(runner)
        warm_s[contender.name] = t.elapsed
        log(f"  {contender.name}: {cfg.warmup_steps} warm-up steps in {t.elapsed:.1f} s (batch {size})")
    return runners, warm_s, failed, skipped


def _warm_up_fitting(cfg: GPTBenchConfig, gpt_cfg: GPTConfig, base: TinyGPT, device: torch.device, batch: int,
                     log: Callable[[str], None]
                     ) -> tuple[list[_Runner], dict[str, float], dict[str, str], dict[str, str], int]:
    """:func:`_warm_up` at ``batch``, halved after each out-of-memory error; also returns the batch that fitted."""
    while True:
        try:
            runners, warm_s, failed, skipped = _warm_up(cfg, gpt_cfg, base, device, batch, log)
            return runners, warm_s, failed, skipped, batch
        except Exception as exc:  # anything but out-of-memory is re-raised
            if batch == 1 or not _is_oom(exc):
                raise
            reason = _error_text(exc)
        # Outside the except block, so the traceback (and the tensors its frames hold) is gone before retrying.
        if device.type == "cuda":
            torch.cuda.empty_cache()
        batch //= 2
        log(f"  out of memory ({reason[:80]}...): retrying with batch {batch}")


def _timed_rounds(runners: list[_Runner], cfg: GPTBenchConfig, device: torch.device, per_round: int, *,
                  log: Callable[[str], None], t_start: float) -> dict[str, list[float]]:
    """Seconds of each round of ``per_round`` steps, per contender; who goes first rotates; stops at the budget."""
    times: dict[str, list[float]] = {r.contender.name: [] for r in runners}
    for rnd in range(cfg.rounds):
        if rnd > 0 and clock.now() - t_start > cfg.time_budget_s:  # at least one round always runs
            log(f"  time budget of {cfg.time_budget_s:.0f} s spent after {rnd} round(s)")
            break
        order = runners[rnd % len(runners):] + runners[: rnd % len(runners)]  # rotate who goes first
        for r in order:
            with Timer(device) as t:
                r.steps(per_round)
            times[r.contender.name].append(t.elapsed)
    return times


def _result_rows(runners: list[_Runner], times: dict[str, list[float]], warm_s: dict[str, float], *,
                 steps_per_round: int, fpt: float, peak: Callable[[str], float | None]) -> list[dict[str, Any]]:
    """One row per contender: tokens/s (median and per round), MFU, final loss, and ratios to the first."""
    rows = []
    for r in runners:
        tps = [r.tokens_per_step * steps_per_round / s for s in times[r.contender.name]]
        prec = r.precision_name
        peak_of_prec = peak(prec)
        rows.append({
            "contender": r.contender.name, "precision": prec, "compiled": r.contender.compiled,
            "batch": int(r.x.shape[0]),
            "tokens_per_s": statistics.median(tps), "tokens_per_s_rounds": tps, "peak_flops": peak_of_prec,
            "mfu": mfu(statistics.median(tps), fpt, peak_of_prec),
            "final_loss": float(r.last_loss) if r.last_loss is not None else float("nan"),
            "warmup_s": warm_s[r.contender.name],
        })
    head = rows[0]
    for row in rows:
        per_round_ratio = [a / b for a, b in zip(row["tokens_per_s_rounds"], head["tokens_per_s_rounds"])]
        row["vs_first"] = statistics.median(per_round_ratio)
        row["vs_first_range"] = (min(per_round_ratio), max(per_round_ratio))
    return rows


def run_gpt_bench(cfg: GPTBenchConfig, device: torch.device | str, *, peak_tflops: float | None = None,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train each contender of ``cfg`` side by side on ``device``: tokens/s, MFU and ratios (see the module doc).

    The first contender is the reference of every ratio. Rounds are timed with the device synchronised at both
    ends (:class:`~course_lib.perf.timing.Timer`), so queued GPU work is counted where it belongs.
    """
    device = torch.device(device)
    gpt_cfg = MODELS[cfg.model]
    torch.manual_seed(0)
    with device:  # initialised where it trains: 124 M normal_ draws are slow on a CPU
        base = TinyGPT(gpt_cfg)
    n_params = non_embedding_params(base)
    fpt = gpt_flops_per_token(n_params, gpt_cfg.n_layer, gpt_cfg.n_embd, gpt_cfg.block_size)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    batch = cfg.batch or auto_batch(device, cfg.model)
    t_start = clock.now()
    runners, warm_s, failed, skipped, batch = _warm_up_fitting(cfg, gpt_cfg, base, device, batch, log)
    if not runners:
        raise RuntimeError("every contender failed: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    per_round = max(1, cfg.timed_steps // cfg.rounds)
    times = _timed_rounds(runners, cfg, device, per_round, log=log, t_start=t_start)
    rows = _result_rows(runners, times, warm_s, steps_per_round=per_round, fpt=fpt,
                        peak=lambda prec: peak_flops(name, peak_tflops, prec))
    head = rows[0]
    for row in rows:
        log(f"  {row['contender']}: " + ", ".join(f"{t:,.0f}" for t in row["tokens_per_s_rounds"])
            + " tokens/s per round")
    best = max(rows, key=lambda row: row["tokens_per_s"] * fpt / (row["peak_flops"] or math.inf))
    result = {
        "gpu": name, "model": cfg.model, "n_params_non_embedding": n_params,
        "n_params_total": sum(p.numel() for p in base.parameters()), "batch": batch, "seq_len": gpt_cfg.block_size,
        "flops_per_token": fpt, "rows": rows, "failed": failed, "skipped_contenders": skipped,
        "rounds": len(times[runners[0].contender.name]), "best": best["contender"],
        "steps_per_round": per_round, "warmup_steps": cfg.warmup_steps, "seconds": clock.now() - t_start,
        "peak_source": ("--peak-tflops" if peak_tflops else "datasheet table" if head["peak_flops"] else
                        "unknown GPU: pass --peak-tflops (its dense bf16/fp16 peak) for MFU"),
        "verdicts": verdicts(rows),
        # The headline figures (the first contender), under the names the benchmark table has always used.
        "tokens_per_s": head["tokens_per_s"], "mfu": head["mfu"], "peak_flops": head["peak_flops"],
    }
    return result


def verdicts(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One sentence per contender after the first, generated from the per-round ratios (never typed in)."""
    out = []
    first = rows[0]["contender"] if rows else ""
    for row in rows[1:]:
        lo, hi = row["vs_first_range"]
        if lo <= 1.0 <= hi:
            out.append(f"{row['contender']} vs {first}: too close to call (rounds {lo:.2f}x-{hi:.2f}x tokens/s).")
        else:
            word = "faster" if row["vs_first"] > 1 else "slower"
            factor = row["vs_first"] if row["vs_first"] > 1 else 1 / row["vs_first"]
            out.append(f"{row['contender']} is {factor:.2f}x {word} than {first} "
                       f"(every round between {lo:.2f}x and {hi:.2f}x its tokens/s).")
    return out


def format_rows(result: dict[str, Any]) -> str:
    """The GPU section as a Markdown table: one row per contender."""
    lines = ["| contender | precision | batch | tokens/s | MFU (datasheet) | datasheet peak | MFU (measured peak) "
             "| vs first |",
             "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        m = f"{row['mfu']:.1%}" if row["mfu"] is not None else "-"
        peak = f"{row['peak_flops'] / 1e12:g} TFLOP/s" if row["peak_flops"] else "unknown"
        # Against the best matmul this GPU reached in its own sweep (course_lib.perf.ceiling), where measured.
        measured = f"{row['mfu_measured']:.1%}" if row.get("mfu_measured") is not None else "-"
        lines.append(f"| {row['contender']} | {row['precision']} | {row.get('batch', result.get('batch', '-'))} | "
                     f"{row['tokens_per_s']:,.0f} | {m} | {peak} | {measured} | {row['vs_first']:.2f}x |")
    lines += [f"| {name} | skipped: {why} | | | | | | |" for name, why in result.get("skipped_contenders", {}).items()]
    return "\n".join(lines)


__all__ = [
    "GPU_PEAK_TFLOPS", "GPT2_SMALL", "Contender", "CONTENDERS", "GPTBenchConfig", "LMLoss", "RECIPE", "auto_batch",
    "batch_for_memory", "memory_batch_size", "recipe_batch",
    "format_rows", "gpt_flops_per_token", "low_precision_dtype", "mfu", "non_embedding_params", "peak_flops",
    "run_gpt_bench", "verdicts",
]
