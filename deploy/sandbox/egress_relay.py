"""The sandbox's end of the egress proxy: 127.0.0.1:3128 relayed to the proxy's sockets.

A sandbox whose task has a network policy has no network, only loopback and the folder the
runtime mounts at /run/deckhands/egress, holding one unix socket per egress proxy replica.
HTTP_PROXY and HTTPS_PROXY name 127.0.0.1:3128, which pip, npm, git and curl honour; this
relay carries each connection to a replica, trying the next when one does not answer (a
replica killed: the next connection goes through another).

It passes the accepted connection itself to the replica (`<replica>.handoff`, SCM_RIGHTS): the
proxy then reads and writes the client's socket, and no byte is copied here. A replica that
cannot take it (under gVisor a sandbox's sockets are not the host's) answers `0`, and the
relay copies the connection's bytes through that same unix connection, as through
`<replica>.sock` when no replica offers a handoff socket.

Started by holder.py as the channel's uid (999), so the agent (uid 1000) can neither stop nor
replace it. Standard library only.
"""

from __future__ import annotations

import _thread
import os
import socket

__all__ = ["serve"]

FOLDER = "/run/deckhands/egress"
PORT = 3128
_CHUNK = 262144


_TOOK = b"1"
_ANSWER_TIMEOUT_S = 120.0


def _sockets(folder: str, suffix: str = ".sock") -> list[str]:
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(suffix))
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names]


def _upstream(folder: str, first: int, suffix: str = ".sock") -> socket.socket | None:
    paths = _sockets(folder, suffix)
    for i in range(len(paths)):
        path = paths[(first + i) % len(paths)]
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.connect(path)
            return up
        except OSError:
            up.close()
    return None


def _copy(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(_CHUNK):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    b"Content-Length: 43\r\n\r\ndeckhands egress proxy: no replica answers\n"
)


def _hand_over(client: socket.socket, folder: str, first: int) -> socket.socket | None:
    """Pass `client` to a replica. None: it is closed here (taken by a replica, or lost with
    it), or no replica answers (still open); else a unix connection to copy it through (the
    replica that would not take it, or another's plain socket)."""
    up = _upstream(folder, first, ".handoff")
    if up is not None:
        try:
            socket.send_fds(up, [b"H"], [client.fileno()])
        except OSError:  # not sent: the plain way
            up.close()
            return _upstream(folder, first)
        try:
            # Sent: the replica may be serving it already, so this waits for its answer (a
            # busy replica answers late, not never) rather than serve it twice.
            up.settimeout(_ANSWER_TIMEOUT_S)
            answer = up.recv(1)
            up.settimeout(None)
        except OSError:
            answer = b""
        if answer and answer != _TOOK:
            return up  # refused (not a host socket): copied through this connection
        up.close()
        client.close()  # taken, or its replica gone with it: the client sees it closed
        return None
    return _upstream(folder, first)


def _serve_one(client: socket.socket, folder: str, first: int) -> None:
    try:
        up = _hand_over(client, folder, first)
    except OSError:
        up = None
    if up is None and client.fileno() < 0:
        return  # handed over
    if up is None:
        try:
            client.sendall(_UNAVAILABLE)
        finally:
            client.close()
        return
    done = _thread.allocate_lock()
    done.acquire()

    def back() -> None:
        _copy(up, client)
        done.release()

    _thread.start_new_thread(back, ())
    _copy(client, up)
    done.acquire()
    client.close()
    up.close()


def serve(folder: str = FOLDER, host: str = "127.0.0.1", port: int = PORT) -> None:
    """Accept forever (in the calling thread); spread connections over the replicas."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(256)
    count = 0
    while True:
        client, _ = listener.accept()
        count += 1
        _thread.start_new_thread(_serve_one, (client, folder, count))


if __name__ == "__main__":
    import sys

    args = sys.argv[1:]
    serve(args[0] if args else FOLDER, port=int(args[1]) if len(args) > 1 else PORT)
