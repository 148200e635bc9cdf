"""Lesson 14 on this device: the sizes its timed comparisons use and the words that explain their verdicts.

The lesson measures; these functions choose the workloads and say what a verdict means *on the device that measured
it*, from the device's facts (:mod:`course_lib.perf.device_facts`) and its measured ceiling
(:mod:`course_lib.perf.ceiling`), never from a template written for one kind of machine:

* **sizes** (:func:`ceiling_sizes`): on a CPU the course's sizes, with the low-precision matmul kept small where its
  sweep found no fast path (one call then takes seconds); on a GPU each timed call meets the rule of
  :mod:`course_lib.perf.sizing` (at least ``max(1 ms, 50 x launch cost)`` of device time at the measured roofs), so a
  comparison times the effect it names, not kernel launches. The bf16-vs-fp32 matmul is 8192 wide or more on a GPU,
  the size the expectation table (:mod:`course_lib.perf.expectations`, ``14-bf16-matmul``) holds it to.
* **hardware words**: a CPU's BLAS library and bf16 instructions; a GPU's kernel launches, cuBLAS and tensor cores.
* **labels** (:func:`limit_label`): a point's roof is its own dtype's; a dtype whose sweep found it slower than fp32
  is a *slow dtype path*, and a call far longer than a tiny operation is not overhead.
* **numbers in sentences**: every comparison is computed from the figures shown (:func:`ceiling_ratio_text`,
  :func:`tiny_chain_texts`), and a prediction's answer range says when the measurement sits on its boundary
  (:func:`range_answer`).

Replayed on the H200 of the GPU evidence and on constructed T4/A100 figures in ``tests/test_ceiling_replay.py``.

Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from course_lib import mode
from course_lib.perf.ceiling import Ceiling
from course_lib.perf.device_facts import DTYPE_SHORT, DeviceFacts
from course_lib.perf.mfu import peak_flops
from course_lib.perf.sizing import MEMORY_SHARE, Work, matmul_work, meets_rule

CPU_LOW_PRECISION_CALL_S = 0.05  # a low-precision matmul call on a CPU without a fast path: at most this long
BF16_EXPECTATION_SIZE = 8192  # expectations.py, 14-bf16-matmul: the size a tensor-core GPU is held to
OVERHEAD_CALLS = 10  # a call within this many tiny operations' time is mostly its fixed cost
BOUNDARY_SHARE = 0.15  # a measurement within this share of a range's boundary is said to sit on it
SQUARE_SIZES = (1024, 2048, 4096, 8192, 16384)
LINEAR_WIDTHS = (1024, 2048, 4096, 8192, 16384, 32768, 49152)
LINEAR_BATCHES = (8, 512)
CHAIN_WIDTH = 1024  # PointwiseChain's width
CHAIN_FLOPS_PER_ELEMENT = 20  # the lesson's estimate for the chain
REFERENCE_GPU = "H100"  # the datasheet a CPU's ceiling is compared with


@dataclass(frozen=True)
class CeilingSizes:
    """Lesson 14's workload sizes on this device: ``matmul_large`` (the square fp32 matmul timed against 64x64 and
    placed on the roofline), ``dtype_matmul`` (the square matmul timed in low precision and fp32),
    ``linear_width`` and ``linear_batches`` (``(small, large)``: the Linear layer timed at both batches),
    ``chain_rows`` (rows of the 1024-wide pointwise chain timed eager and compiled); ``why``: how they were chosen."""

    matmul_large: int
    dtype_matmul: int
    linear_width: int
    linear_batches: tuple[int, int]
    chain_rows: int
    why: str


def linear_work(width: int, batch: int) -> Work:
    """One fp32 ``F.linear`` of ``batch`` rows through a ``width x width`` weight: its FLOPs, the weight and the rows
    read, the output written."""
    nbytes = 4.0 * (width * width + 2 * batch * width)
    return Work(flops=2.0 * batch * width * width, bytes=nbytes, held=nbytes)


def chain_work(rows: int) -> Work:
    """One compiled pass of the pointwise chain over ``rows x 1024`` fp32 elements: read once, written once (eager
    holds a few intermediates of the same size)."""
    numel = rows * CHAIN_WIDTH
    return Work(flops=float(CHAIN_FLOPS_PER_ELEMENT * numel), bytes=8.0 * numel, held=4 * 4.0 * numel)


def _first_meeting(candidates: Sequence[int], work_of, facts: DeviceFacts) -> int:
    """The first candidate whose work meets the rule and fits in :data:`MEMORY_SHARE` of the memory; the largest
    that fits when none does."""
    memory = facts.memory_bytes or 16 * 2**30
    fitting = candidates[0]
    for candidate in candidates:
        work = work_of(candidate)
        if work.held > MEMORY_SHARE * memory:
            break
        fitting = candidate
        if meets_rule(work, facts):
            return candidate
    return fitting


def ceiling_sizes(facts: DeviceFacts, ceiling: Ceiling | None = None, *, low: str = "bfloat16") -> CeilingSizes:
    """The sizes lesson 14 times on this device (see the module docstring). ``ceiling``: the measured ceiling, whose
    sweep says whether ``low`` has a fast path on a CPU (``None``: assume it has).

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    if not facts.is_gpu:
        dtype_n = mode.by_mode(smoke=256, full=512)
        rate = ceiling.matmul.get(low) if ceiling is not None else None
        if rate and ceiling is not None and ceiling.slow_path(low):
            while dtype_n > 64 and 2 * dtype_n**3 / rate > CPU_LOW_PRECISION_CALL_S:
                dtype_n //= 2
        return CeilingSizes(matmul_large=mode.by_mode(smoke=512, full=1024), dtype_matmul=dtype_n,
                            linear_width=1024, linear_batches=LINEAR_BATCHES,
                            chain_rows=mode.by_mode(smoke=512, full=4096),
                            why="the course's CPU sizes (a call's fixed cost is microseconds against milliseconds of "
                                "work)" + (f"; the {DTYPE_SHORT[low]} matmul kept to {dtype_n} wide, as this CPU has "
                                           f"no fast {DTYPE_SHORT[low]} path" if ceiling is not None
                                           and ceiling.slow_path(low) else ""))
    large = _first_meeting(SQUARE_SIZES, matmul_work, facts)
    dtype_n = max(BF16_EXPECTATION_SIZE, _first_meeting(SQUARE_SIZES, lambda n: matmul_work(n, element_bytes=2),
                                                        facts))
    width = _first_meeting(LINEAR_WIDTHS, lambda d: linear_work(d, LINEAR_BATCHES[0]), facts)
    rows = _first_meeting([4096 * 2**k for k in range(10)], chain_work, facts)
    return CeilingSizes(matmul_large=large, dtype_matmul=dtype_n, linear_width=width, linear_batches=LINEAR_BATCHES,
                        chain_rows=rows,
                        why="sized for this GPU: each timed call at least max(1 ms, 50 x its measured launch cost) of "
                            "device time at its measured roofs (course_lib/perf/sizing.py), so the comparisons time "
                            "the work, not the launches")


