"""A StreamReader whose `read` hands back the pieces as they came, not copies of them.

asyncio's StreamReader copies every byte twice: into its buffer as it arrives, and out of it
into the bytes `read` returns. mitmproxy reads every connection with `read` only, so in the
egress proxy's process those two copies of each byte of a download were a tenth of its CPU.
This reader keeps what arrives as a queue of the pieces the transport delivered; `read(n)`
returns the first piece itself (the part of it that fits n, rarely). The first call of any
other method (readline, readuntil, readexactly: nats-py's and redis-py's, a refusal's request
head) joins the pieces into asyncio's buffer and leaves the reader asyncio's own from then on,
so those work unchanged. Pausing the transport past twice the limit, as asyncio does, counts the
queued pieces.

Measured on this machine through a sandbox's handoff socket, a 20 MB plain-HTTP download: 575 and
628 MB/s with asyncio's reader, 662 and 698 MB/s with this one (alternating runs).
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, Any

__all__ = ["PiecesReader", "use_pieces_readers"]


class PiecesReader(asyncio.StreamReader):
    # asyncio.StreamReader's own state, which this works with (typeshed leaves it out).
    _buffer: bytearray
    _eof: bool
    _limit: int
    _paused: bool
    _transport: Any
    _exception: BaseException | None
    if TYPE_CHECKING:

        def _wakeup_waiter(self) -> None: ...

        async def _wait_for_data(self, func_name: str) -> None: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pieces: collections.deque[bytes] = collections.deque()
        self._held = 0  # bytes in _pieces
        self._joined = False  # asyncio's buffer from now on

    def _join(self) -> None:
        self._joined = True
        while self._pieces:
            self._buffer.extend(self._pieces.popleft())
        self._held = 0

    def feed_data(self, data: bytes) -> None:  # type: ignore[override]
        if self._joined:
            super().feed_data(data)
            return
        assert not self._eof, "feed_data after feed_eof"
        if not data:
            return
        self._pieces.append(data if type(data) is bytes else bytes(data))
        self._held += len(data)
        self._wakeup_waiter()
        if self._transport is not None and not self._paused and self._held > 2 * self._limit:
            try:
                self._transport.pause_reading()
            except NotImplementedError:
                self._transport = None
            else:
                self._paused = True

    def _maybe_resume_transport(self) -> None:
        if self._paused and len(self._buffer) + self._held <= self._limit:
            self._paused = False
            self._transport.resume_reading()

    def at_eof(self) -> bool:
        return self._eof and not self._buffer and not self._pieces

    async def read(self, n: int = -1) -> bytes:
        if self._joined or n < 0 or self._buffer:
            self._join()
            return await super().read(n)
        if self._exception is not None:
            raise self._exception
        if n == 0:
            return b""
        if not self._pieces and not self._eof:
            await self._wait_for_data("read")
        if not self._pieces:
            return b""  # end of stream
        piece = self._pieces.popleft()
        if len(piece) > n:
            self._pieces.appendleft(piece[n:])
            piece = piece[:n]
        self._held -= len(piece)
        self._maybe_resume_transport()
        return piece

    def take_pieces(self, most: int) -> list[bytes]:
        """Up to `most` bytes of what is queued, as they came (body_splice.py: what precedes
        a splice); the rest stays queued."""
        taken: list[bytes] = []
        size = 0
        while self._pieces and size < most:
            piece = self._pieces.popleft()
            if size + len(piece) > most:
                self._pieces.appendleft(piece[most - size :])
                piece = piece[: most - size]
            taken.append(piece)
            size += len(piece)
        self._held -= size
        return taken

    async def readline(self) -> bytes:
        self._join()
        return await super().readline()

    async def readuntil(self, separator: Any = b"\n") -> bytes:
        self._join()
        return await super().readuntil(separator)

    async def readexactly(self, n: int) -> bytes:
        self._join()
        return await super().readexactly(n)


def use_pieces_readers() -> None:
    """Every stream this process opens or accepts from now on (asyncio.open_connection,
    start_server and start_unix_server make theirs by this name) reads with PiecesReader."""
    asyncio.streams.StreamReader = PiecesReader  # type: ignore[misc]
