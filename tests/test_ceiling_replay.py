"""Lesson 14's sizes and explanations replayed on devices this machine does not have.

The lesson explains its verdicts with functions of the device's facts and measured ceiling
(``course_lib/perf/ceiling_lesson.py``). Here they are fed the H200 of the GPU evidence (its own figures and
verdicts: ../shared/gpu-evidence/h200-2026-12-04/14_ceiling.full-mode.ipynb), T4- and A100-like GPUs and CPUs
(tests/device_figures.py), and held to what lesson 14 must show:

* every timed comparison meets the sizing rule on a GPU, and the bf16-vs-fp32 matmul is at least the 8192 the
  expectation table reads (``14-bf16-matmul``), under the contender names it reads;
* no CPU vocabulary (BLAS, AVX, AMX, caches of a CPU) on a GPU, no GPU vocabulary on a CPU;
* numbers in sentences are computed from the figures given; a label says "overhead" only for calls that cost about
  what a tiny operation does, and "slow path" for a dtype slower than fp32;
* a prediction's ranges leave what this machine class measures far from a boundary, or say it sits on one.

On the H200 lesson 14 printed "handing the work to the BLAS library" and "this device has bf16 matrix instructions"
(the CPU's words); the checker below flags those sentences.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_lib.perf.ceiling import SLOWER, Ceiling
from course_lib.perf.ceiling_lesson import (
    BF16_EXPECTATION_SIZE,
    batch_texts,
    ceiling_ratio_text,
    ceiling_sizes,
    chain_work,
    dtype_texts,
    fusion_texts,
    limit_label,
    linear_work,
    range_answer,
    size_texts,
    tiny_chain_texts,
)
from course_lib.perf.device_facts import DeviceFacts
from course_lib.perf.expectations import EXPECTATIONS
from course_lib.perf.sizing import matmul_work, meets_rule
from device_figures import A100, CPU_AMX, CPU_PLAIN, H200, T4

ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "notebooks" / "14_ceiling.ipynb"
CPU_WORDS = re.compile(r"\bCPU\b|BLAS(?<!cuBLAS)|\bAVX|\bAMX\b|amx_|avx512|last-level cache|generated loop", re.I)
GPU_WORDS = re.compile(r"tensor cores?|cuBLAS|\bL2\b|HBM|Triton|kernel launch|launching", re.I)
GPUS = {"H200": H200, "T4": T4, "A100": A100}
CPUS = {"CPU": CPU_PLAIN, "CPU with AMX": CPU_AMX}
OLD_H200_SENTENCES = (
    "A 64x64 multiply is only 0.5 MFLOP: the fixed cost of each call (Python, dispatch, allocating the output, "
    "handing the work to the BLAS library) is a large share of it",
    "A 512x512 multiply ran 1.32x as fast in bf16: this device has bf16 matrix instructions, so bf16 has its own, "
    "higher roof.",
)


def _cpu_words(text: str) -> list[str]:
    return [m.group(0) for m in CPU_WORDS.finditer(text.replace("cuBLAS", ""))] + (
        ["bf16 matrix instructions"] if "matrix instructions" in text else [])


def ceiling_of(facts: DeviceFacts, *, stopped: dict | None = None) -> Ceiling:
    """A ceiling with the facts' measured roofs (and, on a GPU, an H100-class datasheet for the H200)."""
    sheet = {"float32": 67e12, "bfloat16": 989e12, "float16": 989e12} if facts is H200 else None
    bandwidth = facts.bandwidth or 20e9
    matmul = dict(facts.matmul) or {"float32": 100e9, "bfloat16": 220e9}
    return Ceiling(device=facts.kind, name=facts.name, threads=1, torch_version="x", matmul=matmul,
                   best_shape={d: (512, 512, 512) for d in matmul},
                   sweep=[{"dtype": d, "m": 64, "n": 64, "k": 64, "flops_per_s": f} for d, f in matmul.items()],
                   copy_bandwidth=bandwidth, triad_bandwidth=bandwidth, datasheet=sheet, stopped=stopped or {})


