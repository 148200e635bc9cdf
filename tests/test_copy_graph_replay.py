"""Lessons 02 and 07's GPU-only comparisons, their explanations replayed on devices this machine does not have.

Lesson 02 times a host-to-GPU copy from pinned memory with ``non_blocking`` against one from pageable memory
(:mod:`course_lib.perf.transfer`); lesson 07 a CUDA graph's replay against the same small-kernel step run eagerly
(:mod:`course_lib.perf.graphs`). Both run on a CUDA GPU only. Fed the H200 of the GPU evidence and T4-, L4-, A100-
and P100-like figures (tests/device_figures.py), each explanation must agree with the expectation table
(:mod:`course_lib.perf.expectations`): the outcome the table expects is explained from the hardware, any other is
named as a miss of the expectation's key, the very verdict ``check_claims`` reports; no CPU vocabulary on a GPU;
"launch-bound" only when the profiler's kernel share says so. On a CPU or an Apple GPU nothing is timed and one
sentence says why, without GPU vocabulary.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import pytest

from course_lib import lesson
from course_lib.perf.compare import Measurement, verdict_from_times
from course_lib.perf.expectations import EXPECTATIONS, check_claims
from course_lib.perf.graphs import EAGER, GRAPH, graph_not_run, graph_texts
from course_lib.perf.kernel_time import KernelShare
from course_lib.perf.sizing import graph_step_size, graph_step_work
from course_lib.perf.transfer import PAGEABLE, PINNED, copy_not_run, copy_texts
from device_figures import CPUS, GPUS, H200, MPS

ROOT = Path(__file__).resolve().parents[1]
CPU_WORDS = re.compile(r"\bCPU\b|BLAS|AVX|\bAMX\b|amx_|features were not read|math library|\bcores\b", re.I)
GPU_WORDS = re.compile(r"tensor cores?|cuBLAS|\bkernels? launch|copy engine|HtoD", re.I)
LAUNCH_BOUND = re.compile(r"launch-bound", re.I)
CUDA = {name: facts for name, facts in GPUS.items() if facts.kind == "cuda"}
ELSEWHERE = {**CPUS, "MPS": MPS}
OUTCOMES = {"faster": (1.0e-3, 2.0e-3), "slower": (2.0e-3, 1.0e-3), "too_close": (1.0e-3, 1.01e-3)}
TABLE = {e.key: e for e in EXPECTATIONS}


def rounds(median: float) -> tuple[float, ...]:
    return tuple(median * (1 + 0.03 * k) for k in (-3, -2, -1, 0, 1, 2, 3))


def verdict(a: str, a_s: float, b: str, b_s: float):
    return verdict_from_times(Measurement(a, rounds(a_s)), Measurement(b, rounds(b_s)))


@functools.cache
def step_of(device: str):
    """Lesson 07's step as sized for this GPU, counted on ``meta`` (once per device: the search counts several)."""
    return graph_step_work(graph_step_size(CUDA[device]))


def misses_of(v, key: str, capability: tuple[int, int]) -> list:
    """What ``make gpu-check`` reports for this verdict, logged by the lesson the expectation ``key`` names."""
    e = TABLE[key]
    claim = {**v.as_dict(), "lesson": e.lesson}
    return [m for m in check_claims([claim], lessons=[e.lesson], capability=capability) if m.key == key]


def test_the_lessons_contenders_are_the_tables() -> None:
    assert TABLE["02-pinned-copy"].faster == (PINNED,) and TABLE["02-pinned-copy"].than == PAGEABLE
    assert TABLE["07-cuda-graph"].faster == (GRAPH,) and TABLE["07-cuda-graph"].than == EAGER


@pytest.mark.parametrize("device", list(CUDA))
@pytest.mark.parametrize("outcome", list(OUTCOMES))
def test_copy_explanations_agree_with_the_table(device: str, outcome: str) -> None:
    facts = CUDA[device]
    v = verdict(PINNED, OUTCOMES[outcome][0], PAGEABLE, OUTCOMES[outcome][1])
    assert v.outcome == outcome
    text = lesson.explain(v, **copy_texts(facts, batch=1024))
    assert text.startswith(v.sentence()) and facts.name in text and "12.0 MiB" in text
    assert not CPU_WORDS.search(text), (device, outcome, text)
    missed = misses_of(v, "02-pinned-copy", facts.capability)
    assert bool(missed) == (outcome != "faster")
    assert ("02-pinned-copy" in text) == bool(missed), "a miss of the table is named as one, and only a miss"
    if outcome == "faster":
        assert "staging buffer" in text and "pin_memory=True" in text


