"""Talking to the in-sandbox executor over the container's attached stdin/stdout.

`ExecutorClient` is the runtime's SandboxSession (shared/sandbox_protocol/): the executor
(deploy/sandbox/executor/) reads one JSON request per line and answers with one JSON line
carrying the same `id`; every reply is checked against its operation's type before anyone
reads it. Without a TTY, Docker multiplexes the attached output in
frames: an 8-byte header (stream type, 3 zero bytes, big-endian payload length) then the payload.
Several clients may be attached to one container (e.g. two replicas): each ignores answers to ids
it did not send.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import socket
import struct
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from shared.sandbox_protocol.messages import (
    OPERATIONS,
    BashReply,
    BashRequest,
    ChunkReply,
    ChunkRequest,
    CommitReply,
    CommitRequest,
    EditReply,
    EditRequest,
    ErrorReply,
    PackReply,
    PackRequest,
    PingReply,
    PythonReply,
    PythonRequest,
    ReadReply,
    ReadRequest,
    ScanReply,
    ScanRequest,
    WriteReply,
    WriteRequest,
)
from shared.sandbox_protocol.session import ExecutorError, SandboxLost

__all__ = ["ExecutorClient", "open_attach_socket"]

log = logging.getLogger("deckhands.runtime.executor")

_HEADER = struct.Struct(">BxxxL")
_STDOUT = 1
_ids = itertools.count(1)
_Reply = TypeVar("_Reply")
_REPLIES: dict[str, TypeAdapter[Any]] = {
    op: TypeAdapter(reply) for op, (_request, reply) in OPERATIONS.items()
}
_ERROR_REPLY: TypeAdapter[ErrorReply] = TypeAdapter(ErrorReply)


def open_attach_socket(api: Any, container_id: str) -> socket.socket:
    """Blocking: attach to the container's stdin+stdout and return a socket of our own.

    docker-py performs the HTTP upgrade; the connection is then duplicated so that asyncio owns
    a plain socket whose lifetime does not depend on docker-py's response objects.
    """
    attached = api.attach_socket(
        container_id, params={"stdin": 1, "stdout": 1, "stderr": 0, "stream": 1}
    )
    raw = getattr(attached, "_sock", attached)
    sock = socket.socket(fileno=os.dup(raw.fileno()))
    with contextlib.suppress(Exception):
        attached.close()
    sock.setblocking(False)
    return sock


# The longest line the executor ever writes is well below this (outputs are cut to a limit,
# kept outputs come in 128 KiB pieces). More is not the executor: see `_violated`.
MAX_LINE_BYTES = 4 << 20
# How long a close waits for what is still buffered to go out before dropping it.
_CLOSE_WAIT_S = 2.0


class ExecutorClient:
    """Request/response over one attach stream; fails every waiter when the stream ends.

    The stream is treated as hostile: code in the sandbox may find a way to write to it. A line
    longer than MAX_LINE_BYTES or one that is not a JSON object ends the sandbox (its waiters
    fail with SandboxLost naming what was seen); nothing it sends can grow the runtime's memory.
    """

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str
    ) -> None:
        self.name = name
        self._reader = reader
        self._writer = writer
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._prefix = os.urandom(4).hex()
        self.lost_reason: str | None = None
        self.violated = False  # the sandbox wrote into the channel: the reason says what
        self._task = asyncio.create_task(self._read_loop(), name=f"executor-reader-{name}")

    @classmethod
    async def connect(cls, sock: socket.socket, name: str) -> ExecutorClient:
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
        return cls(reader, writer, name)

    async def ping(self, wait_s: float) -> PingReply:
        return await self._call("ping", {}, wait_s, PingReply)

    async def bash(self, request: BashRequest, wait_s: float) -> BashReply:
        return await self._call("bash", request, wait_s, BashReply)

    async def python(self, request: PythonRequest, wait_s: float) -> PythonReply:
        return await self._call("python", request, wait_s, PythonReply)

    async def read(self, request: ReadRequest, wait_s: float) -> ReadReply:
        return await self._call("read", request, wait_s, ReadReply)

    async def write(self, request: WriteRequest, wait_s: float) -> WriteReply:
        return await self._call("write", request, wait_s, WriteReply)

    async def edit(self, request: EditRequest, wait_s: float) -> EditReply:
        return await self._call("edit", request, wait_s, EditReply)

    async def chunk(self, request: ChunkRequest, wait_s: float) -> ChunkReply:
        return await self._call("chunk", request, wait_s, ChunkReply)

    async def scan(self, request: ScanRequest, wait_s: float) -> ScanReply:
        return await self._call("scan", request, wait_s, ScanReply)

    async def pack(self, request: PackRequest, wait_s: float) -> PackReply:
        return await self._call("pack", request, wait_s, PackReply)

    async def commit(self, request: CommitRequest, wait_s: float) -> CommitReply:
        return await self._call("commit", request, wait_s, CommitReply)

    async def _call(
        self, op: str, fields: Mapping[str, Any], wait_s: float, reply: type[_Reply]
    ) -> _Reply:
        """Send one request, wait up to `wait_s` for its answer and check it against its type."""
        answer = await self.exchange(op, fields, wait_s)
        try:
            if not answer.get("ok"):
                refusal = _ERROR_REPLY.validate_python(answer)
                raise ExecutorError(refusal["code"], refusal["error"])
            checked: _Reply = _REPLIES[op].validate_python(answer)
        except ValidationError as exc:
            # The executor's own bug or an image of another protocol: the action fails, named.
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'reply'}: {e['msg']}" for e in exc.errors()[:3]
            )
            raise ExecutorError(
                "bad_reply", f"the sandbox's executor answered {op} malformed ({problems})"
            ) from None
        return checked

    async def exchange(self, op: str, fields: Mapping[str, Any], wait_s: float) -> dict[str, Any]:
        """One request, its answer as it came (unchecked): for a peer of this framing that is
        not the executor (the egress folders' helper, egress_stores.py)."""
        if self.lost_reason is not None:
            raise SandboxLost(self.lost_reason)
        rid = f"{self._prefix}-{next(_ids)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            line = json.dumps({"id": rid, "op": op, **fields}, ensure_ascii=False) + "\n"
            # The deadline covers the write too: a stream the engine stopped reading (seen under
            # heavy load) would otherwise hold `drain` for ever.
            async with asyncio.timeout(wait_s):
                try:
                    self._writer.write(line.encode())
                    await self._writer.drain()
                except (ConnectionError, OSError) as exc:
                    self._lose(f"the attach stream broke: {exc}")
                    raise SandboxLost(self.lost_reason or "lost") from exc
                return await future
        finally:
            self._pending.pop(rid, None)

    async def close(self) -> None:
        self._lose("closed by the runtime")
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task
        self._writer.close()
        try:
            async with asyncio.timeout(_CLOSE_WAIT_S):
                await self._writer.wait_closed()
        except TimeoutError:
            # A graceful close first writes out what is buffered; a stream the engine stopped
            # reading never lets it, and the close (a pool's shutdown with it) waited for ever.
            self._writer.transport.abort()
        except Exception:
            pass

    def _lose(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(SandboxLost(self.lost_reason))

    async def _read_loop(self) -> None:
        buffer = bytearray()
        try:
            while True:
                header = await self._reader.readexactly(_HEADER.size)
                kind, size = _HEADER.unpack(header)
                payload = await self._reader.readexactly(size)
                if kind != _STDOUT:
                    continue
                buffer += payload
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if not self._dispatch(line):
                        return
                if len(buffer) > MAX_LINE_BYTES:
                    self._violated(f"a line of more than {MAX_LINE_BYTES:,} bytes")
                    return
        except asyncio.IncompleteReadError:
            self._lose("the sandbox's executor stopped (its container exited or was removed)")
        except (ConnectionError, OSError) as exc:
            self._lose(f"the attach stream broke: {exc}")
        except asyncio.CancelledError:
            self._lose("closed by the runtime")
            raise

    def _violated(self, what: str) -> None:
        log.warning("%s: the executor's channel carried %s; the sandbox is ended", self.name, what)
        self.violated = self.lost_reason is None
        self._lose(
            f"something in the sandbox wrote to the executor's channel ({what}); the sandbox "
            "was ended"
        )

    def _dispatch(self, line: bytes) -> bool:
        """Hand an answer to its waiter; False (and the sandbox lost) if it is not one."""
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self._violated(f"a line that is not the executor's: {line[:80]!r}")
            return False
        future = self._pending.get(str(answer.get("id")))
        if future is not None and not future.done():
            future.set_result(answer)
        return True
