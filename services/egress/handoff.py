"""A sandbox's connection handed to mitmproxy as it is, with nothing of ours relaying it.

mitmproxy serves the unix connection itself (its ServerInstance.handle_stream: the stream it
would have accepted on its own port), so no byte is copied once more on the way in. It reads
the stream with `read` and answers with `write`: those two are wrapped here to count each byte
for the tenant's day (usage.py) and to cut the connection the moment the tenant's allowance is
used up or its policy no longer allows it, and the peer name mitmproxy reads is a key of ours
(links.py: which sandbox the connection is from).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["CountedStream", "StreamHandler"]

# mitmproxy reads 64 KiB at a time; a sandbox's upload goes in fewer, larger pieces.
_READ = 256 * 1024


class StreamHandler(Protocol):
    """What of mitmproxy serves a connection (mitmproxy.proxy.mode_servers.ServerInstance)."""

    async def handle_stream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None: ...


class CountedStream:
    """One connection's two ends as mitmproxy sees them, counted. `count(n)` adds n bytes to
    the tenant's day and says whether it may go on; `key`: the peer port mitmproxy reads."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        key: int,
        count: Callable[[int], bool],
        answered: Callable[[], None] = lambda: None,
    ) -> None:
        self.sent = 0  # by the sandbox
        self.received = 0  # by the sandbox
        self.cut = False
        self.writer = writer
        self._count = count
        read, write, extra = reader.read, writer.write, writer.get_extra_info

        async def counted_read(n: int = -1) -> bytes:
            data = await read(n if n < 0 else max(n, _READ))
            self.sent += len(data)
            self._went(len(data))
            return data

        def counted_write(data: Any) -> None:
            answered()  # its first answer byte: it no longer needs a place to start
            if self.cut:
                return
            self.received += len(data)
            write(data)
            self._went(len(data))

        def named(name: str, default: Any = None) -> Any:
            if name == "peername":
                return ("127.0.0.1", key)
            if name == "sockname":
                return ("127.0.0.1", 0)
            return extra(name, default)

        writer.deckhands_counted = self  # type: ignore[attr-defined]  # for body_splice.py
        reader.read = counted_read  # type: ignore[method-assign]
        writer.write = counted_write  # type: ignore[method-assign]
        writer.get_extra_info = named  # type: ignore[method-assign]

    def given(self, count: int) -> bool:
        """`count` bytes sent to the sandbox past `write` (body_splice.py): whether it may go on."""
        self.received += count
        self._went(count)
        return not self.cut

    def _went(self, count: int) -> None:
        if not self._count(count):
            self.close()

    def close(self) -> None:
        """Cut at once: what mitmproxy wrote and the sandbox has not read is dropped. The socket
        itself is shut, not only this handle of it: a body being moved by splice holds a copy of
        its descriptor (body_splice.py) until mitmproxy, seeing this side gone, cancels the
        host's read; the sandbox sees the end now, whatever that takes."""
        self.cut = True
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError), socket.socket(fileno=os.dup(sock.fileno())) as own:
                own.shutdown(socket.SHUT_RDWR)
        self.writer.transport.abort()
