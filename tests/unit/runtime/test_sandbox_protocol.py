"""The sandbox contract's version, checked once per sandbox when the runtime attaches to it: an
executor of another protocol (an image built from other sources) is refused, named."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from services.runtime import containers
from services.runtime.containers import DockerSandboxes
from services.runtime.errors import SandboxStartError
from services.runtime.settings import RuntimeSettings
from shared.sandbox_protocol import PROTOCOL_VERSION
from tests.fakes.attach_stream import EngineStream


class _Engine:
    """Stands in for Docker: each attach gets a local socket whose engine end answers pings
    with `protocol`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.protocol = PROTOCOL_VERSION
        self.ends: list[socket.socket] = []

    def attach(self, api: Any, container_id: str) -> socket.socket:  # on a Docker thread
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        self.ends.append(theirs)
        protocol = self.protocol
        answer = lambda request: {"id": request["id"], "ok": True, "pid": 7, "protocol": protocol}  # noqa: E731
        asyncio.run_coroutine_threadsafe(EngineStream(theirs, answer).serve(), self.loop)
        return ours


@pytest.fixture
async def engine(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[_Engine]:
    fake = _Engine(asyncio.get_running_loop())
    monkeypatch.setattr(containers, "open_attach_socket", fake.attach)
    yield fake
    for end in fake.ends:
        end.close()


async def _attach(engine: _Engine, protocol: int) -> Any:
    engine.protocol = protocol
    docker_client = SimpleNamespace(api=None, close=lambda: None)
    sandboxes = DockerSandboxes(RuntimeSettings(), "r1", client=docker_client)  # type: ignore[arg-type]
    try:
        return await sandboxes.attach("c0ffee" * 10, "deckhands-task-x", 5.0)
    finally:
        sandboxes.close()


async def test_an_executor_of_this_protocol_is_attached(engine: _Engine) -> None:
    sandbox = await _attach(engine, PROTOCOL_VERSION)
    assert sandbox.session.lost_reason is None
    await sandbox.session.close()


async def test_an_executor_of_another_protocol_is_refused_naming_both(
    engine: _Engine,
) -> None:
    with pytest.raises(SandboxStartError) as refused:
        await _attach(engine, PROTOCOL_VERSION + 1)
    message = str(refused.value)
    assert f"protocol {PROTOCOL_VERSION + 1}, this runtime {PROTOCOL_VERSION}" in message
    assert "make image" in message
