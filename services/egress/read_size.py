"""Larger pieces through mitmproxy: reads of up to 1 MiB, and 256 KiB written ahead.

mitmproxy reads each connection 64 KiB at a time (`reader.read(65535)` in its connection
handler, for the sandbox's side and the host's alike), and every read goes through its layers
as one event: a 20 MB download is some 320 events. Reads of up to 1 MiB make a download 25-40 %
faster here (bench/egress_bench.py, download row: 0.36-0.43x the bridge's throughput before,
0.52-0.54x after). This changes asyncio's StreamReader.read in the egress proxy's process only,
and only for reads of exactly 65535 bytes, which nothing else in that process asks for
(redis-py reads 65536, nats-py 32768); a later mitmproxy that reads another size is simply not
affected. A read may return fewer bytes than asked, so a caller of read(65535) copes with any
size; it then gets up to 1 MiB, what the stream holds.

After each read mitmproxy waits until every writer of the connection has drained below its
high-water mark (asyncio's default: 64 KiB) before it reads again, so the host and the sandbox
took turns: the proxy stood idle while the sandbox read 64 KiB, and the host's sends waited.
Writers in this process buffer up to 256 KiB before that wait. A connection whose reader stops
reading holds at most that much here (and the host's side is then no longer read), 16 MiB for a
task's 64 connections.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["read_larger_pieces", "write_ahead"]

_MITMPROXY_READ = 65535
_LARGER = 1 << 20
_WRITE_AHEAD = 256 * 1024


def read_larger_pieces(reader: type[asyncio.StreamReader] = asyncio.StreamReader) -> None:
    """For `reader` (asyncio's, or a subclass with its own `read`)."""
    read = reader.read
    if getattr(read, "deckhands_larger", False):
        return

    async def larger(self: asyncio.StreamReader, n: int = -1) -> bytes:
        return await read(self, _LARGER if n == _MITMPROXY_READ else n)

    larger.deckhands_larger = True  # type: ignore[attr-defined]
    reader.read = larger  # type: ignore[method-assign]


def write_ahead() -> None:
    init = asyncio.StreamWriter.__init__
    if getattr(init, "deckhands_ahead", False):
        return

    def buffered(self: asyncio.StreamWriter, transport: Any, *args: Any, **kwargs: Any) -> None:
        init(self, transport, *args, **kwargs)
        transport.set_write_buffer_limits(high=_WRITE_AHEAD)

    buffered.deckhands_ahead = True  # type: ignore[attr-defined]
    asyncio.StreamWriter.__init__ = buffered  # type: ignore[method-assign]
