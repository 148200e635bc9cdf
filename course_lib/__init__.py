"""course_lib: the real implementations behind the course *Fast, correct PyTorch training pipelines*.

Find the file for the lesson you are reading:

* ``course_lib.data``       datasets (generated JPEG shapes, CIFAR-10, character text), loaders, in-memory batching
* ``course_lib.models``     the pre-norm ``Block``/``Net``, a small CNN, a tiny GPT
* ``course_lib.train``      the resumable training template: config, schedule, optim, loop, checkpoint
* ``course_lib.perf``       measuring instruments: timing, memory, loader sweeps, profiler, compile, precision
* ``course_lib.distributed`` DDP/FSDP under torchrun
* ``course_lib.grading``    exercise generation and auto-grading
* ``course_lib.mode``       smoke vs full mode (``COURSE_MODE``) and the data cache (``COURSE_DATA_DIR``)
* ``course_lib.device``     cuda → mps → cpu, and which precision each supports
"""

__version__ = "0.1.0"
