"""What each lesson must show on a tensor-core GPU, and why: a table, checked against the lessons' claim logs.

The lessons measure, and the measurement decides what they say. But a measurement can be wrong in a way no claim
check sees: a workload too small for the device (lesson 05 on an H200 once timed kernel launches and concluded
"keep fp32"), a comparison that times something else than it names. So the course also states, once, what the
hardware it is written for must show when a lesson runs there, with the reason from the hardware (datasheets, the
course's own measurements on a GPU). :func:`check_claims` holds the verdicts a lesson logged
(``COURSE_CLAIM_LOG``, :mod:`course_lib.perf.claims`) to this table; ``python -m course_lib gpu-check`` runs it on
the lessons it executed in full mode, and every miss is a named failure: the expectation's key, the lesson, what
was measured and what was expected.

Contender names are the contract: an expectation matches the verdict of its two contenders, in either order, in its
lesson's claim log. Where an executed lesson does not show that comparison (yet), the check says "not shown".

docs/gpu.md renders the table (:func:`markdown_table`; a test keeps the two in step).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TF32_ALLOWED, TF32_STRICT = '"high" (TF32 allowed)', '"highest" (strict fp32)'


@dataclass(frozen=True)
class Expectation:
    """One row: in ``lesson`` (a notebook's file name), one of ``faster`` beats ``than`` by at least ``at_least``
    (a decided verdict; ``1.0``: any decided win) on a CUDA GPU of compute capability ``min_capability`` or newer.
    ``shows``: the expectation in words; ``why``: the reason from the hardware."""

    key: str
    lesson: str
    faster: tuple[str, ...]
    than: str
    at_least: float
    min_capability: tuple[int, int]
    shows: str
    why: str

    def applies_to(self, capability: tuple[int, int] | None) -> bool:
        """Whether a GPU of this compute capability must show it (``None``: no CUDA GPU, nothing applies)."""
        return capability is not None and tuple(capability) >= self.min_capability


EXPECTATIONS: tuple[Expectation, ...] = (
    Expectation(
        key="05-autocast-step", lesson="05_mixed_precision.ipynb", faster=("bf16", "fp16"), than="fp32",
        at_least=1.0, min_capability=(7, 0),
        shows="bf16 (fp16 before compute capability 8.0) autocast trains the GPU-sized CNN step faster than fp32",
        why="Tensor cores run bf16/fp16 matmuls and convolutions many times faster than fp32 (the H200's own sweep: "
            "758 vs 51 TFLOP/s) and autocast halves the activations' bytes; the step is sized for the GPU "
            "(course_lib/perf/sizing.py: at least 1 ms of device time at its roofs), so that work, not kernel "
            "launches, sets its time and outweighs autocast's casts."),
    Expectation(
        key="05-tf32", lesson="05_mixed_precision.ipynb", faster=(TF32_ALLOWED,), than=TF32_STRICT,
        at_least=2.0, min_capability=(8, 0),
        shows="TF32 at least 2x strict fp32 on a square fp32 matmul of 4096 or larger",
        why="From Ampere on, TF32 tensor cores multiply fp32 operands with a 10-bit mantissa at about 8x the strict "
            "fp32 rate (A100: 156 vs 19.5 TFLOP/s dense; H100/H200: 494 vs 67); lesson 05 sizes the matmul at 4096 "
            "or more on a GPU, where the call is compute-bound, not launch-bound."),
    Expectation(
        key="14-bf16-matmul", lesson="14_ceiling.ipynb", faster=("bf16",), than="fp32", at_least=5.0,
        min_capability=(8, 0),
        shows="a bf16 matmul at least 5x fp32 at 8192x8192",
        why="bf16 tensor cores have 8-16x fp32's peak on every datasheet from Ampere on (A100: 312 vs 19.5 TFLOP/s; "
            "H100/H200: 989 vs 67); at 8192, where lesson 14's sweep reached both roofs on the H200 (758 vs 51: "
            "15x), the call is compute-bound, so the roofs' ratio shows."),
    Expectation(
        key="02-pinned-copy", lesson="02_dataloader.ipynb", faster=("pinned + non_blocking",), than="pageable",
        at_least=1.0, min_capability=(0, 0),
        shows="host-to-GPU copies of a batch from pinned memory with non_blocking=True faster than from pageable "
              "memory",
        why="From pageable memory the driver first copies into a pinned staging buffer and the host waits; from "
            "pinned memory the GPU's copy engine reads directly over PCIe/NVLink, and non_blocking lets the host "
            "queue the next work meanwhile."),
    Expectation(
        key="07-cuda-graph", lesson="07_compile_profiler.ipynb", faster=("CUDA graph",), than="eager",
        at_least=1.0, min_capability=(0, 0),
        shows="a CUDA graph faster than eager on a step of many small unfused kernels",
        why="Each small kernel costs a launch from Python (about 12 µs per tiny call on the H200, lesson 14), longer "
            "than the kernel itself; a CUDA graph replays the whole recorded sequence with one launch. A step "
            "already fused into one kernel has nothing to save (lesson 14's H200 run), so the step must be many "
            "small kernels."),
)


@dataclass(frozen=True)
class Miss:
    """An expectation a lesson did not meet: ``kind`` is ``"not shown"``, ``"too close"``, ``"slower"`` or
    ``"short"`` (faster by less than expected); ``message`` says what was measured and what was expected."""

    key: str
    lesson: str
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.key} ({self.lesson}): {self.message}"


def _matching(claims: Iterable[dict[str, Any]], e: Expectation) -> list[tuple[str, float, str]]:
    """``(the expected winner's name, its speed over e.than, the outcome in that direction)`` of each claim that
    compares them, in either order."""
    flip = {"faster": "slower", "slower": "faster", "too_close": "too_close"}
    found = []
    for c in claims:
        if c.get("lesson") != e.lesson:
            continue
        if c.get("a") in e.faster and c.get("b") == e.than:
            found.append((str(c["a"]), float(c["ratio"]), str(c["outcome"])))
        elif c.get("b") in e.faster and c.get("a") == e.than:
            found.append((str(c["b"]), 1.0 / float(c["ratio"]), flip.get(str(c["outcome"]), str(c["outcome"]))))
    return found


def check_claims(claims: Sequence[dict[str, Any]], *, lessons: Iterable[str], capability: tuple[int, int] | None,
                 table: Sequence[Expectation] = EXPECTATIONS) -> list[Miss]:
    """Every expectation of ``table`` that applies to a GPU of ``capability`` and belongs to one of ``lessons`` (the
    notebooks executed), held to ``claims`` (claim-log lines); one :class:`Miss` per verdict that falls short, and
    one per expectation no verdict shows.

    Called by ``python -m course_lib gpu-check`` on the lessons it executed in full mode.
    """
    ran = set(lessons)
    misses = []
    for e in table:
        if e.lesson not in ran or not e.applies_to(capability):
            continue
        expected = e.shows + (f" (at least {e.at_least:g}x)" if e.at_least > 1 else "")
        found = _matching(claims, e)
        if not found:
            misses.append(Miss(e.key, e.lesson, "not shown", f"no verdict {' or '.join(e.faster)} vs {e.than} in the "
                                                              f"claim log; expected {expected}"))
        for name, speed, outcome in found:
            factor = speed if speed >= 1 else 1 / speed
            measured = {"faster": f"{factor:.3g}x faster", "slower": f"{factor:.3g}x slower",
                        "too_close": f"too close to call ({speed:.3g}x)"}.get(outcome, outcome)
            kind = {"slower": "slower", "too_close": "too close"}.get(outcome)
            if kind is None and speed < e.at_least:
                kind = "short"
            if kind:
                misses.append(Miss(e.key, e.lesson, kind, f"{name} vs {e.than}: {measured}; expected {expected}"))
    return misses


def read_claim_log(path: Path) -> tuple[list[dict[str, Any]], str]:
    """The claims of one ``<lesson>.claims.jsonl`` (what gpu-check's lessons part writes) and its lesson
    (``<lesson>.ipynb``); a claim without a lesson takes its file's. Lines that are not JSON objects are left to the
    claims check, which names them."""
    lesson = Path(path).name.removesuffix(".claims.jsonl") + ".ipynb"
    claims = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            claim = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(claim, dict):
            claims.append({**claim, "lesson": claim.get("lesson") or lesson})
    return claims, lesson


def check_folder(folder: Path, capability: tuple[int, int] | None) -> list[Miss]:
    """:func:`check_claims` on every claim log in ``folder`` (the lessons executed there)."""
    claims, lessons = [], []
    for path in sorted(Path(folder).glob("*.claims.jsonl")):
        found, lesson = read_claim_log(path)
        claims += found
        lessons.append(lesson)
    return check_claims(claims, lessons=lessons, capability=capability)


def markdown_table(table: Sequence[Expectation] = EXPECTATIONS) -> str:
    """The table as docs/gpu.md shows it: key, lesson, what must show, where, why, and the contenders it matches."""
    lines = ["| expectation | lesson | must show | on | why | verdict matched |", "|---|---|---|---|---|---|"]
    for e in table:
        where = "any CUDA GPU" if e.min_capability == (0, 0) else (
            f"compute capability {e.min_capability[0]}.{e.min_capability[1]}+")
        contenders = f"{' or '.join(f'`{n}`' for n in e.faster)} vs `{e.than}`"
        if e.at_least > 1:
            contenders += f", at least {e.at_least:g}x"
        lines.append(f"| `{e.key}` | {e.lesson.removesuffix('.ipynb')} | {e.shows} | {where} | {e.why} | "
                     f"{contenders} |")
    return "\n".join(lines)


__all__ = ["Expectation", "EXPECTATIONS", "Miss", "check_claims", "read_claim_log", "check_folder",
           "markdown_table"]
