"""Interrupt a loader measurement with real worker processes at random moments (tests/test_perf_loaders.py).

Usage: python tests/interrupt_loader_probe.py SEED TRIALS; prints, per interrupt, whether it was raised and how many
child processes were left. The exceptions are kept, as a notebook keeps its last traceback."""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time

import psutil
import torch
from torch.utils.data import Dataset

from course_lib.perf.loaders import measure_loader


class Slow(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.zeros(3, 8, 8), i % 3


rng = random.Random(int(sys.argv[1]))
me = psutil.Process()
results, kept = [], []
for trial in range(int(sys.argv[2])):
    delay = rng.uniform(0.0, 1.0)
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    raised = False
    try:
        measure_loader(Slow(), n_batches=200, batch_size=16, num_workers=2, persistent_workers=trial % 2 == 1,
                       epochs=2)
    except KeyboardInterrupt as exc:
        raised = True
        kept.append(exc)  # as a notebook keeps the last traceback, and with it the frames' iterators
    timer.join()
    deadline = time.monotonic() + 10
    while me.children(recursive=True) and time.monotonic() < deadline:
        time.sleep(0.1)
    results.append({"delay": round(delay, 3), "raised": raised, "children": len(me.children(recursive=True))})
print(json.dumps(results))