# ---------------------------------------------------------------- words from the device's facts
def _literal(text: str) -> str:
    """``text`` placed in a template that ``str.format_map`` fills: its braces kept as braces."""
    return text.replace("{", "{{").replace("}", "}}")


def call_cost_words(facts: DeviceFacts) -> str:
    """What a call costs before any arithmetic, on this device."""
    if facts.kind == "cuda":
        return "Python, dispatch, allocating the output, launching the kernel (cuBLAS's, for a matmul)"
    if facts.kind == "mps":
        return "Python, dispatch, allocating the output, encoding and launching a Metal kernel"
    return "Python, dispatch, allocating the output, handing the work to the BLAS library"


def size_texts(facts: DeviceFacts) -> dict[str, str]:
    """Lesson 14's explanations of the 64x64 vs large matmul verdict (placeholders ``{small}``, ``{large}``,
    ``{small_mflop}``, ``{factor}``)."""
    fill = ("the GPU's thousands of cores need shapes large enough to give each of them work"
            if facts.is_gpu else "the library's blocked kernels need shapes big enough to fill their tiles")
    cache = ("its operands fit in the GPU's L2 cache while the large ones stream from HBM"
             if facts.is_gpu else "its operands fit in the fastest cache while the large ones stream from further "
                                  "away, and some BLAS libraries block large shapes poorly")
    return {
        "faster": "Per FLOP the {a} multiply ran {factor}x as fast. A {small} multiply is only {small_mflop} MFLOP: "
                  f"the fixed cost of each call ({call_cost_words(facts)}) is a large share of it, and {fill}. That "
                  "is why a ceiling is the *best* point of a sweep, and why small layers never reach it.",
        "slower": "Unexpected: per FLOP the {small} multiply ran {factor}x as fast as the {large} one. "
                  f"A likely reason: {cache}. The sweep above shows where this machine's best shape is.",
        "too_close": "Per FLOP the two sizes ran alike here: the fixed cost per call is small next to even a {small} "
                     "multiply's arithmetic on this device. The sweep above shows where its FLOP/s does fall off.",
    }


