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

import os

# Kineto, the profiler's C++ tracer, writes "USDT ... profiler_start/profiler_stop" lines (and, without a GPU,
# "gpuGetDeviceCount failed") to stderr for every profiled window: noise that buries a notebook's output. It reads
# its log level when the profiler first starts, and 6 silences it. Set here, not in course_lib.perf.profile, because
# exercises and checks call torch.profiler directly. Set KINETO_LOG_LEVEL=0 yourself to see the lines again.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

__version__ = "0.1.0"
