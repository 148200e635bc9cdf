"""CUDA graphs where they win: a step of many small kernels, replayed with one launch instead of launched one by one.

In eager mode the host issues every kernel from Python: the module call, the dispatcher, the launch, a few
microseconds each (lesson 14 measures the cost of one tiny operation). A step made of many small kernels, each
finishing faster than the host can issue the next, is **launch-bound**: the GPU waits between kernels. A CUDA graph
records the step's kernels once and replays the whole sequence with one launch, so that wait disappears. A step
that compilation already fused into one or two kernels has little to gain (lesson 14's H200 run measured exactly
that), so the comparison here is on a step of many *unfused* small kernels.

:func:`course_lib.perf.sizing.small_kernel_model` is that step (narrow Linear + GELU layers; sized by
:func:`course_lib.perf.sizing.graph_step_size` so it is long enough to time and launch-bound on this GPU);
:func:`graph_contenders` records it as a graph and returns the replay beside the eager call, for
:func:`course_lib.perf.compare.compare`; :func:`graph_texts` explains the verdict in this GPU's measured figures.
On a CPU there is nothing to record: :func:`graph_not_run` says why.

Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``); the expectation it is checked against on a GPU is
``07-cuda-graph`` (:mod:`course_lib.perf.expectations`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from course_lib.perf.device_facts import DeviceFacts
from course_lib.perf.kernel_time import KernelShare
from course_lib.perf.sizing import Work, device_seconds

GRAPH, EAGER = "CUDA graph", "eager"  # the contenders' names: expectation 07-cuda-graph's
WARMUP_CALLS = 3  # eager calls on a side stream before recording (cuBLAS handles, the allocator's pool)


def graph_contenders(model: nn.Module, x: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """``{GRAPH: ..., EAGER: ...}`` for ``model``'s forward on ``x`` (both on one CUDA GPU), without gradients:
    the eager call, and the replay of a CUDA graph recorded once here on a copy of ``x`` (a graph reads and writes
    fixed addresses; to run it on new data, copy the data into that input first).

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    if x.device.type != "cuda":
        raise ValueError(f"graph_contenders: x is on {x.device}, not a CUDA GPU; CUDA graphs exist only there "
                         "(graph_not_run says why nothing is timed elsewhere).")
    static_x = x.clone()
    current = torch.cuda.current_stream(x.device)
    side = torch.cuda.Stream(x.device)  # warm up off the default stream, as recording requires
    with torch.no_grad():
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                model(static_x)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(static_x)

    def replay() -> torch.Tensor:
        graph.replay()
        return static_out  # the graph wrote its output here, at the address it recorded

    def eager() -> torch.Tensor:
        with torch.no_grad():
            return model(static_x)

    return {GRAPH: replay, EAGER: eager}


def graph_texts(facts: DeviceFacts, *, work: Work, busy: KernelShare | None = None) -> dict[str, str]:
    """The three explanations of lesson 07's ``GRAPH`` vs ``EAGER`` verdict on a CUDA GPU, for
    ``lesson.explain(verdict, **graph_texts(facts, work=..., busy=...))``: ``work``, the step counted on ``meta``
    (:func:`course_lib.perf.sizing.graph_step_work`: its operations and their work, at this GPU's measured roofs);
    ``busy``, the profiler's kernel share of the eager step (:func:`course_lib.perf.kernel_time.kernel_share`),
    which alone may call it launch-bound.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    if facts.kind != "cuda":
        raise ValueError(f"graph_texts: {facts.name} is a {facts.kind}, not a CUDA GPU: use graph_not_run(facts).")
    launches = work.launches
    if launches < 1:
        raise ValueError(f"graph_texts: work.launches={launches!r}: count the step with graph_step_work.")
    work_s = device_seconds(work, facts)
    gpu = f"this GPU ({facts.name.replace('{', '{{').replace('}', '}}')})"
    launch = f"{facts.launch_s * 1e6:.1f} µs" if facts.launch_s else "a few µs"
    work = f"{work_s * 1e6:.2g} µs"
    if busy is None:
        instrument = ("No profile was taken: the profiler's device time against the step's wall time would say "
                      "how long the GPU waited.")
    elif busy.overhead_bound:
        instrument = (f"The profiler saw {gpu} running kernels for {busy.share:.0%} of eager's step: the rest of "
                      "the time it waited for the host, so the step was launch-bound.")
    else:
        instrument = (f"The profiler saw {gpu} running kernels for {busy.share:.0%} of eager's step, so its "
                      "kernels, not the launches, set its time.")
    return {
        "faster": f"Eager issued the step's {launches} operations one by one from Python, each costing about "
                  f"{launch} to issue on {gpu} (measured), while the whole step's work takes about {work} at its "
                  "measured roofs: by these figures the launches, not the kernels, set eager's time. The CUDA graph "
                  f"recorded the kernels once and replayed all of them with one launch. {instrument}",
        "slower": f"The CUDA graph was slower than eager on {gpu}, against expectation 07-cuda-graph: a replay "
                  f"issues the kernels of the step's {launches} operations with one launch instead of one each "
                  f"(about {launch} each on this GPU, measured). "
                  f"{instrument} Run "
                  "the cell again; if it repeats, the profiler's trace shows what the replay waited for.",
        "too_close": f"The CUDA graph and eager ran alike on {gpu}, against expectation 07-cuda-graph: with "
                     f"{launches} operations at about {launch} each, eager's launches should have set its time. "
                     f"{instrument} Run the cell again on a quieter machine.",
    }


def graph_not_run(facts: DeviceFacts) -> str:
    """Why lesson 07 times no CUDA graph on this device: the sentence it shows instead of a verdict; ``""`` on a
    CUDA GPU, where the graph is timed.

    Taught in lesson 07 (``notebooks/07_compile_profiler.ipynb``).
    """
    if facts.kind == "cuda":
        return ""
    where = "this Apple GPU" if facts.kind == "mps" else "this CPU"
    return (f"Not timed here: CUDA graphs record and replay work queued for an NVIDIA GPU, and {where} has none to "
            "record (torch.compile's mode=\"reduce-overhead\" behaves like the default mode here). On an NVIDIA GPU "
            "this cell times a step of many small operations, replayed as one CUDA graph, against the same step "
            "run eagerly.")


__all__ = ["GRAPH", "EAGER", "graph_contenders", "graph_texts", "graph_not_run"]