def dtype_texts(facts: DeviceFacts, ceiling: Ceiling, low: str = "bfloat16") -> dict[str, str]:
    """Lesson 14's explanations of the ``low`` vs fp32 matmul verdict (placeholders ``{n}``, ``{factor}``), naming
    what this device has for ``low`` and the roofs its sweep measured."""
    short = DTYPE_SHORT[low]
    units = _literal(facts.low_precision_units)
    roofs = (f" (its sweep: {short} {ceiling.peak(low) / 1e12:,.3g} vs fp32 {ceiling.peak() / 1e12:,.3g} TFLOP/s)"
             if facts.is_gpu else
             f" (its sweep: {short} {ceiling.peak(low) / 1e9:,.3g} vs fp32 {ceiling.peak() / 1e9:,.3g} GFLOP/s)")
    if facts.is_gpu:
        where = f"this GPU has {units}{roofs}"
        return {
            "faster": "A {n}x{n} multiply ran {factor}x as fast in " + short + ": " + where + ", so " + short
                      + " has its own, higher roof. Matmul-bound work gains from autocast here (lesson 05).",
            "slower": "A {n}x{n} multiply took {factor}x as long in " + short + ", although " + where + ". At this "
                      "size the call should be compute-bound: rerun the cell, and check that nothing else shares "
                      "the GPU.",
            "too_close": short + " and fp32 multiplies ran alike here, although " + where + ": rerun the cell, and "
                         "check that nothing else shares the GPU.",
        }
    stop = ceiling.stopped.get(low)
    slow = (f"; its sweep stopped after {short} ran at {stop['ratio']:.2g}x fp32's rate" if stop and
            ceiling.slow_path(low) else "")
    return {
        "faster": "A {n}x{n} multiply ran {factor}x as fast in " + short + f": this CPU has {units}{roofs}, so "
                  + short + " has its own, higher roof. Matmul-bound work can gain from autocast here (lesson 05).",
        "slower": "A {n}x{n} multiply took {factor}x as long in " + short + f": this CPU has {units}{roofs}{slow}, "
                  "so it converts around every block: a slow " + short + " path, which saves memory here, not time.",
        "too_close": short + f" and fp32 multiplies ran alike here: this CPU has {units}{roofs}, so " + short
                     + " saves memory here but not time.",
    }