@pytest.mark.parametrize("device", list(CUDA))
@pytest.mark.parametrize("outcome", list(OUTCOMES))
@pytest.mark.parametrize("kernels", [None, 0.15, 0.9])
def test_graph_explanations_agree_with_the_table_and_the_instrument(device: str, outcome: str,
                                                                    kernels: float | None) -> None:
    facts = CUDA[device]
    work = step_of(device)
    busy = None if kernels is None else KernelShare(wall_s=1e-3, kernel_s=kernels * 1e-3)
    v = verdict(GRAPH, OUTCOMES[outcome][0], EAGER, OUTCOMES[outcome][1])
    text = lesson.explain(v, **graph_texts(facts, work=work, busy=busy))
    assert text.startswith(v.sentence()) and facts.name in text and f"{work.launches} operations" in text
    assert f"{facts.launch_s * 1e6:.1f} µs" in text, "the launch cost is this GPU's measured one"
    assert not CPU_WORDS.search(text), (device, outcome, text)
    assert bool(LAUNCH_BOUND.search(text)) == (busy is not None and busy.overhead_bound), text
    if busy is not None:
        assert f"{busy.share:.0%}" in text
    missed = misses_of(v, "07-cuda-graph", facts.capability)
    assert bool(missed) == (outcome != "faster")
    assert ("07-cuda-graph" in text) == bool(missed)


def test_the_h200_figures_replayed() -> None:
    """What lessons 02 and 07 would say on the evidence's H200 for the outcome the table expects."""
    copy = lesson.explain(verdict(PINNED, 0.09, PAGEABLE, 0.3), **copy_texts(H200, batch=350_592))
    assert "4.01 GiB" in copy and "NVIDIA H200" in copy
    work = step_of("H200")
    graph = lesson.explain(verdict(GRAPH, 0.3e-3, EAGER, 1.6e-3),
                           **graph_texts(H200, work=work, busy=KernelShare(wall_s=1.6e-3, kernel_s=0.2e-3)))
    assert "12.2 µs" in graph and "128 operations" in graph and "launch-bound" in graph and "12%" in graph


@pytest.mark.parametrize("device", list(ELSEWHERE))
def test_elsewhere_nothing_is_timed_and_one_sentence_says_why(device: str) -> None:
    facts = ELSEWHERE[device]
    for said in (copy_not_run(facts), graph_not_run(facts)):
        assert said.startswith("Not timed here:") and not GPU_WORDS.search(said), said
        assert ("Apple GPU" in said) == (facts.kind == "mps") and ("this CPU" in said) == (facts.kind == "cpu")
    with pytest.raises(ValueError, match="not a CUDA GPU"):
        copy_texts(facts, batch=64)
    with pytest.raises(ValueError, match="not a CUDA GPU"):
        graph_texts(facts, work=graph_step_work(4))
    assert copy_not_run(H200) == "" and graph_not_run(H200) == ""


def _code(name: str) -> str:
    cells = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def _splatted(source: str) -> set[str]:
    """The functions whose result a lesson splats into ``lesson.explain(verdict, **...)``."""
    return {ast.unparse(k.value.func) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "explain" for k in n.keywords
            if k.arg is None and isinstance(k.value, ast.Call)}


def test_lessons_02_and_07_time_size_and_explain_through_the_library() -> None:
    l02, l07 = _code("02_dataloader.ipynb"), _code("07_compile_profiler.ipynb")
    assert "copy_texts" in _splatted(l02) and "graph_texts" in _splatted(l07)
    for needed in ("device_facts(device)", "copy_batch(facts)", "copy_contenders(", "verdict(PINNED, PAGEABLE)",
                   "copy_not_run(facts)"):
        assert needed in l02, f"lesson 02 does not use {needed}"
    for needed in ("device_facts(device)", "graph_step_size(facts)", "graph_step_work(", "graph_contenders(",
                   "verdict(GRAPH, EAGER)", "kernel_share(", "graph_not_run(facts)"):
        assert needed in l07, f"lesson 07 does not use {needed}"
