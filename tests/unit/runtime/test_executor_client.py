"""The runtime's end of a sandbox's attach stream, over a local socket pair standing in for
the engine's stream."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from services.runtime.executor_client import ExecutorClient
from shared.sandbox_protocol.session import ExecutorError, SandboxLost
from tests.fakes.attach_stream import EngineStream


async def test_closing_a_stream_the_other_end_stopped_reading_does_not_hang() -> None:
    """Under heavy load the engine stopped reading an attach stream: a request's write stayed
    buffered, and closing the client (a pool shutting down) waited for ever for the buffer to
    go out."""
    ours, engine = socket.socketpair()
    engine.setblocking(False)
    client = await ExecutorClient.connect(ours, "stalled")
    try:
        with pytest.raises(TimeoutError):
            await client.bash({"command": "x" * (16 << 20), "timeout_s": 1}, 0.5)  # never read
        began = time.monotonic()
        await asyncio.wait_for(client.close(), 10)
        assert time.monotonic() - began < 5
    finally:
        engine.close()


@pytest.fixture
async def talk() -> AsyncIterator[Callable[[Callable[[dict[str, Any]], Any]], Any]]:
    made: list[tuple[ExecutorClient, asyncio.Task[None]]] = []

    async def connect(
        answer: Callable[[dict[str, Any]], Any],
    ) -> tuple[ExecutorClient, EngineStream]:
        ours, theirs = socket.socketpair()
        engine = EngineStream(theirs, answer)
        client = await ExecutorClient.connect(ours, "unit")
        made.append((client, asyncio.create_task(engine.serve())))
        return client, engine

    yield connect
    for client, serving in made:
        await client.close()
        serving.cancel()


async def test_a_reply_is_read_as_its_operations_type(talk: Any) -> None:
    def answer(request: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": request["id"],
            "ok": True,
            "output": "hi\n",
            "exit_code": 0,
            "cwd": "/workspace",
            "timed_out": False,
            "running": False,
            "note": "",
        }

    client, engine = await talk(answer)
    reply = await client.bash({"command": "echo hi", "timeout_s": 5, "env": {"A": "b"}}, 5)
    assert reply["output"] == "hi\n" and reply["exit_code"] == 0
    (sent,) = engine.requests
    assert sent["op"] == "bash" and sent["command"] == "echo hi" and sent["env"] == {"A": "b"}


async def test_a_refusal_raises_its_code_and_a_malformed_reply_is_named(talk: Any) -> None:
    def answer(request: dict[str, Any]) -> dict[str, Any]:
        if request["op"] == "read":
            return {"id": request["id"], "ok": False, "code": "file_not_found", "error": "nope"}
        return {"id": request["id"], "ok": True, "path": "/workspace/f"}  # no size

    client, _ = await talk(answer)
    with pytest.raises(ExecutorError) as refused:
        await client.read({"path": "missing"}, 5)
    assert refused.value.code == "file_not_found" and str(refused.value) == "nope"
    with pytest.raises(ExecutorError) as malformed:
        await client.write({"path": "f", "content": "x"}, 5)
    assert malformed.value.code == "bad_reply"
    assert "write" in str(malformed.value) and "size" in str(malformed.value)
    assert client.lost_reason is None  # the executor's bug fails the call, not the sandbox


async def test_a_line_that_is_not_the_executors_ends_the_session(talk: Any) -> None:
    client, _ = await talk(lambda request: b"not json at all")
    with pytest.raises(SandboxLost):
        await client.ping(5)
    assert client.violated and client.lost_reason and "wrote to the executor" in client.lost_reason
    with pytest.raises(SandboxLost):  # and every later call fails the same way
        await client.python({"code": "1", "timeout_s": 1}, 5)