def batch_texts(facts: DeviceFacts) -> dict[str, str]:
    """Lesson 14's explanations of the Linear layer at its large vs small batch (placeholders ``{d}``, ``{big}``,
    ``{few}``, ``{factor}``)."""
    cache = ("the GPU's L2 cache holds much of the {d} x {d} weight" if facts.is_gpu
             else "this CPU's caches hold the whole {d} x {d} weight")
    return {
        "faster": "Per FLOP the layer ran {factor}x as fast at batch {big}: each weight loaded from memory now serves "
                  "{big} rows instead of {few}, so the point moved right along the slope, towards the compute roof.",
        "slower": "Per FLOP the layer took {factor}x as long at batch {big}, against what intensity predicts: "
                  f"a likely reason is that {cache}, so batch {{few}} is not memory-bound either. Rerun the cell "
                  "before reading more into it.",
        "too_close": f"The two batch sizes ran alike per FLOP: {cache}, so the extra reuse buys nothing measurable "
                     "here.",
    }


def fusion_texts(facts: DeviceFacts) -> dict[str, str]:
    """Lesson 14's explanations of the large pointwise chain, compiled vs eager (placeholders ``{ops}``,
    ``{factor}``)."""
    generated = "the generated Triton kernel" if facts.kind == "cuda" else "the generated loop"
    return {
        "faster": "The fused chain ran {factor}x as fast: eager runs {ops} operations, each reading and writing the "
                  f"whole tensor; {generated} reads it once and writes it once. The same FLOPs over far fewer bytes: "
                  "the point moves right, and up its slope.",
        "slower": "The compiled chain took {factor}x as long, though it moves far fewer bytes than the {ops} eager "
                  f"operations: {generated} may run worse than eager's kernels here"
                  + ("" if facts.is_gpu else ", or the tensor fits in cache so bytes were not the limit")
                  + ". Lesson 07 shows the generated code to read.",
        "too_close": "Eager and compiled ran alike: "
                     + ("at this size the GPU was not limited by the bytes the {ops} eager passes moved"
                        if facts.is_gpu else "the tensor fits in this machine's caches, so the {ops} eager passes "
                                             "were not paying memory's price")
                     + ", and fusing them saves little here.",
    }


def tiny_chain_texts(facts: DeviceFacts, *, ops: int, call_s: float, compiled_s: float, eager_s: float
                     ) -> dict[str, str]:
    """Lesson 14's explanations of the tiny chain, compiled vs eager, from the numbers measured: ``ops`` eager
    operations, ``call_s`` seconds of one small call (the fifty-calls cell), ``compiled_s``/``eager_s`` per call
    (placeholders ``{shape}``, ``{factor}``)."""
    per_op = eager_s / ops
    in_calls = compiled_s / call_s
    eager = (f"eager ran {ops} operations in {eager_s * 1e6:,.3g} µs, {per_op * 1e6:,.3g} µs each (a small call "
             f"cost {call_s * 1e6:,.3g} µs in the cell above)")
    compiled = (f"the compiled call took {compiled_s * 1e6:,.3g} µs, about {in_calls:,.2g} small calls' worth: its "
                "guards, the compiled wrapper's bookkeeping and "
                + ("the kernel launch" if facts.is_gpu else "the call into one generated loop"))
    return {
        "faster": "On a {shape} tensor the compiled chain ran {factor}x as fast: " + eager + "; " + compiled
                  + ". The arithmetic was never the cost.",
        "slower": "On a {shape} tensor the compiled chain took {factor}x as long: " + compiled + ", more than "
                  + eager + ".",
        "too_close": "On a {shape} tensor compiled and eager ran alike: " + eager + "; " + compiled + ".",
    }


