"""Lesson 05's explanations replayed on devices this machine does not have.

The lesson explains its two speed verdicts (low precision vs fp32 training step; TF32 vs strict fp32 matmul) with
``lesson.explain(verdict, **precision_speed_texts(facts, ...))`` and ``**tf32_texts(facts, ...)``: the words come from
the device's facts, and "overhead-bound" from the profiler's kernel share. Here the same functions are fed the H200
of the GPU evidence (with the very verdicts it measured), T4-, L4-, A100- and P100-like GPUs, an Apple GPU and CPUs
(tests/device_figures.py), and every sentence is held to what the expectation table says a tensor-core GPU shows:

* no "keep fp32" where low precision won, where the step was overhead-bound, or where the GPU has tensor cores for
  the low-precision dtype;
* no CPU vocabulary (BLAS, AVX, AMX, "a CPU whose features were not read", the CPU's math library) on a GPU, and no
  GPU vocabulary (tensor cores) on a CPU;
* "overhead-bound" exactly when the kernel share says so;
* a GPU's sentence names what it has (tensor cores, the measured roofs).

On the H200 (evidence: 05_mixed_precision.full-mode.ipynb) lesson 05 printed "bf16 was 1.11x slower ... On this
cuda (a GPU, or a CPU whose features were not read) ... Keep fp32 for speed on this machine"; the checker below
flags that sentence (:func:`test_the_checker_flags_what_lesson_05_printed_on_the_h200`).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from course_lib import lesson
from course_lib.perf.compare import Measurement, Verdict, verdict_from_times
from course_lib.perf.device_facts import DeviceFacts
from course_lib.perf.kernel_time import KernelShare
from course_lib.perf.precision import precision_speed_texts, tf32_texts
from device_figures import A100, CPU_AMX, CPU_PLAIN, CPU_UNREAD, CPUS, GPUS, H200, T4

ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "notebooks" / "05_mixed_precision.ipynb"
CPU_WORDS = re.compile(r"\bCPU\b|BLAS|AVX|\bAMX\b|amx_|features were not read|math library", re.I)
GPU_WORDS = re.compile(r"tensor cores?|\bTF32 tensor|cuBLAS|\bkernels? launch", re.I)
KEEP_FP32 = re.compile(r"keep fp32", re.I)
OVERHEAD = re.compile(r"overhead-bound", re.I)


def rounds(median: float, spread: float = 0.03) -> tuple[float, ...]:
    """Seven rounds around ``median``."""
    return tuple(median * (1 + spread * k) for k in (-3, -2, -1, 0, 1, 2, 3))


def verdict(a: str, a_s: float, b: str, b_s: float) -> Verdict:
    return verdict_from_times(Measurement(a, rounds(a_s)), Measurement(b, rounds(b_s)))


# The verdicts lesson 05 measured on the H200 (GPU evidence): bf16 3.14 ms vs fp32 2.84 ms per step (slower);
# "high" 19.3 µs vs "highest" 30.1 µs per 256x256 matmul (faster).
H200_STEP = verdict("bf16", 3.14e-3, "fp32", 2.84e-3)
H200_TF32 = verdict('"high" (TF32 allowed)', 19.3e-6, '"highest" (strict fp32)', 30.1e-6)
OLD_H200_SENTENCE = (
    "On this machine bf16 was 1.11x slower than fp32 by wall-clock time (3.14 ms vs 2.84 ms per call, medians of 7 "
    "interleaved rounds with 8 intra-op threads; the rounds' middle half 1.05x to 1.16x). On this cuda (a GPU, or a "
    "CPU whose features were not read) the bf16 kernels did not make up for the casts autocast adds (every weight "
    "and activation converted on the way in, results converted back for fp32 ops): low precision cost time here. "
    "Keep fp32 for speed on this machine; bf16 pays off where the hardware has fast bf16 units.")


def share(kernel_fraction: float) -> KernelShare:
    return KernelShare(wall_s=1e-3, kernel_s=kernel_fraction * 1e-3)


OUTCOMES = {"faster": (1.0e-3, 2.0e-3), "slower": (2.0e-3, 1.0e-3), "too_close": (1.0e-3, 1.01e-3)}
BUSY = {"no instrument": None, "overhead-bound": 0.15, "kernels busy": 0.9}


def problems(text: str, facts: DeviceFacts, outcome: str, kernels: float | None, low: str) -> list[str]:
    """What a step explanation says wrongly for this device, outcome and kernel share (see the module docstring)."""
    found = []
    overhead = kernels is not None and kernels < 0.5
    tensor_cores = facts.kind == "cuda" and facts.capability is not None and facts.capability >= (
        (8, 0) if low == "bf16" else (7, 0))
    if KEEP_FP32.search(text) and (outcome == "faster" or overhead or tensor_cores):
        found.append("advises keeping fp32")
    if facts.is_gpu and CPU_WORDS.search(text):
        found.append(f"CPU vocabulary on a GPU: {CPU_WORDS.search(text).group(0)!r}")
    if facts.kind == "cpu" and GPU_WORDS.search(text):
        found.append(f"GPU vocabulary on a CPU: {GPU_WORDS.search(text).group(0)!r}")
    if bool(OVERHEAD.search(text)) != overhead:
        found.append("says overhead-bound without the instrument saying so" if not overhead else
                     "the kernel share says overhead-bound; the text does not")
    if tensor_cores and "tensor cores" not in text:
        found.append("does not name the tensor cores")
    if facts.matmul and facts.is_gpu and facts.roof_ratio(low) and "measured matmul roofs" not in text:
        found.append("does not cite the measured roofs")
    return found


DEVICES = {**GPUS, **CPUS}


@pytest.mark.parametrize("device", list(DEVICES))
@pytest.mark.parametrize("outcome", list(OUTCOMES))
@pytest.mark.parametrize("busy", list(BUSY))
def test_step_explanations_fit_the_device_outcome_and_instrument(device: str, outcome: str, busy: str) -> None:
    facts = DEVICES[device]
    low = facts.fast_low_precision
    kernels = BUSY[busy] if facts.kind == "cuda" else None  # only a CUDA GPU has the instrument
    shares = None if kernels is None else {low: share(kernels), "fp32": share(kernels)}
    v = verdict(low, OUTCOMES[outcome][0], "fp32", OUTCOMES[outcome][1])
    assert v.outcome == outcome
    text = lesson.explain(v, **precision_speed_texts(facts, low=low, busy=shares))
    assert text.startswith(v.sentence())
    assert not problems(text, facts, outcome, kernels, low), (device, outcome, busy, text)


def test_the_h200_verdicts_of_the_evidence_replayed() -> None:
    """What lesson 05 now says on the H200 for the verdicts it measured there."""
    plain = lesson.explain(H200_STEP, **precision_speed_texts(H200, low="bf16"))
    measured = lesson.explain(H200_STEP, **precision_speed_texts(H200, low="bf16",
                                                                 busy={"bf16": share(0.2), "fp32": share(0.25)}))
    assert H200_STEP.outcome == "slower"
    assert not problems(plain, H200, "slower", None, "bf16") and not problems(measured, H200, "slower", 0.2, "bf16")
    assert "758 TFLOP/s" in plain and "50.7 TFLOP/s" in plain and "NVIDIA H200" in plain
    assert "overhead-bound" in measured and "20%" in measured
    tf32 = lesson.explain(H200_TF32, **tf32_texts(H200, size=256))
    assert H200_TF32.outcome == "faster" and "tensor cores" in tf32 and not CPU_WORDS.search(tf32), tf32


def test_the_checker_flags_what_lesson_05_printed_on_the_h200() -> None:
    found = problems(OLD_H200_SENTENCE, H200, "slower", None, "bf16")
    assert "advises keeping fp32" in found and any("CPU vocabulary" in p for p in found), found
    assert "advises keeping fp32" in problems("Keep fp32 for speed.", T4, "slower", None, "fp16")
    assert problems("tensor cores", CPU_PLAIN, "slower", None, "bf16")
    assert problems("a step that is overhead-bound", A100, "slower", None, "bf16")  # no instrument said so


@pytest.mark.parametrize("device", list(DEVICES))
@pytest.mark.parametrize("outcome", list(OUTCOMES))
def test_tf32_explanations_name_what_the_device_has(device: str, outcome: str) -> None:
    facts = DEVICES[device]
    a, b = '"high" (TF32 allowed)', '"highest" (strict fp32)'
    v = verdict(a, OUTCOMES[outcome][0], b, OUTCOMES[outcome][1])
    text = lesson.explain(v, **tf32_texts(facts, size=8192))
    if facts.is_gpu:
        assert not CPU_WORDS.search(text), text
    else:
        assert "CPU" in text and not GPU_WORDS.search(text), text
    if facts.has_tf32 and outcome == "faster":
        assert "tensor cores" in text and "8192x8192" in text
    if facts.kind == "cuda" and not facts.has_tf32:
        assert "no TF32" in text and "compute capability 8.0" in text


def test_cpu_advice_follows_its_bf16_units() -> None:
    slower = verdict("bf16", 2e-3, "fp32", 1e-3)
    assert "Keep fp32" in lesson.explain(slower, **precision_speed_texts(CPU_PLAIN))
    assert "Keep fp32" not in lesson.explain(slower, **precision_speed_texts(CPU_AMX))
    assert "amx_bf16" in lesson.explain(slower, **precision_speed_texts(CPU_AMX))
    assert "lists no CPU flags" in lesson.explain(slower, **precision_speed_texts(CPU_UNREAD))
    with pytest.raises(ValueError, match="low='int8'"):
        precision_speed_texts(CPU_PLAIN, low="int8")


def _explain_calls(source: str) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "explain"]


def test_lesson_05_explains_and_sizes_from_the_device() -> None:
    """The lesson itself calls what is replayed above: both speed verdicts explained by the library's functions of
    the device's facts (the step's with the profiler's kernel share), its workloads from the sizing module."""
    cells = ["".join(c["source"]) for c in json.loads(LESSON.read_text(encoding="utf-8"))["cells"]
             if c["cell_type"] == "code"]
    source = "\n".join(cells)
    splatted = {}
    for cell in cells:
        for call in _explain_calls(cell):
            for k in call.keywords:
                if k.arg is None and isinstance(k.value, ast.Call) and isinstance(k.value.func, ast.Name):
                    splatted[k.value.func.id] = ast.unparse(k.value)
    assert "precision_speed_texts" in splatted and "busy=busy" in splatted["precision_speed_texts"], splatted
    assert "tf32_texts" in splatted, "lesson 05's TF32 verdict is not explained from the device's facts"
    for needed in ("sizes_for(facts)", "device_facts(device)", "kernel_share(", "sizes.tf32_size",
                   "sizes.precision_batch", "sizes.precision_width", "sizes.precision_steps"):
        assert needed in source, f"lesson 05 does not use {needed}"
    assert "features were not read" not in source and "/proc/cpuinfo" not in source