def all_texts(facts: DeviceFacts) -> str:
    ceiling = ceiling_of(facts)
    low = "bfloat16" if "bfloat16" in ceiling.matmul else "float16"
    parts = [size_texts(facts), dtype_texts(facts, ceiling, low), batch_texts(facts), fusion_texts(facts),
             tiny_chain_texts(facts, ops=13, call_s=12.2e-6, compiled_s=77.5e-6, eager_s=157e-6)]
    return " ".join(t for p in parts for t in p.values()) + " " + ceiling_ratio_text(ceiling, facts)


def test_the_checker_flags_what_lesson_14_printed_on_the_h200() -> None:
    for sentence in OLD_H200_SENTENCES:
        assert _cpu_words(sentence), sentence


@pytest.mark.parametrize("name", list(GPUS))
def test_a_gpu_is_explained_in_a_gpus_words(name: str) -> None:
    text = all_texts(GPUS[name])
    assert not _cpu_words(text), (name, _cpu_words(text))
    assert "tensor cores" in text or "no tensor cores" in text
    assert "cuBLAS" in text and "launching" in text


@pytest.mark.parametrize("name", list(CPUS))
def test_a_cpu_is_explained_in_a_cpus_words(name: str) -> None:
    text = all_texts(CPUS[name])
    assert not GPU_WORDS.search(text), GPU_WORDS.search(text)
    assert "BLAS library" in text


@pytest.mark.parametrize("name", list(GPUS))
def test_every_timed_comparison_meets_the_rule_on_a_gpu(name: str) -> None:
    facts = GPUS[name]
    sizes = ceiling_sizes(facts, ceiling_of(facts))
    assert meets_rule(matmul_work(sizes.matmul_large), facts)
    assert meets_rule(matmul_work(sizes.dtype_matmul, element_bytes=2), facts)
    assert all(meets_rule(linear_work(sizes.linear_width, b), facts) for b in sizes.linear_batches)
    assert meets_rule(chain_work(sizes.chain_rows), facts)
    assert sizes.dtype_matmul >= BF16_EXPECTATION_SIZE


def test_the_bf16_comparison_is_the_one_the_expectation_reads() -> None:
    row = next(e for e in EXPECTATIONS if e.key == "14-bf16-matmul")
    assert row.lesson == LESSON.name and f"{BF16_EXPECTATION_SIZE}x{BF16_EXPECTATION_SIZE}" in row.shows
    cell = next("".join(c["source"]) for c in json.loads(LESSON.read_text())["cells"]
                if "dtype_texts(" in "".join(c["source"]))
    assert all(f'"{name}": square_matmul(n' in cell for name in (*row.faster, row.than))
    assert "n = sizes.dtype_matmul" in cell


