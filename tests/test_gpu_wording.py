"""Lessons that explain a timed comparison in texts of their own say it in the words of the device they ran on.

Lesson 08's batch-size verdict and lesson 11's stage verdicts are explained by texts written in the notebook; each
picks them from the device's facts. Here those assignments are executed for the H200 of the GPU evidence and for
T4-, A100- and CPU figures (tests/device_figures.py): no CPU vocabulary (a CPU's caches or cores, BLAS, AVX) where
the device is a GPU, and on a CPU the texts the lessons always printed.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest

from device_figures import A100, CPU_PLAIN, H200, T4

ROOT = Path(__file__).resolve().parents[1]
CPU_WORDS = re.compile(r"\bCPU\b|BLAS|AVX|\bAMX\b|(?<!tensor )\bcores\b|caches?\b", re.I)
GPUS = {"H200": H200, "T4": T4, "A100": A100}


def assigned(lesson: str, names: set[str], facts: Any) -> dict[str, Any]:
    """The values the lesson's code assigns to ``names``, computed with ``facts`` as the device's facts."""
    cells = json.loads((ROOT / "notebooks" / lesson).read_text(encoding="utf-8"))["cells"]
    namespace: dict[str, Any] = {"facts": facts}
    found = set()
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        for node in ast.parse("".join(cell["source"])).body:
            targets = {t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)}
            if targets & names:
                exec(compile(ast.Module([node], []), lesson, "exec"), namespace)
                found |= targets
    assert found == names, f"{lesson} no longer assigns {names - found}"
    return {n: namespace[n] for n in names}


def texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in texts(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in texts(v)]
    return []


@pytest.mark.parametrize("gpu", list(GPUS))
def test_lesson_08s_batch_verdict_in_gpu_words(gpu: str) -> None:
    said = assigned("08_latency_memory.ipynb", {"slower_cause", "close_cause"}, GPUS[gpu])
    for text in texts(said):
        assert not CPU_WORDS.search(text), text
    cpu = assigned("08_latency_memory.ipynb", {"slower_cause", "close_cause"}, CPU_PLAIN)
    assert "CPU's caches" in cpu["slower_cause"] and "on this CPU" in cpu["close_cause"]


@pytest.mark.parametrize("gpu", list(GPUS))
def test_lesson_11s_stage_explanations_in_gpu_words(gpu: str) -> None:
    facts = GPUS[gpu]
    why = assigned("11_capstone.ipynb", {"CPU_WHY", "GPU_WHY", "WHY"}, facts)["WHY"]
    assert set(why) == {"loader workers", "in-memory data", "bf16", "compile", "no per-step sync"}
    for text in texts(why):
        assert not CPU_WORDS.search(text), text
    assert facts.low_precision_units in why["bf16"][0]
    on_cpu = assigned("11_capstone.ipynb", {"CPU_WHY", "GPU_WHY", "WHY"}, CPU_PLAIN)["WHY"]
    assert "this CPU has fast bf16 arithmetic" in on_cpu["bf16"][0]


def test_lesson_06s_accumulation_verdict_in_gpu_words() -> None:
    """Lesson 06 picks its device-dependent words for explain() as one dict, ``words``, by ``facts.is_gpu``."""
    for facts, cpu in ((H200, False), (T4, False), (CPU_PLAIN, True)):
        chosen = assigned("06_accumulation.ipynb", {"words"}, facts)["words"]
        assert set(chosen) == {"use_less", "quicker", "close"}
        assert bool(CPU_WORDS.search(" ".join(texts(chosen)))) == cpu, chosen
