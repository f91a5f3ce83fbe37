"""mitmproxy's 64 KiB reads made larger in the egress proxy's process (read_size.py): only a
read of exactly 65535 bytes, and never more than the stream holds."""

from __future__ import annotations

import asyncio
import socket

import pytest

from services.egress.read_size import read_larger_pieces, write_ahead


async def test_only_mitmproxy_s_read_size_gets_larger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asyncio.StreamReader, "read", asyncio.StreamReader.read)
    read_larger_pieces()
    read_larger_pieces()  # twice: still one wrapper
    reader = asyncio.StreamReader(limit=4 << 20)
    reader.feed_data(b"x" * (3 << 20))
    assert len(await reader.read(65535)) == 1 << 20
    assert len(await reader.read(65536)) == 65536  # redis-py's size: as asked
    assert len(await reader.read(100)) == 100
    reader.feed_eof()
    assert len(await reader.read(65535)) == 1 << 20
    left = (3 << 20) - 2 * (1 << 20) - 65536 - 100
    assert len(await reader.read(65535)) == left  # what the stream holds, no more
    assert await reader.read(65535) == b""


async def test_writers_buffer_more_before_a_drain_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asyncio.StreamWriter, "__init__", asyncio.StreamWriter.__init__)
    write_ahead()
    write_ahead()  # twice: still one wrapper
    left, right = socket.socketpair()
    _, writer = await asyncio.open_connection(sock=left)
    try:
        assert writer.transport.get_write_buffer_limits()[1] == 256 * 1024
    finally:
        writer.close()
        right.close()
