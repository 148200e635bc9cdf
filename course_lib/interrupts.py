"""Holding a Ctrl-C back until a block that must not be cut in half has finished.

Several places write two things that must agree (a checkpoint and its metrics file, a grading run's staged files)
or start processes whose start-up swallows a signal (a loader's workers forking: a Ctrl-C landing in ``fork``'s own
handlers was lost). Each wraps that block in :func:`ctrl_c_deferred`. It sits with the other foundations (``atomic``,
``clock``) so that the training loop, the measuring instruments and the grader share it without importing each
other.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) that arrives inside the block and raise it at the block's end (main thread only);
    SIGTERM too, when a Python handler was installed for it (:func:`stop_signals`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    deferred = [signal.SIGINT] + ([signal.SIGTERM] if callable(signal.getsignal(signal.SIGTERM)) else [])
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in deferred}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
        if received:
            old = previous[received[0]]
            if callable(old):
                old(received[0], None)  # the default SIGINT handler raises KeyboardInterrupt here
            elif old == signal.SIG_DFL:
                raise KeyboardInterrupt
