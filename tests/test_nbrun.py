"""The notebook runner polls its kernel's sockets in slices: a missed wake-up costs a slice, a limit still holds."""

from __future__ import annotations

import asyncio
import time
from queue import Empty

import pytest

from course_lib import nbrun


class Socket:
    """A channel whose message is in the socket from ``ready_at`` on, but whose poll is never woken for it: only a
    poll that times out looks again (what pyzmq's asyncio sockets did to a lesson's execute_reply)."""

    def __init__(self, ready_at: float | None) -> None:
        self.ready_at, self.polls = ready_at, []

    async def get_msg(self, timeout: float | None = None) -> dict:
        self.polls.append(timeout)
        if timeout is None:
            raise AssertionError("an unbounded poll never sees a message whose wake-up was missed")
        await asyncio.sleep(timeout)
        if self.ready_at is not None and time.monotonic() >= self.ready_at:
            return {"msg_type": "execute_reply"}
        raise Empty


@pytest.fixture(autouse=True)
def short_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nbrun, "SLICE_S", 0.01)


def test_a_message_whose_wake_up_was_missed_is_read_at_the_next_slice() -> None:
    socket = Socket(ready_at=time.monotonic() + 0.05)
    for limit in (None, 30.0):  # IOPub's poll has no limit, the shell's has the cell's
        socket.polls.clear()
        assert asyncio.run(nbrun._sliced(socket.get_msg)(timeout=limit)) == {"msg_type": "execute_reply"}
        assert socket.polls and all(p is not None and p <= nbrun.SLICE_S for p in socket.polls)


def test_the_whole_limit_still_holds() -> None:
    socket = Socket(ready_at=None)
    started = time.monotonic()
    with pytest.raises(Empty):
        asyncio.run(nbrun._sliced(socket.get_msg)(timeout=0.1))
    assert time.monotonic() - started >= 0.1 and len(socket.polls) >= 5  # sliced, and not given up early


def test_the_runner_slices_both_channels_of_its_client(monkeypatch: pytest.MonkeyPatch) -> None:
    class Channel:
        async def get_msg(self, timeout: float | None = None) -> dict:
            return {"timeout": timeout}

    class Client:
        shell_channel, iopub_channel = Channel(), Channel()

    async def start(self: object) -> Client:
        return Client()

    monkeypatch.setattr(nbrun.NotebookClient, "async_start_new_kernel_client", start)  # starting is nbclient's
    client = asyncio.run(nbrun.NotebookRunner.__new__(nbrun.NotebookRunner).async_start_new_kernel_client())
    for channel in (client.shell_channel, client.iopub_channel):
        assert asyncio.run(channel.get_msg(timeout=None)) == {"timeout": nbrun.SLICE_S}
