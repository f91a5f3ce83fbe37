"""A sandbox's connections passed to this replica as they are, with no relay copying them.

The sandbox's relay (deploy/sandbox/egress_relay.py) accepts a client's TCP connection on
127.0.0.1:3128 inside the sandbox, connects to `<replica>.handoff` in the sandbox's folder and
passes the accepted socket itself (SCM_RIGHTS, one byte with it). This replica then reads and
writes the client's own socket: the relay's two copies of every byte, and the thread doing them
on the sandbox's CPU, are gone (bench/egress_bench.py, download row). Which sandbox it is from
is still the folder the unix connection came through, never anything it sends.

What a sandbox passes is its own, so it is checked before use: exactly one descriptor, a
connected TCP socket (AF_INET or AF_INET6, SOCK_STREAM, a peer, not listening). This replica
only reads and writes it, never connects or binds it, so it reaches nothing the sandbox could
not. Anything else
(a file, a pipe, a unix socket, several descriptors, none: a gVisor sandbox's sockets are not
host sockets and arrive as none) is closed, answered `0`, and the unix connection itself is then
served as the plain stream the relay falls back to. `1` tells the relay this replica took it.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

__all__ = ["REFUSED", "TOOK", "PassedSockets"]

log = logging.getLogger("deckhands.egress")

TOOK = b"1"
REFUSED = b"0"
# How long a sandbox's relay may take to send its socket once connected: long, since a sandbox
# whose CPU is busy (a flood of its own) runs its relay late.
_PASS_TIMEOUT_S = 30.0
_BACKLOG = 256
_INT_SIZE = array.array("i").itemsize
# Room for a few descriptors, so that a message with several is seen whole and all are closed.
_ANCILLARY = socket.CMSG_SPACE(8 * _INT_SIZE)

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _received(conn: socket.socket) -> tuple[bytes, list[int], bool]:
    """One byte and the descriptors passed with it; True when the kernel cut the list short."""
    data, ancillary, flags, _ = conn.recvmsg(1, _ANCILLARY, socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % _INT_SIZE
            fds.extend(array.array("i", payload[:usable]))
    return data, fds, bool(flags & socket.MSG_CTRUNC)


def _tcp_socket(fds: list[int], truncated: bool) -> socket.socket | None:
    """The one TCP socket passed, or None (and every descriptor closed)."""
    if len(fds) != 1 or truncated:
        for fd in fds:
            os.close(fd)
        return None
    try:
        sock = socket.socket(fileno=fds[0])  # its family and type read from the descriptor
    except OSError:  # not a socket
        os.close(fds[0])
        return None
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        sock.close()
        return None
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        sock.getpeername()  # connected: nothing to connect here
    except OSError:
        listening = 1
    if listening:
        sock.close()
        return None
    sock.setblocking(False)
    return sock


class PassedSockets:
    """Listens on one sandbox's `<replica>.handoff` and serves each passed socket with `serve`
    (the same as a connection to its `<replica>.sock`)."""

    def __init__(self, path: Path, serve: Serve, limit: int, max_waiting: int) -> None:
        self.path = path
        self._serve = serve
        self._limit = limit
        self._max_waiting = max_waiting
        self._listener: socket.socket | None = None
        self._receiving = 0  # connections whose socket has not come yet
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # this replica's, left by its previous run
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.path))
            os.chmod(self.path, 0o666)  # the sandbox's relay runs as its own uid
            listener.listen(_BACKLOG)
        except OSError:
            listener.close()
            raise
        listener.setblocking(False)
        self._listener = listener
        asyncio.get_running_loop().add_reader(listener.fileno(), self._accept)

    def _accept(self) -> None:
        """Every connection waiting, at once: one per turn of a busy event loop (a flood of
        thousands) made the sandboxes' relays wait many seconds for their answer."""
        assert self._listener is not None
        for _ in range(_BACKLOG):
            try:
                conn, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of descriptors: the others still serve
                log.warning("cannot accept on %s: %s", self.path, exc)
                return
            if self._receiving >= self._max_waiting:
                conn.close()  # a sandbox opening connections and sending nothing on them
                continue
            self._receiving += 1
            task = asyncio.create_task(self._one(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _one(self, conn: socket.socket) -> None:
        try:
            stream = await self._receive(conn)
        finally:
            self._receiving -= 1
        if stream is None:
            return
        try:
            reader, writer = await asyncio.open_connection(sock=stream, limit=self._limit)
        except OSError:
            stream.close()
            return
        await self._serve(reader, writer)

    async def _receive(self, conn: socket.socket) -> socket.socket | None:
        """The socket to serve: the one passed, or `conn` itself; None when there is neither."""
        conn.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            readable: asyncio.Future[None] = loop.create_future()

            def ready() -> None:
                if not readable.done():
                    readable.set_result(None)

            loop.add_reader(conn.fileno(), ready)
            try:
                await asyncio.wait_for(readable, _PASS_TIMEOUT_S)
            finally:
                loop.remove_reader(conn.fileno())
            data, fds, truncated = _received(conn)
        except (OSError, TimeoutError):
            conn.close()
            return None
        if not data:  # closed before it sent anything
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        passed = _tcp_socket(fds, truncated)
        try:
            conn.send(TOOK if passed is not None else REFUSED)
        except OSError:
            conn.close()
            if passed is not None:
                passed.close()
            return None
        if passed is None:
            return conn  # served as a plain stream, what the relay then sends through it
        conn.close()
        return passed

    def close(self) -> None:
        """No new connection; those being served go on until they end, as an asyncio server's."""
        if self._listener is not None:
            with contextlib.suppress(RuntimeError):  # its loop closed already
                asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._listener.close()
        with contextlib.suppress(OSError):
            self.path.unlink()
