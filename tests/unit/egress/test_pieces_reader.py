"""The egress proxy's StreamReader (pieces_reader.py): `read` hands back what arrived as it is,
the transport is paused and resumed as asyncio's would be, and every other method works as
asyncio's once called."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from services.egress.pieces_reader import PiecesReader


class _Transport:
    def __init__(self) -> None:
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


async def test_read_returns_each_piece_itself_and_splits_only_when_asked_for_less() -> None:
    reader = PiecesReader(limit=1 << 20)
    first, second = b"a" * 1000, b"b" * 500
    reader.feed_data(first)
    reader.feed_data(second)
    assert await reader.read(65536) is first  # not a copy
    assert await reader.read(200) == b"b" * 200
    assert await reader.read(65536) == b"b" * 300
    reader.feed_data(bytearray(b"xyz"))  # not bytes: kept as bytes
    assert await reader.read(10) == b"xyz"
    reader.feed_eof()
    assert await reader.read(10) == b""
    assert reader.at_eof()


async def test_a_read_waits_for_the_next_piece() -> None:
    reader = PiecesReader()
    waiting = asyncio.create_task(reader.read(100))
    await asyncio.sleep(0)
    assert not waiting.done()
    reader.feed_data(b"late")
    assert await waiting == b"late"


async def test_the_transport_pauses_past_twice_the_limit_and_resumes_below_it() -> None:
    reader = PiecesReader(limit=100)
    transport = _Transport()
    reader.set_transport(transport)  # type: ignore[arg-type]
    for _ in range(3):
        reader.feed_data(b"x" * 80)
    assert transport.paused  # 240 held > 200
    await reader.read(1000)
    assert transport.paused  # 160 held > 100
    await reader.read(1000)
    assert not transport.paused


async def test_other_methods_see_every_byte_in_order_then_and_after() -> None:
    reader = PiecesReader()
    reader.feed_data(b"one\ntw")
    reader.feed_data(b"o\nthree")
    assert await reader.read(2) == b"on"
    assert await reader.readline() == b"e\n"
    assert await reader.readuntil(b"\n") == b"two\n"
    reader.feed_data(b"-four")
    assert await reader.readexactly(7) == b"three-f"
    reader.feed_eof()
    assert await reader.read() == b"our"


async def test_an_error_set_on_the_stream_is_raised_by_read() -> None:
    reader = PiecesReader()
    reader.set_exception(ConnectionResetError("gone"))
    with pytest.raises(ConnectionResetError):
        await reader.read(10)


def test_mitmproxy_is_the_one_body_pieces_knows() -> None:
    """body_pieces.py reaches into mitmproxy's HTTP/1 layer and h11's body reader: a mitmproxy
    of another shape would only make the proxy copy bodies again, so it is caught here."""
    root = Path(__file__).resolve().parents[3]
    python = root / ".venv-egress" / "bin" / "python"
    assert python.exists(), "no .venv-egress: `make deps` makes it"
    out = subprocess.run(
        [
            str(python),
            "-c",
            "from services.egress.body_pieces import applies, pass_body_pieces\n"
            "print(applies() and pass_body_pieces())",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.stdout.strip() == "True", out.stderr
