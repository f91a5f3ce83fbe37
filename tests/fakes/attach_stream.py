"""The engine's end of a container's attach stream, over a local socket: what the runtime's
ExecutorClient talks to, answering as a test says (no Docker, no executor)."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["EngineStream"]


class EngineStream:
    """The engine's end of the stream: answers each request line with what `answer` makes of
    it, in the engine's frames (8-byte header, then the payload)."""

    def __init__(self, sock: socket.socket, answer: Callable[[dict[str, Any]], Any]) -> None:
        self.sock, self.answer = sock, answer
        self.requests: list[dict[str, Any]] = []

    async def serve(self) -> None:
        reader, writer = await asyncio.open_connection(sock=self.sock)
        while line := await reader.readline():
            request = json.loads(line)
            self.requests.append(request)
            reply = self.answer(request)
            payload = (reply if isinstance(reply, bytes) else json.dumps(reply).encode()) + b"\n"
            writer.write(struct.pack(">BxxxL", 1, len(payload)) + payload)
            await writer.drain()
