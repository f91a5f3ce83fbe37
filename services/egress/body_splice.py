"""The rest of a long streamed plain-HTTP body moved host to sandbox inside the kernel (splice(2)).

body_relay.py writes each piece of such a body to the sandbox as it is read, past mitmproxy's
layers, but each byte still comes up into this process and goes back down: a read and a write
of up to 1 MiB, and the event loop's steps between them, about 0.45 ms of CPU per MB here, a
third of a download's CPU on a 2-core machine (bench/egress_bench.py, download row). Once a
piece has been relayed and more than `_LEAST` bytes of the body are left, the next read of the
host's connection moves all of them but the last through a pipe with splice(2): the pages go
from one socket to the other, never copied into Python (about 0.24 ms of CPU per MB in a probe
on this machine). The last byte is then read as any other, so mitmproxy sees the body end and
finishes the flow as it always did.

While it moves, the host's transport reads nothing (this reads its socket through a duplicate),
and it starts only once what mitmproxy wrote to the sandbox has left (ordering). Every piece
given to the sandbox is counted for the tenant's day and may cut the connection
(handoff.CountedStream.given), as a write would be. It runs inside mitmproxy's read of the host
connection, so anything that ends a read there (the connection closed by the layers, its idle
timeout: a cancel) ends it the same way; the host's end of stream or error is left for that read
to find. Without splice (not Linux) or a socket under either transport, nothing changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .metrics import BODY_RELAYED, BODY_SPLICED

__all__ = ["Moved", "move", "splice_next_read"]

_LEAST = 1 << 20  # what is left of a body for a pipe and two descriptors to pay off
_PIPE = 1 << 20  # asked of the kernel; pipe-max-size allows this much by default
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)

# What a splice needs to know when the read comes: the host's body reader and the sandbox's
# connection, still as the relay found them (None otherwise).
Recheck = Callable[[], "tuple[Any, Any] | None"]


@dataclass
class Moved:
    taken: int = 0  # from the host's socket
    given: int = 0  # to the sandbox's socket


def splice_next_read(handler: Any, conn: Any, recheck: Recheck, left: int) -> None:
    """After a relayed piece with `left` bytes of its body still to come: the next read of
    `conn` (mitmproxy's host connection under `handler`) first moves them by splice."""
    if left <= _LEAST or not hasattr(os, "splice"):
        return
    io = handler.transports.get(conn)
    reader = io.reader if io is not None else None
    if reader is None or getattr(conn, "tls", True):
        return
    if getattr(reader, "deckhands_splice", None) is None:
        _take_reads(reader)
    reader.deckhands_splice = (handler, conn, recheck)


def _take_reads(reader: Any) -> None:
    read = reader.read

    async def spliced_read(n: int = -1) -> bytes:
        planned = reader.deckhands_splice
        if planned:
            reader.deckhands_splice = ()
            await _splice_rest(reader, *planned)
        data: bytes = await read(n)
        return data

    reader.deckhands_splice = ()
    reader.read = spliced_read


async def _splice_rest(reader: Any, handler: Any, conn: Any, recheck: Recheck) -> None:
    found = recheck()
    if found is None or reader._buffer or reader._paused:
        return
    body, sandbox = found
    host, out = handler.transports.get(conn), handler.transports.get(sandbox)
    counted = getattr(out.writer, "deckhands_counted", None) if out is not None else None
    if host is None or host.writer is None or counted is None or counted.cut:
        return
    taking, giving = host.writer.transport, out.writer.transport
    source, sink = taking.get_extra_info("socket"), giving.get_extra_info("socket")
    if source is None or sink is None or body._remaining - 1 <= _LEAST or taking.is_closing():
        return
    taking.pause_reading()
    try:
        _pass_held(reader, body, out.writer)
        count = body._remaining - 1  # the last byte through mitmproxy: it ends the flow
        if count <= _LEAST or getattr(reader, "_held", 0) or counted.cut:
            return
        if not await _written(out.writer) or counted.cut:
            return

        def given(size: int) -> bool:
            BODY_SPLICED.inc(size)
            return bool(counted.given(size))

        source_fd, sink_fd = os.dup(source.fileno()), os.dup(sink.fileno())
        moved = Moved()
        try:
            await move(source_fd, sink_fd, count, moved, given, handler.timeout_watchdog)
        finally:
            os.close(source_fd)
            os.close(sink_fd)
            body._remaining -= moved.taken
    finally:
        if not taking.is_closing():
            taking.resume_reading()


def _pass_held(reader: Any, body: Any, writer: asyncio.StreamWriter) -> None:
    """What the host's reader already holds of the body goes to the sandbox first, written as
    the relay writes it (counted), up to the body's last byte: the splice then starts on an
    empty queue, at once, however the host's bytes came in."""
    take = getattr(reader, "take_pieces", None)
    if take is None:
        return
    for piece in take(body._remaining - 1):
        body._remaining -= len(piece)
        writer.write(piece)
        BODY_RELAYED.inc(len(piece))


async def _written(writer: asyncio.StreamWriter) -> bool:
    """Whether all mitmproxy wrote to the sandbox has been sent (so nothing overtakes it)."""
    transport: Any = writer.transport
    if not transport.get_write_buffer_size():
        return True
    low, high = transport.get_write_buffer_limits()
    transport.set_write_buffer_limits(high=0, low=0)
    try:
        await writer.drain()
    except OSError:
        return False
    finally:
        if not transport.is_closing():
            transport.set_write_buffer_limits(high=high, low=low)
    return not transport.is_closing() and not transport.get_write_buffer_size()


async def move(
    source: int, sink: int, count: int, moved: Moved, given: Callable[[int], bool], watchdog: Any
) -> None:
    """Up to `count` bytes from socket `source` to socket `sink` (non-blocking both), through a
    pipe. `given(n)` after each piece handed to the sink says whether to go on; `moved` says how
    far it got, whatever ends it (the source's end, the sink's error, a cancel)."""
    loop = asyncio.get_running_loop()
    pipe_out, pipe_in = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):  # a smaller pipe only means more steps
            fcntl.fcntl(pipe_in, fcntl.F_SETPIPE_SZ, _PIPE)
        room = fcntl.fcntl(pipe_in, fcntl.F_GETPIPE_SZ)
        held = 0  # bytes in the pipe
        ended = False  # the source gave its end or an error: the next read finds which
        while True:
            took = 0 if ended else _take(source, pipe_in, min(room - held, count - moved.taken))
            if took is None:
                ended = True
            elif took:
                moved.taken += took
                held += took
            try:
                gave = _give(pipe_out, sink, held) if held else 0
            except OSError:
                return  # the sandbox's side is gone; mitmproxy learns it from its own reads
            if gave:
                held -= gave
                moved.given += gave
                if not given(gave):
                    return
            if took or gave:
                watchdog.register_activity()
            if not held and (ended or moved.taken == count):
                return
            if not took and not gave:
                # A pipe holding bytes may also be full (it counts pages, not bytes): then only
                # the sink's room lets it go on.
                await _ready(loop, sink if held else source, writing=bool(held))
    finally:
        os.close(pipe_out)
        os.close(pipe_in)


def _take(source: int, pipe: int, size: int) -> int | None:
    """Bytes moved from the socket into the pipe: 0 when none is there yet (or no room), None
    at the socket's end or error (the read after the splice finds which)."""
    if size <= 0:
        return 0
    try:
        return os.splice(source, pipe, size, flags=_FLAGS) or None
    except BlockingIOError:
        return 0
    except OSError:
        return None


def _give(pipe: int, sink: int, size: int) -> int:
    """Bytes moved from the pipe to the socket: 0 when it has no room now; its errors raised."""
    try:
        return os.splice(pipe, sink, size, flags=_FLAGS)
    except BlockingIOError:
        return 0


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, writing: bool) -> None:
    waiter = loop.create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    (loop.add_writer if writing else loop.add_reader)(fd, wake)
    try:
        await waiter
    finally:
        (loop.remove_writer if writing else loop.remove_reader)(fd)