def limit_label(share: float, bound: str, dtype: str, ceiling: Ceiling, *, call_s: float,
                launch_s: float | None) -> str:
    """What limits a point that reached ``share`` of its own ``dtype``'s roof, one call taking ``call_s`` seconds on
    a device whose tiniest operation takes ``launch_s`` (:func:`~course_lib.perf.device_facts.launch_seconds`):

    * a *slow dtype path* when ``dtype``'s sweep found it slower than fp32 (its time is the dtype's arithmetic);
    * ``"compute-bound"`` / ``"memory-bound"`` at a third of its roof or more;
    * *overhead-bound* when one call takes at most :data:`OVERHEAD_CALLS` tiny operations' time: the call's fixed
      cost is most of it;
    * otherwise below its roof at this shape: a call thousands of times longer than a tiny one is not overhead, its
      shape (how the kernels block it, how the caches hold it) keeps it from the roof.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    if ceiling.slow_path(dtype):
        return f"slow {DTYPE_SHORT.get(dtype, dtype)} path (slower than fp32 here)"
    if share >= 1 / 3:
        return f"{bound}-bound"
    if launch_s is None or call_s <= OVERHEAD_CALLS * launch_s:
        return "overhead-bound (far below its roof)"
    return f"{bound}-bound, below its roof at this shape (a call is {call_s / launch_s:,.0f} tiny operations' time)"


def ceiling_ratio_text(ceiling: Ceiling, facts: DeviceFacts) -> str:
    """How this machine's measured ceiling compares with a data-centre GPU's datasheet peak, from the figures: on a
    CPU against an H100's fp32 and bf16 peaks; on a GPU its measured roofs against its own datasheet.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    if facts.is_gpu:
        if not ceiling.datasheet:
            return "This GPU's datasheet peak is not in the course's table."
        parts = [f"{DTYPE_SHORT[d]} {ceiling.matmul[d] / sheet:.0%}" for d, sheet in ceiling.datasheet.items()
                 if d in ceiling.matmul]
        return "This GPU's measured roofs reach " + ", ".join(parts) + " of its datasheet peaks."
    fp32, bf16 = peak_flops(REFERENCE_GPU, precision="fp32"), peak_flops(REFERENCE_GPU, precision="bf16")
    assert fp32 and bf16  # the course's table has the H100
    return (f"An {REFERENCE_GPU}'s datasheet peak is {fp32 / ceiling.peak():,.0f}x this machine's measured fp32 "
            f"ceiling in fp32 ({fp32 / 1e12:.0f} TFLOP/s) and {bf16 / ceiling.peak():,.0f}x in bf16 "
            f"({bf16 / 1e12:.0f} TFLOP/s)")


def range_answer(value: float, bounds: Sequence[float], labels: Sequence[str], *, unit: str = "x") -> tuple[str, str]:
    """``(the label of the range value falls in, a note)``: ``labels[i]`` covers ``bounds[i-1] <= value <
    bounds[i]``; the note says when ``value`` sits within :data:`BOUNDARY_SHARE` of a boundary (a rerun may land on
    the other side, so both neighbours count as right), else is empty.

    Taught in lesson 14 (``notebooks/14_ceiling.ipynb``).
    """
    if len(labels) != len(bounds) + 1 or list(bounds) != sorted(bounds):
        raise ValueError(f"range_answer: {len(labels)} labels need {len(labels) - 1} increasing bounds, got "
                         f"{list(bounds)}.")
    index = sum(value >= b for b in bounds)
    near = [b for b in bounds if abs(value - b) <= BOUNDARY_SHARE * b]
    if not near:
        return labels[index], ""
    shown = f"{near[0]:.0%}" if unit == "%" else f"{near[0]:g}{unit}"
    return labels[index], (f" The measurement sits on the boundary at {shown}: a rerun may land on the other side, "
                           "so either neighbouring answer is as right.")


__all__ = ["CeilingSizes", "ceiling_sizes", "linear_work", "chain_work", "call_cost_words", "size_texts",
           "dtype_texts", "batch_texts", "fusion_texts", "tiny_chain_texts", "limit_label", "ceiling_ratio_text",
           "range_answer"]
