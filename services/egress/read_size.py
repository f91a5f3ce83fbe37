"""mitmproxy reads each connection 64 KiB at a time (`reader.read(65535)` in its connection
handler, for the sandbox's side and the host's alike), and every read goes through its layers
as one event: a 20 MB download is some 320 events. Reads of up to 1 MiB make a download 25-40 %
faster here (bench/egress_bench.py, download row: 0.36-0.43x the bridge's throughput before,
0.52-0.54x after).

This changes asyncio's StreamReader.read in the egress proxy's process only, and only for reads
of exactly 65535 bytes, which nothing else in that process asks for (redis-py reads 65536,
nats-py 32768); a later mitmproxy that reads another size is simply not affected. A read may
return fewer bytes than asked, so a caller of read(65535) copes with any size; it then gets up
to 1 MiB, what the stream holds.
"""

from __future__ import annotations

import asyncio

__all__ = ["read_larger_pieces"]

_MITMPROXY_READ = 65535
_LARGER = 1 << 20


def read_larger_pieces() -> None:
    read = asyncio.StreamReader.read
    if getattr(read, "deckhands_larger", False):
        return

    async def larger(self: asyncio.StreamReader, n: int = -1) -> bytes:
        return await read(self, _LARGER if n == _MITMPROXY_READ else n)

    larger.deckhands_larger = True  # type: ignore[attr-defined]
    asyncio.StreamReader.read = larger  # type: ignore[method-assign]
