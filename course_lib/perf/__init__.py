"""Measuring instruments for the performance lessons.

Every number a lesson shows is measured on the learner's machine with these helpers:

* :mod:`~course_lib.perf.timing`     -- latency and throughput done right (warm-up, synchronisation, repetitions).
* :mod:`~course_lib.perf.memory`     -- parameter counts, stored bytes, training-memory arithmetic, peak memory.
* :mod:`~course_lib.perf.loaders`    -- DataLoader measurements and the experiment order for tuning them.
* :mod:`~course_lib.perf.stepsplit`  -- one training step split into data wait, transfer and compute.
* :mod:`~course_lib.perf.profile`    -- ``torch.profiler`` with a schedule, top-k tables, Chrome traces.
* :mod:`~course_lib.perf.compile`    -- ``torch.compile`` with an honest eager fallback, recompilation counting, TF32.
* :mod:`~course_lib.perf.precision`  -- fp32 vs bf16 (vs fp16 on CUDA) side by side.
* :mod:`~course_lib.perf.bench`      -- the benchmark table (``python -m course_lib bench``).
* :mod:`~course_lib.perf.anatomy`    -- a training step's FLOPs and memory by category, by formula and measured.
* :mod:`~course_lib.perf.checkpointing`, :mod:`~course_lib.perf.memory_format`, :mod:`~course_lib.perf.optimizers`,
  :mod:`~course_lib.perf.threads`, :mod:`~course_lib.perf.busy` -- the techniques of lesson 12 (activation
  checkpointing, ``channels_last``, foreach/fused optimizers, thread counts, busy cores).

Submodules are imported on demand (``from course_lib.perf.timing import measure_latency``) so that importing one
instrument does not pay for the others.
"""

from __future__ import annotations

__all__ = ["timing", "memory", "loaders", "stepsplit", "profile", "compile", "precision", "bench", "anatomy",
           "checkpointing", "memory_format", "optimizers", "threads", "busy"]
