"""The runtime's end of a sandbox's attach stream, over a local socket pair standing in for
the engine's stream."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from services.runtime.executor_client import ExecutorClient


async def test_closing_a_stream_the_other_end_stopped_reading_does_not_hang() -> None:
    """Under heavy load the engine stopped reading an attach stream: a request's write stayed
    buffered, and closing the client (a pool shutting down) waited for ever for the buffer to
    go out."""
    ours, engine = socket.socketpair()
    engine.setblocking(False)
    client = await ExecutorClient.connect(ours, "stalled")
    try:
        with pytest.raises(TimeoutError):
            await client.request("bash", 0.5, command="x" * (16 << 20))  # never read
        began = time.monotonic()
        await asyncio.wait_for(client.close(), 10)
        assert time.monotonic() - began < 5
    finally:
        engine.close()