def test_a_cpu_keeps_its_sizes_and_bounds_a_slow_low_precision_matmul(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COURSE_MODE", "full")
    fast = ceiling_sizes(CPU_PLAIN, ceiling_of(CPU_PLAIN))
    assert (fast.matmul_large, fast.dtype_matmul, fast.linear_width, fast.chain_rows) == (1024, 512, 1024, 4096)
    # The CPU: bf16 at 0.29 GFLOP/s (one 2048-wide multiply took 59 s); a 512 call would take 0.9 s.
    slow = ceiling_of(CPU_PLAIN, stopped={"bfloat16": {"reason": SLOWER, "shape": [128, 128, 128], "ratio": 0.01}})
    slow.matmul["bfloat16"] = 0.29e9
    sized = ceiling_sizes(CPU_PLAIN, slow)
    assert 2 * sized.dtype_matmul**3 / 0.29e9 <= 0.05 and sized.dtype_matmul >= 64
    assert "no fast bf16 path" in sized.why
    assert "slow bf16 path" in dtype_texts(CPU_PLAIN, slow)["slower"]


def test_labels_tell_a_slow_dtype_path_and_a_shape_from_overhead() -> None:
    slow = ceiling_of(CPU_PLAIN, stopped={"bfloat16": {"reason": SLOWER, "shape": [128, 128, 128], "ratio": 0.01}})
    # The 1024 bf16 matmul, ~2.5 s a call, was labelled overhead-bound.
    assert limit_label(0.05, "compute", "bfloat16", slow, call_s=2.5, launch_s=3e-6).startswith("slow bf16 path")
    assert limit_label(0.29, "compute", "float32", slow, call_s=0.07, launch_s=3e-6).startswith(
        "compute-bound, below its roof at this shape")
    assert limit_label(0.007, "memory", "float32", slow, call_s=3e-6, launch_s=3e-6).startswith("overhead-bound")
    assert limit_label(0.5, "memory", "float32", slow, call_s=1e-3, launch_s=3e-6) == "memory-bound"
    # The H200's Linear at batch 8 (22.6 µs against a 12.2 µs tiny operation): overhead.
    assert limit_label(0.01, "memory", "float32", ceiling_of(H200), call_s=22.6e-6, launch_s=12.2e-6).startswith(
        "overhead-bound")


def test_numbers_in_sentences_come_from_the_figures() -> None:
    texts = tiny_chain_texts(H200, ops=13, call_s=12.2e-6, compiled_s=77.5e-6, eager_s=157e-6)
    assert "13 operations in 157 µs, 12.1 µs each" in texts["faster"]
    assert "about 6.4 small calls' worth" in texts["faster"] and "one call remain" not in texts["faster"]
    said = ceiling_ratio_text(ceiling_of(CPU_PLAIN), CPU_PLAIN)  # 100 GFLOP/s fp32 measured
    assert "670x" in said and "9,890x" in said and "hundred" not in said
    assert ceiling_ratio_text(ceiling_of(H200), H200) == ("This GPU's measured roofs reach fp32 76%, bf16 77%, "
                                                          "fp16 75% of its datasheet peaks.")


def test_the_overhead_question_leaves_what_machines_measure_far_from_a_boundary() -> None:
    cell = next("".join(c["source"]) for c in json.loads(LESSON.read_text())["cells"]
                if "OVERHEAD_RANGES = " in "".join(c["source"]))
    labels = json.loads(cell.split("OVERHEAD_RANGES = ", 1)[1].split("\n", 1)[0])
    bounds = (3, 15, 150)
    # This CPU: 50.9x (middle half 44-65x); the H200: fifty launches against one, about 50x.
    for measured in (44, 50.9, 65):
        assert range_answer(measured, bounds, labels) == ("15-150x", "")
    # The old ranges ended at 50x: the same measurement sat on the boundary, and the answer flipped between runs.
    answer, note = range_answer(50.9, (2, 10, 50), ["under 2x", "2-10x", "10-50x", "more than 50x"])
    assert answer == "more than 50x" and "sits on the boundary at 50x" in note
    with pytest.raises(ValueError, match="increasing bounds"):
        range_answer(1.0, (2, 1), ["a", "b", "c"])


def test_the_share_question_leaves_what_machines_measure_far_from_a_boundary() -> None:
    cell = next("".join(c["source"]) for c in json.loads(LESSON.read_text())["cells"]
                if "SHARE_RANGES = " in "".join(c["source"]))
    labels = json.loads(cell.split("SHARE_RANGES = ", 1)[1].split("\n", 1)[0])
    # This CPU's small GPT: 55.8% and 60.8% of its ceiling in two runs (the old ranges ended at 60%).
    for share in (0.43, 0.558, 0.608):
        assert range_answer(share, (0.05, 0.25, 0.8), labels, unit="%") == ("25-80%", "")
    assert range_answer(0.608, (0.1, 0.3, 0.6), labels, unit="%")[1]  # the old boundary: on it
    assert "range_answer(gpt_share, (0.05, 0.25, 0.8), SHARE_RANGES" in "".join(
        "".join(c["source"]) for c in json.loads(LESSON.read_text())["cells"])
