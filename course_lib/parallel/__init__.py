"""Distributed training from the inside: each kind of parallelism written from ``torch.distributed`` collectives.

One mechanism per file, each short enough to read in one sitting, top to bottom:

* :mod:`~course_lib.parallel.comm` -- count every collective (op, bytes, when issued, when finished) and predict
  its time with the alpha-beta model of a ring all-reduce; measure and fit bandwidth and latency.
* :mod:`~course_lib.parallel.data_parallel` -- data parallelism three ways: all-reduce after backward, one async
  all-reduce per gradient as it is ready, and buckets (what DDP does).
* :mod:`~course_lib.parallel.zero` -- ZeRO-1 by hand (each rank keeps 1/world of the optimizer state), and what
  FSDP2 stores per rank.
* :mod:`~course_lib.parallel.tensor_parallel` -- one MLP block split over the ranks: a column-parallel then a
  row-parallel linear, one all-reduce in forward and one in backward.

Everything runs on CPU processes with gloo (``torchrun --nproc_per_node=2``) and unchanged on GPUs with NCCL.
Submodules are imported on demand (``from course_lib.parallel.comm import count_collectives``).

Taught in lesson 13 (``notebooks/13_parallel.ipynb``).
"""

from __future__ import annotations

__all__ = ["comm", "data_parallel", "zero", "tensor_parallel"]
