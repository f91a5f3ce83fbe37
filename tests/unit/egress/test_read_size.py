"""mitmproxy's 64 KiB reads made larger in the egress proxy's process (read_size.py): only a
read of exactly 65535 bytes, and never more than the stream holds."""

from __future__ import annotations

import asyncio

import pytest

from services.egress.read_size import read_larger_pieces


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
