"""Executing a notebook from a script, without the client ever waiting on a message that has already arrived.

nbclient waits for a cell's ``execute_reply`` with one poll of the shell socket as long as the cell's whole time
limit, and for its outputs with one poll of the IOPub socket that never times out. Through pyzmq's asyncio
sockets such a poll can miss its wake-up: here a lesson's cell sat "running" with the kernel idle and the reply
already in the client's socket, and it was read only when the poll timed out (150 s later, or never). A poll that
times out looks at the socket once more, so :class:`NotebookRunner` polls in one-second slices up to the same limit:
a missed wake-up costs a second, and a cell that really runs long is still stopped at its limit.

Used by the course website (:func:`course_lib.website.execute`) and by the tests that run notebooks in a kernel.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from queue import Empty
from typing import Any

from nbclient import NotebookClient

SLICE_S = 1.0  # how long one poll may wait before the socket is looked at again


def _sliced(get_msg: Any) -> Any:
    """``get_msg(timeout)`` as a loop of polls of at most ``SLICE_S`` each, over the same total time."""

    async def get_msg_in_slices(timeout: float | None = None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SLICE_S if deadline is None else max(0.0, min(SLICE_S, deadline - time.monotonic()))
            try:
                return await get_msg(timeout=left)
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    return get_msg_in_slices


class NotebookRunner(NotebookClient):
    """An nbclient ``NotebookClient`` whose shell and IOPub reads poll in slices (see the module docstring)."""

    async def async_start_new_kernel_client(self) -> Any:
        client = await super().async_start_new_kernel_client()
        for channel in (client.shell_channel, client.iopub_channel):
            channel.get_msg = _sliced(channel.get_msg)
        return client


def unattended_env(notebook: Path) -> dict[str, str]:
    """The environment a notebook's kernel gets when a script executes it: this process's, minus what would change it.

    The kernel gets Jupyter's inline backend, so plots become images in the saved notebook (a non-interactive backend
    set for scripts or tests, ``MPLBACKEND=Agg``, would leave the figures out); nobody answers the lessons' questions,
    so each reveal is written out in full (``COURSE_UNATTENDED``); and the kernel is told the notebook's name, as
    Jupyter Server tells it (``JPY_SESSION_NAME``), so a claim log names the lesson.
    """
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env["COURSE_UNATTENDED"] = "1"
    env["JPY_SESSION_NAME"] = Path(notebook).name
    return env
